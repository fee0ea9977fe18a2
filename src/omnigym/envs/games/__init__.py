"""Many-agent games from the field's libraries: ``pettingzoo/NAME`` (any env in PettingZoo's
registry, classic boards, butterfly, SISL, and MPE from its new home ``mpe2``) and ``openspiel/NAME`` (any game
``pyspiel.registered_names()`` lists), as one turn-based ``Game`` (core.py); ``TurnEnv``
(turn_env.py) is one seat of a two-seat game as a gymnasium env, the other seat played by an
opponent (opponents.py: uniform random, alpha-beta search, or self-play's league, rl/league.py).
docs/games.md.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil

import numpy as np

from omnigym.envs.games.core import Game, OpenSpielGame, PettingZooGame
from omnigym.errors import OmnigymError, missing_extra

PREFIXES = ("pettingzoo/", "openspiel/")
# Boards with no chance and nothing hidden: the search opponent can play them.
PERFECT_INFORMATION = ("tictactoe", "connect_four", "chess", "go")
# --preset auto's family for each game (algos' PRESETS); other games get none.
FAMILIES = (("pettingzoo/tictactoe_v3", "tictactoe"), ("openspiel/tic_tac_toe", "tictactoe"),
            ("pettingzoo/connect_four_v3", "connect_four"), ("openspiel/connect_four", "connect_four"))
# The search opponent's default depth per game (--search-depth 0): tic-tac-toe's whole tree
# (a perfect player), two plies elsewhere (takes a win in one, blocks a loss in one).
FULL_DEPTH = 9
DEFAULT_DEPTH = 2


def is_game_id(env_id) -> bool:
    return isinstance(env_id, str) and env_id.startswith(PREFIXES)


def game_family(env_id) -> str | None:
    return next((family for game, family in FAMILIES if game == env_id), None)


def default_search_depth(env_id: str) -> int:
    return FULL_DEPTH if game_family(env_id) == "tictactoe" else DEFAULT_DEPTH


def pettingzoo_names() -> dict[str, str]:
    """``NAME -> where it is made from`` for every env PettingZoo's registry holds (its id
    ``classic/tictactoe-v3`` spelt as the module, ``tictactoe_v3``) and every MPE env in mpe2
    (MPE's home since PettingZoo 1.25, ``mpe2:simple_spread_v3``)."""
    import pettingzoo

    names = {spec_id.split("/")[-1].replace("-v", "_v"): spec_id for spec_id in pettingzoo.aec_registry}
    if importlib.util.find_spec("mpe2") is not None:
        import mpe2

        names.update({m.name: f"mpe2:{m.name}" for m in pkgutil.iter_modules(mpe2.__path__)
                      if "_v" in m.name and m.name.rsplit("_v", 1)[1].isdigit()})
    return names


def _unknown(env_id: str, known) -> OmnigymError:
    prefix, name = env_id.split("/", 1)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(prefix + '/' + c for c in close)}" if close else ""
    return OmnigymError(f"unknown game {env_id!r}{hint} (docs/games.md lists where the names come from)")


def check_game_id(env_id: str) -> None:
    """One line for a game id that does not exist, or whose library is not installed."""
    prefix, name = env_id.split("/", 1)
    if prefix == "pettingzoo":
        if importlib.util.find_spec("pettingzoo") is None:
            raise missing_extra("pettingzoo", "games")
        names = pettingzoo_names()
        if name not in names:
            raise _unknown(env_id, names)
    else:
        if importlib.util.find_spec("pyspiel") is None:
            raise missing_extra("open-spiel", "games")
        import pyspiel

        if name not in pyspiel.registered_names():
            raise _unknown(env_id, pyspiel.registered_names())


def check_max_cycles(env_id: str, kwargs: dict) -> None:
    """MPE, butterfly and SISL end an episode after ``max_cycles`` steps, and take any value:
    0, -1 or 2.5 made every episode one step long, in silence."""
    cycles = kwargs.get("max_cycles")
    if cycles is not None and (isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 1):
        raise OmnigymError(f"{env_id}: --env-kwargs max_cycles must be a whole number of steps, 1 or more, "
                           f"got {cycles!r}")


def pettingzoo_env(name: str, **kwargs):
    """PettingZoo's own AEC env for ``name``, made through its registry (``pettingzoo.make``):
    what omnigym plays, and what ``pettingzoo.test.api_test`` checks in tests/test_games.py."""
    check_game_id(f"pettingzoo/{name}")
    check_max_cycles(f"pettingzoo/{name}", kwargs)
    source = pettingzoo_names()[name]
    if source.startswith("mpe2:"):
        return importlib.import_module(f"mpe2.{name}").env(**kwargs)
    import pettingzoo

    return pettingzoo.make("aec", source, **kwargs)


def without_cpp_stderr(call):
    """``call()`` with file descriptor 2 set aside: OpenSpiel's C++ prints a refused setting
    (``OpenSpiel exception: Unknown parameter 'players'``) to stderr before raising the same
    message in Python, which then says it in omnigym's one line. What was printed is passed on
    when the call succeeds."""
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
        try:
            result = call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        held.seek(0)
        printed = held.read()
    if printed:  # a warning of a call that worked is the user's to see
        sys.stderr.write(printed.decode(errors="replace"))
        sys.stderr.flush()
    return result


PROBE_SECONDS = 10.0
"""``check_openspiel_settings``: how long the probe game may take (a big board's random game is long)"""
PROBE_FAULTS = ((3, "has no legal move in a position before its end"), (4, "gives observations of changing sizes"))
"""``check_openspiel_settings``: the probe's exit codes for what it saw, and what they say"""


def check_openspiel_settings(env_id: str, game, kwargs: dict) -> None:
    """One line for game parameters OpenSpiel loads but cannot play. Its C++ checks few of them:
    connect four with ``rows=0`` loads, then crashes the process (SIGSEGV or SIGABRT, by build) at the first state,
    with no word and a run directory left behind; hex with ``board_size=0`` has no legal move.
    So a forked child plays one random game of them to its end first, and the parent reads how
    it ended. Python errors are left to the parent's own use of the game (they are one line)."""
    import os
    import signal
    import time

    pid = os.fork()
    if pid == 0:  # the child: only OpenSpiel's calls, then _exit (no Python teardown, no atexit)
        code = 0
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            rng = np.random.default_rng(0)
            state, size = game.new_initial_state(), None
            for _ in range(100_000):
                if state.is_terminal():
                    break
                if state.is_chance_node():
                    actions, probs = zip(*state.chance_outcomes())
                    state.apply_action(int(rng.choice(actions, p=probs)))
                    continue
                legal = state.legal_actions()
                if not legal:
                    code = 3
                    break
                seen = len(state.observation_tensor(0)) if game.get_type().provides_observation_tensor else size
                if size is not None and seen != size:
                    code = 4
                    break
                size = seen
                state.apply_action(int(rng.choice(legal)))
        except BaseException:
            code = 0
        os._exit(code)
    deadline = time.monotonic() + PROBE_SECONDS
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:  # a long game, not a fault seen: play it
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.005)
    settings = " ".join(f"{key}={value}" for key, value in kwargs.items())
    who = f"{env_id} with {settings}" if settings else env_id  # alphazero's ids carry them: openspiel/connect_four(rows=0)
    if os.WIFSIGNALED(status):
        raise OmnigymError(f"{who} crashed OpenSpiel ({signal.Signals(os.WTERMSIG(status)).name} in "
                           "a random game of it): a parameter is out of the range the game can play; check its values")
    fault = dict(PROBE_FAULTS).get(os.WEXITSTATUS(status))
    if fault:
        raise OmnigymError(f"{who} {fault} (in a random game of it): "
                           "a parameter is out of the range the game can play; check its values")


def make_game(env_id: str, **kwargs) -> Game:
    """The game behind ``pettingzoo/NAME`` or ``openspiel/NAME``; ``kwargs``: the env's own
    (PettingZoo) or the game's parameters (OpenSpiel, e.g. ``players=3``)."""
    if not is_game_id(env_id):
        raise OmnigymError(f"{env_id!r} is not a game id; games are pettingzoo/NAME or openspiel/NAME")
    check_game_id(env_id)
    prefix, name = env_id.split("/", 1)
    try:
        if prefix == "pettingzoo":
            perfect = name.rsplit("_v", 1)[0] in PERFECT_INFORMATION
            return PettingZooGame(name, pettingzoo_env(name, **kwargs), perfect_information=perfect)
        import pyspiel

        game = without_cpp_stderr(lambda: pyspiel.load_game(name, kwargs))
        if kwargs:
            check_openspiel_settings(env_id, game, kwargs)
        return OpenSpielGame(name, game)
    except OmnigymError:
        raise
    except Exception as exc:  # the library refused the settings (an unknown kwarg, a bad parameter)
        # OpenSpiel lists a game's parameters on the lines after "Available parameters are:"
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())[:300]
        detail += " none" if detail.endswith(":") else ""
        raise OmnigymError(f"{env_id} could not be made: {type(exc).__name__}: {detail}") from None


def register_game(env_id: str) -> None:
    """Puts ``env_id`` into gymnasium's registry as a ``TurnEnv`` (what ``make_vec`` makes)."""
    import gymnasium as gym

    check_game_id(env_id)
    if env_id not in gym.registry:
        gym.register(env_id, entry_point="omnigym.envs.games.turn_env:TurnEnv", kwargs={"game": env_id})
