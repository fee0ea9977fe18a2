"""What a run would allocate is estimated before it allocates: a run that cannot fit is
refused in one line naming the flag and the estimate, quickly and with nothing written; every
default and preset fits."""

import json
import time

import pytest

from omnigym import resources
from omnigym.cli import main
from test_bad_input import snapshot

GB = 1 << 30


@pytest.mark.parametrize("argv, free, message", [
    (["train", "ppo", "--num-envs", "100000"], 1 * GB, "--num-envs 100000 needs about 6.1 GB of memory in all"),
    (["train", "ppo", "--num-envs", "20000000"], None, "--num-envs 20000000 needs about 1220.7 GB"),
    (["train", "ppo", "--backend", "async", "--num-envs", "500"], 4 * GB, "--num-envs 500 needs about 19.6 GB"),
    (["train", "ppo", "--num-steps", "20000000"], 1 * GB, "give a smaller --num-steps or --num-envs"),
    (["train", "reinforce", "--num-steps", "20000000"], 1 * GB, "give a smaller --num-steps or --num-envs"),
    (["train", "dqn", "--buffer-size", "100000000", "--total-timesteps", "100000000"], 1 * GB,
     "--buffer-size 100000000 needs about"),
    # (a --buffer-size to hold the batch: a smaller one is refused first, by the config)
    (["train", "sac", "--env-id", "Pendulum-v1", "--batch-size", "100000000", "--buffer-size", "100000000"], 1 * GB,
     "--batch-size 100000000 needs about"),
    (["train", "td3", "--env-id", "Pendulum-v1", "--buffer-size", "1000000000", "--total-timesteps", "1000000000"],
     1 * GB, "--buffer-size 1000000000 needs about"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_run_that_cannot_fit_is_refused_before_it_allocates(tmp_path, monkeypatch, capsys, argv, free, message):
    monkeypatch.chdir(tmp_path)
    if free is not None:
        monkeypatch.setattr(resources, "available_memory", lambda: free)
    start = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - start < 5  # not minutes of making envs first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "is free here" in err[0], err
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("algo, env_id", [
    ("ppo", "CartPole-v1"), ("reinforce", "CartPole-v1"), ("dqn", "CartPole-v1"), ("sac", "Pendulum-v1"),
    ("td3", "Pendulum-v1"), ("ppo", "HalfCheetah-v5"), ("sac", "HalfCheetah-v5"), ("td3", "HalfCheetah-v5"),
    ("ppo", "ALE/Pong-v5"), ("dqn", "ALE/Pong-v5"),
])
def test_every_default_and_preset_fits_a_16_gb_machine(algo, env_id):
    """The DQN Atari preset's million-frame replay memory is the largest: about 8 GB (docs/atari.md)."""
    import gymnasium as gym

    from omnigym.algos import config_class, get_algorithm
    from omnigym.envs.atari import AtariOptions
    from omnigym.envs.vector import env_family, make_vec

    if env_id.startswith("ALE/"):
        pytest.importorskip("ale_py")
    if env_id.startswith("HalfCheetah"):
        pytest.importorskip("mujoco")
    cfg = config_class(get_algorithm(algo))(env_id=env_id).with_preset()
    envs = make_vec(env_id, 1, backend="sync", seed=0, atari=AtariOptions.from_config(cfg))
    family = env_family(env_id)
    start = time.perf_counter()
    resources.check_envs(cfg, family, available=16 * GB)
    resources.check_buffers(cfg, family, envs.single_observation_space, envs.single_action_space, available=16 * GB)
    assert time.perf_counter() - start < 0.5
    needs = resources.buffer_needs(cfg, family, envs.single_observation_space, envs.single_action_space)
    assert sum(size for _, size in needs.values()) < (9 * GB if (algo, env_id) == ("dqn", "ALE/Pong-v5") else GB)
    envs.close()
    assert isinstance(envs.single_observation_space, gym.spaces.Box)


def test_available_memory_is_read_here():
    free = resources.available_memory()
    assert free is None or 0 < free < 1 << 50


def write_pairs(path):
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i)}) + "\n"
                            for i in range(40)))


@pytest.mark.parametrize("argv, free", [
    (["train", "sft", "--batch-size", "100000000"], GB // 4),
    (["train", "dpo", "--data", "pairs.jsonl", "--eval-size", "5", "--batch-size", "100000000"], GB // 1024),
    (["train", "rm", "--data", "pairs.jsonl", "--eval-size", "5", "--batch-size", "100000000"], GB // 1024),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_a_language_batch_that_cannot_fit_is_refused_before_the_first_step(tmp_path, monkeypatch, capsys, argv, free):
    """SFT's --batch-size 100000000 took every training example in one step: 3.5 GB and
    minutes on the tiny model, before anything said so."""
    monkeypatch.chdir(tmp_path)
    write_pairs(tmp_path / "pairs.jsonl")
    monkeypatch.setattr(resources, "available_memory", lambda: free)
    before = snapshot(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--batch-size 100000000 needs about" in err[0] and "is free here" in err[0], err
    assert snapshot(tmp_path) == before


def test_the_default_language_batches_fit():
    class SmolLM2:  # SmolLM2-135M's config (docs/real_model.md)
        vocab_size, hidden_size, num_hidden_layers, num_attention_heads = 49152, 576, 30, 9

    # SFT's default batch at its longest, and RM's (a scalar head, no logits) with pairs of 128 tokens
    assert resources.language_batch_bytes(16, 256, SmolLM2) < 8 * GB
    assert resources.language_batch_bytes(2 * 32, 128, SmolLM2, logits=False) < 8 * GB


def test_a_large_run_that_fits_says_so_in_one_line_before_it_is_made(capsys):
    """--num-envs 100000 fits a machine with 22 GB free, and building it takes minutes: it used
    to pass in silence. A part over SAID_ABOVE is named with its estimate; a small run says nothing."""
    from omnigym.algos import config_class, get_algorithm

    cfg = config_class(get_algorithm("ppo"))(env_id="CartPole-v1", num_envs=100_000)
    resources.check_envs(cfg, None, available=64 * GB)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: note: --num-envs 100000 takes about 6.1 GB of the 64.0 GB free here"), err
    resources.check_envs(config_class(get_algorithm("ppo"))(env_id="CartPole-v1"), None, available=64 * GB)
    assert capsys.readouterr().err == ""
