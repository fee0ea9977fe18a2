"""DAPO's soft overlong punishment (Yu et al., 2025, eq. 13): a length-aware penalty added to
the reward of an episode that comes close to the length limit.

    R_length(y) = 0                              if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                = -1                             if |y| > L_max

``L_max`` is the limit (``--max-episode-tokens``, else ``--max-new-tokens``), ``L_cache`` the
buffer (``--overlong-buffer``), ``|y|`` the tokens the model generated in the episode (the
env's inserted tokens do not count: the model did not choose them). Why soft: a reply cut off
at the limit scores 0 whatever its reasoning was, which punishes sound but long reasoning as
hard as nonsense; the ramp tells the model that length itself costs, before the cut.
"""

from __future__ import annotations


def overlong_penalty(length: int, limit: int, buffer: int) -> float:
    """The penalty (0 down to -1) of ``length`` generated tokens under ``limit`` with a ``buffer``
    of that many tokens before it; ``buffer`` 0 is no penalty."""
    if buffer <= 0 or length <= limit - buffer:
        return 0.0
    if length > limit:
        return -1.0
    return ((limit - buffer) - length) / buffer
