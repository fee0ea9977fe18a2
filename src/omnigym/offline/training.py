"""The loop every offline algorithm runs: sample a batch from the dataset's replay buffer, take the
algorithm's update on it, and every so often log the losses, evaluate in the env (return and D4RL
normalized score) and checkpoint. The algorithm files (algos/control/bc.py, td3_bc.py, iql.py) hold
their networks and their update; this holds what they share, as ``track/`` does for the online ones.

A checkpoint holds the networks and optimizers (the algorithm's components), the observation
statistics, the replay sampler's random stream and the RNGs: a resumed run samples the same
batches and logs the same numbers. The dataset is read again on resume (it is not copied into
the checkpoint); ``--dataset`` is fixed for a run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from omnigym.config import check_compiler, check_precision, compiled
from omnigym.envs.goal import GoalLayout, network_view
from omnigym.errors import OmnigymError
from omnigym.offline.datasets import Evaluator, ObservationStats, OfflineConfig, OfflineData, load_offline_data
from omnigym.rl.losses import check_finite
from omnigym.rl.replay import Replay
from omnigym.track.progress import Clock, ProgressBar, crossed_multiple
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import Run, start_run


@dataclass
class UpdateFlags:
    """How an offline algorithm's gradient step computes (iql, td3_bc, bc take these flags)."""

    precision: str = "fp32"
    """fp32, or bf16: the networks' matrix products in bfloat16 (autocast); their weights, gradients,
    Adam's state and the losses stay float32. Faster where the CPU has AVX512-BF16 or AMX (and on GPUs),
    slower where bf16 is emulated (docs/offline.md, "Faster updates")"""
    compile: bool = False
    """compile the update's forward pass and losses (and so their backward) with torch.compile: 12-25 s
    to build on a cold cache; needs a C++ compiler on CPU (docs/offline.md, "Faster updates")"""

    def check_update(self) -> None:
        check_precision(self.precision)
        if self.compile:
            check_compiler(self.device)


def update_objective(cfg: UpdateFlags, objective: Callable) -> Callable:
    """``objective(*tensors) -> (loss, metrics)``, an update's forward pass and losses, in
    ``--precision`` and compiled with ``--compile``. The backward and the optimizer steps stay
    outside it: autocast is for the forward (its backward runs in the dtypes the forward chose), and
    a compiled optimizer step would be rebuilt each time a learning-rate schedule moves."""
    if cfg.precision == "bf16":
        device_type, plain = torch.device(cfg.device).type, objective

        def objective(*tensors):
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return plain(*tensors)
    if not cfg.compile:
        return objective
    # One graph per objective: the batch's shapes never change within a run (dynamic=False).
    return compiled(objective, dynamic=False, what="the update")


def start_offline_run(cfg: OfflineConfig, algo: str, top_fraction: float = 1.0) -> tuple[OfflineData, Evaluator, Run]:
    """The dataset read and checked, the env to evaluate in made, then the run directory: a
    refusal (a dataset for another env, no actions, ...) leaves nothing written."""
    data = load_offline_data(cfg, algo, top_fraction)
    cfg.env_id = data.env_id  # config.json records the env the run was evaluated in
    if Path(cfg.dataset).expanduser().is_dir():  # and a folder where it is: a resume from elsewhere found none
        cfg.dataset = os.path.abspath(Path(cfg.dataset).expanduser())
    evaluator = Evaluator(cfg, data)
    try:
        run = start_run(cfg, algo, cfg.env_id)
    except BaseException:
        evaluator.close()
        raise
    print(f"dataset: {cfg.dataset} ({data.episodes} episodes, {data.transitions} steps of {data.env_id}, mean return "
          f"{data.returns.mean():.1f})" + ("" if data.ref_max_score is not None else "; it has no reference returns, "
                                          "so no normalized score is logged (docs/offline.md)"), flush=True)
    return data, evaluator, run


class DatasetIdentity:
    """What a run's checkpoint says of the dataset it trained on: a resume on a dataset changed
    since (``omnigym collect --overwrite`` into the same id) is refused, as its numbers would not
    go on where they stopped."""

    def __init__(self, cfg: OfflineConfig, data: OfflineData):
        self.dataset = cfg.dataset
        self.shape = {"episodes": int(data.episodes), "transitions": int(data.transitions),
                      "return_sum": float(np.sum(data.returns))}

    def state_dict(self) -> dict:
        return dict(self.shape)

    def load_state_dict(self, saved: dict) -> None:
        if saved != self.shape:  # the same dataset read again sums its returns to the same float
            raise OmnigymError(f"--dataset {self.dataset} has changed since this run trained on it ({saved['episodes']} "
                               f"episodes, {saved['transitions']} transitions then; {self.shape['episodes']} and "
                               f"{self.shape['transitions']} now): the run cannot go on where it stopped; start a new "
                               "run on it")


def train_offline(cfg: OfflineConfig, algo: str, run: Run, data: OfflineData, evaluator: Evaluator,
                  components: dict, update: Callable[[dict, int], dict], act: Callable) -> dict:
    """Run ``update(batch, step) -> {metric: tensor}`` for ``--total-timesteps`` gradient steps;
    ``act(normalized obs) -> actions`` is the policy evaluations play."""
    device = torch.device(cfg.device)
    replay = Replay(data.buffer, cfg.seed, save_buffer=False)  # the dataset is read again on resume
    components = {**components, "obs_stats": data.obs_stats, "replay": replay}
    identity = DatasetIdentity(cfg, data)
    try:
        if run.saved and "dataset" in run.saved["components"]:  # checkpoints from before it was kept have none
            identity.load_state_dict(run.saved["components"]["dataset"])
        counters = run.begin(components)  # restores the checkpoint when resuming
    except BaseException:
        evaluator.close()
        raise
    components["dataset"] = identity  # saved with every checkpoint from now on
    step = counters.get("global_step", 0)
    losses: dict[str, torch.Tensor] = {}
    last_eval: dict = {}
    progress = ProgressBar(cfg.total_timesteps, algo, start=step, enabled=cfg.progress)
    clock = Clock(step)
    try:
        while step < cfg.total_timesteps:
            batch = {k: v.to(device, non_blocking=True)
                     for k, v in data.buffer.sample(cfg.batch_size, replay.rng, with_index=True).items()}
            losses = update(batch, step)
            previous_step, step = step, step + 1
            done = step >= cfg.total_timesteps
            metrics = {}
            if crossed_multiple(step, previous_step, cfg.log_every) or done:
                metrics.update({k: v.item() for k, v in losses.items()})
                # NaN weights make every later loss NaN: a poisoned run is never saved
                check_finite(torch.tensor(sum(metrics.values())), step)
                metrics["perf/sps"] = clock.sps(step)  # gradient steps per second
            if crossed_multiple(step, previous_step, cfg.eval_every) or done:
                last_eval = evaluator(act, step)
                metrics.update(last_eval)
            if metrics:
                run.log(step, metrics)
            progress.update(step, sps=int(clock.sps(step)), **evaluation_shown(last_eval))
            if done or checkpoint_due(step, previous_step, cfg.checkpoint_every):
                run.save(components, global_step=step)
    except BaseException:  # SIGTERM or an error: its line said 100% of a total it never reached
        progress.close(finished=False)
        raise
    finally:
        evaluator.close()
    progress.close()
    return finish_offline_run(cfg, run, data, step, last_eval)


def finish_offline_run(cfg, run: Run, data: OfflineData, step: int, last_eval: dict, when: str = "") -> dict:
    """Close the run (its curve of the normalized score, else the return), say where it is and
    its final score (``when``: e.g. " after N online steps"), and return the summary."""
    main = "eval/normalized_score" if data.ref_max_score is not None else "eval/episodic_return"
    plot_path = run.close(plot=cfg.plot, metric=main)
    what = (f"final {'D4RL normalized score' if main == 'eval/normalized_score' else 'evaluation return'} "
            f"(mean of {cfg.eval_episodes} episode{'s' * (cfg.eval_episodes != 1)})")
    shown = f"{last_eval[main]:.1f}" if main in last_eval else "not evaluated"
    run.say(f"run: {run.dir}", *([f"learning curve: {plot_path}"] if plot_path else []), f"{what}{when}: {shown}")
    return {"run_dir": str(run.dir), "global_step": step, **last_eval, "plot": str(plot_path) if plot_path else None}


def evaluation_shown(last_eval: dict) -> dict:
    """The progress line's figure of the last evaluation, named for what it is: D4RL's normalized
    score where the dataset has reference returns, else the evaluation episodes' mean return."""
    if "eval/normalized_score" in last_eval:
        return {"norm_score": last_eval["eval/normalized_score"]}
    return {"eval_ret": last_eval.get("eval/episodic_return")}  # None before the first evaluation: left out


def offline_policy(actor: torch.nn.Module, components: dict):
    """A checkpointed offline actor as ``obs batch (numpy) -> actions (numpy)`` for ``omnigym
    eval`` and ``omnigym collect``: observations standardized as in training first."""
    if "obs_stats" not in components:
        raise OmnigymError("the checkpoint has no observation statistics; it is not an offline run's")
    stats = ObservationStats(np.zeros(1), np.ones(1))
    stats.load_state_dict(components["obs_stats"])
    actor.load_state_dict(components["actor"])

    @torch.inference_mode()
    def policy(obs):
        if isinstance(obs, dict):  # a goal env's observations, as the networks saw them in training
            obs = GoalLayout.network_input(obs)
        return actor(torch.as_tensor(stats(obs))).numpy()

    return policy


def network_obs_dim(envs) -> int:
    """The width of the observations an offline run's networks take in ``envs`` (a goal env's:
    ``observation ++ desired_goal``)."""
    return network_view(envs.single_observation_space)[0].shape[0]
