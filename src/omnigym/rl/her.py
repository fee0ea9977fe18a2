"""Hindsight experience replay (Andrychowicz et al., 2017) as a replay strategy of
rl/replay.py: which stored transitions get another goal when a minibatch is drawn, and which
goal they get.

An episode that never reached its goal still reached *something*: the goals it achieved. A
transition relabelled with one of them, and its reward recomputed by the env's
``compute_reward(achieved_goal, new_goal, info)``, is a transition from a task that was
solved, and teaches a goal-conditioned policy as much. Relabelling happens when a minibatch is
drawn, not when transitions are stored (SB3's ``HerReplayBuffer`` does the same): of each
minibatch, the first ``round(batch * k / (k + 1))`` transitions are relabelled, the rest keep
their own goal and reward, so each real transition stands beside ``k`` relabelled ones on
average (the paper's and SB3's ``n_sampled_goal``).

The new goal is the achieved goal (after the step) of a transition of the same episode:

- ``future``: one from this transition on, to the end of the episode (the paper's best);
- ``final``: the episode's last transition;
- ``episode``: any transition of the episode.

An episode still running when a batch is drawn ends, for this purpose, at its newest stored
transition; transitions that left the memory (its ring wrapped) are not drawn as goals.
A transition's ``terminated`` is kept as the env gave it: the goal envs here end episodes by
time only, so no termination depends on the goal that changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from omnigym.config import flag
from omnigym.errors import OmnigymError, require

STRATEGIES = ("future", "final", "episode")


@dataclass
class HindsightFlags:
    """The hindsight replay flags of the off-policy algorithms (SAC, TD3, DQN): a mixin put
    before ``ControlConfig`` in a config's bases, so that its ``check`` runs with theirs."""

    her: bool = False
    """hindsight experience replay: relabel transitions with goals achieved in their episode (goal envs; docs/her.md)"""
    her_strategy: str = "future"
    """which achieved goal replaces the desired one: future (later in the episode), final (the episode's last),
    episode (any of the episode's)"""
    her_k: int = 4
    """relabelled transitions per real one: k/(k+1) of each minibatch is relabelled (SB3's n_sampled_goal)"""

    def check(self) -> None:
        super().check()
        require(self.her_strategy in STRATEGIES,
                f"unknown --her-strategy {self.her_strategy!r}; choose {', '.join(STRATEGIES)}")
        require(self.her_k > 0, f"--her-k must be positive (relabelled transitions per real one), got {self.her_k}")
        require(self.her or (self.her_k, self.her_strategy) == (HindsightFlags.her_k, HindsightFlags.her_strategy),
                "--her-k and --her-strategy are for --her (hindsight replay); add --her, or leave them out")


class HindsightRelabelling:
    def __init__(self, strategy: str, k: int, compute_reward):
        """``compute_reward(achieved_goals [n, g], goals [n, g], info) -> rewards [n]``: the env's."""
        if strategy not in STRATEGIES:
            raise OmnigymError(f"unknown --her-strategy {strategy!r}; choose {', '.join(STRATEGIES)}")
        require(k > 0, f"--her-k must be positive, got {k}")
        self.strategy, self.k, self.compute_reward = strategy, k, compute_reward

    def relabelled(self, batch_size: int) -> int:
        """How many of a minibatch (its first ones) get a new goal."""
        return round(batch_size * self.k / (self.k + 1))

    def goal_sources(self, t: np.ndarray, first: np.ndarray, last: np.ndarray,
                     rng: np.random.Generator) -> np.ndarray:
        """For transitions ``t`` of episodes stored from ``first`` to ``last`` (absolute indices
        in their env's memory, ``first <= t <= last``): the transitions whose achieved goals
        become their goals."""
        if self.strategy == "final":
            return last.copy()
        low = t if self.strategy == "future" else first
        return low + np.floor(rng.random(len(t)) * (last - low + 1)).astype(np.int64)

    def rewards(self, achieved: np.ndarray, goals: np.ndarray) -> np.ndarray:
        """The env's rewards for relabelled goals. Its ``compute_reward`` was probed on a batch of
        2 before the run (envs/goal.py); one that fails, or answers another shape or a NaN, only on
        a real minibatch is stopped here with its name, not as a traceback or a NaN loss later."""
        try:
            rewards = np.asarray(self.compute_reward(achieved, goals, {}), dtype=np.float32)
        except Exception as exc:
            raise OmnigymError(f"--her: the env's compute_reward failed on a minibatch of {len(goals)} relabelled goals "
                               f"({type(exc).__name__}: {exc}); it must take batches (arrays [n, goal]) and return "
                               "[n] rewards") from None
        if rewards.size != len(goals):
            raise OmnigymError(f"--her: the env's compute_reward returned shape {rewards.shape} for a minibatch of "
                               f"{len(goals)} goals; it must return one reward per goal")
        rewards = rewards.reshape(len(goals))
        if not np.isfinite(rewards).all():
            raise OmnigymError(f"--her: the env's compute_reward returned a non-finite reward "
                               f"({rewards[~np.isfinite(rewards)][0]}) for a relabelled goal; it must return finite rewards")
        return rewards


def check_goal_env(cfg, space) -> None:
    """``--her`` on an env without goals: one line saying so, before any other check of its
    observations (a Dict without the three keys would otherwise hear "wrap it in FlattenObservation")."""
    from omnigym.envs.goal import GoalLayout

    if cfg.her:
        require(GoalLayout.of(space) is not None, f"{flag('her')} needs a goal env (Dict observations with observation, "
                                                  f"achieved_goal and desired_goal, and compute_reward); {cfg.env_id} has {space}")


def replay_buffer(cfg, envs, action_shape: tuple, action_dtype, obs_dtype=np.float32, frame_stack: int = 1):
    """The replay memory of an off-policy run: goal envs store observation, achieved and
    desired goal, and ``--her`` relabels them; other envs, their observations as they are.
    Called before the run directory exists: a refusal (``--her`` on an env without goals)
    leaves nothing behind."""
    from omnigym.envs.goal import GoalLayout, goal_reward_function
    from omnigym.rl.replay import ReplayBuffer

    space = envs.single_observation_space
    goals = GoalLayout.of(space)
    relabel = None
    if cfg.her:
        check_goal_env(cfg, space)
        relabel = HindsightRelabelling(cfg.her_strategy, cfg.her_k, goal_reward_function(envs))
    if goals is not None:
        return ReplayBuffer(cfg.buffer_size, (goals.stored_dim,), action_shape, obs_dtype=np.float32,
                            action_dtype=action_dtype, num_envs=cfg.num_envs, goals=goals, relabel=relabel)
    return ReplayBuffer(cfg.buffer_size, space.shape, action_shape, obs_dtype=obs_dtype, action_dtype=action_dtype,
                        num_envs=cfg.num_envs, frame_stack=frame_stack)
