"""``omnigym collect RUN --from-replay``: the replay buffer a run saved, as a dataset's episodes.

D4RL's *medium-replay* is the replay buffer of the run that trained the *medium* policy: every
transition the run stored while learning, from its first random actions on. A run trained with
``--save-buffer`` (sac, td3, dqn) has that buffer in its last checkpoint; it is read back into the
replay seam's ``ReplayBuffer`` (the run's own configuration, the run's env's spaces) and cut into
episodes where the run's episodes ended (``ReplayBuffer.episodes``). An episode that ended without
terminating was truncated by the env's time limit; the run's newest episode, still running when
the run stopped, is kept and marked truncated (its steps are real, its end is where the run
stopped). Episodes of a buffer that wrapped start where its live part does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from omnigym.errors import OmnigymError, a_run, require
from omnigym.evaluation.control import LoadedRun


def replay_episodes(run_dir: str, load_run: Callable[[str, str], LoadedRun]) -> tuple[str, str, list]:
    """``(env_id, algorithm, episodes)`` of the run's saved replay buffer; each episode is
    ``(observations, actions, rewards, terminations, truncations)``, observations in the env's dtype.
    ``load_run``: ``omnigym.runs.load_run``, passed down (see offline/collect.py's ``collect``)."""
    import gymnasium as gym

    from omnigym.offline.online import online_capacity
    from omnigym.rl.replay import ReplayBuffer

    require(Path(run_dir).is_dir(), f"collect --from-replay: {run_dir!r} is not a run directory")
    run = load_run(run_dir, "omnigym collect")
    cfg, saved, algo = run.cfg, run.saved, run.algorithm
    replay = saved["components"].get("replay")
    require(replay is not None, f"collect --from-replay: {run_dir} is {a_run(algo)}, which keeps no replay buffer")
    if replay.get("buffer") is None and getattr(cfg, "dataset", None):
        raise OmnigymError(f"collect --from-replay: {run_dir} is an offline run: its transitions are the dataset "
                           f"{cfg.dataset} itself (to sample its policy instead: omnigym collect {run_dir} --episodes "
                           "N --dataset NAME)")
    require(replay.get("buffer") is not None, f"collect --from-replay: {run_dir} saved no replay buffer (train it "
                                              "with --save-buffer; docs/offline.md)")
    require(isinstance(cfg.env_id, str) and not cfg.env_id.startswith("<"),
            f"collect --from-replay: {run_dir} was trained on a Python object, not an env id omnigym can make again")
    require(not getattr(cfg, "pixels", False) and not getattr(cfg, "her", False),
            f"collect --from-replay: {run_dir} stored pixels or goals; collect writes state datasets")
    env = gym.make(cfg.env_id)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    require(isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1,
            f"collect --from-replay: {cfg.env_id} has {obs_space} observations; collect writes vector ones")
    state = replay["buffer"]
    # an offline run gone online (--resume-online) keeps its online steps in a buffer of its own size, one env
    capacity, num_envs = ((cfg.buffer_size, cfg.num_envs) if hasattr(cfg, "buffer_size") else (online_capacity(cfg), 1))
    buffer = ReplayBuffer(capacity, obs_space.shape, action_space.shape, obs_dtype=state["frames"].dtype,
                          action_dtype=state["actions"].dtype, num_envs=num_envs)
    buffer.load_state_dict(state)
    episodes = []
    for observations, actions, rewards, terminated, _ended in buffer.episodes():
        truncated = np.zeros(len(rewards), dtype=bool)
        truncated[-1] = not terminated[-1]  # a time limit, or where the run stopped (not ended)
        episodes.append((observations.astype(obs_space.dtype), actions.astype(action_space.dtype),
                         rewards.astype(np.float64), terminated, truncated))
    require(episodes, f"collect --from-replay: the replay buffer of {run_dir} is empty")
    return cfg.env_id, algo, episodes
