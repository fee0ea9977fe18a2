"""Finished episodes as gymnasium's RecordEpisodeStatistics reports them."""

from __future__ import annotations

from collections import deque

import numpy as np


class EpisodeStats:
    def __init__(self, print_episodes: bool = False, window: int = 20):
        self.recent = deque(maxlen=window)
        self.print_episodes = print_episodes
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._successes: list[float] = []
        self.goal_env = False  # an episode ended with info["is_success"]: the curve shows the success rate too

    def add(self, info: dict, global_step: int) -> None:
        if "episode" not in info:
            return
        for i in np.flatnonzero(info["_episode"]):
            self._record(float(info["episode"]["r"][i]), int(info["episode"]["l"][i]), global_step)
            if "is_success" in info:  # goal envs: whether the episode's last step reached the goal
                self._successes.append(float(info["is_success"][i]))
                self.goal_env = True

    def _record(self, r: float, length: int, global_step: int) -> None:
        self.recent.append(r)
        self._returns.append(r)
        self._lengths.append(length)
        if self.print_episodes:
            print(f"global_step={global_step}, episodic_return={r}", flush=True)

    def take(self) -> list[tuple[float, int]]:
        """The (return, length) of each episode finished since the last drain or take, removed
        (a rollout worker sends them to the learner)."""
        episodes = list(zip(self._returns, self._lengths))
        self._returns, self._lengths, self._successes = [], [], []
        return episodes

    def add_episodes(self, episodes: list[tuple[float, int]], global_step: int) -> None:
        """Episodes another process finished (``take``'s output)."""
        for r, length in episodes:
            self._record(r, length, global_step)

    def drain(self) -> dict:
        """Metrics of the episodes finished since the last drain."""
        if not self._returns:
            return {}
        out = {"charts/episodic_return": float(np.mean(self._returns)),
               "charts/episodic_length": float(np.mean(self._lengths)),
               "charts/episodes": len(self._returns),
               "charts/return_last_20": self.mean_recent}
        if self._successes:
            out["charts/success_rate"] = float(np.mean(self._successes))
        self._returns, self._lengths, self._successes = [], [], []
        return out

    @property
    def mean_recent(self) -> float:
        return float(np.mean(self.recent)) if self.recent else float("nan")

    def state_dict(self) -> dict:
        # the episodes not yet drained into a metric line too: a checkpoint between two log lines
        # (SAC, DQN: --log-every and --checkpoint-every differ) must not lose them on resume
        return {"recent": list(self.recent), "maxlen": self.recent.maxlen, "returns": list(self._returns),
                "lengths": list(self._lengths), "successes": list(self._successes), "goal_env": self.goal_env}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque(state["recent"], maxlen=state["maxlen"])
        self._returns, self._lengths = list(state.get("returns", [])), list(state.get("lengths", []))
        self._successes, self.goal_env = list(state.get("successes", [])), state.get("goal_env", False)


def close_control_run(run, stats: EpisodeStats, plot: bool, global_step: int) -> dict:
    """Close the run and tell a person where it is and how it ended."""
    plot_path = run.close(plot=plot, metric=("charts/episodic_return", "charts/success_rate") if stats.goal_env
                          else "charts/episodic_return")
    run.say(f"run: {run.dir}", *([f"learning curve: {plot_path}"] if plot_path else []),
            f"final mean return (last {len(stats.recent)} episodes): {stats.mean_recent:.2f}")
    return {"run_dir": str(run.dir), "global_step": global_step, "mean_return_last_20": stats.mean_recent,
            "plot": str(plot_path) if plot_path else None}
