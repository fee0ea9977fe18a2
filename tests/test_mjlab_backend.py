"""``--backend mjlab`` (envs/mjlab_backend.py): the adapter's conversion and autoreset logic,
tested on the CPU against a fake env that behaves as mjlab's ``ManagerBasedRlEnv`` does with
``auto_reset=False`` (torch tensors, a dict of observation groups, terminal observations
returned, no step before the finished envs are reset); the oracle is gymnasium's own
``SyncVectorEnv`` in NEXT_STEP mode on the same dynamics. Without mjlab or a CUDA GPU the
backend refuses in one line and no run directory is made; the real-mjlab test runs only
where both are present (none was lent to this work: it skips here)."""

import importlib.util
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import test_bad_input
from omnigym.cli import main
from omnigym.envs.mjlab_backend import LOCOMOTION_TASKS, MjlabVectorEnv, mjlab_task
from omnigym.envs.vector import make_vec
from omnigym.errors import OmnigymError

LIMITS = (3, 5, 4)
"""env i's episode ends after LIMITS[i] steps: env 0 by time out (truncated), the others by termination"""


def limit_ends(i, t, x):
    """(terminated, truncated) of env i after its t-th step at position x."""
    return (i > 0 and t >= LIMITS[i]) or x > 6.0, i == 0 and t >= LIMITS[i]


class FakeMjlabEnv:
    """mjlab's ManagerBasedRlEnv, auto_reset=False, on a 1-D point: x += sum(action), reward x."""

    def __init__(self, num_envs=len(LIMITS), device="cpu"):
        self.cfg = SimpleNamespace(auto_reset=False, seed=None)
        self.num_envs, self.device = num_envs, device
        box = SimpleNamespace
        self.single_observation_space = SimpleNamespace(spaces={
            "actor": box(shape=(2,), dtype="float32", low=-np.inf, high=np.inf),
            "critic": box(shape=(3,), dtype="float32", low=-np.inf, high=np.inf)})
        self.single_action_space = box(shape=(2,), dtype="float32", low=-np.inf, high=np.inf)
        self.x = torch.zeros(num_envs, device=device)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.pending = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.resets = torch.zeros(num_envs, dtype=torch.long)
        self.closed = False

    def _obs(self):
        actor = torch.stack([self.x, self.t.float()], -1)
        return {"actor": actor, "critic": torch.cat([actor, self.resets.float().unsqueeze(-1)], -1)}

    def reset(self, *, seed=None, env_ids=None, options=None):
        ids = torch.arange(self.num_envs) if env_ids is None else env_ids
        self.x[ids], self.t[ids], self.pending[ids] = 0.0, 0, False
        self.resets[ids] += 1
        return self._obs(), {"log": {}}

    def step(self, action):
        assert isinstance(action, torch.Tensor) and action.dtype == torch.float32
        if self.pending.any():
            raise RuntimeError("Environments must be reset via reset(env_ids=...) before calling step() again")
        self.x += action.sum(-1)
        self.t += 1
        ends = [limit_ends(i, int(self.t[i]), float(self.x[i])) for i in range(self.num_envs)]
        terminated = torch.tensor([e[0] for e in ends])
        truncated = torch.tensor([e[1] for e in ends])
        self.pending |= terminated | truncated
        return self._obs(), self.x * 0.5, terminated, truncated, {"log": {"Episode_Reward/x": torch.tensor(1.0)}}

    def close(self):
        self.closed = True


class PointEnv(gym.Env):
    """The same dynamics as one gymnasium env, for gymnasium's own NEXT_STEP vector env."""

    def __init__(self, i):
        self.i = i
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        self.x, self.t = 0.0, 0
        return np.array([0.0, 0.0], np.float32), {}

    def step(self, action):
        self.x = float(np.float32(self.x) + np.float32(np.sum(action, dtype=np.float32)))
        self.t += 1
        terminated, truncated = limit_ends(self.i, self.t, self.x)
        return np.array([self.x, self.t], np.float32), self.x * 0.5, terminated, truncated, {}


def actions(steps, seed=0):
    return np.random.default_rng(seed).uniform(-0.5, 1.0, (steps, len(LIMITS), 2)).astype(np.float32)


def test_steps_match_gymnasium_next_step_autoreset():
    adapter = MjlabVectorEnv(FakeMjlabEnv())
    oracle = gym.vector.SyncVectorEnv([lambda i=i: PointEnv(i) for i in range(len(LIMITS))],
                                      autoreset_mode=AutoresetMode.NEXT_STEP)
    assert adapter.metadata["autoreset_mode"] == oracle.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    got, want = adapter.reset(seed=1)[0], oracle.reset(seed=1)[0]
    np.testing.assert_array_equal(got, want)
    ended_steps = 0
    for step, action in enumerate(actions(40)):
        got, want = adapter.step(action), oracle.step(action)
        for name, g, w in zip(("obs", "reward", "terminated", "truncated"), got[:4], want[:4]):
            np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"{name} at step {step}")
            assert g.shape == w.shape, (name, g.shape, w.shape)
        ended_steps += int((got[2] | got[3]).sum())
    assert ended_steps >= 15  # every env ended several episodes, by termination and by time out
    assert got[0].dtype == np.float32 and got[1].dtype == np.float64 and got[2].dtype == bool


def test_the_step_after_an_end_returns_the_reset_observation_and_ignores_the_action():
    fake = FakeMjlabEnv()
    adapter = MjlabVectorEnv(fake)
    adapter.reset()
    ones = np.ones((len(LIMITS), 2), np.float32)
    for _ in range(LIMITS[0]):
        obs, reward, terminated, truncated, _ = adapter.step(ones)
    assert truncated[0] and not terminated[0] and obs[0].tolist() == [2.0 * LIMITS[0], LIMITS[0]]  # the true last
    obs, reward, terminated, truncated, info = adapter.step(ones * 100)  # env 0's action is ignored
    assert obs[0].tolist() == [0.0, 0.0] and reward[0] == 0.0 and not terminated[0] and not truncated[0]
    assert obs[1].tolist() == [2.0 * (LIMITS[0] + 1) + 198.0, LIMITS[0] + 1]  # the others stepped as usual
    assert fake.resets.tolist() == [3, 1, 1]  # the initial reset, then two for the autoreset step
    assert info == {}


def test_episode_statistics_match_gymnasiums():
    def returns(envs):
        envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
        envs.reset(seed=0)
        seen = []
        for action in actions(60, seed=3):
            info = envs.step(action)[4]
            if "episode" in info:
                seen += [(i, round(float(info["episode"]["r"][i]), 4), int(info["episode"]["l"][i]))
                         for i in np.flatnonzero(info["_episode"])]
        return seen

    oracle = gym.vector.SyncVectorEnv([lambda i=i: PointEnv(i) for i in range(len(LIMITS))],
                                      autoreset_mode=AutoresetMode.NEXT_STEP)
    seen = returns(MjlabVectorEnv(FakeMjlabEnv()))
    assert len(seen) >= 20 and seen == returns(oracle)


def test_spaces_actions_and_groups():
    fake = FakeMjlabEnv()
    adapter = MjlabVectorEnv(fake, clip_actions=0.25)
    assert adapter.single_observation_space == gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)  # the actor group
    assert adapter.single_action_space == gym.spaces.Box(-0.25, 0.25, (2,), np.float32)
    assert adapter.observation_space.shape == (3, 2) and adapter.action_space.shape == (3, 2)
    adapter.reset()
    obs = adapter.step(np.full((3, 2), 5.0, np.float32))[0]
    assert obs[:, 0].tolist() == [0.5, 0.5, 0.5]  # clipped to +-0.25 per action dimension, as rsl_rl does
    assert MjlabVectorEnv(fake, group="critic").single_observation_space.shape == (3,)
    adapter.close()
    assert fake.closed
    fake.cfg.auto_reset = True
    with pytest.raises(ValueError, match="auto_reset = False"):
        MjlabVectorEnv(fake)
    fake.cfg.auto_reset = False
    fake.single_observation_space.spaces["actor"] = SimpleNamespace(shape=(), spaces={"joint_pos": None})
    with pytest.raises(OmnigymError, match="is a dict of terms; omnigym's networks take one array"):
        MjlabVectorEnv(fake)


def test_locomotion_ids_map_to_mjlabs_go1_velocity_task(capsys):
    assert mjlab_task("omnigym/Go2-Velocity-Rough-v0") == "Mjlab-Velocity-Rough-Unitree-Go1"
    assert "mjlab ships the Unitree Go1, not the Go2" in capsys.readouterr().out
    assert mjlab_task("Mjlab-Velocity-Flat-Unitree-G1") == "Mjlab-Velocity-Flat-Unitree-G1"
    assert capsys.readouterr().out == ""
    assert set(LOCOMOTION_TASKS) == {"omnigym/Go2-Velocity-Flat-v0", "omnigym/Go2-Velocity-Rough-v0"}


@pytest.mark.parametrize("mjlab_installed, message", [
    (False, "mjlab is not installed; install it with: pip install 'omnigym[gpu-sim]'"),
    (True, "--backend mjlab needs an NVIDIA GPU with CUDA (mjlab runs on MuJoCo Warp); torch sees none here")])
def test_without_mjlab_or_a_gpu_one_line_and_no_run_dir(tmp_path, monkeypatch, capsys, mjlab_installed, message):
    if torch.cuda.is_available() and importlib.util.find_spec("mjlab") is not None:
        pytest.skip("mjlab and a CUDA GPU are both here: nothing is refused")
    monkeypatch.chdir(tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: SimpleNamespace() if name == "mjlab" and mjlab_installed else
                        None if name == "mjlab" else find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = test_bad_input.snapshot(tmp_path)
    assert main(["train", "ppo", "--backend", "mjlab", "--env-id", "omnigym/Go2-Velocity-Flat-v0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"omnigym: error: {message}"), err
    assert test_bad_input.snapshot(tmp_path) == before


REAL_MJLAB_MISSING = ("mjlab is not installed (pip install 'omnigym[gpu-sim]'; it needs an NVIDIA GPU)"
                      if importlib.util.find_spec("mjlab") is None else
                      "--backend mjlab needs an NVIDIA GPU with CUDA" if not torch.cuda.is_available() else "")


@pytest.mark.skipif(bool(REAL_MJLAB_MISSING), reason=REAL_MJLAB_MISSING)
def test_real_mjlab_go1_velocity_task_steps_with_next_step_autoreset():
    envs = make_vec("Mjlab-Velocity-Flat-Unitree-Go1", 64, backend="mjlab", seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (64, *envs.single_observation_space.shape) and obs.dtype == np.float32
    ended, episodes = np.zeros(64, bool), 0
    for _ in range(300):
        obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample() * 3)
        assert obs.shape[0] == 64 and np.isfinite(obs).all() and np.isfinite(reward).all()
        assert (reward[ended] == 0).all() and not (terminated | truncated)[ended].any()
        ended = terminated | truncated
        episodes += int(ended.sum())
    envs.close()
    assert episodes > 0  # large random actions make the robot fall: episodes ended and were reset
