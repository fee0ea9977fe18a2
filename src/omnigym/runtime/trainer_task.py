"""The trainer itself on Ray (``--ray-trainer``): the command's process starts the run as a
Ray task and waits for it.

With ``--runtime ray`` the generators (or rollout workers) are Ray actors; ``--ray-trainer``
puts the trainer beside them, in a worker process Ray places: on a cluster
(``RAY_ADDRESS=...``), a node with ``--trainer-gpus`` GPUs free, as OpenRLHF and verl place
their actor model. The run is the same run, bit for bit (tested): the task calls the same
``train(cfg)`` in the trainer's working directory, and the generators it starts are actors
of that task. What the task prints reaches this process through Ray's log forwarding. An
error in it is one line here; Ctrl-C here interrupts the task (a run without a checkpoint is
put back as it was) and says how to resume one that has a checkpoint.
"""

from __future__ import annotations

import importlib
import os
import time

IN_TRAINER_TASK = "OMNIGYM_TRAINER_TASK"
"""set in the trainer task's environment: there ``train(cfg)`` runs the run itself"""
CANCEL_WAIT = 120.0
"""seconds Ctrl-C waits for the interrupted trainer to put its run directory in order"""
LOG_FLUSH = 2.0
"""seconds for Ray's log forwarding to deliver the task's last lines (the run's closing
lines) before this process goes on or exits"""


def inside_trainer_task() -> bool:
    return os.environ.get(IN_TRAINER_TASK) == "1"


def run_trainer(module_name: str, cfg, cwd: str, call):
    """What the Ray task runs: the algorithm's ``train(cfg)``, from the trainer's folder, as the
    same call (the flags the user gave, the directory decided for the run)."""
    os.chdir(cwd)
    return importlib.import_module(module_name).train(cfg, call=call)


def train_on_ray(module_name: str, cfg, call):
    """Run ``module.train(cfg)`` as a Ray task with one CPU and ``cfg.trainer_gpus`` GPUs;
    returns its summary. Starts a local cluster for the run unless one is already joined.
    ``call`` is this process's ``TrainCall``: the task gets a fresh one with what the caller
    gave and the run directory, decided here so that an interrupted run can be named."""
    from omnigym.runtime.cluster import init_ray
    from omnigym.runtime.ray_actors import THREAD_ENV, _ray, remote_error
    from omnigym.track.run import TrainCall

    ray = _ray()
    algo = module_name.rsplit(".", 1)[-1]
    run_dir = call.run_dir_for(cfg, algo, getattr(cfg, "env_id", None) or cfg.model)
    task_call = TrainCall(given_flags=call.given_flags, run_dir=call.run_dir)
    owns_ray = not ray.is_initialized()
    if owns_ray:  # joins --ray-address / RAY_ADDRESS; a local Ray: the trainer and each generator take one CPU
        init_ray(cfg.ray_address, max(cfg.num_generators + 2, os.cpu_count() or 1), THREAD_ENV)
    task = ray.remote(run_trainer).options(num_cpus=1, num_gpus=cfg.trainer_gpus, max_retries=0,
                                           runtime_env={"env_vars": {**THREAD_ENV, IN_TRAINER_TASK: "1"}})
    ref = task.remote(module_name, cfg, os.getcwd(), task_call)
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as error:
        raise remote_error(error, "the trainer task") from None
    except KeyboardInterrupt:
        ray.cancel(ref)  # a KeyboardInterrupt in the task: it tidies its run as a Ctrl-C would
        try:
            ray.get(ref, timeout=CANCEL_WAIT)
        except Exception:  # cancelled, as asked
            pass
        raise TrainerInterrupted(interrupted_state(algo, run_dir)) from None
    finally:
        time.sleep(LOG_FLUSH)
        if owns_ray and ray.is_initialized():
            ray.shutdown()


class TrainerInterrupted(KeyboardInterrupt):
    """Ctrl-C while the trainer ran on Ray; ``where`` says where its run stands."""

    def __init__(self, where: str):
        super().__init__(where)
        self.where = where


def interrupted_state(algo: str, run_dir: str) -> str:
    from omnigym.track.checkpoint import CHECKPOINT_NAME

    if os.path.exists(os.path.join(run_dir, CHECKPOINT_NAME)):
        return f"continue with: omnigym train {algo} --resume {run_dir}"
    return "no checkpoint was written yet, so there is nothing to resume; the run directory was put back as it was"

