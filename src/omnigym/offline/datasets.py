"""Minari datasets as the offline algorithms read them (BC, TD3+BC, IQL: one file each in algos/control).

``--dataset`` names a Minari dataset: a folder (the dataset's own, or its ``data/``), or an id
that ``minari.load_dataset`` finds under ``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``).
An id that is not there locally is downloaded from Minari's remote (Hugging Face) only when
the hub is not switched off (``HF_HUB_OFFLINE=1``, as the tests and offline machines set it);
either way a miss is one line naming the dataset and the fix.

Its episodes go into the replay seam's ``ReplayBuffer`` (``add_episode``: each observation
stored once, transitions in order), and the algorithm samples from it as SAC and TD3 do.
Observations are standardized by the dataset's mean and std, as CORL does (``ObservationStats``,
saved in the checkpoint so that the trained policy is evaluated on the same scale).

Goal-conditioned datasets (Dict observations ``observation``, ``achieved_goal``,
``desired_goal``: Fetch, PointMaze and AntMaze style) are read as the online goal envs are
(``envs/goal.py``'s ``network_view``): the networks see ``observation ++ desired_goal``, in
training and in evaluation alike.

The score every evaluation logs is D4RL's normalized score,
``100 * (return - ref_min_score) / (ref_max_score - ref_min_score)``, with the reference returns
stored in the dataset's metadata (``omnigym collect --expert`` or ``--ref-max-score`` writes
them; D4RL's own datasets on Minari carry them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from omnigym.config import ControlConfig, require_fraction, require_positive
from omnigym.envs.goal import network_view
from omnigym.errors import OmnigymError, missing_extra, require
from omnigym.models.continuous import check_spaces
from omnigym.rl.replay import ReplayBuffer

OBS_STD_EPSILON = 1e-3
"""added to each observation feature's std before dividing (CORL's ``compute_mean_std`` eps)"""


@dataclass
class OfflineConfig(ControlConfig):
    """Flags every offline algorithm shares: the dataset, gradient steps, evaluation."""

    dataset: str = ""
    """a Minari dataset: its id (found under MINARI_DATASETS_PATH, default ~/.minari/datasets) or its folder;
    omnigym collect writes one (docs/offline.md)"""
    env_id: str | None = None
    """the env to evaluate in (default: the one the dataset names); another env than the dataset's is refused"""
    total_timesteps: int = 1_000_000
    """gradient steps to train for (offline: there are no env steps)"""
    num_envs: int = 1
    preset: str = "none"
    batch_size: int = 256
    gamma: float = 0.99
    hidden: tuple[int, ...] = (256, 256)
    normalize_obs: bool = True
    """standardize observations by the dataset's mean and std (CORL's normalize)"""
    eval_every: int = 5000
    """gradient steps between evaluations in the env (and at the end)"""
    eval_episodes: int = 10
    """episodes per evaluation (each evaluation seeds them afresh: same step, same episodes)"""
    log_every: int = 1000
    """gradient steps between loss lines"""

    RESUME_FIXED = ControlConfig.RESUME_FIXED + ("dataset", "normalize_obs")
    SAVED_REQUIRED = ("dataset",)

    def check(self) -> None:
        super().check()
        # --resume-online (offline/online.py) takes the offline run's dataset
        require(bool(self.dataset) or bool(getattr(self, "resume_online", None)), "--dataset is required: a Minari dataset id or folder (omnigym collect "
                                    "writes one; docs/offline.md)")
        require_positive(self, "batch_size", "eval_every", "eval_episodes", "log_every", "hidden")
        require_fraction(self, "gamma")  # --gamma 2 trained on in silence
        require(not self.pixels and not self.capture_video, "--pixels and --capture-video are online flags; an "
                                                            "offline run learns from the dataset's observations")
        require(self.num_envs == 1, "--num-envs: offline runs train from the dataset and evaluate in one env at a "
                                    "time; leave it at 1 (--eval-episodes sets how many episodes)")


def import_minari():
    import sys

    require(sys.version_info >= (3, 11), "offline datasets need minari, and minari 0.5 needs Python 3.11 or newer")
    try:
        import minari
    except ImportError:
        raise missing_extra("minari", "offline") from None
    return minari


def datasets_root() -> Path:
    """Where Minari keeps datasets: ``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``."""
    return Path(os.environ.get("MINARI_DATASETS_PATH") or Path.home() / ".minari" / "datasets")


def open_dataset(name: str):
    """The ``minari.MinariDataset`` that ``--dataset name`` names (see the module's docstring)."""
    minari = import_minari()
    from minari.dataset.minari_dataset import MinariDataset

    path = Path(name).expanduser()
    if path.is_dir():
        data = path / "data" if (path / "data").is_dir() else path
        try:
            return MinariDataset(data)
        except Exception as exc:  # no metadata.json, unreadable HDF5/Arrow files
            raise OmnigymError(f"--dataset {name}: not a Minari dataset folder ({first_line(exc)})") from None
    if name.startswith(("/", ".", "~")) or path.exists():
        raise OmnigymError(f"--dataset {name}: no such folder; give a Minari dataset folder or id")
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        parse_dataset_id(name)
    except (ValueError, TypeError):  # a folder that is not here (it advised "collect ... --dataset FOLDER/data")
        raise OmnigymError(f"--dataset {name}: no such folder here, and not a Minari id (NAME-vN or "
                           "NAMESPACE/NAME-vN); give a dataset folder or id") from None
    if (datasets_root() / name / "data").is_dir():
        try:
            return minari.load_dataset(name)
        except Exception as exc:
            raise OmnigymError(f"--dataset {name}: the local dataset cannot be read ({first_line(exc)})") from None
    where = f"not a local Minari dataset (none in {datasets_root()}, MINARI_DATASETS_PATH)"
    fix = f"write one with: omnigym collect RUN_OR_POLICY --episodes N --dataset {name}"
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False"):
        raise OmnigymError(f"--dataset {name}: {where}, and downloading is off (HF_HUB_OFFLINE=1); {fix}")
    unreachable = hub_unreachable()
    if unreachable:  # said at once: huggingface_hub would retry for half a minute, printing each try
        raise OmnigymError(f"--dataset {name}: {where}, and the hub cannot be reached to download it "
                           f"({unreachable}); {fix}")
    try:  # Minari's remote: its Hugging Face datasets (farama-minari/...)
        return minari.load_dataset(name, download=True)
    except Exception as exc:
        raise OmnigymError(f"--dataset {name}: {where}, and it could not be downloaded ({first_line(exc)}); "
                           f"{fix}") from None


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hugging Face hub (``HF_ENDPOINT``, default huggingface.co) cannot be reached, or
    None when a connection to it opens."""
    import socket
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = endpoint.hostname or "huggingface.co", endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or type(exc).__name__}"
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def dataset_env_id(dataset) -> str | None:
    """The id of the env a dataset was collected in (its eval env where it names one)."""
    # the eval env's spec is read by MinariDataset but kept private (recover_environment uses it)
    spec = getattr(dataset, "_eval_env_spec", None) or dataset.spec.env_spec
    return spec.id if spec is not None else None


def normalized_score(returns, ref_min_score: float, ref_max_score: float) -> np.ndarray:
    """D4RL's normalized score, 0 for the random policy's mean return and 100 for the expert's."""
    return 100.0 * (np.asarray(returns, dtype=np.float64) - ref_min_score) / (ref_max_score - ref_min_score)


class ObservationStats:
    """The dataset's per-feature observation mean and std (ones and zeros without
    ``--normalize-obs``); a checkpoint component, so a policy is evaluated on its own scale."""

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return ((np.asarray(obs, dtype=np.float32) - self.mean) / self.std).astype(np.float32)

    def state_dict(self) -> dict:
        return {"mean": torch.from_numpy(self.mean), "std": torch.from_numpy(self.std)}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.std = state["mean"].numpy(), state["std"].numpy()


@dataclass
class OfflineData:
    """A dataset loaded for training: the replay buffer holding its transitions (observations
    standardized), the statistics used for that, and what evaluation needs."""

    buffer: ReplayBuffer
    obs_stats: ObservationStats
    env_id: str
    observation_space: gym.spaces.Box
    """what the networks see (a goal dataset's ``observation ++ desired_goal``)"""
    action_space: gym.spaces.Box
    ref_min_score: float | None
    ref_max_score: float | None
    episodes: int
    transitions: int
    returns: np.ndarray
    """the undiscounted return of each episode kept"""
    dataset_observation_space: gym.spaces.Space | None = None
    """the dataset's own (a Dict for a goal dataset): what the env it is evaluated in must have"""

    def score(self, returns) -> dict:
        """The metrics of one evaluation's episode returns."""
        metrics = {"eval/episodic_return": float(np.mean(returns)), "eval/episodic_return_std": float(np.std(returns))}
        if self.ref_min_score is not None and self.ref_max_score is not None:
            metrics["eval/normalized_score"] = float(np.mean(normalized_score(returns, self.ref_min_score,
                                                                              self.ref_max_score)))
        return metrics


def load_offline_data(cfg: OfflineConfig, algo: str, top_fraction: float = 1.0) -> OfflineData:
    """``cfg.dataset`` checked for ``algo`` and read into a ``ReplayBuffer``. ``top_fraction``
    keeps the best episodes by return (CORL's "x% BC"). Refusals (another env than
    ``--env-id``, no actions, no steps, actions ``algo`` cannot take) come before anything is written."""
    dataset = open_dataset(cfg.dataset)
    label = f"--dataset {cfg.dataset}"
    env_id = dataset_env_id(dataset)
    if cfg.env_id is not None and env_id is not None and cfg.env_id != env_id:
        raise OmnigymError(f"{label} was collected in {env_id}, not {cfg.env_id}; give --env-id {env_id} (or leave "
                           "it out), or a dataset of that env")
    env_id = cfg.env_id or env_id
    require(env_id is not None, f"{label} names no env to evaluate in; give --env-id")
    require(dataset.total_steps > 0, f"{label} is empty (0 steps); collect some episodes into it first")
    action_space = dataset.action_space
    require(action_space is not None, f"{label} has no action space in its metadata (a dataset without actions); "
                                      "offline RL learns from (observation, action, reward) steps")
    obs_space, to_network = network_view(dataset.observation_space)  # a goal dataset's Dicts: observation ++ goal
    try:
        check_spaces(algo, obs_space, action_space)
    except OmnigymError as exc:
        raise OmnigymError(f"{label}: {str(exc).replace('the env has', 'the dataset has')}") from None
    episodes = read_episodes(dataset, label, obs_space, action_space, to_network)
    returns = np.array([float(e[2].sum()) for e in episodes])
    if top_fraction < 1.0:  # the best episodes by return, at least one
        keep = np.argsort(-returns, kind="stable")[:max(1, int(round(top_fraction * len(episodes))))]
        episodes, returns = [episodes[i] for i in sorted(keep)], returns[sorted(keep)]
    all_obs = np.concatenate([e[0][:-1] for e in episodes])
    if cfg.normalize_obs:
        stats = ObservationStats(all_obs.mean(0), all_obs.std(0) + OBS_STD_EPSILON)
    else:
        stats = ObservationStats(np.zeros(obs_space.shape), np.ones(obs_space.shape))
    transitions = sum(len(e[2]) for e in episodes)
    # room for every transition and every episode's extra (last) observation: nothing is evicted
    buffer = ReplayBuffer(transitions + len(episodes), obs_space.shape, action_space.shape, action_dtype=np.float32)
    for observations, actions, rewards, terminations in episodes:
        buffer.add_episode(stats(observations), actions, rewards, terminations)
    metadata = dataset.storage.metadata
    refs = [metadata.get("ref_min_score"), metadata.get("ref_max_score")]
    return OfflineData(buffer, stats, env_id, obs_space, action_space, *refs, len(episodes), transitions, returns,
                       dataset.observation_space)


def read_episodes(dataset, label: str, obs_space, action_space, to_network=lambda obs: obs) -> list[tuple]:
    """Each episode as (observations [T+1] as the networks see them, actions [T], rewards [T],
    terminations [T]), checked."""
    episodes = []
    try:
        for episode in dataset.iterate_episodes():
            actions = np.asarray(episode.actions, dtype=np.float32)
            observations = np.asarray(to_network(episode.observations), dtype=np.float32)
            steps = len(episode.rewards)
            require(actions.shape == (steps, *action_space.shape),
                    f"{label}: episode {episode.id} has actions of shape {actions.shape}, not ({steps}, "
                    f"{', '.join(map(str, action_space.shape))}) as its action space says")
            require(observations.shape == (steps + 1, *obs_space.shape),
                    f"{label}: episode {episode.id} has observations of shape {observations.shape}, not "
                    f"({steps + 1}, {', '.join(map(str, obs_space.shape))})")
            rewards = np.asarray(episode.rewards, dtype=np.float32)
            for what, values in (("observation", observations), ("action", actions), ("reward", rewards)):
                # nan or inf here was a NaN loss at the first update, blamed on the learning rate
                if not np.isfinite(values).all():
                    at = int(np.argwhere(~np.isfinite(values))[0][0])
                    raise OmnigymError(f"{label}: episode {episode.id} has a non-finite {what} "
                                       f"({values[~np.isfinite(values)][0]}) at step {at}; offline RL cannot learn "
                                       "from it: fix that episode or collect the dataset again")
            if steps:
                episodes.append((observations, actions, rewards, np.asarray(episode.terminations, dtype=np.float32)))
    except OmnigymError:
        raise
    except KeyError as exc:  # HDF5/Arrow storage without a field (h5py names it inside its own sentence)
        missing = next((f for f in ("actions", "observations", "rewards", "terminations", "truncations")
                        if f in str(exc)), None)
        if missing is None:  # h5py's KeyError for damaged bytes too ("bad object header"): not a missing field
            raise OmnigymError(f"{label}: its episodes cannot be read ({first_line(exc)}); the dataset's files are "
                               "damaged: collect it again") from None
        raise OmnigymError(f"{label}: its episodes have no {missing}; offline RL learns from (observation, action, "
                           "reward) steps") from None
    except Exception as exc:
        raise OmnigymError(f"{label}: its episodes cannot be read ({first_line(exc)})") from None
    require(episodes, f"{label} is empty (no episode with a step); collect some episodes into it first")
    return episodes


class Evaluator:
    """Plays ``--eval-episodes`` episodes of the policy in the dataset's env, all at once (one
    env each), seeded by the gradient step: an evaluation is the same after a resume."""

    def __init__(self, cfg: OfflineConfig, data: OfflineData):
        from omnigym.envs.vector import make_vec, parse_env_kwargs

        self.cfg, self.data = cfg, data
        self.envs = make_vec(data.env_id, cfg.eval_episodes, backend="sync", seed=cfg.seed,
                             **parse_env_kwargs(cfg.env_kwargs))
        space, expected = self.envs.single_observation_space, data.dataset_observation_space or data.observation_space
        if shapes(space) != shapes(expected) or self.envs.single_action_space.shape != data.action_space.shape:
            self.envs.close()
            raise OmnigymError(f"--dataset {cfg.dataset}: its observations {shapes(expected)} and "
                               f"actions {data.action_space.shape} do not fit {data.env_id}'s {shapes(space)} and "
                               f"{self.envs.single_action_space.shape}; it was collected in another env")
        self.to_network = network_view(space)[1]

    @torch.no_grad()
    def __call__(self, act, step: int) -> dict:
        """``act(normalized obs tensor) -> actions tensor``; the metrics of the episodes it plays."""
        from omnigym.envs.cursor import check_finite_obs, check_finite_rewards

        n = self.cfg.eval_episodes
        obs, _ = self.envs.reset(seed=self.cfg.seed + 7919 * step)  # a prime apart: no two evaluations share seeds
        check_finite_obs(obs, 0)  # as a training run's env is checked: a nan score otherwise, exit 0
        returns, done, steps = np.zeros(n), np.zeros(n, dtype=bool), 0
        low, high = self.data.action_space.low, self.data.action_space.high
        while not done.all():
            actions = act(torch.as_tensor(self.data.obs_stats(self.to_network(obs)))).cpu().numpy().clip(low, high)
            obs, rewards, _, _, info = self.envs.step(actions)
            steps += n
            check_finite_obs(obs, steps)
            check_finite_rewards(np.asarray(rewards, dtype=np.float64), steps)
            if "episode" in info:
                ended = info["_episode"] & ~done
                returns[ended], done = info["episode"]["r"][ended], done | ended
        return self.data.score(returns)

    def close(self) -> None:
        self.envs.close()


def shapes(space: gym.spaces.Space):
    """A space's shape, or each key's for a Dict (what must match between a dataset and its env)."""
    if isinstance(space, gym.spaces.Dict):
        return {key: shapes(part) for key, part in space.spaces.items()}
    return space.shape
