"""Each seam's contract is the whole truth: algorithms (and what they hand a seam object to)
use only the members the seam's Protocol declares.

Every algorithm runs a few steps with each seam object it builds (training backend,
inference engine, generator, rollouts) wrapped in a proxy that answers the declared members
only: a caller reaching past the seam (``generator.engine``, ``backend.sibling()``, writing
``engine.version``) fails here with the member's name.
"""

import json

import pytest

from omnigym.backends.base import TrainingBackend
from omnigym.generators.base import Generator
from omnigym.inference.engine import InferenceEngine
from omnigym.runtime import Rollouts
from omnigym.runtime.control_workers import ControlRollouts

SEAMS = {"make_backend": TrainingBackend, "make_engine": InferenceEngine, "make_rollouts": Rollouts,
         "make_control_rollouts": ControlRollouts, "make_generator": Generator, "PromptGenerator": Generator,
         "TextEnvGenerator": Generator}
"""The factories (and classes) an algorithm module builds seam objects with -> the seam's Protocol."""


def declared(protocol) -> set[str]:
    members = set(getattr(protocol, "__annotations__", {}))
    return members | {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}


class Undeclared(AssertionError):
    pass


class SeamProxy:
    """``target`` seen through ``protocol``: its declared members, read-only."""

    def __init__(self, target, protocol):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_protocol", protocol)

    def __getattr__(self, name):
        protocol = object.__getattribute__(self, "_protocol")
        if name not in declared(protocol):
            raise Undeclared(f"{name!r} is not declared by {protocol.__name__}")
        return getattr(object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name, value):
        raise Undeclared(f"{object.__getattribute__(self, '_protocol').__name__}.{name} was written from outside")


def through_seams(monkeypatch, *modules) -> list[str]:
    """Wrap every seam factory the modules use; returns the seams that were built."""
    built = []

    def wrapping(factory, protocol):
        def build(*args, **kwargs):
            built.append(protocol.__name__)
            return SeamProxy(factory(*args, **kwargs), protocol)
        return build

    for module in modules:
        for name, protocol in SEAMS.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, wrapping(getattr(module, name), protocol))
    return built


QUIET = dict(progress=False, plot=False, tensorboard=False)


def test_the_proxy_refuses_what_a_protocol_does_not_declare():
    class Engine:
        version = 3
        model = "weights"

        def generate(self, prompts, n, params):
            return []

    proxy = SeamProxy(Engine(), InferenceEngine)
    assert proxy.version == 3 and proxy.generate([], 1, None) == []
    with pytest.raises(Undeclared, match="'model' is not declared by InferenceEngine"):
        proxy.model
    with pytest.raises(Undeclared, match="InferenceEngine.version was written"):
        proxy.version = 4


def test_language_algorithms_use_only_what_their_seams_declare(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from omnigym.algos.lm import dpo, grpo, rlhf, rm, sft, text_reinforce
    from omnigym.pipelines import grpo_warmup
    from omnigym.tasks.gold_world import label_pairs, prompts, reply

    import random

    built = through_seams(monkeypatch, grpo, grpo_warmup, rlhf, rm, sft, dpo, text_reinforce)
    rng = random.Random(0)
    rows = prompts(200, 0)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(p) + "\n" for p in label_pairs(rows, [(reply(rng), reply(rng)) for _ in rows])))

    # the warm-up stage, then GRPO with two epochs, a reference and every group trained
    grpo.train(grpo.GRPOConfig(run_dir=str(tmp_path / "grpo"), sft_steps=2, sft_eval_every=1, steps=2,
                               prompts_per_step=2, group_size=2, eval_size=4, eval_every=1, ppo_epochs=2,
                               skip_equal_groups=False, **QUIET))
    rm.train(rm.RMConfig(run_dir=str(tmp_path / "rm"), data=str(pairs), eval_size=20, steps=2, batch_size=4,
                         eval_every=2, **QUIET))
    rlhf.train(rlhf.RLHFConfig(run_dir=str(tmp_path / "rlhf"), reward_model=str(tmp_path / "rm"), data=str(pairs),
                               steps=2, prompts_per_step=4, minibatches=2, ppo_epochs=1, eval_prompts=4,
                               eval_every=2, max_new_tokens=6, target_kl=0.5, **QUIET))
    sft.train(sft.SFTConfig(run_dir=str(tmp_path / "sft"), steps=2, eval_size=10, batch_size=4, eval_every=2, **QUIET))
    dpo.train(dpo.DPOConfig(run_dir=str(tmp_path / "dpo"), data=str(pairs), eval_size=10, steps=2, batch_size=4,
                            eval_every=2, **QUIET))
    text_reinforce.train(text_reinforce.TextReinforceConfig(run_dir=str(tmp_path / "tr"), keywords="z", steps=2,
                                                            **QUIET))
    # every seam was built through a proxy (a renamed factory would leave this test checking nothing)
    assert {"TrainingBackend", "InferenceEngine", "Generator", "Rollouts"} <= set(built)


def test_ppo_uses_only_what_its_rollouts_declare(tmp_path, monkeypatch):
    from omnigym.algos.control import ppo

    built = through_seams(monkeypatch, ppo)
    ppo.train(ppo.PPOConfig(run_dir=str(tmp_path), total_timesteps=256, num_envs=2, num_steps=64, **QUIET))
    assert built == ["ControlRollouts"]
