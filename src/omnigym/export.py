"""``omnigym export``: a trained control policy as one standalone file, ONNX or TorchScript.

The file maps a batch of raw observations (the env's, float32; uint8 for images) to the
actions the env receives, deterministically: PPO's and REINFORCE's Gaussian mean (or argmax
of the logits), SAC's squashed mean scaled to the action bounds, TD3's actor, DQN's argmax
Q, DrQ's encoder and squashed mean; the offline algorithms' actors as they evaluate (BC's and
TD3+BC's tanh actor, IQL's Gaussian mean, CQL's squashed mean). A goal env's Dict observation
is taken flattened, ``observation ++ desired_goal``, as the networks read it (the file's
metadata ``input.layout`` names the keys and widths). What training put between the env and
the network is folded in: PPO's ``--normalize-obs`` running statistics (in float64, clipped to
+-10, as ``RunningMeanStd.normalize`` does), an offline run's dataset standardization and,
for PPO and REINFORCE on a Box, the clip into the action bounds that their rollouts and
``omnigym eval`` apply at the env boundary. SAC and TD3 need no clip: tanh, scaled to the
bounds, keeps their actions inside, and no clip is added, so the file does what their
``load_policy`` does. Environment wrappers (Atari's frame preprocessing) stay outside.

The networks are the algorithms' own classes (models/control.py, models/continuous.py)
loaded from the checkpoint; nothing here redefines them. Before the file is moved into
place it is run (onnxruntime, or ``torch.jit.load``) on probe observations and compared
with the checkpoint's policy as ``omnigym eval`` rebuilds it
(``runs.load_policy``, the algorithm's ``load_policy``); a file that disagrees is never written. docs/export.md has the details
and the per-step latency.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path
from types import MappingProxyType

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from omnigym.errors import OmnigymError, a_run, missing_extra
from omnigym.models.goal_view import GoalLayout
from omnigym.track.lock import RunLock
from omnigym.track.run_dir import EXPORTED_POLICIES, check_out_of_other_runs, refuse_run_files

ONNX_FILE, TORCHSCRIPT_FILE = EXPORTED_POLICIES
FORMATS = MappingProxyType({"onnx": ONNX_FILE, "torchscript": TORCHSCRIPT_FILE})
"""each format and the file it writes into the run directory by default (a run's own: --overwrite sets them aside)"""
OBS_CLIP = 10.0
"""RunningMeanStd.normalize's clip of normalized observations"""
PROBES = 256
"""random observations the written file is checked on"""
TOLERANCE = 1e-5
"""the largest difference allowed between the file's actions and the checkpoint policy's"""
METADATA_FILE = "omnigym.json"
"""the TorchScript archive's extra file with the metadata (ONNX keeps it in metadata_props)"""


class ExportedPolicy(nn.Module):
    """``obs batch -> actions``: normalization, the deterministic actor, the action clip.
    ``obs_rms``: an online run's running statistics (float64, clipped); ``obs_stats``: an offline
    run's dataset mean and std (float32, unclipped, as ``ObservationStats`` computes it)."""

    def __init__(self, actor: nn.Module, obs_rms: dict | None, clip_to: gym.spaces.Box | None,
                 obs_stats: dict | None = None):
        super().__init__()
        self.actor, self.normalize, self.clip = actor, obs_rms is not None, clip_to is not None
        self.standardize = obs_stats is not None
        if obs_stats is not None:
            self.register_buffer("stats_mean", torch.as_tensor(obs_stats["mean"], dtype=torch.float32))
            self.register_buffer("stats_std", torch.as_tensor(obs_stats["std"], dtype=torch.float32))
        if obs_rms is not None:  # float64, as the numpy statistics: the same numbers as training
            self.register_buffer("obs_mean", torch.as_tensor(np.asarray(obs_rms["mean"], np.float64)))
            self.register_buffer("obs_std", torch.as_tensor(np.sqrt(np.asarray(obs_rms["var"], np.float64) + 1e-8)))
        if clip_to is not None:
            self.register_buffer("action_low", torch.as_tensor(clip_to.low, dtype=torch.float32))
            self.register_buffer("action_high", torch.as_tensor(clip_to.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.normalize:
            obs = ((obs.double() - self.obs_mean) / self.obs_std).clamp(-OBS_CLIP, OBS_CLIP).float()
        if self.standardize:
            obs = (obs.float() - self.stats_mean) / self.stats_std
        action = self.actor(obs)
        if self.clip:
            action = torch.minimum(torch.maximum(action, self.action_low), self.action_high)
        return action


class Deterministic(nn.Module):
    """``net.<method>(obs)``: the deterministic action method of an algorithm's network."""

    def __init__(self, net: nn.Module, method: str):
        super().__init__()
        self.net, self.method = net, method

    def forward(self, obs):
        return getattr(self.net, self.method)(obs)


class _GreedyQ(nn.Module):
    def __init__(self, q_network):
        super().__init__()
        self.q_network = q_network

    def forward(self, obs):
        return self.q_network(obs).argmax(-1)


class _EncodedActor(nn.Module):
    """DrQ's policy: the critic's encoder, then the actor's squashed mean on its maps."""

    def __init__(self, encoder, actor):
        super().__init__()
        self.encoder, self.actor = encoder, actor

    def forward(self, obs):
        return self.actor.mode(self.encoder(obs))


# Each returns ``(actor, running obs statistics, dataset obs statistics, clip)``; ``obs_space`` is
# the space the networks see (a goal env's flattened observation ++ desired_goal).

def _actor_critic(cfg, components, obs_space, action_space):
    from omnigym.envs.games.symmetry import symmetries_of
    from omnigym.models.control import ActorCritic

    agent = ActorCritic(obs_space, action_space, tuple(cfg.hidden), symmetries_of(cfg))
    agent.load_state_dict(components["model"])
    obs_rms = (components.get("collector") or {}).get("obs_rms")
    return (Deterministic(agent, "greedy"), obs_rms, None,
            action_space if isinstance(action_space, gym.spaces.Box) else None)


def _q_network(cfg, components, obs_space, action_space):
    from omnigym.models.control import QNetwork

    q_network = QNetwork(obs_space, int(action_space.n), tuple(cfg.hidden))
    q_network.load_state_dict(components["model"])
    return _GreedyQ(q_network), None, None, None


def _sac_actor(cfg, components, obs_space, action_space):
    from omnigym.models.continuous import SquashedGaussianActor

    actor = SquashedGaussianActor(obs_space.shape[0], action_space, tuple(cfg.hidden))
    actor.load_state_dict(components["actor"])
    return Deterministic(actor, "mode"), None, None, None


def _td3_actor(cfg, components, obs_space, action_space):
    from omnigym.models.continuous import DeterministicActor

    actor = DeterministicActor(obs_space.shape[0], action_space, tuple(cfg.hidden))
    actor.load_state_dict(components["actor"])
    return actor, None, None, None


def _drq_actor(cfg, components, obs_space, action_space):
    from omnigym.models.pixel_encoder import PixelActor, PixelCritic

    critic = PixelCritic(obs_space.shape, action_space.shape[0], cfg.features, tuple(cfg.hidden))
    critic.load_state_dict(components["critic"])
    actor = PixelActor(critic.encoder.out_features, action_space, cfg.features, tuple(cfg.hidden))
    actor.load_state_dict(components["actor"])
    return _EncodedActor(critic.encoder, actor), None, None, None


def _offline_actor(actor_class):
    """An offline algorithm's actor (``actor_class()``: the class its ``load_policy`` builds, acting
    as it evaluates: BC's and TD3+BC's tanh actor, IQL's Gaussian mean, CQL's squashed mean) on
    the dataset's standardized observations."""

    def build(cfg, components, obs_space, action_space):
        actor = actor_class()(obs_space.shape[0], action_space, tuple(cfg.hidden))
        actor.load_state_dict(components["actor"])
        return actor, None, components["obs_stats"], None

    return build


def _tanh_actor():
    from omnigym.models.continuous import DeterministicActor

    return DeterministicActor


def _gaussian_mean_actor():
    from omnigym.models.continuous import GaussianActor

    return GaussianActor


def _cql_actor():
    from omnigym.algos.control.cql import GreedyActor

    return GreedyActor


ACTORS = MappingProxyType({"ppo": _actor_critic, "reinforce": _actor_critic, "dqn": _q_network, "sac": _sac_actor,
                          "td3": _td3_actor, "drq": _drq_actor, "bc": _offline_actor(_tanh_actor),
                          "td3_bc": _offline_actor(_tanh_actor), "iql": _offline_actor(_gaussian_mean_actor),
                          "cql": _offline_actor(_cql_actor)})
"""each exportable algorithm's deterministic actor: ``(cfg, components, network obs space, action space)
-> (actor, running obs statistics, dataset obs statistics, clip)``"""


def describe_space(space: gym.Space) -> dict:
    """A JSON description of an observation or action space, for the file's metadata."""
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {key: describe_space(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.Box):
        described = {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype)}
        if len(space.shape) == 1:  # an image's bounds are one number repeated: left out
            described.update(low=space.low.tolist(), high=space.high.tolist())
        return described
    return {"type": type(space).__name__, "repr": repr(space)}


def default_out(run_dir: str | os.PathLike, fmt: str) -> Path:
    return Path(run_dir) / FORMATS[fmt]


def check_format(fmt: str) -> None:
    """The format is known and, for ONNX, the [export] extra is installed."""
    if fmt not in FORMATS:
        raise OmnigymError(f"unknown export format {fmt!r}; choose onnx or torchscript")
    if fmt == "onnx":
        for package in ("onnx", "onnxscript", "onnxruntime"):
            try:
                __import__(package)
            except ImportError:
                raise missing_extra(package, "export") from None


def check_out(run_dir: str | os.PathLike, out: Path, force: bool) -> None:
    """``out`` may be written: not a folder, not one of the run's files, not replaced unasked."""
    run = Path(run_dir).resolve()
    if out.is_dir():
        raise OmnigymError(f"--out {out} is a directory; name the file to write")
    if out.exists():
        # any run's files, this one's or another's (a finished run's checkpoint.pt was replaced by
        # --force), and a Minari dataset's: an export replaces only what an export wrote
        for folder in out.resolve().parents:
            is_run = (folder / "config.json").is_file() and ((folder / "checkpoint.pt").exists() or
                                                             (folder / "metrics.jsonl").is_file())
            if is_run and out.resolve() not in {default_out(folder, f).resolve() for f in FORMATS}:
                whose = "the run's" if folder == run else f"the run {folder}'s"
                raise OmnigymError(f"--out {out} is one of {whose} own files; export never replaces those")
            if (folder / "data" / "metadata.json").is_file():
                raise OmnigymError(f"--out {out} is a file of the Minari dataset in {folder}; export never replaces "
                                   "those")
        if not force:
            raise OmnigymError(f"{out} exists; pass --force to replace it")
    if not out.resolve().parent.is_dir():
        raise OmnigymError(f"--out {out}: no such folder {out.parent}")
    check_out_of_other_runs(out, [run_dir], "--out", "which this export is not of", "the policy", "policy.onnx")
    refuse_run_files(out, "--out", "export", own_runs=[run_dir], allowed=EXPORTED_POLICIES)  # its lock, a link


def exportable(run_dir: str | os.PathLike) -> str:
    """The run's algorithm, or one line why it has no control policy to export."""
    from omnigym.algos import ALGORITHMS
    from omnigym.track.files import load_config_dict

    algo = load_config_dict(run_dir)["algo"]
    if algo not in ACTORS:
        # "an ppo_lstm run": the article fits the algorithm's name (a_run)
        kind = f"a language-model {algo} run" if ALGORITHMS.get(algo, "").startswith("omnigym.algos.lm.") else a_run(algo)
        raise OmnigymError(f"{run_dir} is {kind}; omnigym export writes the control policies of "
                           f"{', '.join(ACTORS)} runs")
    return algo


def input_layout(obs_space: gym.Space) -> list[dict] | None:
    """How a goal env's Dict observation is flattened into the file's input: each key and its
    width, in order (the networks' ``observation ++ desired_goal``); None for a Box."""
    layout = GoalLayout.of(obs_space)
    if layout is None:
        return None
    return [{"key": "observation", "size": layout.obs_dim}, {"key": "desired_goal", "size": layout.goal_dim}]


def flatten(obs: dict, layout: list[dict]) -> np.ndarray:
    """A batch of Dict observations as the exported file takes it, by the file's ``input.layout``."""
    return np.concatenate([np.asarray(obs[part["key"]], np.float32).reshape(-1, part["size"]) for part in layout], -1)


def build_policy(algo: str, cfg, components: dict, obs_space: gym.Space, action_space: gym.Space) -> ExportedPolicy:
    """The file's module. ``obs_space`` is the env's; a goal env's Dict is read as the networks
    read it, flattened (``input_layout``)."""
    layout = GoalLayout.of(obs_space)
    network_space = layout.network_space if layout is not None else obs_space
    if not isinstance(network_space, gym.spaces.Box):
        raise OmnigymError(f"export takes Box observations or a goal env's Dict (observation, achieved_goal, "
                           f"desired_goal), and this run's env has {obs_space}")
    try:
        actor, obs_rms, obs_stats, clip_to = ACTORS[algo](cfg, components, network_space, action_space)
    except (KeyError, RuntimeError) as exc:  # a checkpoint of other networks than these classes build
        raise OmnigymError(f"the checkpoint's networks do not match {algo}'s ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0]})") from None
    return ExportedPolicy(actor, obs_rms, clip_to, obs_stats).eval()


def probe_observations(space: gym.spaces.Box, obs_rms: dict | None, n: int = PROBES, seed: int = 0) -> np.ndarray:
    """Observations where the policy works: around the run's statistics when it normalized
    (``mean`` and ``var``; out to 3 standard deviations, so the +-10 clip is crossed rarely),
    else in the Box."""
    rng = np.random.default_rng(seed)
    shape = (n, *space.shape)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if obs_rms is not None:
        return (obs_rms["mean"] + np.sqrt(obs_rms["var"]) * rng.uniform(-3, 3, shape)).astype(np.float32)
    low, high = np.broadcast_to(space.low, space.shape), np.broadcast_to(space.high, space.shape)
    bounded = np.isfinite(low) & np.isfinite(high)
    wide = rng.normal(size=shape) * 2
    return np.where(bounded, rng.uniform(np.where(bounded, low, 0), np.where(bounded, high, 1), shape),
                    wide).astype(np.float32)


def probe_statistics(components: dict) -> dict | None:
    """The run's observation statistics as ``probe_observations`` takes them (``mean``, ``var``):
    an online run's running ones, an offline run's dataset mean and std; None without."""
    obs_rms = (components.get("collector") or {}).get("obs_rms")
    if obs_rms is not None:
        return obs_rms
    stats = components.get("obs_stats")
    if stats is None:
        return None
    std = np.asarray(stats["std"], np.float64)
    return {"mean": np.asarray(stats["mean"], np.float64), "var": std * std}


def probes(obs_space: gym.Space, components: dict, n: int = PROBES, seed: int = 0):
    """``(the file's input, the env's observations)`` for the same probes: equal for a Box; for a
    goal env the flattened ``observation ++ desired_goal`` and the Dict it comes from (its
    ``achieved_goal``, which the policy does not read, drawn as well)."""
    layout = input_layout(obs_space)
    if layout is None:
        observations = probe_observations(obs_space, probe_statistics(components), n, seed)
        return observations, observations
    flat = probe_observations(GoalLayout.of(obs_space).network_space, probe_statistics(components), n, seed)
    parts = np.split(flat, np.cumsum([part["size"] for part in layout])[:-1], axis=-1)
    observations = {part["key"]: values for part, values in zip(layout, parts)}
    observations["achieved_goal"] = probe_observations(obs_space["achieved_goal"], None, n, seed + 1)
    return flat, observations


def load_exported(path: str | os.PathLike, fmt: str):
    """The written file as ``obs (numpy batch) -> actions (numpy)``, run by onnxruntime or TorchScript."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda obs: session.run(None, {"obs": obs})[0]
    module = _jit_load(path)

    @torch.inference_mode()
    def policy(obs):
        return module(torch.as_tensor(obs)).numpy()

    return policy


def _jit_load(path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript; it still runs
        return torch.jit.load(str(path), **kwargs)


def read_metadata(path: str | os.PathLike, fmt: str) -> dict:
    """The metadata the file carries (as written by ``export_run``)."""
    if fmt == "onnx":
        import onnx

        return {p.key: json.loads(p.value) for p in onnx.load(str(path)).metadata_props}
    files = {METADATA_FILE: ""}
    _jit_load(path, _extra_files=files)
    return json.loads(files[METADATA_FILE])


def mismatch(exported, reference, observations: np.ndarray, discrete: bool, env_observations=None) -> str | None:
    """How the exported file's actions differ from the reference policy's, or None if they agree.
    ``env_observations``: what the reference gets where it differs from the file's input (a goal
    env's Dict, which the file takes flattened)."""
    got = np.asarray(exported(observations))
    want = np.asarray(reference(observations if env_observations is None else env_observations))
    if got.shape != want.shape:
        return f"actions of shape {got.shape}, not {want.shape}"
    if discrete:
        wrong = int((got != want).sum())
        return f"{wrong} of {len(want)} actions differ" if wrong else None
    worst = float(np.max(np.abs(got.astype(np.float64) - want)))
    return f"actions differ by up to {worst:.3g} (tolerance {TOLERANCE})" if not worst <= TOLERANCE else None


def write_onnx(policy: ExportedPolicy, example: torch.Tensor, metadata: dict, path: Path) -> None:
    import logging

    import onnx

    # torch.export-based exporter (torch's default since 2.9; the TorchScript-based one is
    # deprecated). The batch axis is symbolic; the example has two rows so it is not fixed at 1.
    batch = torch.export.Dim("batch")
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)  # a warning per torchvision op it cannot find: noise for a policy
    try:
        program = torch.onnx.export(policy, (example,), dynamo=True, input_names=["obs"], output_names=["action"],
                                    dynamic_shapes=({0: batch},), verbose=False)
    finally:
        logger.setLevel(level)
    proto = program.model_proto
    metadata["opset"] = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    for key, value in metadata.items():
        proto.metadata_props.add(key=key, value=json.dumps(value))
    onnx.checker.check_model(proto)
    _write_bytes(path, proto.SerializeToString())


def write_torchscript(policy: ExportedPolicy, example: torch.Tensor, metadata: dict, path: Path) -> None:
    # Traced, not scripted: the policy has no data-dependent branches, and tracing takes the
    # networks as they are (scripting would need their optional mask arguments typed).
    traced = torch.jit.trace(policy, (example,), check_trace=True)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer, _extra_files={METADATA_FILE: json.dumps(metadata)})
    _write_bytes(path, buffer.getvalue())


def place(tmp: Path, out: Path, force: bool) -> None:
    """Move the finished file to ``out``. Without ``force``, by a hard link, which fails if
    ``out`` exists: another export that wrote it since ``check_out`` looked is not replaced.
    Where hard links are not allowed (some network and FAT file systems), by a rename."""
    if not force:
        try:
            os.link(tmp, out)
            return
        except FileExistsError:
            raise OmnigymError(f"{out} exists (written while this export ran); pass --force to replace it") from None
        except OSError:
            pass
    os.replace(tmp, out)


def _write_bytes(path: Path, data: bytes) -> None:
    """The serialized file, written from memory by Python: a full disk is one ``DiskFault`` line.
    (torch.jit.save writing to a path aborts the whole process on a short write, a C++
    ``terminate`` from its writer; onnx.save raises a bare OSError.)"""
    with open(path, "wb") as file:
        file.write(data)


def export_run(run_dir: str | os.PathLike, fmt: str = "onnx", out: str | os.PathLike | None = None,
               force: bool = False, env=None) -> dict:
    """Writes the run's policy as ``fmt`` to ``out`` (default ``RUN_DIR/policy.onnx`` or
    ``policy.pt``), checked against the checkpoint's policy (``load_policy(run_dir)``, the one
    ``omnigym eval`` plays); returns what was written."""
    from omnigym.runs import load_policy

    check_format(fmt)
    algo = exportable(run_dir)
    if out is not None and str(out).endswith(("/", os.sep)):  # Path() would drop the slash and write a file "x"
        raise OmnigymError(f"--out {out} names a folder; name the file to write")
    out = Path(out) if out is not None else default_out(run_dir, fmt)
    check_out(run_dir, out, force)
    reference = load_policy(run_dir, greedy=True, env=env)
    cfg, components = reference.cfg, reference.components
    obs_space, action_space = reference.observation_space, reference.action_space
    policy = build_policy(algo, cfg, components, obs_space, action_space)
    inputs, observations = probes(obs_space, components)
    example = torch.as_tensor(inputs[:2])
    layout = input_layout(obs_space)
    metadata = {"format": fmt, "algorithm": algo, "run": str(Path(run_dir).resolve()),
                "env_id": str(cfg.env_id), "global_step": reference.global_step,
                "observation_space": describe_space(obs_space), "action_space": describe_space(action_space),
                "input": {"name": "obs", "shape": ["batch", *inputs.shape[1:]], "dtype": str(example.dtype)[6:],
                          **({"layout": layout} if layout else {})},
                "observation_normalization": policy.normalize or policy.standardize, "action_clipping": policy.clip,
                "torch": torch.__version__}
    from omnigym import __version__
    from omnigym.track.files import write_fault

    metadata["omnigym"] = __version__
    # Written beside the target and renamed over it: a reader never sees half a file, and a
    # failed export (or one that disagrees with the checkpoint) leaves what was there.
    # (Named by process id rather than by mkstemp, whose file is private: the policy keeps the umask's permissions.)
    # Beside --out itself, not beside what a symlink there points to: os.replace replaces the
    # link, and a link to another file system (or into the run) must not put the temporary there.
    tmp = Path(os.path.abspath(out)).with_name(f".{out.name}.{os.getpid()}.tmp")
    # written into its own run, export is one of the run's writers: not while the run trains
    lock = RunLock(Path(run_dir))
    if Path(run_dir).resolve() in tmp.resolve().parents:
        lock.acquire()
    try:
        with warnings.catch_warnings(), torch.no_grad(), write_fault(out):
            warnings.simplefilter("ignore")  # the exporters' deprecation and tracer chatter
            (write_onnx if fmt == "onnx" else write_torchscript)(policy, example, metadata, tmp)
        differs = mismatch(load_exported(tmp, fmt), reference, inputs, isinstance(action_space, gym.spaces.Discrete),
                           env_observations=observations)
        if differs:
            raise OmnigymError(f"the exported {fmt} policy does not reproduce the checkpoint's: {differs} on "
                               f"{len(inputs)} probe observations; nothing written")
        place(tmp, out, force)
    finally:
        tmp.unlink(missing_ok=True)
        lock.release()
    return {"path": str(out), "bytes": out.stat().st_size, "probes": len(inputs), **metadata}
