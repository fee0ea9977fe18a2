import importlib.util

import numpy as np
import pytest

from omnigym import make_vec
from omnigym.errors import OmnigymError


def run_episodes(envs, steps=600, seed=0):
    rng = np.random.default_rng(seed)
    envs.reset(seed=3)
    returns, flags = [], []
    for _ in range(steps):
        _, _, terminated, truncated, info = envs.step(rng.integers(0, 2, envs.num_envs))
        flags.append((terminated.copy(), truncated.copy()))
        if "episode" in info:
            returns += [float(r) for r, done in zip(info["episode"]["r"], info["_episode"]) if done]
    return returns, flags


@pytest.mark.parametrize("backend", ["sync", "async", "native"])
def test_backends_record_episodes_and_keep_truncation_apart(backend):
    envs = make_vec("CartPole-v1", 2, backend=backend, seed=3, max_episode_steps=12)
    returns, flags = run_episodes(envs)
    envs.close()
    assert len(returns) > 20
    assert all(0 < r <= 12 for r in returns)
    truncations = sum(int(tr.sum()) for _, tr in flags)
    terminations = sum(int(te.sum()) for te, _ in flags)
    assert truncations > 0 and terminations > 0
    assert any((tr & ~te).any() for te, tr in flags)  # a time limit is not a termination


def test_same_seed_same_episodes():
    a, _ = run_episodes(make_vec("CartPole-v1", 2, backend="sync", seed=5))
    b, _ = run_episodes(make_vec("CartPole-v1", 2, backend="sync", seed=5))
    assert a == b


def test_auto_picks_native_when_there_is_one():
    envs = make_vec("CartPole-v1", 3)
    assert "CartPoleVectorEnv" in type(envs.unwrapped).__name__
    envs.close()
    envs = make_vec("Pendulum-v1", 2)
    assert "SyncVectorEnv" in type(envs.unwrapped).__name__
    envs.close()


def test_unknown_env_id_names_the_closest_ids():
    with pytest.raises(OmnigymError, match=r"unknown env id 'CartPole-v7'; closest known ids: CartPole-v1"):
        make_vec("CartPole-v7", 1)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])  # True was gymnasium's TypeError
def test_num_envs_must_be_positive(n):
    with pytest.raises(OmnigymError, match="--num-envs must be a positive whole number"):
        make_vec("CartPole-v1", n)


def test_native_backend_needs_a_native_env():
    with pytest.raises(OmnigymError, match="no native vectorized implementation"):
        make_vec("Pendulum-v1", 2, backend="native")


@pytest.mark.skipif(importlib.util.find_spec("envpool") is None, reason="envpool not installed")
def test_envpool_backend_records_episodes():
    envs = make_vec("CartPole-v1", 2, backend="envpool", seed=3)
    returns, _ = run_episodes(envs, steps=400)
    assert len(returns) > 5
