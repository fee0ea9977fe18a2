"""Small envs the tests train on, named as ``toy_envs:Name`` the way a user names their own.

Each has a known best return, so a test can tell a policy that learned from one that did
not, and so can tell an ``eval`` that reproduces training from one that does not.
"""

import gymnasium as gym
import numpy as np

EPISODE = 20


class _SignEnv(gym.Env):
    """The observation is ``offset + s`` with ``s`` = -1 or +1 drawn each step; the large
    offset makes the sign unreadable without observation normalization."""

    def __init__(self, offset: float = 1000.0):
        self.offset = offset
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def _obs(self):
        return np.array([self.offset + self.s], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.s = 0, float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action):
        reward = self.reward(action)
        self.t += 1
        self.s = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), reward, False, self.t >= EPISODE, {}


class SignEnv(_SignEnv):
    """Continuous: reward ``-|a - s|`` with ``a`` in [-1, 1]. The env does not clip, so an
    action beyond the box costs more: the best policy pushes its mean past +-1 and relies
    on the clipping that training (and eval) apply. Best return 0."""

    def __init__(self, offset: float = 1000.0):
        super().__init__(offset)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reward(self, action):
        return -abs(float(np.asarray(action).reshape(-1)[0]) - self.s)


class SignChoiceEnv(_SignEnv):
    """Discrete: reward 1 for action 1 when ``s`` > 0 and action 0 otherwise. Best return 20."""

    def __init__(self, offset: float = 1000.0):
        super().__init__(offset)
        self.action_space = gym.spaces.Discrete(2)

    def reward(self, action):
        return float(int(action) == int(self.s > 0))


class SidePixelEnv(gym.Env):
    """Pixels: an 84x84 frame with a bright bar on the left or the right; reward 1 for
    naming the side (action 0 left, 1 right). Best return 20."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 255, (1, 84, 84), np.uint8)
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        frame = np.zeros((1, 84, 84), dtype=np.uint8)
        columns = slice(8, 30) if self.side == 0 else slice(54, 76)
        frame[0, 20:64, columns] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.side = 0, int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.side)
        self.t += 1
        self.side = int(self.np_random.integers(2))
        return self._obs(), reward, False, self.t >= EPISODE, {}


class MaskedChoiceEnv(gym.Env):
    """Invalid actions: each step 2 of 6 actions are valid (given in ``info["action_mask"]``),
    one of them the target, which the observation names; reward 1 for the target, 0 for the
    other valid action, and an invalid action ends the episode with -10. Best return 20; a
    policy that takes valid actions at random gets 10."""

    n = 6

    def __init__(self):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 * self.n,), np.float32)
        self.action_space = gym.spaces.Discrete(self.n)
        self.invalid_taken = 0

    def _draw(self):
        self.target, self.other = (int(a) for a in self.np_random.choice(self.n, 2, replace=False))
        mask = np.zeros(self.n, dtype=bool)
        mask[[self.target, self.other]] = True
        obs = np.zeros(2 * self.n, dtype=np.float32)
        obs[self.target], obs[self.n:] = 1.0, mask
        return obs, {"action_mask": mask}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._draw()

    def step(self, action):
        action, self.t = int(action), self.t + 1
        if action not in (self.target, self.other):
            self.invalid_taken += 1
            obs, info = self._draw()
            return obs, -10.0, True, False, info
        reward = float(action == self.target)
        obs, info = self._draw()
        return obs, reward, False, self.t >= EPISODE, info


class MaskMethodEnv(MaskedChoiceEnv):
    """The same task with the mask from an ``action_masks()`` method (sb3-contrib's name)."""

    def _draw(self):
        obs, info = super()._draw()
        self._mask = info.pop("action_mask")
        return obs, info

    def action_masks(self):
        return self._mask


class AllInvalidMaskEnv(MaskedChoiceEnv):
    """A broken mask: on the third step no action is valid."""

    def _draw(self):
        obs, info = super()._draw()
        if getattr(self, "t", 0) >= 2:
            info["action_mask"] = np.zeros(self.n, dtype=bool)
        return obs, info


class ListMaskEnv(MaskedChoiceEnv):
    """The mask as a Python list in the info: it was refused as "shape ()" (the vector env holds
    one list per env as an object array), where the same list from action_masks() trained."""

    def _draw(self):
        obs, info = super()._draw()
        info["action_mask"] = [bool(x) for x in info["action_mask"]]
        return obs, info


class FractionMaskEnv(MaskedChoiceEnv):
    """A mask of probabilities, not booleans: 0.5 was read as allowed."""

    def _draw(self):
        obs, info = super()._draw()
        info["action_mask"] = info["action_mask"] * 0.5
        return obs, info


class NaNEnv(gym.Env):
    """Returns a NaN observation on its third step (a broken env)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.full(2, np.nan if self.t == 3 else 0.0, np.float32)
        return obs, 1.0, False, self.t >= EPISODE, {}


gym.register("SignChoice-v0", entry_point=SignChoiceEnv, max_episode_steps=EPISODE)


class InterruptEnv(NaNEnv):
    """A Ctrl-C arrives on the 90th step of the process (as KeyboardInterrupt)."""

    steps = 0

    def step(self, action):
        InterruptEnv.steps += 1
        if InterruptEnv.steps % 90 == 0:
            raise KeyboardInterrupt
        self.t += 1
        return np.zeros(2, np.float32), 1.0, False, self.t >= EPISODE, {}


class _SpaceEnv(gym.Env):
    """A correct env whose observation space is ``observation_space``, with zero observations."""

    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._zero(), {}

    def step(self, action):
        return self._zero(), 0.0, False, True, {}


class DictObsEnv(_SpaceEnv):
    """A Dict observation space, which the networks do not take."""

    observation_space = gym.spaces.Dict({"x": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def _zero(self):
        return {"x": np.zeros(2, np.float32)}


class ImageLastEnv(_SpaceEnv):
    """Channels-last images (H x W x C), which the CNN does not take."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)

    def _zero(self):
        return np.zeros((84, 84, 3), np.uint8)


class OldGymEnv(NaNEnv):
    """The old gym API: reset returns the observation alone."""

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32)


class EndlessEnv(NaNEnv):
    """Never ends an episode (a class given with no time limit)."""

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


class HangingEnv(NaNEnv):
    """Hangs (sleeps 10 minutes) on the 100th step of its process: a stuck simulator."""

    steps = 0

    def step(self, action):
        HangingEnv.steps += 1
        if HangingEnv.steps == 100:
            import time

            time.sleep(600)
        self.t += 1
        return np.zeros(2, np.float32), 1.0, False, self.t >= EPISODE, {}


class TupleObsEnv(_SpaceEnv):
    """A Tuple observation space: the check's message (np.shape of its observation) raised, and was
    reported as the env raising."""

    observation_space = gym.spaces.Tuple((gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3)))

    def _zero(self):
        return np.zeros(2, np.float32), 0


class InfoListEnv(NaNEnv):
    """step returns a list where the info dict goes."""

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, []


class StepReturnsEnv(NaNEnv):
    """step returns ``STEP_RETURNS``' values where gymnasium wants a real reward and bool flags:
    an array ``terminated`` was a traceback in the vector env, ``None`` an episode that never
    ended (it reads False), a complex reward a traceback."""

    STEP_RETURNS: dict = {}

    def step(self, action):
        values = {"reward": 1.0, "terminated": False, "truncated": False, **self.STEP_RETURNS}
        return np.zeros(2, np.float32), values["reward"], values["terminated"], values["truncated"], {}


class ArrayTerminatedEnv(StepReturnsEnv):
    STEP_RETURNS = {"terminated": np.array([False, False])}


class NoneTruncatedEnv(StepReturnsEnv):
    STEP_RETURNS = {"truncated": None}


class StringTerminatedEnv(StepReturnsEnv):
    STEP_RETURNS = {"terminated": "yes"}


class ComplexRewardEnv(StepReturnsEnv):
    STEP_RETURNS = {"reward": complex(1.0, 1.0)}


class IntFlagsEnv(StepReturnsEnv):
    """0/1 integers and numpy scalars for the flags and reward: allowed, as gymnasium's vector env takes them."""

    STEP_RETURNS = {"reward": np.int64(1), "terminated": np.bool_(False), "truncated": 0}


class CloseRaisesEnv(NaNEnv):
    """close raises: it escaped the check, a traceback."""

    def close(self):
        raise RuntimeError("close boom")


class SizedEnv(NaNEnv):
    """Needs an argument: made without --env-kwargs, the check refused an env the run could make."""

    def __init__(self, size):
        self.size = size
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (size,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(self.size, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(self.size, np.float32), 1.0, False, self.t >= EPISODE, {}


class RaisesLateEnv(NaNEnv):
    """Its own code raises on its 100th step (a bug in a user's env, found after the run's first checkpoint)."""

    steps = 0

    def step(self, action):
        RaisesLateEnv.steps += 1
        if RaisesLateEnv.steps >= 100:
            raise RuntimeError("late boom")
        self.t += 1
        return np.zeros(2, np.float32), 1.0, False, self.t >= EPISODE, {}
