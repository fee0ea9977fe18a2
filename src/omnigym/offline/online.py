"""Offline -> online: ``omnigym train ALGO --resume-online RUN_DIR --online-steps N`` continues a
finished offline run of ALGO (td3_bc, iql, cql; cql --calibrated is Cal-QL) in its live env, in a
new run directory (the offline run is never changed).

The new run starts from the offline run's networks, optimizers (and schedules), with its settings
(those given now win, except the ones its networks and data depend on: the dataset, the env, the
widths, which are refused when they differ). Each step it plays one env step with the method's
exploring policy and stores it in a second ``ReplayBuffer`` (the replay seam's; it is the run's
own, checkpointed), then (after ``--warmup-steps``: WSRL's warm-up, steps played with the offline
policy and stored before any update) takes one gradient step of the method's own update, the same loss as
offline (CORL's finetune scripts: IQL, CQL and Cal-QL keep their offline losses online), on a batch
that mixes the two: ``--mixing-ratio`` (0.5, CORL's and Cal-QL's) of it from the dataset, the rest
from the online steps. The dataset's buffer is read again from the dataset on ``--resume``, as
offline; the online buffer, the env mid-episode and the RNGs are in the checkpoint, so a resumed
online run logs the same numbers as one never stopped.

Steps (``global_step``, ``--eval-every``, ``--log-every``, ``--checkpoint-every``) count env steps
here; the run logs the episodes it plays (``charts/episodic_return``) and at step 0 and every
``--eval-every`` the greedy policy's evaluation with its normalized score, as offline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np
import torch

from omnigym.envs.goal import network_view
from omnigym.errors import OmnigymError, a_run, require, shown_value
from omnigym.offline.datasets import Evaluator, OfflineData
from omnigym.offline.training import finish_offline_run
from omnigym.rl.losses import check_finite
from omnigym.rl.replay import Replay, ReplayBuffer
from omnigym.track.episodes import EpisodeStats
from omnigym.track.progress import Clock, ProgressBar, crossed_multiple
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import Run, current_call

OWN_SETTINGS = ("run_dir", "resume", "overwrite", "resume_online", "online_steps", "mixing_ratio", "warmup_steps", "seed",
                "total_timesteps", "eval_every", "log_every", "checkpoint_every", "eval_episodes", "print_episodes",
                "progress", "plot", "tensorboard", "wandb", "device", "torch_threads")
"""what an online run does not take from the offline one: where and how it runs, and its step counts
(env steps now, gradient steps there)"""


ONLINE_ALGOS = ("cql", "iql", "td3_bc")
"""the offline algorithms with an online phase (their configs take ``OnlineFlags``)"""


@dataclass
class OnlineFlags:
    """The flags of offline -> online fine-tuning (an offline algorithm's config takes them in)."""

    resume_online: str | None = None
    """continue this finished offline run of the same algorithm in its env, as a new run (docs/offline.md)"""
    online_steps: int = 0
    """with --resume-online: env steps to train online (one gradient step each)"""
    mixing_ratio: float = 0.5
    """with --resume-online: the fraction of each batch drawn from the dataset (the rest: online steps)"""
    warmup_steps: int = 0
    """with --resume-online: env steps played with the offline policy before the first update (WSRL's
    warm-up; WSRL then learns from online steps only: --mixing-ratio 0)"""

    RESUME_FIXED: ClassVar[tuple[str, ...]] = ("resume_online", "online_steps", "warmup_steps")

    def spent_budget(self, run_dir, algo: str) -> str | None:
        """An online run that ran all its steps cannot be made longer (they are fixed for the run):
        "give a larger --total-timesteps" was refused when followed."""
        if not self.resume_online:
            return None
        return (f"{run_dir} has run all its --online-steps ({self.online_steps}), which are fixed for an online run; "
                f"{longer_online(algo, self.resume_online)}")

    def resume_refusal(self) -> str | None:
        """``--resume OFFLINE_RUN --online-steps N``: the way online is --resume-online, which the
        line "made with --online-steps 0" did not say (track/resume.py asks before its own lines)."""
        if self.resume and self.online_steps and not self.resume_online:
            return (f"--resume continues {self.resume} as it was made; an offline run goes online as a new run: give "
                    f"--resume-online {self.resume} --online-steps {self.online_steps} in place of --resume")
        return None

    def check_online(self) -> None:
        refusal = self.resume_refusal()
        require(refusal is None, str(refusal))
        require(self.online_steps >= 0, f"--online-steps must be positive, got {self.online_steps}")
        require(0 <= self.mixing_ratio < 1, f"--mixing-ratio must be in [0, 1) (the dataset's share of each batch), "
                                            f"got {self.mixing_ratio}")
        require(not self.resume_online or self.online_steps > 0,
                "--resume-online needs --online-steps N: how many env steps to train online")
        require(self.resume_online or not self.online_steps,
                "--online-steps is for --resume-online RUN_DIR (an offline run to continue online)")
        require(self.resume_online or not self.warmup_steps,
                "--warmup-steps is for --resume-online RUN_DIR (an offline run to continue online)")
        require(0 <= self.warmup_steps < max(self.online_steps, 1),
                f"--warmup-steps must be in [0, --online-steps) (env steps before the first update), "
                f"got {self.warmup_steps} with --online-steps {self.online_steps}")


def online_settings(cfg, algo: str):
    """``cfg`` for a new online run (the offline run's settings under the ones given now) and the
    offline run's checkpoint; ``(cfg, None)`` for an offline run or a resumed online one. Refuses
    in one line, before anything is written: no run there, another algorithm's, an online run, an
    unfinished one, or a setting its networks or data cannot take."""
    if not cfg.resume_online:
        return cfg, None
    if cfg.resume:  # a resumed online run: its own settings (config.json), its steps counted online
        # (its config.json holds --total-timesteps equal to --online-steps: another was given now; the
        # default is what a config made in Python without it holds)
        default = next(f.default for f in dataclasses.fields(cfg) if f.name == "total_timesteps")
        require(cfg.total_timesteps in (cfg.online_steps, default),
                f"--total-timesteps {cfg.total_timesteps} does not apply to an online run: its length is its "
                f"--online-steps ({cfg.online_steps}), fixed for the run; {longer_online(algo, cfg.resume_online)}")
        return dataclasses.replace(cfg, total_timesteps=cfg.online_steps), None
    from omnigym.config import config_from_dict
    from omnigym.track.checkpoint import Checkpointer
    from omnigym.track.files import CONFIG_NAME, load_config_dict

    source = Path(cfg.resume_online)
    label = f"--resume-online {source}"
    try:
        saved = load_config_dict(source)
    except OmnigymError as exc:
        raise OmnigymError(f"{label}: {exc}") from None
    made_by = saved.get("algo")
    if "dataset" not in saved:
        raise OmnigymError(f"{label} is {a_run(made_by)}, not an offline one; --resume-online continues an offline run "
                           f"(omnigym train {algo} --dataset ...)")
    if made_by != algo:
        if made_by not in ONLINE_ALGOS:  # bc has no online phase: naming it would be advice that fails
            raise OmnigymError(f"{label} is {a_run(made_by)}, which has no online phase; --resume-online continues "
                               f"{', '.join(ONLINE_ALGOS)} runs by their own algorithm")
        raise OmnigymError(f"{label} is {a_run(made_by)}; continue it online with: omnigym train {made_by} "
                           f"--resume-online {source} --online-steps {cfg.online_steps}")
    if saved.get("resume_online"):
        raise OmnigymError(f"{label} is an online run already; continue it with: omnigym train {algo} "
                           f"--resume {source}")
    if cfg.run_dir and Path(cfg.run_dir).resolve() == source.resolve():
        raise OmnigymError(f"{label}: the online run is a new run; give another --run-dir (the offline run is kept "
                           "as it is)")
    offline = config_from_dict(type(cfg), saved, str(source / CONFIG_NAME))
    checkpoint = Checkpointer(source)
    require(checkpoint.exists(), f"{label} has no checkpoint; finish it first: omnigym train {algo} --resume {source}")
    state = checkpoint.load()
    done = state["counters"].get("global_step", 0)
    if done < offline.total_timesteps:
        from omnigym.track.lock import RunLock, holder_of

        unfinished = f"{label} has not finished (gradient step {done} of {offline.total_timesteps})"
        probe = RunLock(source)
        try:  # a run training now: --resume, the advice below, would be refused by its lock
            probe.acquire()
        except OmnigymError:
            raise OmnigymError(f"{unfinished} and is training now ({holder_of(probe.path)}); wait for it to end, "
                               "then run this again") from None
        finally:
            probe.release()
        raise OmnigymError(f"{unfinished}; finish it first: omnigym train {algo} --resume {source}")
    given = current_call().given_flags
    if given is None:  # from Python: the fields away from their defaults count as given
        given = {f.name for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING
                 and getattr(cfg, f.name) != f.default}
    for name in cfg.RESUME_FIXED:
        if name in given and name not in OWN_SETTINGS and getattr(cfg, name) != getattr(offline, name):
            raise OmnigymError(f"{label} was trained with --{name.replace('_', '-')} {shown_value(getattr(offline, name))}, "
                               f"not {shown_value(getattr(cfg, name))}; the online run continues its networks on its data "
                               "(leave the flag out)")
    require("total_timesteps" not in given or cfg.total_timesteps == cfg.online_steps,  # it was dropped in silence
            f"--total-timesteps {cfg.total_timesteps} does not apply to an online run: its length is its "
            f"--online-steps ({cfg.online_steps}); leave it out")
    inherited = {f.name: getattr(offline, f.name) for f in dataclasses.fields(cfg)
                 if f.name not in given and f.name not in OWN_SETTINGS}
    return dataclasses.replace(cfg, **inherited, total_timesteps=cfg.online_steps), state


def load_offline_state(components: dict, state: dict) -> None:
    """The offline run's networks, optimizers and schedules into the new run's ``components``
    (not its data sampler, statistics or log: the online run has its own). An optimizer keeps
    the learning rate this run was configured with (``--policy-lr`` given now is used; a loaded
    optimizer state would bring back the offline one), unless a schedule drives it (IQL's actor:
    the schedule goes on where it was)."""
    learned = (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    scheduled = {id(c.optimizer) for c in components.values() if isinstance(c, torch.optim.lr_scheduler.LRScheduler)}
    for name, component in components.items():
        if isinstance(component, learned) and name in state["components"]:
            keep_rate = isinstance(component, torch.optim.Optimizer) and id(component) not in scheduled
            configured = [group["lr"] for group in component.param_groups] if keep_rate else []
            component.load_state_dict(state["components"][name])
            for group, lr in zip(component.param_groups if keep_rate else (), configured):
                group["lr"] = lr


def longer_online(algo: str, offline_run) -> str:
    return (f"to train online for longer, start another online run from the offline one: omnigym train {algo} "
            f"--resume-online {offline_run} --online-steps N")


def online_capacity(cfg) -> int:
    """The online replay buffer's size: twice the steps, room for every frame even if each episode
    lasted one step (an episode start stores two). ``collect --from-replay`` reads it back with it."""
    return 2 * cfg.online_steps


def train_online(cfg, algo: str, run: Run, data: OfflineData, evaluator: Evaluator, components: dict,
                 update: Callable[[dict, int], dict], act: Callable, explore: Callable, source: dict | None,
                 reward: Callable = lambda r: r, on_step: Callable | None = None) -> dict:
    """``cfg.online_steps`` env steps of ``explore(normalized obs tensor) -> actions`` with one
    ``update(mixed batch, step)`` each; ``act`` is the greedy policy evaluations play; ``reward``
    maps env rewards to what the method learns from (the offline run's scaling); ``on_step(buffer,
    episode_over)`` hears of each online transition stored (Cal-QL's returns-to-go)."""
    from omnigym.envs.cursor import EnvCursor
    from omnigym.envs.vector import make_vec, parse_env_kwargs

    device = torch.device(cfg.device)
    try:
        envs = make_vec(data.env_id, 1, backend="sync", seed=cfg.seed, **parse_env_kwargs(cfg.env_kwargs))
    except BaseException:
        evaluator.close()
        raise
    online = ReplayBuffer(online_capacity(cfg), data.observation_space.shape, data.action_space.shape,
                          action_dtype=np.float32)
    replay = Replay(online, cfg.seed, save_buffer=True)  # the online steps are the run's own: checkpointed
    to_network = network_view(envs.single_observation_space)[1]  # a goal env's Dicts: observation ++ goal

    def prepare(obs):
        return data.obs_stats(to_network(obs))

    cursor = EnvCursor(envs, cfg.seed, prepare=prepare)
    stats = EpisodeStats(cfg.print_episodes)
    components = {**components, "obs_stats": data.obs_stats, "replay": replay, "episodes": stats, "envs": cursor}
    try:
        if source is not None:  # a new online run starts from the offline one; a resumed one from its own checkpoint
            load_offline_state(components, source)
        counters = run.begin(components)
    except BaseException:
        evaluator.close()
        cursor.close()
        raise
    step = counters.get("global_step", 0)
    from_dataset = int(cfg.batch_size * cfg.mixing_ratio)
    low, high = data.action_space.low, data.action_space.high
    losses: dict[str, torch.Tensor] = {}
    last_eval: dict = {}
    progress = ProgressBar(cfg.online_steps, f"{algo} online", start=step, enabled=cfg.progress)
    clock = Clock(step)
    try:
        if step == 0:  # where the offline policy starts from
            last_eval = evaluator(act, 0)
            run.log(0, last_eval)
        while step < cfg.online_steps:
            obs = cursor.obs
            with torch.no_grad():
                actions = explore(torch.as_tensor(obs, device=device)).cpu().numpy().clip(low, high)
            next_obs, rewards, terminated, truncated, info, valid = cursor.step(actions)
            stats.add(info, step + int(valid.sum()))
            if not valid.any():  # the autoreset step after an episode's end: no transition
                continue
            online.add(obs, actions, reward(rewards.astype(np.float32)), prepare(next_obs), terminated)
            if on_step is not None:
                on_step(online, bool(terminated[0] or truncated[0]))
            previous_step, step = step, step + 1
            if previous_step >= cfg.warmup_steps:  # WSRL: the first steps only fill the online buffer
                losses = update(mixed_batch(data.buffer, online, cfg.batch_size, from_dataset, replay.rng, device),
                                previous_step - cfg.warmup_steps)
            done = step >= cfg.online_steps
            metrics = stats.drain()
            if crossed_multiple(step, previous_step, cfg.log_every) or done:
                values = {k: v.item() for k, v in losses.items()}
                check_finite(torch.tensor(sum(values.values())), step)  # a poisoned run is never saved
                metrics.update({**values, "perf/sps": clock.sps(step)})
            if crossed_multiple(step, previous_step, cfg.eval_every) or done:
                last_eval = evaluator(act, step)
                metrics.update(last_eval)
            if metrics:
                run.log(step, metrics)
            progress.update(step, sps=int(clock.sps(step)), **stats.shown())
            if done or checkpoint_due(step, previous_step, cfg.checkpoint_every):
                run.save(components, global_step=step)
    finally:
        progress.close()
        evaluator.close()
        cursor.close()
    return finish_offline_run(cfg, run, data, step, last_eval, when=f" after {step} online steps")


def mixed_batch(dataset: ReplayBuffer, online: ReplayBuffer, size: int, from_dataset: int, rng, device) -> dict:
    """``from_dataset`` transitions of the dataset and the rest of the online steps, one batch;
    ``online`` says which are which and ``index`` where each lies in its own buffer."""
    parts = [dataset.sample(from_dataset, rng, with_index=True)] if from_dataset else []
    parts.append(online.sample(size - from_dataset, rng, with_index=True))
    batch = {k: torch.cat([p[k] for p in parts]) for k in parts[-1]}
    batch["online"] = torch.arange(size) >= from_dataset
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
