"""Goal-conditioned envs: Dict observations (``observation``, ``achieved_goal``,
``desired_goal``) and a vectorized ``compute_reward(achieved_goal, desired_goal, info)``, the
contract of gymnasium-robotics' ``GoalEnv`` that hindsight replay (rl/her.py) relabels with.

- ``GoalLayout`` and ``network_view`` (how such an observation reaches the networks and the
  replay memory) live in ``models/goal_view.py``, below envs; they are imported here too.
- gymnasium-robotics' Fetch tasks (``FetchReach-v4``, ``FetchPush-v4``, ``FetchPickAndPlace-v4``,
  ``FetchSlide-v4``) are registered lazily, as ale-py's games are (envs/vector.py), with a
  fix for a bug of gymnasium-robotics 1.4.2 under mujoco >= 3.17 (``joint_enum_bug``): where the
  bug is, those ids are made from ``envs/fetch.py``'s subclasses, which fix each env, not the library.
- omnigym's own goal envs, fast enough for tests and for reading: ``omnigym/BitFlip-v0`` (the
  HER paper's bit flipping, discrete actions, for DQN) and ``omnigym/PointReach-v0`` (a point
  mass steered to a goal in the plane, continuous actions, for SAC and TD3).

None of these envs ends an episode on success: they are truncated by time only (Fetch after
50 steps), so a transition's ``terminated`` never depends on the goal that relabelling changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io

import gymnasium as gym
import numpy as np

from omnigym.errors import OmnigymError, missing_extra
from omnigym.models.goal_view import GOAL_KEYS, GoalLayout, is_goal_space, network_view  # noqa: F401 (rl/her.py, offline/, algos/control/ import them from here)

FETCH_IDS = ("FetchReach-v4", "FetchPush-v4", "FetchPickAndPlace-v4", "FetchSlide-v4")
OWN_IDS = ("omnigym/BitFlip-v0", "omnigym/PointReach-v0")
ROBOTICS_PREFIXES = ("Fetch", "HandManipulate", "HandReach", "AdroitHand", "PointMaze", "AntMaze", "FrankaKitchen")
"""ids gymnasium-robotics registers: only these import it (an import of a quarter second)"""


def goal_reward_function(envs):
    """The env's ``compute_reward``, from one env of ``envs`` (a sync vector env's first env;
    a fresh env for the other backends), checked to be vectorized over a batch of goals."""
    vector = envs.unwrapped
    if isinstance(vector, gym.vector.SyncVectorEnv):
        env = vector.envs[0]
    elif hasattr(vector, "env_fns"):
        env = vector.env_fns[-1]()  # the last: env 0's may record video
    else:
        raise OmnigymError("--her needs the env's compute_reward; use --backend sync or async")
    compute_reward = getattr(env.unwrapped, "compute_reward", None)
    if not callable(compute_reward):
        raise OmnigymError(f"--her needs the env's compute_reward(achieved_goal, desired_goal, info) to recompute "
                           f"rewards for relabelled goals; {type(env.unwrapped).__name__} has none")
    space = env.observation_space
    goals = np.stack([space["desired_goal"].sample() for _ in range(2)]).astype(np.float32)
    try:
        rewards = np.asarray(compute_reward(goals, goals[::-1], {}))
    except Exception as exc:
        raise OmnigymError(f"--her: the env's compute_reward failed on a batch of 2 goals ({type(exc).__name__}: "
                           f"{exc}); it must take batches (arrays [n, goal]) and return [n] rewards") from None
    if rewards.shape != (2,):
        raise OmnigymError(f"--her: the env's compute_reward returned shape {rewards.shape} for a batch of 2 goals; "
                           "it must return one reward per goal")
    return compute_reward


# --- gymnasium-robotics' Fetch tasks ---

def register_own_envs() -> None:
    """omnigym's goal envs, registered when this module is imported (``gym.make`` then knows them)."""
    for own, entry in zip(OWN_IDS, ("omnigym.envs.goal:BitFlipEnv", "omnigym.envs.goal:PointReachEnv")):
        if own not in gym.registry:
            gym.register(own, entry_point=entry)


def register_goal_envs(env_id) -> None:
    """Register omnigym's own goal envs, and gymnasium-robotics' envs when ``env_id`` is one of
    theirs not registered yet (its import registers them; the Fetch fix is used where needed)."""
    register_own_envs()
    if not isinstance(env_id, str) or env_id in gym.registry or not env_id.startswith(ROBOTICS_PREFIXES):
        return
    if importlib.util.find_spec("gymnasium_robotics") is None:
        raise missing_extra("gymnasium-robotics", "robots")
    register_robotics()


def register_robotics() -> None:
    # Its import prints a notice about the Adroit hand envs' rewards to stderr (farama_notifications);
    # omnigym runs none of them, so it is not passed on.
    with contextlib.redirect_stderr(io.StringIO()):
        import gymnasium_robotics
    gym.register_envs(gymnasium_robotics)
    use_fixed_fetch()


def joint_enum_bug() -> bool:
    """Whether gymnasium-robotics' joint helpers refuse a hinge joint. Its ``utils.mujoco_utils``
    checks ``model.jnt_type[i] in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)``;
    ``in`` compares each enum with the numpy integer, which mujoco >= 3.17's enums answer False,
    so every Fetch env fails its constructor with a bare AssertionError (gymnasium-robotics
    1.4.2). Asked of the library itself, on a one-hinge model, so a fixed release is left alone."""
    import mujoco
    from gymnasium_robotics.utils import mujoco_utils

    model = mujoco.MjModel.from_xml_string(
        '<mujoco><worldbody><body><joint name="hinge" type="hinge"/><geom size="0.1"/></body></worldbody></mujoco>')
    try:
        mujoco_utils.get_joint_qpos(model, mujoco.MjData(model), "hinge")
    except AssertionError:
        return True
    return False


def use_fixed_fetch() -> bool:
    """Where ``joint_enum_bug()``: the Fetch ids made from ``envs/fetch.py``'s subclasses, which
    fix the joint helpers on their own instances (gymnasium-robotics' module is not touched).
    Returns whether it did. The ids keep their spec (time limit, kwargs); only the class changes."""
    if not joint_enum_bug():
        return False
    from omnigym.envs.fetch import FIXED

    for env_id, entry_point in FIXED:
        if env_id in gym.registry and gym.registry[env_id].entry_point != entry_point:
            # the registry is gymnasium's table of ids; replacing an entry is what gym.register does
            gym.registry[env_id] = dataclasses.replace(gym.registry[env_id], entry_point=entry_point)
    return True


def available_goal_envs() -> list[str]:
    """The goal env ids that can be made here."""
    register_goal_envs(None)
    ids = list(OWN_IDS)
    if importlib.util.find_spec("gymnasium_robotics") is not None:
        register_robotics()
        ids += [i for i in FETCH_IDS if i in gym.registry]
    return ids


# --- omnigym's own goal envs ---

def sparse_reward(achieved, desired, tolerance: float) -> np.ndarray:
    """0 where ``achieved`` lies within ``tolerance`` of ``desired`` (Euclidean distance), -1
    elsewhere, over batches: the sparse reward of the HER paper and of Fetch."""
    distance = np.linalg.norm(np.asarray(achieved, np.float64) - np.asarray(desired, np.float64), axis=-1)
    return np.where(distance > tolerance, -1.0, 0.0).astype(np.float32)


class BitFlipEnv(gym.Env):
    """The HER paper's bit flipping (Andrychowicz et al., 2017, section 3.1): a state of
    ``n_bits`` bits, action ``i`` flips bit ``i``, and the reward is -1 where the state differs
    from the goal, 0 where it equals it. An episode is ``n_bits`` steps (enough to flip every
    bit) and is truncated, never terminated, like every goal env here; so that a solved state can
    be held to the end, action ``n_bits`` flips nothing (the paper's env ends on success
    instead). Success is the goal held at the episode's end. Without hindsight, the reward of 0
    is all but never seen past n = 15 or so."""

    metadata = {"render_modes": []}

    def __init__(self, n_bits: int = 8):
        bits = gym.spaces.Box(0.0, 1.0, (n_bits,), np.float32)
        self.observation_space = gym.spaces.Dict({k: bits for k in GOAL_KEYS})
        self.action_space = gym.spaces.Discrete(n_bits + 1)  # the last one: flip nothing
        self.n_bits = n_bits

    def _obs(self) -> dict:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.goal = self.state
        while np.array_equal(self.goal, self.state):  # an episode that starts solved teaches nothing
            self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.float32)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        if int(action) < self.n_bits:
            self.state[int(action)] = 1.0 - self.state[int(action)]
        self.steps += 1
        reward = float(self.compute_reward(self.state, self.goal, {}))
        return self._obs(), reward, False, self.steps >= self.n_bits, {"is_success": float(reward == 0.0)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal, 0.5)  # bits: equal or at least 1 apart


class PointReachEnv(gym.Env):
    """A point in the square [-1, 1]^2 moved by up to ``0.2`` per step toward a goal drawn
    uniformly in the same square; reward 0 within ``0.1`` of it, -1 elsewhere; 20 steps an
    episode, truncated. The smallest continuous FetchReach: SAC or TD3 with hindsight solve it
    in a few thousand steps."""

    metadata = {"render_modes": []}
    SPEED, TOLERANCE, STEPS = 0.2, 0.1, 20

    def __init__(self):
        point = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_space = gym.spaces.Dict({k: point for k in GOAL_KEYS})
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _obs(self) -> dict:
        return {"observation": self.position.copy(), "achieved_goal": self.position.copy(),
                "desired_goal": self.goal.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        move = np.clip(np.asarray(action, np.float32), -1.0, 1.0) * self.SPEED
        self.position = np.clip(self.position + move, -1.0, 1.0).astype(np.float32)
        self.steps += 1
        reward = float(self.compute_reward(self.position, self.goal, {}))
        return self._obs(), reward, False, self.steps >= self.STEPS, {"is_success": float(reward == 0.0)}

    def compute_reward(self, achieved_goal, desired_goal, info):
        return sparse_reward(achieved_goal, desired_goal, self.TOLERANCE)


register_own_envs()
