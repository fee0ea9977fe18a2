"""Finished episodes as gymnasium's RecordEpisodeStatistics reports them."""

from __future__ import annotations

from collections import deque

import numpy as np


class EpisodeStats:
    def __init__(self, print_episodes: bool = False, window: int = 20):
        self.recent = deque(maxlen=window)
        self.recent_successes = deque(maxlen=window)
        """goal envs: whether each of the last ``window`` episodes reached its goal (what docs/her.md reads)"""
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
                self.recent_successes.append(float(info["is_success"][i]))
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

    @property
    def success_recent(self) -> float:
        return float(np.mean(self.recent_successes)) if self.recent_successes else float("nan")

    def shown(self) -> dict:
        """The progress line's figures: a goal env's success rate first (the figure a goal env is
        judged by; its return counts steps short of the goal), then the return."""
        return {**({"success": self.success_recent} if self.goal_env else {}), "ret": self.mean_recent}

    def state_dict(self) -> dict:
        # the episodes not yet drained into a metric line too: a checkpoint between two log lines
        # (SAC, DQN: --log-every and --checkpoint-every differ) must not lose them on resume
        return {"recent": list(self.recent), "maxlen": self.recent.maxlen, "returns": list(self._returns),
                "lengths": list(self._lengths), "successes": list(self._successes), "goal_env": self.goal_env,
                "recent_successes": list(self.recent_successes)}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque(state["recent"], maxlen=state["maxlen"])
        self._returns, self._lengths = list(state.get("returns", [])), list(state.get("lengths", []))
        self._successes, self.goal_env = list(state.get("successes", [])), state.get("goal_env", False)
        self.recent_successes = deque(state.get("recent_successes", []), maxlen=state["maxlen"])


def close_control_run(run, stats: EpisodeStats, plot: bool, global_step: int, stepped: int | None = None) -> dict:
    """Close the run and tell a person where it is and how it ended. ``stepped``: the env steps
    an on-policy run's whole rollouts took, autoresets included (None: the run stepped until it
    had counted ``--total-timesteps``)."""
    plot_path = run.close(plot=plot, metric=("charts/episodic_return", "charts/success_rate") if stats.goal_env
                          else "charts/episodic_return")
    run.say(f"run: {run.dir}", *([f"learning curve: {plot_path}"] if plot_path else []),
            *steps_trained(run.cfg, global_step, stepped), final_line(stats, global_step, run.cfg.num_envs))
    summary = {"run_dir": str(run.dir), "global_step": global_step, "mean_return_last_20": stats.mean_recent}
    if stats.goal_env:
        summary["success_rate_last_20"] = stats.success_recent
    return {**summary, "plot": str(plot_path) if plot_path else None}


def final_line(stats: EpisodeStats, global_step: int, num_envs: int) -> str:
    """The run's last line: a goal env's success rate (what docs/her.md judges it by), else the
    mean return; in words when no episode finished (a mean of none is no number)."""
    if not stats.recent:
        envs = f"{num_envs} envs x {global_step // num_envs:,} steps" if num_envs > 1 else "1 env"
        return (f"no episode finished in {global_step:,} env steps ({envs}), so there is no return to report; "
                "train for more steps (--total-timesteps) to finish one")
    if stats.goal_env and stats.recent_successes:
        return (f"final success rate (last {episodes(len(stats.recent_successes))}): {stats.success_recent:.2f}  "
                f"(mean return {stats.mean_recent:.2f})")
    return f"final mean return (last {episodes(len(stats.recent))}): {stats.mean_recent:.2f}"


def episodes(n: int) -> str:
    return f"{n} episode{'s' * (n != 1)}"


def steps_trained(cfg, global_step: int, stepped: int | None) -> list[str]:
    """Why the count of env steps trained differs from ``--total-timesteps``, when it does: an
    on-policy run steps whole rollouts (``whole_rollouts``), and the step after
    an episode ends is the vector env's autoreset, which is not counted; an off-policy run's envs
    step together, so its count can pass the total on the last step."""
    asked = cfg.total_timesteps
    if global_step == asked:
        return []
    start = f"trained {global_step:,} env steps for --total-timesteps {asked:,}: "
    if stepped is None:
        if 0 < global_step - asked < cfg.num_envs:
            return [start + f"the {cfg.num_envs} envs step together, and the count passed it on the last step"]
        return []
    parts = []
    if stepped != asked:
        rollouts = stepped // (cfg.num_envs * cfg.num_steps)
        parts.append(f"{rollouts:,} whole rollout{'s' * (rollouts != 1)} of {cfg.num_envs} envs x {cfg.num_steps} "
                     f"steps stepped {stepped:,}")
    if stepped > global_step:
        parts.append(f"{stepped - global_step:,} of the {stepped:,} stepped were autoresets (the step after an "
                     "episode ends starts the next one: no transition, not counted)")
    return [start + ", and ".join(parts)] if parts else []
