"""Hindsight experience replay and goal envs: relabelling on a hand-built episode (which goals
each strategy may pick, rewards recomputed by the env's compute_reward, the unrelabelled share),
exact resume with the HER buffer, same seed => same metrics, DQN+HER learns bit flipping, SAC
on a goal env without --her, the gymnasium-robotics shim, bad input; FetchReach learning (slow)."""

import json
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

import test_bad_input
from omnigym.algos import dqn, sac, td3
from omnigym.cli import main
from omnigym.envs.goal import GoalLayout, PointReachEnv, network_view
from omnigym.errors import OmnigymError
from omnigym.runs import evaluate_run
from omnigym.resources import stored_bytes
from omnigym.rl.her import HindsightRelabelling
from omnigym.rl.replay import ReplayBuffer
from omnigym.track.checkpoint import load_checkpoint
from interrupts import interrupt_at_log
from test_reproducibility import metrics

# --- relabelling, on episodes built by hand ---

LAYOUT = GoalLayout(obs_dim=1, goal_dim=1)
DESIRED = 99.0


def recorded_reward(achieved, goals, info):
    """A reward that shows which (achieved, goal) pair it was computed from."""
    return -np.abs(np.asarray(achieved) - np.asarray(goals))[:, 0] * 1000 - np.asarray(achieved)[:, 0]


def step_obs(achieved: float) -> dict:
    return {"observation": np.array([[achieved]]), "achieved_goal": np.array([[achieved]]),
            "desired_goal": np.array([[DESIRED]])}


def hand_built(strategy: str, k: int = 4, capacity: int = 100, episodes=((0, 5), (10, 4)), running=(20, 3)):
    """Episodes whose achieved goal after step t is ``start + t + 1`` (so each transition's next
    achieved goal names it), ended by truncation; then one still running. Stored rewards are 7."""
    buffer = ReplayBuffer(capacity, (LAYOUT.stored_dim,), (), num_envs=1, goals=LAYOUT,
                          relabel=HindsightRelabelling(strategy, k, recorded_reward))
    for start, length in (*episodes, running):
        for t in range(length):
            ends = t == length - 1 and (start, length) != running
            buffer.add(step_obs(start + t), np.array([0]), np.array([7.0]), step_obs(start + t + 1),
                       np.array([False]), truncated=np.array([ends]))
    return buffer


def allowed_goals(strategy: str, achieved_next: float) -> set[float]:
    """The goals a strategy may give the transition whose next achieved goal is ``achieved_next``."""
    for start, length in ((0, 5), (10, 4), (20, 3)):
        goals = [start + t + 1.0 for t in range(length)]
        if achieved_next in goals:
            return {"future": {g for g in goals if g >= achieved_next}, "final": {goals[-1]},
                    "episode": set(goals)}[strategy]
    raise AssertionError(achieved_next)


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelled_goals_come_from_the_transitions_episode_as_the_strategy_says(strategy):
    buffer = hand_built(strategy)
    batch = buffer.sample(2000, np.random.default_rng(0))
    obs, next_obs, rewards = batch["obs"].numpy(), batch["next_obs"].numpy(), batch["rewards"].numpy()
    relabelled = batch["relabelled"].numpy()
    goals, achieved_next = obs[:, 1], next_obs[:, 0]
    assert (next_obs[:, 1] == goals).all()  # obs and next obs pursue the same goal
    seen = {a: set() for a in achieved_next}
    for goal, achieved, reward, moved in zip(goals, achieved_next, rewards, relabelled):
        if moved:
            assert goal in allowed_goals(strategy, achieved)
            assert reward == recorded_reward(np.array([[achieved]]), np.array([[goal]]), {})[0]
            seen[achieved].add(goal)
        else:
            assert goal == DESIRED and reward == 7.0  # the env's own goal and reward
    assert all(seen[a] == allowed_goals(strategy, a) for a in seen)  # every allowed goal gets drawn
    assert relabelled.sum() == round(2000 * 4 / 5) and not relabelled[1600:].any()


@pytest.mark.parametrize("k, share", [(1, 0.5), (4, 0.2), (9, 0.1)])
def test_k_relabels_per_real_transition_leave_one_in_k_plus_1_unrelabelled(k, share):
    batch = hand_built("future", k=k).sample(1000, np.random.default_rng(1))
    assert (~batch["relabelled"].numpy()).mean() == share


def test_goals_of_transitions_that_left_the_memory_are_never_drawn():
    # 12 transitions in a memory of 8: the first episode's first 4 are gone, so "episode" draws 5 only
    buffer = hand_built("episode", capacity=8, episodes=((0, 9),), running=(20, 3))
    batch = buffer.sample(3000, np.random.default_rng(2))
    goals = batch["obs"].numpy()[:, 1][batch["relabelled"].numpy()]
    assert set(goals) == {5.0, 6.0, 7.0, 8.0, 9.0, 21.0, 22.0, 23.0}


def test_a_running_episode_relabels_up_to_its_newest_transition():
    buffer = hand_built("final", episodes=(), running=(20, 3))
    goals = buffer.sample(100, np.random.default_rng(3))["obs"].numpy()[:80, 1]
    assert set(goals) == {23.0}
    buffer.add(step_obs(23), np.array([0]), np.array([7.0]), step_obs(24), np.array([False]),
               truncated=np.array([True]))
    assert set(buffer.sample(100, np.random.default_rng(3))["obs"].numpy()[:80, 1]) == {24.0}


def _fails_on_big_batches(achieved, goals, info):
    if len(goals) > 2:  # passes the probe's batch of 2 (envs/goal.py), not a real minibatch
        raise RuntimeError("only small batches")
    return recorded_reward(achieved, goals, info)


@pytest.mark.parametrize("compute_reward, message", [
    (_fails_on_big_batches, "compute_reward failed on a minibatch of 26 relabelled goals (RuntimeError: only small"),
    (lambda a, g, info: np.zeros((len(g), 2)), "compute_reward returned shape (26, 2) for a minibatch of 26 goals"),
    (lambda a, g, info: np.full(len(g), np.nan), "compute_reward returned a non-finite reward (nan)"),
], ids=["raises", "shape", "nan"])
def test_a_compute_reward_that_goes_wrong_on_a_minibatch_is_named_not_a_traceback_or_nan_loss(compute_reward, message):
    """Found attacking: a NaN reward surfaced steps later as 'the env returned a non-finite
    observation' (NaN loss -> NaN action -> NaN position); a raise or a wrong shape, as a traceback."""
    buffer = hand_built("future")
    buffer.relabel.compute_reward = compute_reward
    with pytest.raises(OmnigymError, match=re.escape(message)):
        buffer.sample(32, np.random.default_rng(0))


def test_an_env_that_terminates_under_her_gets_one_warning(capsys):
    """Found attacking: a goal env that terminates on success trained with --her silently; its
    relabelled transitions keep the terminated of the original goal (docs/her.md)."""
    buffer = hand_built("future")
    assert "warning" not in capsys.readouterr().err  # truncation only: nothing to say
    for _ in range(2):
        buffer.add(step_obs(40), np.array([0]), np.array([0.0]), step_obs(41), np.array([True]))
    err = capsys.readouterr().err
    assert err.count("omnigym: warning: --her: the env terminated an episode") == 1


def test_the_goal_replay_memory_round_trips_through_its_state_dict():
    buffer, copy_ = hand_built("future"), hand_built("future", episodes=(), running=(50, 1))
    copy_.load_state_dict(buffer.state_dict())
    a, b = buffer.sample(64, np.random.default_rng(4)), copy_.sample(64, np.random.default_rng(4))
    assert all(torch.equal(a[key], b[key]) for key in a)


# --- goal envs and how they reach the networks ---

def test_a_goal_observation_reaches_the_networks_as_observation_and_desired_goal():
    env = PointReachEnv()
    space, network_input = network_view(env.observation_space)
    obs, _ = env.reset(seed=0)
    batch = {k: v[None] for k, v in obs.items()}
    assert space.shape == (4,)
    np.testing.assert_array_equal(network_input(batch)[0], np.concatenate([obs["observation"], obs["desired_goal"]]))
    assert network_view(gym.spaces.Box(-1, 1, (3,)))[1]("same") == "same"
    assert stored_bytes(env.observation_space) == 6 * 4


def test_compute_reward_is_vectorized_and_agrees_with_the_steps_reward():
    env = gym.make("omnigym/BitFlip-v0")
    obs, _ = env.reset(seed=0)
    achieved = np.stack([obs["desired_goal"], 1 - obs["desired_goal"]])
    np.testing.assert_array_equal(env.unwrapped.compute_reward(achieved, obs["desired_goal"][None], {}), [0.0, -1.0])
    obs, reward, terminated, truncated, info = env.step(8)  # flips nothing
    assert reward == -1.0 and not terminated and info["is_success"] == 0.0


# --- training with --her ---

SMALL = dict(env_id="omnigym/PointReach-v0", num_envs=2, total_timesteps=800, learning_starts=200, batch_size=32,
             hidden=(32, 32), buffer_size=2000, log_every=200, checkpoint_every=400, her=True)


def train_sac(run_dir, **extra):
    return sac.train(sac.SACConfig(seed=3, run_dir=str(run_dir), progress=False, plot=False, tensorboard=False,
                                   **{**SMALL, **extra}))


def test_same_seed_gives_identical_metrics_with_her(tmp_path):
    train_sac(tmp_path / "a")
    train_sac(tmp_path / "b")
    a = metrics(tmp_path / "a")
    assert "charts/success_rate" in a[-1] and "losses/actor_loss" in a[-1]
    assert a == metrics(tmp_path / "b")


def test_interrupted_her_run_resumes_to_the_same_metrics(tmp_path, monkeypatch):
    """With --save-buffer the checkpoint holds the goal memory and its episodes: the run cut on
    its 3rd metrics line (after the checkpoint at 400) resumes to the same numbers."""
    train_sac(tmp_path / "whole", save_buffer=True)
    interrupt_at_log(monkeypatch, lambda: train_sac(tmp_path / "cut", save_buffer=True), n=3)
    assert "episode_last" in load_checkpoint(tmp_path / "cut")["components"]["replay"]["buffer"]
    train_sac(tmp_path / "cut", save_buffer=True, resume=str(tmp_path / "cut"))
    assert metrics(tmp_path / "cut") == metrics(tmp_path / "whole")


@pytest.mark.parametrize("algo", [sac, td3])
@pytest.mark.parametrize("her", [False, True])
def test_sac_and_td3_train_on_the_flattened_goal_observation_with_and_without_her(algo, her, tmp_path):
    config = algo.SACConfig if algo is sac else algo.TD3Config
    for run, steps in (("untrained", SMALL["learning_starts"]), ("run", 400)):  # same seed, same initial weights
        algo.train(config(seed=1, run_dir=str(tmp_path / run), progress=False, plot=False, tensorboard=False,
                          **{**SMALL, "her": her, "total_timesteps": steps}))
    before = load_checkpoint(tmp_path / "untrained")["components"]["actor"]
    saved = load_checkpoint(tmp_path / "run")["components"]["actor"]
    assert saved["torso.0.weight"].shape[1] == 4  # observation ++ desired goal
    assert not torch.equal(saved["torso.0.weight"], before["torso.0.weight"])  # it learned
    assert "charts/success_rate" in metrics(tmp_path / "run")[-1] and "losses/actor_loss" in metrics(tmp_path / "run")[-1]


def success_rates(run_dir) -> list[float]:
    return [row["charts/success_rate"] for row in metrics(run_dir) if "charts/success_rate" in row]


def test_dqn_with_her_learns_bit_flipping(tmp_path, capsys):
    """8 bits: an episode's random play ends on its goal about once in 256; with hindsight the
    greedy policy reaches and holds it in most episodes after 3000 steps."""
    cfg = dqn.DQNConfig(env_id="omnigym/BitFlip-v0", num_envs=1, total_timesteps=3000, learning_starts=500,
                        her=True, seed=1, run_dir=str(tmp_path / "run"), progress=False, plot=False,
                        tensorboard=False, checkpoint_every=0)
    before = dqn.QNetwork(network_view(gym.make("omnigym/BitFlip-v0").observation_space)[0], 9, cfg.hidden)
    dqn.train(cfg)
    rates = success_rates(tmp_path / "run")
    assert rates[0] < 0.3 and rates[-1] >= 0.85
    weights = load_checkpoint(tmp_path / "run")["components"]["model"]
    assert weights["net.0.weight"].shape == before.net[0].weight.shape
    successes = []
    evaluate_run(str(tmp_path / "run"), episodes=20, greedy=True, successes=successes)
    assert np.mean(successes) >= 0.9
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--episodes", "5", "--greedy"]) == 0
    assert "success rate: " in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "run"), "--metric", "charts/success_rate",
                 "--out", str(tmp_path / "success.png")]) == 0
    assert (tmp_path / "success.png").stat().st_size > 0


def test_omnigym_list_names_the_goal_envs(capsys):
    assert main(["list"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("goal envs:"))
    assert "omnigym/BitFlip-v0" in line and "omnigym/PointReach-v0" in line


BAD = [
    (["train", "dqn", "--her"], "--her needs a goal env (Dict observations with observation, achieved_goal and "
                                "desired_goal, and compute_reward); CartPole-v1 has Box("),
    (["train", "sac", "--her", "--env-id", "Pendulum-v1"], "--her needs a goal env"),
    (["train", "sac", "--her", "--her-k", "0"], "--her-k must be positive (relabelled transitions per real one), got 0"),
    (["train", "td3", "--her-k", "-2"], "--her-k must be positive"),
    (["train", "dqn", "--her-strategy", "past"], "unknown --her-strategy 'past'; choose future, final, episode"),
    # they did nothing without --her, in silence
    (["train", "sac", "--her-k", "8"], "--her-k and --her-strategy are for --her (hindsight replay)"),
    (["train", "td3", "--her-strategy", "final"], "--her-k and --her-strategy are for --her (hindsight replay)"),
    (["train", "sac", "--env-id", "omnigym/BitFlip-v0", "--her"], "SAC needs a continuous (Box) action space"),
    # found attacking: a Dict without the three keys heard "wrap the env in FlattenObservation" under --her
    (["train", "td3", "--her", "--env-id", "test_her:DictWithoutGoals"], "--her needs a goal env (Dict observations with "
                                                                         "observation, achieved_goal and desired_goal"),
]


class DictWithoutGoals(PointReachEnv):
    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({"observation": self.observation_space["observation"],
                                                  "goal": self.observation_space["desired_goal"]})

    def _obs(self) -> dict:
        return {"observation": self.position.copy(), "goal": self.goal.copy()}


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    test_bad_input.test_bad_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message)


# --- gymnasium-robotics' Fetch tasks ---

def fetch():
    pytest.importorskip("gymnasium_robotics", reason="Fetch envs need gymnasium-robotics: pip install 'omnigym[robots]'")
    from omnigym.envs import goal

    goal.register_robotics()
    return goal


def test_the_fetch_fix_is_used_only_where_the_bug_is_and_leaves_the_library_alone():
    goal = fetch()
    import mujoco
    from gymnasium_robotics.utils import mujoco_utils

    # The library's own check, on this mujoco: the enum answers `in` with False.
    buggy = np.int32(mujoco.mjtJoint.mjJNT_HINGE) not in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)
    assert goal.joint_enum_bug() == buggy  # asked after register_robotics: the module was not patched
    assert mujoco_utils.get_joint_qpos.__module__ == "gymnasium_robotics.utils.mujoco_utils"
    assert not hasattr(mujoco_utils, "_omnigym_shim")
    entry = gym.spec("FetchReach-v4").entry_point
    assert entry == ("omnigym.envs.fetch:FetchReach" if buggy else "gymnasium_robotics.envs.fetch.reach:MujocoFetchReachEnv")
    patched = mujoco_utils.get_joint_qpos
    try:  # a fixed release: nothing is replaced
        mujoco_utils.get_joint_qpos = lambda model, data, name: data.joint(name).qpos.copy()
        assert goal.joint_enum_bug() is False and goal.use_fixed_fetch() is False
    finally:
        mujoco_utils.get_joint_qpos = patched
    env = gym.make("FetchReach-v4")
    obs, _ = env.reset(seed=0)
    assert GoalLayout.of(env.observation_space) == GoalLayout(10, 3)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    assert reward == env.unwrapped.compute_reward(obs["achieved_goal"], obs["desired_goal"], info)
    assert "is_success" in info


def test_a_fetch_run_resumes_with_its_goal(tmp_path, monkeypatch):
    """The checkpointed env keeps its goal (gymnasium-robotics' env pickles without it)."""
    fetch()
    from omnigym.envs.cursor import EnvCursor
    from omnigym.envs.vector import make_vec

    cursor = EnvCursor(make_vec("FetchReach-v4", 1, backend="sync", seed=0), seed=0)
    actions = np.random.default_rng(0).uniform(-1, 1, (30, 1, 4)).astype(np.float32)
    for a in actions[:10]:
        cursor.step(a)
    state = cursor.state_dict()
    after = [cursor.step(a)[0]["desired_goal"].copy() for a in actions[10:]]
    resumed = EnvCursor(make_vec("FetchReach-v4", 1, backend="sync", seed=0), seed=0)
    resumed.load_state_dict(state)
    again = [resumed.step(a)[0]["desired_goal"].copy() for a in actions[10:]]
    np.testing.assert_array_equal(after, again)


@pytest.mark.slow
def test_sac_with_her_learns_fetch_reach(tmp_path):
    """The README's line (SAC's fetch preset: rl-zoo's FetchReach settings, gamma 0.95, lr 1e-3,
    batch 256, 64x64 networks, future, k=4), shortened to 15k steps: the greedy policy reaches
    the goal in at least 90% of 20 fresh episodes."""
    fetch()
    cfg = sac.SACConfig(env_id="FetchReach-v4", num_envs=1, total_timesteps=15000, her=True, seed=1,
                        run_dir=str(tmp_path / "run"), progress=False, plot=False, tensorboard=False,
                        checkpoint_every=0, log_every=500)  # the rest: --preset auto's fetch
    sac.train(cfg)
    successes = []
    evaluate_run(str(tmp_path / "run"), episodes=20, greedy=True, successes=successes)
    assert np.mean(successes) >= 0.9
    assert success_rates(tmp_path / "run")[0] < 0.5


def test_her_is_fixed_on_resume(tmp_path, capsys):
    """--no-her on a HER run's resume was taken (a plain buffer went on from a goal run), and with a saved --her-k
    refused as '--her-k and --her-strategy are for --her', flags the user never gave."""
    run = tmp_path / "run"
    assert main(["train", "dqn", "--env-id", "omnigym/BitFlip-v0", "--her", "--her-k", "8", "--total-timesteps", "200",
                 "--learning-starts", "100", "--run-dir", str(run), "--no-progress", "--no-plot"]) == 0
    before = test_bad_input.snapshot(run)
    capsys.readouterr()
    assert main(["train", "dqn", "--resume", str(run), "--no-her", "--total-timesteps", "400"]) == 2
    assert capsys.readouterr().err.strip() == (f"omnigym: error: {run} was made with --her, not --no-her; its "
                                               "checkpoint only fits its own setting (leave the flag out to keep it)")
    assert test_bad_input.snapshot(run) == before
