"""Rewards: batched callables ``(completions, examples) -> tensor`` in one registry.

A reward takes a list of completions and the list of examples they answer and returns
one float per completion as a 1-D tensor. A verifier written for one completion becomes
a batched reward with ``per_sample``; a learned reward model is a reward like any other
(it scores the whole batch in one forward pass). Rewards are registered by name and must
be picklable (module-level functions or objects, no lambdas), so that they can be sent
to another process; any state they need travels with the example or the object, never in
a module-global cache.

The registry of your rewards (``register_reward``), ``per_sample`` and ``checked`` are ``base.py``;
this package adds the lookup and the weighted sum on top of it. The built-in rewards are a
table here (``builtin_rewards``), made afresh for each lookup: what one holds (the code
sandbox, reasoning-gym's scorers) belongs to that reward object, not to the process.

``WeightedSum({"math": 1.0, "format": 0.1})`` is the weighted sum of several rewards and
also reports each part, so each can be logged as its own metric (``reward/math``, ...).
"""

from __future__ import annotations

import copy
import re
from typing import Sequence

import torch

from omnigym.errors import OmnigymError
from omnigym.rewards.base import (MAX_REWARD, REWARDS, CallableReward, Reward, as_reward, checked, per_sample,
                                  register_reward, usable_totals)
from omnigym.user_code import call_user_code, import_object, import_reference, is_reference

__all__ = ["REWARDS", "CallableReward", "Reward", "WeightedSum", "as_reward", "builtin_rewards", "checked", "get_reward", "leading_part", "parse_weights", "per_sample",
           "register_reward", "scored_with_notes", "scored_with_parts"]

def builtin_rewards() -> dict[str, Reward]:
    """The rewards omnigym ships, by name, made afresh (their modules are imported here, on
    first use: code.py reads its harness, reasoning_gym.py needs its package)."""
    from omnigym.rewards import code, gold, instructions, reasoning_gym, text

    return {"format": per_sample(text.format_reward), "math": per_sample(text.math_reward),
            "keyword": per_sample(text.keyword_reward), "length": per_sample(text.length_reward),
            "code": per_sample(code.CodeScore(graded=False)), "code_graded": per_sample(code.CodeScore(graded=True)),
            "reasoning_gym": per_sample(reasoning_gym.ReasoningGymScore()),
            "gold_vowels": per_sample(gold.gold_vowels), "ifeval": per_sample(instructions.ifeval_strict),
            "ifeval_loose": per_sample(instructions.ifeval_loose), "ifeval_all": per_sample(instructions.ifeval_all)}


def get_reward(name: str, judge_rubric: str | None = None) -> Reward:
    """A built-in or registered reward, or ``module:name`` from your own code: a reward the
    module registers under ``name`` on import, or the module's batched reward object ``name``;
    ``rm:RUN_DIR`` is a reward model trained by ``omnigym train rm``, ``rm:http://HOST:PORT`` one
    served by ``omnigym serve-rm``, ``prm:RUN_DIR`` a process reward model trained by ``omnigym train
    prm`` (a reply's weakest step), ``judge:MODEL_OR_URL`` an LLM judge (rewards/judge.py) with the
    rubric of the file ``judge_rubric`` (default: its own)."""
    builtins = builtin_rewards()
    if name in builtins:
        return builtins[name]
    if name in REWARDS:
        return REWARDS[name]
    if name.startswith("rm:"):  # a trained reward model: rm:RUN_DIR, or rm:http://HOST:PORT serving one
        from omnigym.rewards.remote import RemoteRewardModel, is_reward_url
        from omnigym.rewards.reward_model import RewardModelScorer

        if is_reward_url(name[3:]):
            return RemoteRewardModel(name[3:])
        return RewardModelScorer(name[3:])
    if name.startswith("prm:"):  # a process reward model: prm:RUN_DIR (rewards/process.py)
        from omnigym.rewards.process import ProcessRewardScorer

        return ProcessRewardScorer(name[4:])
    if name == "judge" or name.startswith("judge:"):  # an LLM judge: judge:MODEL_FOLDER or judge:http://HOST:PORT/v1
        from omnigym.rewards.judge import JudgeReward, read_rubric

        return JudgeReward(name[len("judge:"):], read_rubric(judge_rubric))
    if is_reference(name):
        _, attr = import_reference(name, "reward")
        reward = REWARDS.get(attr) or import_object(name, "reward")
        if not callable(reward):
            raise OmnigymError(f"reward {name} is not callable; a reward is (completions, examples) -> tensor")
        return reward
    raise OmnigymError(f"unknown reward {name!r}; known: {', '.join(sorted({*builtins, *REWARDS}))}, "
                       "or module:name of your own")


class WeightedSum(Reward):
    """``sum_i weight_i * reward_i``; ``components`` gives each reward's own values."""

    def __init__(self, weights: dict[str, float], judge_rubric: str | None = None, places: dict | None = None):
        """``places``: {part: what to load it from} for parts whose folder is elsewhere than their
        name says (a run resumed from another directory: ``track/resume.py``'s ``reward_places``);
        a part keeps its name, and its metrics theirs."""
        self.weights, self.judge_rubric = dict(weights), judge_rubric
        places = places or {}
        self.parts = {name: as_reward(get_reward(places.get(name, name), judge_rubric), name) for name in self.weights}
        self.label = ",".join(f"{name}:{weight}" for name, weight in self.weights.items())

    def components(self, completions: Sequence[str], examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        return {name: checked(name, call_user_code(f"reward {name}", reward, completions, examples), len(completions))
                for name, reward in self.parts.items()}

    def score(self, completions: Sequence[str], examples: Sequence[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        parts = self.components(completions, examples)
        return self.total(parts), parts

    def score_notes(self, completions, examples):
        """``score`` and the parts' notes, added up where two parts note the same name."""
        parts, notes = {}, {}
        for name, reward in self.parts.items():
            # a part that raises (a judge's engine, a sandbox) is one line naming it, as in score()
            values, _, own = call_user_code(f"reward {name}", reward.score_notes, completions, examples)
            parts[name] = values
            for key, column in own.items():
                notes[key] = [a + b for a, b in zip(notes.get(key, [0.0] * len(column)), column)]
        return self.total(parts), parts, notes

    def accuracy(self) -> Reward:
        """The first part alone: ``math`` in ``math:1.0,format:0.1``. The part itself, not a new
        one: a reward model or a judge is not loaded a second time (nor from its name again, which
        a resumed run may have found elsewhere)."""
        first = next(iter(self.weights))
        alone = copy.copy(self)
        alone.weights, alone.parts, alone.label = {first: 1.0}, {first: self.parts[first]}, f"{first}:1.0"
        return alone

    def to(self, device: str) -> "WeightedSum":
        """Run the parts that hold a model (``rm:``) on ``device``."""
        for part in self.parts.values():
            part.to(device)
        return self

    def total(self, components: dict[str, torch.Tensor]) -> torch.Tensor:
        values = list(components.items())
        out = torch.zeros_like(values[0][1])
        for name, value in values:
            out = out + self.weights[name] * value
        if not usable_totals(out):  # each part finite, the weighted sum past float32's range: inf advantages
            spec = ", ".join(f"{name}:{self.weights[name]:g}" for name, _ in values)
            raise OmnigymError(f"the weighted reward ({spec}) came to {out[out.abs().argmax()].item()!r}, past "
                               f"{MAX_REWARD:g}; give the rewards smaller weights")
        return out

    def __call__(self, completions: Sequence[str], examples: Sequence[dict]) -> torch.Tensor:
        return self.total(self.components(completions, examples))


def scored_with_parts(reward, completions: Sequence[str],
                      examples: Sequence[dict]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(totals, parts)`` of any reward (``Reward.score``; a plain callable is the env's reward)."""
    return as_reward(reward, "of the env").score(completions, examples)


def scored_with_notes(reward, completions: Sequence[str], examples: Sequence[dict]):
    """``(totals, parts, notes)`` of any reward (``Reward.score_notes``): notes are per-completion
    numbers a reward observed beside its score (``sandbox_blocked``), for the trajectories' info."""
    reward = as_reward(reward, "of the env")
    return call_user_code(f"reward {reward.label}", reward.score_notes, completions, examples)


def leading_part(reward) -> Reward:
    """The reward that decides correctness (``Reward.accuracy``): a weighted sum's first part
    (math in math:1.0,format:0.1), or the reward itself."""
    return as_reward(reward, "of the env").accuracy()


def parse_weights(spec: str, judge_rubric: str | None = None, places: dict | None = None,
                  flag: str = "--rewards") -> WeightedSum:
    """``"math:1.0,format:0.1"`` as a ``WeightedSum``; every name must be a known reward
    (``my_module:my_reward:1.0`` names your own, ``rm:http://127.0.0.1:8000:1.0`` a served reward
    model: the weight follows the last colon; ``judge_rubric``: the rubric file of ``judge:`` parts;
    ``places``: as ``WeightedSum``'s; ``flag``: the flag the spec came from, as its errors name it)."""
    weights = {}
    for part in spec.split(","):
        name, _, weight = part.strip().rpartition(":")
        if re.fullmatch(r"(rm|judge):https?://(\[[^\]]*\]|[^/:\[\]]+)", name, flags=re.IGNORECASE) and weight.isdigit():
            # rm:http://HOST:PORT with its weight left out: the port would be read as the weight
            raise OmnigymError(f"{flag} {part.strip()}: give the weight after the port "
                               f"({part.strip()}:1.0)")
        if name in weights:
            raise OmnigymError(f"{flag} names {name} twice; give each reward once, with its weight")
        try:
            weights[name] = float(weight)
        except ValueError:
            if part.strip().rstrip(":") == "judge":
                raise OmnigymError(f"{flag} judge: names no judge; write judge:MODEL_FOLDER:1.0 or "
                                   "judge:http://HOST:PORT/v1:1.0") from None
            if part.strip().startswith("judge:"):
                raise OmnigymError(f"{flag} {part.strip()}: the weight after the last colon must be a number "
                                   "(judge:MODEL_OR_URL:1.0)") from None
            name = ""
        if not name:
            raise OmnigymError(f"{flag} must look like 'math:1.0,format:0.1' (name:weight,...), got {spec!r}")
        if weights[name] != weights[name] or abs(weights[name]) == float("inf"):
            raise OmnigymError(f"{flag}: the weight of {name} must be a finite number, got {weight}")
    return WeightedSum(weights, judge_rubric, places)

