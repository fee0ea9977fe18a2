"""Replay memory for off-policy algorithms (DQN, SAC, TD3) that stores each frame once.

A transition's next observation is, most of the time, the following transition's
observation; and with stacked frames (Atari's 4 x 84 x 84) an observation shares all but
its newest frame with the one before. Storing ``obs`` and ``next_obs`` whole would keep
each 84 x 84 frame eight times; here it is kept once:

- Each env has its own ring of *frames* (a frame is one slice of the stack, or the whole
  observation when ``frame_stack`` is 1) and its own ring of transitions. A transition
  holds the absolute index of its observation's newest frame and of its next
  observation's newest frame; an observation is the ``frame_stack`` frames ending there.
- ``add`` pushes one frame per env step: the newest slice of ``next_obs``. Only when an
  observation does not continue the env's previous ``next_obs`` (the first step of an
  episode) are its frames pushed whole. Both are decided by comparing arrays, so what
  ``sample`` rebuilds is bit for bit what was added, whatever the env.
- When the frame ring wraps, transitions whose frames were overwritten leave the memory
  with the oldest ones (the frame ring has room for a quarter more frames than
  transitions, so with episodes of more than a few steps this never comes first).

Only ``terminated`` is stored: a truncated transition still bootstraps from its next
observation, which is the episode's true final observation.

Goal envs (envs/goal.py: Dict observations) store ``observation ++ achieved_goal ++
desired_goal`` as one vector and are sampled as the networks see them, ``observation ++
goal``. Their transitions also know their episode (its first transition, and its last once it
has ended: ``truncated`` or ``terminated``), so that a ``relabel`` strategy (rl/her.py,
hindsight replay) can swap a sampled transition's goal for one achieved in its episode, with the
reward the env's ``compute_reward`` gives for it.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch

from omnigym.errors import OmnigymError


class ReplayBuffer:
    def __init__(self, capacity: int, obs_shape: tuple, action_shape: tuple, obs_dtype=np.float32,
                 action_dtype=np.int64, num_envs: int = 1, frame_stack: int = 1, goals=None, relabel=None):
        """``frame_stack`` > 1: observations are stacks along their first axis (Atari's
        ``frame_stack`` frames), and each frame is stored once. ``goals``: a goal env's
        ``GoalLayout`` (observations are its Dicts, ``obs_shape`` its stored size); ``relabel``:
        a ``HindsightRelabelling`` that gives sampled transitions achieved goals."""
        obs_shape = tuple(obs_shape)
        if frame_stack > 1 and (not obs_shape or obs_shape[0] != frame_stack):
            raise ValueError(f"frame_stack {frame_stack} needs observations stacked on their first axis, got {obs_shape}")
        self.capacity, self.num_envs, self.stack, self.obs_shape = capacity, num_envs, frame_stack, obs_shape
        frame_shape = obs_shape[1:] if frame_stack > 1 else obs_shape
        self.env_capacity = math.ceil(capacity / num_envs)
        self.frame_capacity = self.env_capacity + self.env_capacity // 4 + 2 * frame_stack + 2
        try:
            self.frames = np.zeros((num_envs, self.frame_capacity, *frame_shape), dtype=obs_dtype)
        except MemoryError:  # more than the machine can map, even unwritten: numpy's traceback
            size = num_envs * self.frame_capacity * math.prod(frame_shape) * np.dtype(obs_dtype).itemsize
            raise OmnigymError(f"--buffer-size {capacity:,}: its observations alone ({size / 2**30:.1f} GiB) cannot be "
                               "allocated on this machine; give a smaller --buffer-size") from None
        self.frames_pushed = np.zeros(num_envs, dtype=np.int64)
        self.obs_frame = np.zeros((num_envs, self.env_capacity), dtype=np.int64)   # absolute frame indices
        self.next_frame = np.zeros((num_envs, self.env_capacity), dtype=np.int64)
        self.actions = np.zeros((num_envs, self.env_capacity, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros((num_envs, self.env_capacity), dtype=np.float32)
        self.terminated = np.zeros((num_envs, self.env_capacity), dtype=np.float32)
        self.added = np.zeros(num_envs, dtype=np.int64)   # transitions ever added, per env
        self.oldest = np.zeros(num_envs, dtype=np.int64)  # absolute index of the oldest live one
        self.last_next_obs = np.zeros((num_envs, *obs_shape), dtype=obs_dtype)
        self.has_last = np.zeros(num_envs, dtype=bool)
        self.goals, self.relabel = goals, relabel
        self.warned_termination = False
        if goals is not None:  # each transition's episode, as absolute transition indices of its env
            self.episode_first = np.zeros((num_envs, self.env_capacity), dtype=np.int64)
            self.episode_last = np.full((num_envs, self.env_capacity), -1, dtype=np.int64)  # -1: still running
            self.current_first = np.zeros(num_envs, dtype=np.int64)
            self.episode_over = np.ones(num_envs, dtype=bool)  # the env's next transition starts an episode

    def __len__(self) -> int:
        return int((self.added - self.oldest).sum())

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self._state_names())

    def _push(self, envs: np.ndarray, frames: np.ndarray) -> None:
        """Push ``frames[i]`` (one frame, or ``[k, *frame]``) onto the ring of env ``envs[i]``."""
        slots = self.frames_pushed[envs] % self.frame_capacity
        self.frames[envs, slots] = frames
        self.frames_pushed[envs] += 1

    def add(self, obs, actions, rewards, next_obs, terminated, valid=None, truncated=None) -> None:
        """Add one vector step (row ``i`` from env ``i``); ``valid`` masks out autoreset steps.
        ``truncated`` (with ``terminated``) ends goal envs' episodes for hindsight relabelling."""
        envs = np.arange(len(rewards)) if valid is None else np.flatnonzero(valid)
        if len(envs) == 0:
            return
        if self.goals is not None:
            obs, next_obs = self.goals.stored(obs), self.goals.stored(next_obs)
        # as stored: a float64 env's next observation, kept as float32, must still match the next obs
        obs, next_obs = (np.asarray(x, dtype=self.frames.dtype)[envs] for x in (obs, next_obs))
        axes = tuple(range(1, obs.ndim))
        continues = self.has_last[envs] & np.all(obs == self.last_next_obs[envs], axis=axes)
        for i in np.flatnonzero(~continues):  # an episode's first step: its observation's frames, whole
            for frame in (obs[i] if self.stack > 1 else obs[i][None]):
                self._push(envs[i:i + 1], frame[None])
        obs_frame = self.frames_pushed[envs] - 1
        if self.stack > 1:
            shifted = np.all(next_obs[:, :-1] == obs[:, 1:], axis=axes)
            for i in np.flatnonzero(~shifted):  # not a frame stack after all: all of next_obs
                for frame in next_obs[i, :-1]:
                    self._push(envs[i:i + 1], frame[None])
            self._push(envs, next_obs[:, -1])
        else:
            self._push(envs, next_obs)
        rows = self.added[envs] % self.env_capacity
        self.obs_frame[envs, rows], self.next_frame[envs, rows] = obs_frame, self.frames_pushed[envs] - 1
        self.actions[envs, rows] = np.asarray(actions)[envs]
        self.rewards[envs, rows] = np.asarray(rewards)[envs]
        self.terminated[envs, rows] = np.asarray(terminated)[envs]
        if self.relabel is not None and not self.warned_termination and np.asarray(terminated)[envs].any():
            self.warned_termination = True  # once a process: a relabelled transition keeps its terminated
            print("omnigym: warning: --her: the env terminated an episode; a relabelled transition keeps its "
                  "terminated, which is wrong where termination depends on the goal (stopping on success): end "
                  "goal-env episodes by time only (truncated), as gymnasium-robotics' do (docs/her.md)", file=sys.stderr)
        if self.goals is not None:
            self._episodes_of(envs, rows, np.asarray(terminated)[envs] |
                              (False if truncated is None else np.asarray(truncated)[envs]))
        self.added[envs] += 1
        self.last_next_obs[envs], self.has_last[envs] = next_obs, True
        self._evict(envs)
        if self.goals is not None:  # an episode that ended: its live transitions learn where it ends
            for env in envs[self.episode_over[envs]]:
                last = self.added[env] - 1
                live = np.arange(max(self.current_first[env], self.oldest[env]), last + 1) % self.env_capacity
                self.episode_last[env, live] = last

    def add_episode(self, observations, actions, rewards, terminated) -> None:
        """Add a whole logged episode at once (offline datasets: ``observations`` has one row more
        than the episode has steps, as Minari stores it), as ``add`` would store it step by step:
        its frames once each, its transitions in order. One env, no frame stack, no goals."""
        if self.num_envs != 1 or self.stack != 1 or self.goals is not None:
            raise ValueError("add_episode takes plain vector episodes into a one-env buffer")
        steps = len(rewards)
        if steps == 0:
            return
        if steps + 1 > self.frame_capacity:
            raise ValueError(f"an episode of {steps} steps does not fit a buffer of {self.capacity} transitions")
        first = self.frames_pushed[0]  # the absolute index of the episode's first observation's frame
        self.frames[0, (first + np.arange(steps + 1)) % self.frame_capacity] = observations
        self.frames_pushed[0] += steps + 1
        rows = (self.added[0] + np.arange(steps)) % self.env_capacity
        self.obs_frame[0, rows], self.next_frame[0, rows] = first + np.arange(steps), first + 1 + np.arange(steps)
        self.actions[0, rows], self.rewards[0, rows], self.terminated[0, rows] = actions, rewards, terminated
        self.added[0] += steps
        self.last_next_obs[0], self.has_last[0] = observations[-1], True
        self._evict(np.zeros(1, dtype=np.int64))

    def episodes(self):
        """The live transitions as episodes, env by env, oldest first: ``(observations, actions,
        rewards, terminated, ended)`` with one observation more than steps (as ``add_episode``
        takes them). An episode starts where a transition's observation is not the one before's
        next observation; ``ended`` is False only for an env's
        newest episode when it had not terminated (it may still have been running). The oldest
        episode of a wrapped buffer starts where its live part does. Plain vector observations only."""
        if self.stack != 1 or self.goals is not None:
            raise ValueError("episodes reads plain vector observations (no frame stacks, no goal envs)")
        for env in range(self.num_envs):
            rows = np.arange(self.oldest[env], self.added[env]) % self.env_capacity
            if len(rows) == 0:
                continue
            obs_frame, next_frame = self.obs_frame[env, rows], self.next_frame[env, rows]
            # by value: a buffer may hold a continuing observation twice (float64 envs before ``add`` cast them)
            follows = np.all(self.frames[env, obs_frame[1:] % self.frame_capacity] ==
                             self.frames[env, next_frame[:-1] % self.frame_capacity], axis=1)
            starts = np.flatnonzero(np.r_[True, ~follows])
            for start, end in zip(starts, np.r_[starts[1:], len(rows)]):
                frames = np.r_[obs_frame[start], next_frame[start:end]] % self.frame_capacity
                terminated = self.terminated[env, rows[start:end]].astype(bool)
                yield (self.frames[env, frames], self.actions[env, rows[start:end]], self.rewards[env, rows[start:end]],
                       terminated, end < len(rows) or bool(terminated[-1]))

    def _episodes_of(self, envs: np.ndarray, rows: np.ndarray, ended: np.ndarray) -> None:
        starts = self.episode_over[envs]
        self.current_first[envs[starts]] = self.added[envs[starts]]
        self.episode_first[envs, rows], self.episode_last[envs, rows] = self.current_first[envs], -1
        self.episode_over[envs] = ended.astype(bool)

    def _evict(self, envs: np.ndarray) -> None:
        """Drop transitions past the transition ring's size or whose oldest frame was overwritten."""
        self.oldest[envs] = np.maximum(self.oldest[envs], self.added[envs] - self.env_capacity)
        live = self.oldest[envs] < self.added[envs]
        oldest_frame = self.obs_frame[envs, self.oldest[envs] % self.env_capacity] - (self.stack - 1)
        for env in envs[live & (oldest_frame < self.frames_pushed[envs] - self.frame_capacity)]:
            first_kept_frame = self.frames_pushed[env] - self.frame_capacity
            while self.oldest[env] < self.added[env] and \
                    self.obs_frame[env, self.oldest[env] % self.env_capacity] - (self.stack - 1) < first_kept_frame:
                self.oldest[env] += 1

    def _observations(self, envs: np.ndarray, newest: np.ndarray) -> np.ndarray:
        if self.stack == 1:  # one frame is the observation: a third of a CartPole minibatch's draw is spared
            return self.frames[envs, newest % self.frame_capacity]
        offsets = np.arange(-(self.stack - 1), 1)
        slots = (newest[:, None] + offsets) % self.frame_capacity
        return self.frames[envs[:, None], slots].reshape(len(envs), *self.obs_shape)

    def sample(self, batch_size: int, rng: np.random.Generator, with_index: bool = False) -> dict[str, torch.Tensor]:
        """Transitions drawn uniformly from all live ones (goal envs: the first of them
        relabelled, with ``relabel``; ``relabelled`` says which). ``with_index`` adds each one's
        absolute index in its env's memory (``index``: the order it was added in, from 0), for
        per-transition values kept beside the buffer (Cal-QL's returns-to-go)."""
        sizes = self.added - self.oldest
        ends = np.cumsum(sizes)
        draw = rng.integers(0, ends[-1], size=batch_size)
        if self.num_envs == 1:  # the same draw, without the search for each one's env
            envs, index = np.zeros(batch_size, dtype=np.int64), self.oldest[0] + draw
        else:
            envs = np.searchsorted(ends, draw, side="right")
            index = self.oldest[envs] + draw - (ends[envs] - sizes[envs])  # absolute, in the env's own memory
        rows = index % self.env_capacity
        obs = self._observations(envs, self.obs_frame[envs, rows])
        next_obs = self._observations(envs, self.next_frame[envs, rows])
        rewards = self.rewards[envs, rows]
        batch = {}
        if self.goals is not None:
            goals = self.goals.desired(obs).copy()
            relabelled = np.zeros(batch_size, dtype=bool)
            if self.relabel is not None:
                n = self.relabel.relabelled(batch_size)
                goals[:n], rewards[:n] = self._hindsight(envs[:n], index[:n], next_obs[:n], rng)
                relabelled[:n] = True
            obs, next_obs = self.goals.with_goal(obs, goals), self.goals.with_goal(next_obs, goals)
            batch["relabelled"] = torch.from_numpy(relabelled)
        if with_index:
            batch["index"] = torch.from_numpy(index)
        return {
            "obs": torch.from_numpy(obs),
            "actions": torch.from_numpy(self.actions[envs, rows]),
            "rewards": torch.from_numpy(rewards),
            "next_obs": torch.from_numpy(next_obs),
            "terminated": torch.from_numpy(self.terminated[envs, rows]),
            **batch,
        }

    def _hindsight(self, envs: np.ndarray, index: np.ndarray, next_obs: np.ndarray, rng: np.random.Generator):
        """New goals for transitions ``index`` of ``envs`` (goals achieved in their episodes, as
        the strategy picks them) and the rewards the env gives for them."""
        rows = index % self.env_capacity
        last = self.episode_last[envs, rows]
        last = np.where(last < 0, self.added[envs] - 1, last)  # a running episode ends at its newest transition
        first = np.maximum(self.episode_first[envs, rows], self.oldest[envs])
        sources = self.relabel.goal_sources(index, first, last, rng) % self.env_capacity
        goals = self.goals.achieved(self._observations(envs, self.next_frame[envs, sources]))
        return goals, self.relabel.rewards(self.goals.achieved(next_obs), goals)

    STATE = ("frames", "frames_pushed", "obs_frame", "next_frame", "actions", "rewards", "terminated", "added",
             "oldest", "last_next_obs", "has_last")
    GOAL_STATE = ("episode_first", "episode_last", "current_first", "episode_over")

    def _state_names(self) -> tuple[str, ...]:
        return self.STATE + (self.GOAL_STATE if self.goals is not None else ())

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._state_names()}

    def load_state_dict(self, state: dict) -> None:
        for k in self._state_names():
            setattr(self, k, state[k])


class Replay:
    """The replay buffer and the run's own random stream (exploration, replay indices), as a
    checkpoint sees them: the buffer only with ``--save-buffer``. ``restored`` says whether a
    resumed run got its buffer back; without it, the run refills it before learning again."""

    def __init__(self, buffer: ReplayBuffer, seed: int, save_buffer: bool):
        self.buffer, self.rng, self.save_buffer = buffer, np.random.default_rng(seed), save_buffer
        self.restored = False

    def learning_starts(self, learning_starts: int, global_step: int) -> int:
        """The step after which updates (re)start: ``learning_starts`` more steps after a resume
        that did not get its buffer back (said in a note: the run then differs from one never
        stopped, which docs/tracking.md promises only with the buffer saved)."""
        if global_step == 0 or self.restored:
            return learning_starts
        print(f"omnigym: note: the checkpoint holds no replay buffer (--save-buffer was off), so the resumed run "
              f"fills it again for {learning_starts:,} steps before it updates, and will not repeat an uninterrupted "
              "run's numbers; give --save-buffer to a new run to resume exactly", file=sys.stderr, flush=True)
        return global_step + learning_starts

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "buffer": self.buffer.state_dict() if self.save_buffer else None}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        if state["buffer"] is not None:
            self.buffer.load_state_dict(state["buffer"])
            self.restored = True
