"""A finished control run, found by its algorithm: ``load_policy``, ``evaluate_run``,
``evaluate_tracking`` and ``collect`` from a run directory.

A run directory names its algorithm in ``config.json``; turning it back into a policy needs
that algorithm's config class and ``load_policy``, which the registry (``omnigym.algos``)
finds by name. This module is that lookup (``load_run``), and it sits in the commands layer
beside ``export.py``: ``evaluation/`` and ``offline/`` sit below the algorithms, because the
trainers use them, so they take what ``load_run`` returns (a ``LoadedRun``) or, where a command
loads several runs after checking its flags (``omnigym collect``), ``load_run`` itself.
"""

from __future__ import annotations

import os

from omnigym.algos import check_foreign_settings, config_class, get_algorithm
from omnigym.config import config_from_dict, unknown_settings
from omnigym.errors import OmnigymError
from omnigym.evaluation.control import LoadedRun, RunPolicy, check_episodes, play_episodes
from omnigym.track.checkpoint import Checkpointer
from omnigym.track.files import CONFIG_NAME, load_config_dict


def load_run(run_dir: str | os.PathLike, command: str = "omnigym eval", check=None) -> LoadedRun:
    """A finished (or checkpointed) control run: its algorithm's module, its config and its last
    checkpoint; ``command`` names the caller in the line that refuses a run it cannot play;
    ``check(cfg)``, when given, refuses what the caller cannot do before the checkpoint is read."""
    run_dir = str(run_dir)
    values = load_config_dict(run_dir)
    module = get_algorithm(values.get("algo", "?"))
    if not hasattr(module, "load_policy"):
        raise OmnigymError(f"{command} does not support {values['algo']} runs; their eval metrics are in metrics.jsonl")
    source = os.path.join(run_dir, CONFIG_NAME)
    check_foreign_settings(values["algo"], unknown_settings(config_class(module), values), source)
    cfg = config_from_dict(config_class(module), values, source)
    if check is not None:
        check(cfg)
    return LoadedRun(run_dir, module, cfg, Checkpointer(run_dir).load())


def load_policy(run_dir: str | os.PathLike, greedy: bool = True, env=None) -> RunPolicy:
    """``policy = load_policy("runs/X"); action = policy(obs)``: the run's last checkpoint as a
    callable (``RunPolicy``). ``greedy=False`` samples where the algorithm has a stochastic
    policy (PPO, SAC); ``env``: the env to take the spaces from, for a run trained on a Python
    object its config.json cannot name."""
    return RunPolicy(load_run(run_dir, "load_policy"), greedy=greedy, env=env)


def evaluate_run(run_dir: str | os.PathLike, episodes: int = 10, greedy: bool = False, seed: int = 12345, env=None,
                 video_dir: str | None = None, successes: list | None = None,
                 unfinished: list | None = None) -> list[float]:
    """``omnigym eval``: returns of ``episodes`` episodes of the run's env (the arguments:
    ``evaluation.control.play_episodes``). The flags are checked before the run is loaded.
    ``unfinished``: a list that gets a line where the checkpoint is short of the run's budget."""
    from omnigym.track.resume import budget_reached

    check_episodes(episodes, seed)
    run = load_run(run_dir)
    if unfinished is not None and getattr(run.cfg, "BUDGET", None):
        counter, done, goal = budget_reached(run.cfg, run.saved["counters"])
        if done < goal:  # a stopped run's policy is not the finished one
            unfinished.append(f"the run has not finished: its last checkpoint is at {counter} {done:,} of {goal:,}")
    return play_episodes(run, episodes, greedy=greedy, seed=seed, env=env, video_dir=video_dir, successes=successes)


def evaluate_tracking(run_dir: str | os.PathLike, episodes: int = 10, randomize: bool = False,
                      command: tuple[float, float, float] = (0.5, 0.0, 0.0), greedy: bool = False,
                      seed: int = 12345):
    """``omnigym eval RUN --randomize/--command``: a locomotion run's ``TrackingReport``
    (``evaluation.locomotion.tracking_report``)."""
    from omnigym.evaluation.locomotion import check_tracking, tracking_report

    check_episodes(episodes, seed)
    run = load_run(run_dir, check=lambda cfg: check_tracking(cfg, str(run_dir), randomize))
    return tracking_report(run, episodes, randomize=randomize, command=command, greedy=greedy, seed=seed)


def collect(sources: list[str], episodes: int | None, dataset_id: str, **settings) -> dict:
    """``omnigym collect``: a Minari dataset from ``random`` and run directories (the settings:
    ``offline.collect.collect``), each run loaded here by its algorithm."""
    from omnigym.offline.collect import collect as write_dataset

    return write_dataset(sources, episodes, dataset_id, load_run=load_run, **settings)
