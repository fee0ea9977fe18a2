"""Goal-conditioned envs: Dict observations (``observation``, ``achieved_goal``,
``desired_goal``) and a vectorized ``compute_reward(achieved_goal, desired_goal, info)``, the
contract of gymnasium-robotics' ``GoalEnv`` that hindsight replay (rl/her.py) relabels with.

- ``GoalLayout`` is how such an observation reaches the networks and the replay memory: the
  networks see ``observation ++ desired_goal`` (one flat float32 vector), the replay memory
  stores ``observation ++ achieved_goal ++ desired_goal`` so that a goal can be swapped for
  one achieved later in the episode. ``network_view`` gives any algorithm the space its
  networks see and the function that turns an observation batch into their input (the
  identity for every other env).
- gymnasium-robotics' Fetch tasks (``FetchReach-v4``, ``FetchPush-v4``, ``FetchPickAndPlace-v4``,
  ``FetchSlide-v4``) are registered lazily, as ale-py's games are (envs/vector.py), with a
  compat shim for a bug of gymnasium-robotics 1.4.2 under mujoco >= 3.17 (``joint_enum_bug``).
- omnigym's own goal envs, fast enough for tests and for reading: ``omnigym/BitFlip-v0`` (the
  HER paper's bit flipping, discrete actions, for DQN) and ``omnigym/PointReach-v0`` (a point
  mass steered to a goal in the plane, continuous actions, for SAC and TD3).

None of these envs ends an episode on success: they are truncated by time only (Fetch after
50 steps), so a transition's ``terminated`` never depends on the goal that relabelling changes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from omnigym.errors import OmnigymError, missing_extra

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")
FETCH_IDS = ("FetchReach-v4", "FetchPush-v4", "FetchPickAndPlace-v4", "FetchSlide-v4")
OWN_IDS = ("omnigym/BitFlip-v0", "omnigym/PointReach-v0")
ROBOTICS_PREFIXES = ("Fetch", "HandManipulate", "HandReach", "AdroitHand", "PointMaze", "AntMaze", "FrankaKitchen")
"""ids gymnasium-robotics registers: only these import it (an import of a quarter second)"""


# --- how a goal observation reaches the networks and the replay memory ---

def is_goal_space(space) -> bool:
    """A Dict of the three goal keys, each a 1-D Box (gymnasium-robotics' GoalEnv layout)."""
    return isinstance(space, gym.spaces.Dict) and set(space.spaces) >= set(GOAL_KEYS) and all(
        isinstance(space[k], gym.spaces.Box) and len(space[k].shape) == 1 for k in GOAL_KEYS) and \
        space["achieved_goal"].shape == space["desired_goal"].shape


@dataclass(frozen=True)
class GoalLayout:
    obs_dim: int
    goal_dim: int

    @classmethod
    def of(cls, space) -> "GoalLayout | None":
        """The layout of a goal env's observation space; None for any other space."""
        if not is_goal_space(space):
            return None
        return cls(space["observation"].shape[0], space["desired_goal"].shape[0])

    @property
    def stored_dim(self) -> int:
        return self.obs_dim + 2 * self.goal_dim

    @property
    def network_space(self) -> gym.spaces.Box:
        return gym.spaces.Box(-np.inf, np.inf, (self.obs_dim + self.goal_dim,), np.float32)

    def stored(self, obs: dict) -> np.ndarray:
        """A batch of Dict observations as the replay memory keeps them: ``[n, obs + 2 goal]``."""
        return np.concatenate([np.asarray(obs[k], dtype=np.float32) for k in GOAL_KEYS], -1)

    @staticmethod
    def network_input(obs: dict) -> np.ndarray:
        """A batch of Dict observations as the networks see them: ``[n, obs + goal]``."""
        return np.concatenate([np.asarray(obs[k], dtype=np.float32) for k in ("observation", "desired_goal")], -1)

    def achieved(self, stored: np.ndarray) -> np.ndarray:
        return stored[..., self.obs_dim:self.obs_dim + self.goal_dim]

    def desired(self, stored: np.ndarray) -> np.ndarray:
        return stored[..., self.obs_dim + self.goal_dim:]

    def with_goal(self, stored: np.ndarray, goals: np.ndarray) -> np.ndarray:
        """Stored observations as the networks see them, pursuing ``goals``."""
        return np.concatenate([stored[..., :self.obs_dim], goals], -1)


def network_view(space):
    """``(the space the networks see, obs batch -> network input)``: ``observation ++
    desired_goal`` for a goal env, the space and the observation unchanged otherwise."""
    layout = GoalLayout.of(space)
    return (space, lambda obs: obs) if layout is None else (layout.network_space, layout.network_input)


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
    theirs not registered yet (its import registers them; the shim is applied where needed)."""
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
    apply_joint_enum_shim()


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


def apply_joint_enum_shim() -> bool:
    """Where ``joint_enum_bug()``: replace the four joint helpers of ``gymnasium_robotics.utils.
    mujoco_utils`` (the Fetch, hand and maze envs call them through that module) by MuJoCo's own
    named access, ``data.joint(name).qpos``, which knows each joint type's width. Returns whether
    it patched."""
    from gymnasium_robotics.utils import mujoco_utils

    if getattr(mujoco_utils, "_omnigym_shim", False) or not joint_enum_bug():
        return False

    def set_joint_qpos(model, data, name, value):
        data.joint(name).qpos[:] = value

    def set_joint_qvel(model, data, name, value):
        data.joint(name).qvel[:] = value

    def get_joint_qpos(model, data, name):
        return data.joint(name).qpos.copy()

    def get_joint_qvel(model, data, name):
        return data.joint(name).qvel.copy()

    mujoco_utils._omnigym_replaced = {name: getattr(mujoco_utils, name) for name in
                                      ("set_joint_qpos", "set_joint_qvel", "get_joint_qpos", "get_joint_qvel")}
    mujoco_utils.set_joint_qpos, mujoco_utils.set_joint_qvel = set_joint_qpos, set_joint_qvel
    mujoco_utils.get_joint_qpos, mujoco_utils.get_joint_qvel = get_joint_qpos, get_joint_qvel
    mujoco_utils._omnigym_shim = True
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
