"""Same seed, same metrics; an interrupted and resumed run equals an uninterrupted one."""

import json

import pytest

from omnigym.algos import dqn, ppo, reinforce
from interrupts import interrupt_at_log

SMALL = {
    "ppo": (ppo, dict(total_timesteps=4096, num_envs=4, num_steps=64, checkpoint_every=512)),
    "dqn": (dqn, dict(total_timesteps=3000, learning_starts=500, train_frequency=64, gradient_steps=8,
                      log_every=250, checkpoint_every=500, buffer_size=2000, save_buffer=True)),
    "reinforce": (reinforce, dict(total_timesteps=4096, num_envs=4, num_steps=128, checkpoint_every=1024)),
    # MuJoCo's preset: observation and reward statistics, pickled MuJoCo envs
    "ppo-mujoco": (ppo, dict(env_id="InvertedPendulum-v5", total_timesteps=4096, num_steps=256, num_minibatches=4,
                             update_epochs=2, checkpoint_every=512)),
}


def metrics(run_dir):
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def train(name, run_dir, **extra):
    module, kwargs = SMALL[name]
    config_cls = {ppo: ppo.PPOConfig, dqn: dqn.DQNConfig, reinforce: reinforce.ReinforceConfig}[module]
    cfg = config_cls(seed=7, run_dir=str(run_dir), progress=False, plot=False, tensorboard=False, **kwargs)
    for key, value in extra.items():
        setattr(cfg, key, value)
    return module.train(cfg)


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_same_seed_gives_identical_metrics(name, tmp_path):
    train(name, tmp_path / "a")
    train(name, tmp_path / "b")
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert len(a) > 5
    assert a == b


@pytest.mark.parametrize("name", ["ppo", "dqn", "reinforce", "ppo-mujoco"])
def test_interrupted_run_resumes_to_the_same_metrics(name, tmp_path, monkeypatch):
    train(name, tmp_path / "whole")

    # Interrupt on the 7th metrics line, after it is written but before the next checkpoint:
    # resume must drop that line and redo the work from the checkpoint before it.
    interrupt_at_log(monkeypatch, lambda: train(name, tmp_path / "cut"), n=7)
    assert len(metrics(tmp_path / "cut")) == 7

    train(name, tmp_path / "cut", resume=str(tmp_path / "cut"))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


def test_dqn_checkpoint_leaves_the_replay_memory_out_unless_asked(tmp_path):
    import os

    train("dqn", tmp_path / "with", buffer_size=200_000)
    train("dqn", tmp_path / "without", buffer_size=200_000, save_buffer=False)
    size = {name: os.path.getsize(tmp_path / name / "checkpoint.pt") for name in ("with", "without")}
    assert size["without"] < size["with"] / 5
    # Resumed without its memory, the run refills it and goes on to the end.
    train("dqn", tmp_path / "without", total_timesteps=4000, buffer_size=200_000, save_buffer=False, resume=str(tmp_path / "without"))
    steps = [row["global_step"] for row in metrics(tmp_path / "without") if "global_step" in row]
    assert steps and max(steps) >= 4000


@pytest.mark.slow  # torch.compile takes ~20 s of CPU to build the graph
def test_compiled_ppo_takes_the_same_first_update_as_eager(tmp_path):
    """``--compile`` changes how the loss is computed, not what: on the same rollout (the
    numpy actor does not depend on it) the first update's losses agree to float rounding."""
    train("ppo", tmp_path / "eager", total_timesteps=256)
    train("ppo", tmp_path / "compiled", total_timesteps=256, compile=True)
    eager, compiled = metrics(tmp_path / "eager")[0], metrics(tmp_path / "compiled")[0]
    assert eager["global_step"] == compiled["global_step"] > 200  # the same rollout (autoreset steps not counted)
    for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"):
        assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-6), key
    assert eager["losses/value_loss"] > 0
