"""``omnigym collect SOURCE... --episodes N --dataset NAME``: a Minari dataset from policies.

Each SOURCE plays ``--episodes`` episodes in turn into one dataset: ``random`` (uniform actions),
or the directory of a control run (its last checkpoint, through its algorithm's ``load_policy``,
as ``omnigym eval`` plays it). D4RL's recipes are then: ``random``; ``medium`` (a run stopped at
about a third of the expert's return); ``expert`` (a finished run); ``medium-expert`` (the medium
and the expert run as two sources); *medium-replay* (``RUN --from-replay``: the replay buffer the
medium run saved, offline/from_replay.py). The episodes become Minari's ``EpisodeBuffer``s and the
dataset is written by Minari itself (``create_dataset_from_buffers``), with the env's spec, the algorithm that
collected it and the reference returns of D4RL's normalized score: ``ref_min_score`` (a uniform
random policy's mean return, measured, or ``--ref-min-score``) and ``ref_max_score`` (``--expert
RUN``'s mean return, measured, or ``--ref-max-score``).

The dataset is written in a hidden staging folder beside the others and moved into place whole:
a collection that fails or is interrupted leaves nothing, and an existing dataset is replaced
only with ``--overwrite`` (after the new one is complete).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gymnasium as gym
import numpy as np

from omnigym.envs.vector import make_vec
from omnigym.errors import OmnigymError, a_run, require
from omnigym.evaluation.control import LoadedRun
from omnigym.offline.datasets import datasets_root, first_line, import_minari
from omnigym.offline.from_replay import replay_episodes
from omnigym.process import run_scope
from omnigym.scoped_env import environment
from omnigym.track.lock import RunLock
from omnigym.track.progress import ProgressBar

RANDOM = "random"


@dataclass
class Source:
    """One policy episodes come from: ``act(obs batch) -> actions`` and what to call it."""

    name: str
    algorithm: str
    env_id: str | None
    act: Callable[[np.ndarray], np.ndarray] | None  # None: uniform random actions


RunLoader = Callable[[str, str], LoadedRun]
"""``load_run(run_dir, command) -> LoadedRun``: ``omnigym.runs.load_run``. A run's policy is
rebuilt by its algorithm, which the algorithm registry finds by name; the registry sits above
this package (the offline algorithms train with it), so the caller above passes the loader in."""


def load_source(name: str, greedy: bool, load_run: RunLoader) -> Source:
    if name == RANDOM:
        return Source(name, RANDOM, None, None)
    require(Path(name).is_dir(), f"collect: {name!r} is neither 'random' nor a run directory")
    run = load_run(name, "omnigym collect")
    cfg = run.cfg
    require(isinstance(cfg.env_id, str) and not cfg.env_id.startswith("<"),
            f"collect: {name} was trained on a Python object, not an env id omnigym can make again")
    require(not getattr(cfg, "pixels", False), f"collect: {name} learned from pixels; collect writes state datasets")
    envs = make_vec(cfg.env_id, 1, backend="sync")  # what load_policy reads its spaces from
    try:
        policy = run.policy(envs, greedy)
    finally:
        envs.close()
    require(not hasattr(policy, "reset"), f"collect: {name} is {a_run(run.algorithm)}, whose policy has memory; "
                                          "collect plays memoryless policies (a dataset's steps carry no hidden state)")
    return Source(name, run.algorithm, cfg.env_id, policy)


def mean_return(env_id: str, act, episodes: int, seed: int) -> float:
    """The mean return of ``episodes`` episodes of ``act`` (None: uniform random actions), played
    side by side and seeded: the same figure every time."""
    envs = make_vec(env_id, episodes, backend="sync", seed=seed)
    try:
        obs, _ = envs.reset(seed=seed)
        returns, done = np.zeros(episodes), np.zeros(episodes, dtype=bool)
        with run_scope(seed):
            while not done.all():
                actions = envs.action_space.sample() if act is None else act(obs)
                obs, _, _, _, info = envs.step(actions)
                if "episode" in info:
                    ended = info["_episode"] & ~done
                    returns[ended], done = info["episode"]["r"][ended], done | ended
    finally:
        envs.close()
    return float(returns.mean())


def collect(sources: list[str], episodes: int | None, dataset_id: str, env_id: str | None = None, seed: int = 0,
            greedy: bool = False, expert: str | None = None, ref_min_score: float | None = None,
            ref_max_score: float | None = None, reference_episodes: int = 100, overwrite: bool = False,
            from_replay: bool = False, *, load_run: RunLoader) -> dict:
    """Write the dataset (see the module's docstring; ``from_replay``: offline/from_replay.py); returns
    what was written (``summary`` says it in a line). ``omnigym.runs.collect`` is this with its
    ``load_run``, the way to call it from Python."""
    minari = import_minari()
    from minari.dataset.minari_dataset import parse_dataset_id

    require(not from_replay or episodes is None, "--from-replay takes the run's whole replay buffer; leave out --episodes")
    require(from_replay or episodes is not None, "--episodes is required (episodes from each source)")
    require(from_replay or episodes > 0, f"--episodes must be positive, got {episodes}")
    require(reference_episodes > 0, f"--reference-episodes must be positive, got {reference_episodes}")
    # episode i is reset with seed + i: gymnasium's traceback for a seed outside [0, 2**32)
    require(0 <= seed and seed + max(episodes or 0, reference_episodes) <= 2**32,
            f"--seed must be between 0 and 2**32 - 1 with room for its episodes (seed + i), got {seed}")
    require(sources, "collect: name a source: random, or a control run's directory")
    require(not (expert and ref_max_score is not None), "give --expert RUN or --ref-max-score, not both")
    try:
        namespace = parse_dataset_id(dataset_id)[0]
    except (ValueError, TypeError):  # TypeError: Minari's own parser on an id without -vN (minari 0.5)
        raise OmnigymError(f"--dataset {dataset_id!r}: a Minari id is NAME-vN or NAMESPACE/NAME-vN "
                           "(e.g. pendulum/random-v0)") from None
    root = datasets_root()
    blocked = next((p for p in [root, *root.parents] if p.exists()), None)
    require(blocked is None or blocked.is_dir(), f"the datasets folder {root} cannot be made: {blocked} is a file; "
                                                 "set MINARI_DATASETS_PATH to a folder")
    target = root / dataset_id
    require(overwrite or not target.exists(), f"--dataset {dataset_id} already exists in {root}; give --overwrite "
                                              "to replace it, or another name")
    require(ref_min_score is None or ref_max_score is not None or expert,
            "--ref-min-score needs --ref-max-score (or --expert RUN) beside it; alone it would be dropped")
    check_reference_scores(ref_min_score, ref_max_score)
    if from_replay:
        require(len(sources) == 1 and sources[0] != RANDOM, "collect --from-replay reads one run's directory")
        replay_env_id, algo, replayed = replay_episodes(sources[0], load_run)
        loaded = [Source(sources[0], f"{algo} replay buffer", replay_env_id, None)]
    else:
        loaded = [load_source(name, greedy, load_run) for name in sources]
    env_ids = {s.env_id for s in loaded if s.env_id is not None} | ({env_id} if env_id else set())
    require(len(env_ids) <= 1, f"collect: the sources play different envs ({', '.join(sorted(env_ids))}); "
                               "one dataset holds one env's episodes")
    require(env_ids, "collect: a random policy needs the env: give --env-id")
    (env_id,) = env_ids
    require(expert != RANDOM, "--expert names a trained run whose mean return is the reference's top; random play "
                              "is its bottom already")
    expert_source = load_source(expert, True, load_run) if expert else None
    require(expert_source is None or expert_source.env_id == env_id,
            f"--expert {expert} plays {expert_source.env_id if expert_source else ''}, not {env_id}")
    if ref_max_score is None and expert_source is not None:
        ref_max_score = mean_return(env_id, expert_source.act, reference_episodes, seed)
    low_given = ref_min_score is not None
    if ref_min_score is None and ref_max_score is not None:
        ref_min_score = mean_return(env_id, None, reference_episodes, seed)
    if expert is None:  # a --ref-max-score given alone, against random play's measured return
        check_reference_scores(ref_min_score, ref_max_score)
    else:  # an expert below the bottom turned the normalized score upside down (-600 scored -549, -1500 +275)
        require(ref_min_score < ref_max_score,
                f"--expert {expert} returns {ref_max_score:.1f} a greedy episode, not above "
                f"{'--ref-min-score' if low_given else 'random play'}'s {ref_min_score:.1f}: the normalized score "
                "would fall as the return rises; give a better trained --expert, or --ref-max-score")

    root.mkdir(parents=True, exist_ok=True)
    # one collect per dataset id: two into one new id both said "wrote", and the later replaced the other
    lock = RunLock(root, f".omnigym-collect-{dataset_id.replace('/', '--')}.lock", f"--dataset {dataset_id}")
    lock.acquire()
    staging = Path(tempfile.mkdtemp(prefix=".omnigym-collect-", dir=root))  # hidden: minari lists no dot-folders
    try:
        with environment({"MINARI_DATASETS_PATH": str(staging)}):
            buffers, returns = replay_buffers(sources[0], replayed) if from_replay else play(loaded, episodes, env_id, seed)
            with warnings.catch_warnings():  # Minari's advice to name an author, an e-mail, a code link
                warnings.simplefilter("ignore")
                minari.create_dataset_from_buffers(
                    dataset_id, buffers, env=env_id, algorithm_name=" + ".join(f"omnigym/{s.algorithm}" for s in loaded),
                    ref_min_score=ref_min_score, ref_max_score=ref_max_score, num_episodes_average_score=reference_episodes,
                    description=f"omnigym collect: {len(buffers) if from_replay else episodes} episodes "
                                f"{'of' if from_replay else 'each from'} " + ", ".join(
                        f"{s.name} ({s.algorithm}, mean return {returns[s.name]:.1f})" for s in loaded))
        require(overwrite or not target.exists(), f"--dataset {dataset_id} was written meanwhile by a process "
                                                  "that did not lock it; this one is not kept: give --overwrite to "
                                                  "replace it, or another name")
        replace_into(staging / dataset_id, target, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        lock.release()
    if namespace is not None:
        from minari.namespace import create_namespace, list_local_namespaces

        if namespace not in list_local_namespaces():
            create_namespace(namespace)
    dataset = minari.load_dataset(dataset_id)
    return {"dataset": dataset_id, "path": str(target), "episodes": dataset.total_episodes,
            "steps": dataset.total_steps, "env_id": env_id, "returns": returns,
            "ref_min_score": ref_min_score, "ref_max_score": ref_max_score}


def play(sources: list[Source], episodes: int, env_id: str, seed: int):
    """Each source's episodes, in turn, as Minari's ``EpisodeBuffer``s (whole arrays: Minari's
    step-by-step ``DataCollector`` needs jax); episode ``i`` is reset with ``seed + i``. Returns
    the buffers and each source's mean return."""
    import_minari()
    from minari.data_collector.episode_buffer import EpisodeBuffer

    try:
        env = gym.make(env_id)
    except Exception as exc:
        raise OmnigymError(f"env {env_id} could not be made: {first_line(exc)}") from None
    env.action_space.seed(seed)
    buffers, returns = [], {}
    # a long collect (100,000 episodes of a slow env) said nothing until it was done
    progress = ProgressBar(len(sources) * episodes, "collect (episodes)")
    with run_scope(seed):  # a run's sampled actions come from torch's generator
        for source in sources:
            totals = []
            for _ in range(episodes):
                index = len(buffers)
                obs, _ = env.reset(seed=seed + index)
                observations, actions, rewards, terminations, truncations = [obs], [], [], [], []
                while not (terminations and (terminations[-1] or truncations[-1])):
                    action = env.action_space.sample() if source.act is None else source.act(batch_of_one(obs))[0]
                    obs, reward, terminated, truncated, _ = env.step(action)
                    observations.append(obs), actions.append(action), rewards.append(float(reward))
                    terminations.append(bool(terminated)), truncations.append(bool(truncated))
                buffers.append(EpisodeBuffer(id=index, seed=seed + index, observations=stacked(observations),
                                             actions=np.stack(actions), rewards=np.array(rewards),
                                             terminations=np.array(terminations), truncations=np.array(truncations)))
                totals.append(sum(rewards))
                progress.update(len(buffers), source=source.name)
            returns[source.name] = float(np.mean(totals))
    progress.close()
    env.close()
    return buffers, returns


def batch_of_one(obs):
    """One observation as a batch of one (a goal env's Dict: each key's)."""
    return {key: value[None] for key, value in obs.items()} if isinstance(obs, dict) else obs[None]


def stacked(observations: list):
    """An episode's observations as arrays over time (a goal env's Dicts: an array per key, as
    Minari stores Dict spaces)."""
    if isinstance(observations[0], dict):
        return {key: np.stack([o[key] for o in observations]) for key in observations[0]}
    return np.stack(observations)


def replay_buffers(name: str, replayed: list):
    """The replayed episodes (``replay_episodes``) as Minari's ``EpisodeBuffer``s, and their mean return."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    buffers = [EpisodeBuffer(id=index, observations=observations, actions=actions, rewards=rewards,
                             terminations=terminations, truncations=truncations)
               for index, (observations, actions, rewards, terminations, truncations) in enumerate(replayed)]
    return buffers, {name: float(np.mean([episode[2].sum() for episode in replayed]))}


def check_reference_scores(low: float | None, high: float | None) -> None:
    """D4RL's normalized score is ``100 (score - low) / (high - low)``: finite, with low under
    high, or it is inf or NaN at every evaluation. Neither given: no normalized score."""
    import math

    for name, value in (("--ref-min-score", low), ("--ref-max-score", high)):
        require(value is None or math.isfinite(value), f"{name} must be a finite number, got {value}")
    if low is None or high is None:
        return
    require(low < high, f"--ref-min-score ({low}) must be below --ref-max-score ({high}): the normalized score "
                        "divides by their difference")


def replace_into(new: Path, target: Path, staging: Path) -> None:
    """Move the finished dataset folder ``new`` to ``target``; one there already goes only once
    the new one is in place (moved aside into ``staging`` first, which is then removed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        aside = staging / "replaced"
        os.replace(target, aside)
        try:
            os.replace(new, target)
        except BaseException:
            os.replace(aside, target)
            raise
    else:
        os.replace(new, target)


def summary(done: dict) -> str:
    refs = (f"; reference returns {done['ref_min_score']:.1f} (random) to {done['ref_max_score']:.1f} (expert)"
            if done["ref_max_score"] is not None else "; no reference returns (give --expert RUN or --ref-max-score "
            "for the normalized score)")
    shown = ", ".join(f"{k} {v:.1f}" for k, v in done["returns"].items())
    return (f"wrote {done['dataset']} ({done['episodes']} episodes, {done['steps']} steps of {done['env_id']}) to "
            f"{done['path']}; mean return: {shown}{refs}")
