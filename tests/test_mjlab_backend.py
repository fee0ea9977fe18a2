"""``--backend mjlab`` (envs/mjlab_backend.py): the adapter's conversion and autoreset logic,
tested on the CPU against a fake env that behaves as mjlab's ``ManagerBasedRlEnv`` does with
``auto_reset=False`` (torch tensors, a dict of observation groups, terminal observations
returned, no step before the finished envs are reset); the oracle is gymnasium's own
``SyncVectorEnv`` in NEXT_STEP mode on the same dynamics. Without mjlab or a CUDA GPU the
backend refuses in one line and no run directory is made; the real-mjlab test runs only
where both are present (none was lent to this work: it skips here)."""

import importlib.util
import json
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import test_bad_input
from omnigym.cli import main
from omnigym.envs.mjlab_backend import LOCOMOTION_TASKS, MjlabVectorEnv, check_available, fix_command, mjlab_task
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


@pytest.mark.parametrize("device, message", [
    ("cdua", "--backend mjlab runs on cuda, cuda:N or cpu (Warp's devices); got device='cdua'"),
    ("mps", "--backend mjlab runs on cuda, cuda:N or cpu (Warp's devices); got device='mps'"),
    (0, "--backend mjlab runs on cuda, cuda:N or cpu (Warp's devices); got device=0"),
])
def test_a_device_mjlab_cannot_run_on_is_refused_in_one_line(tmp_path, monkeypatch, capsys, device, message):
    monkeypatch.chdir(tmp_path)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace() if name == "mjlab" else
                        find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    before = test_bad_input.snapshot(tmp_path)
    assert main(["train", "ppo", "--backend", "mjlab", "--env-id", "Mjlab-Velocity-Flat-Unitree-Go1",
                 "--env-kwargs", f"device={device}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"omnigym: error: {message}"), err
    assert test_bad_input.snapshot(tmp_path) == before


def test_a_gpu_index_past_the_last_is_refused(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(OmnigymError, match=r"torch sees 1 CUDA GPU\(s\) here, cuda:0 to cuda:0"):
        check_available("cuda:7")
    assert check_available("cuda") == "cuda" and check_available("cpu") == "cpu"


def fake_velocity_cfg():
    ranges = SimpleNamespace(lin_vel_x=(-1.0, 1.0), lin_vel_y=(-1.0, 1.0), ang_vel_z=(-0.5, 0.5), heading=(-3.14, 3.14))
    twist = SimpleNamespace(ranges=ranges, heading_command=True, resampling_time_range=(3.0, 8.0), rel_standing_envs=0.1,
                            rel_heading_envs=0.3, rel_forward_envs=0.2, rel_world_envs=0.0, init_velocity_prob=0.0)
    return SimpleNamespace(commands={"twist": twist}, curriculum={"command_vel": object(), "terrain_levels": object()})


def test_fix_command_gives_every_env_one_command_for_its_whole_episode():
    cfg = fake_velocity_cfg()
    fix_command(cfg, (0.5, 0.0, 0.2))
    twist = cfg.commands["twist"]
    assert (twist.ranges.lin_vel_x, twist.ranges.lin_vel_y, twist.ranges.ang_vel_z) == ((0.5, 0.5), (0.0, 0.0), (0.2, 0.2))
    assert not twist.heading_command and twist.ranges.heading is None  # mjlab refuses a heading range without it
    assert twist.resampling_time_range[0] > 1e6  # never resampled within an episode
    assert twist.rel_standing_envs == twist.rel_heading_envs == twist.rel_forward_envs == 0.0
    assert list(cfg.curriculum) == ["terrain_levels"]  # the command curriculum would widen the ranges again


def test_fix_command_refuses_a_task_without_a_velocity_command():
    cfg = fake_velocity_cfg()
    cfg.commands = {"motion": SimpleNamespace()}
    with pytest.raises(OmnigymError, match="no 'twist' velocity command"):
        fix_command(cfg, (0.5, 0.0, 0.0))


def test_eval_randomize_of_an_mjlab_run_is_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "Mjlab-Velocity-Flat-Unitree-Go1",
                                                 "backend": "mjlab"}))
    before = test_bad_input.snapshot(tmp_path)
    assert main(["eval", str(run), "--randomize"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evaluate it with --command alone" in err[0], err
    assert test_bad_input.snapshot(tmp_path) == before


REAL_DEVICE, REAL_ENVS = ("cuda:0", 64) if torch.cuda.is_available() else ("cpu", 8)
"""where the real-mjlab test runs: Warp's CPU kernels stand in for the GPU (the same task code)"""


@pytest.mark.skipif(importlib.util.find_spec("mjlab") is None,
                    reason="mjlab is not installed (pip install 'omnigym[gpu-sim]' in a venv of its own: it pins mujoco "
                           "~=3.11, and the dev environment has 3.17)")
def test_real_mjlab_go1_velocity_task_steps_with_next_step_autoreset():
    envs = make_vec("Mjlab-Velocity-Flat-Unitree-Go1", REAL_ENVS, backend="mjlab", seed=0, device=REAL_DEVICE)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (REAL_ENVS, *envs.single_observation_space.shape) and obs.dtype == np.float32
    ended, episodes = np.zeros(REAL_ENVS, bool), 0
    for _ in range(300):
        obs, reward, terminated, truncated, info = envs.step(envs.action_space.sample() * 3)
        assert obs.shape[0] == REAL_ENVS and np.isfinite(obs).all() and np.isfinite(reward).all()
        assert (reward[ended] == 0).all() and not (terminated | truncated)[ended].any()
        ended = terminated | truncated
        episodes += int(ended.sum())
    envs.close()
    assert episodes > 0  # large random actions make the robot fall: episodes ended and were reset


@pytest.mark.skipif(importlib.util.find_spec("mjlab") is None, reason="mjlab is not installed (see above)")
def test_real_mjlab_fixed_command_holds_for_every_env_through_resets():
    envs = make_vec("Mjlab-Velocity-Flat-Unitree-Go1", REAL_ENVS, backend="mjlab", seed=0, device=REAL_DEVICE,
                    command=(0.5, 0.0, 0.0))
    envs.reset(seed=0)
    twist = envs.unwrapped.env.command_manager.get_command("twist")
    for _ in range(60):
        envs.step(envs.action_space.sample() * 3)  # falls: some envs are reset, and resample their command
        np.testing.assert_allclose(twist.cpu().numpy(), np.tile([0.5, 0.0, 0.0], (REAL_ENVS, 1)), atol=1e-6)
    assert envs.unwrapped.base_lin_vel().shape == (REAL_ENVS, 3)
    envs.close()
