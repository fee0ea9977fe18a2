"""Process-wide settings a run needs, scoped to the run.

``omnigym.cli`` is the entry point and the only place that changes the process for good
(threads of a fresh process, transformers' progress bars). A ``train()`` called from
Python instead gets ``run_scope``: it seeds python, numpy and torch, sets torch's
thread count for the run and flushes denormal floats to zero (``optim.flush_denormals``),
and puts all of them back when the run returns or fails, so the caller's process is left
as it was found. A run with a data-parallel ``--backend``
joins the processes ``torchrun`` started first (``distributed.py``); only the first of them writes.
What belongs to one run and not to the process (the flags given, the preset line, the run
directory, the run itself) travels in that call's ``TrainCall`` (``track/run.py``).
"""

from __future__ import annotations

import copy
import functools
import random
from contextlib import contextmanager

import numpy as np
import torch

from omnigym.optim import flush_denormals


@contextmanager
def run_scope(seed: int, torch_threads: int = 0):
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state(), torch.get_num_threads())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    # on one thread (the default): torch's OpenMP threads would not all follow the setting, so
    # with more a tensor op would flush in some chunks and not in others, during the run and after
    flushing = flush_denormals() if torch.get_num_threads() == 1 else None
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if torch.get_num_threads() != saved[3]:
            torch.set_num_threads(saved[3])
        if flushing is not None:
            flush_denormals(flushing)  # a run inside a run (a demo's stages) leaves the outer one as it was


def abandon_surely(run) -> None:
    """``run.abandon()``, again if a second Ctrl-C lands before it holds the signals (its first
    line is a place Python runs a handler): what it did already is not done twice."""
    for _ in range(3):
        try:
            run.abandon()
            return
        except KeyboardInterrupt:
            continue


def scoped_run(train):
    """Decorator for an algorithm's ``train(cfg)``: applies a control run's preset, checks the config
    (``cfg.check()``: every flag's range, before anything is built), runs it inside
    ``run_scope(cfg.seed, cfg.torch_threads)``, and undoes a run that fails or is interrupted
    before its first checkpoint (``Run.abandon``).

    ``train(cfg, call=TrainCall(...))`` is how a caller says what is not in the config (the
    CLI: which flags the user gave) and learns what the run decided (its directory, the run
    itself while it is under way); without one, the call gets its own. The run trains on a
    copy of ``cfg``: the caller's config is never changed."""

    @functools.wraps(train)
    def wrapper(cfg, *, call=None):
        from omnigym.track.run import TrainCall, within_call

        call = TrainCall() if call is None else call
        given = cfg
        cfg, call.preset_line = cfg.apply_preset(call.given_flags)  # control runs: the env family's hyperparameters
        cfg = copy.copy(cfg)  # whatever the run does to its config stays out of the caller's
        cfg.check()
        with within_call(call):
            if cfg.trains_on_ray():  # --ray-trainer: this very call, as a Ray task
                from omnigym.runtime.trainer_task import inside_trainer_task, train_on_ray

                if not inside_trainer_task():  # the task applies the preset and checks again, as here
                    return train_on_ray(train.__module__, given, call)
            if cfg.data_parallel():  # checked: torchrun started us
                from omnigym.distributed import init_process_group

                init_process_group(cfg.device)
            with run_scope(cfg.seed, cfg.torch_threads):
                try:
                    return train(cfg)
                except BaseException:  # an error or Ctrl-C: a run without a checkpoint is undone
                    run = call.run or call.started  # started, not yet begun: only stages set aside to put back
                    if run is not None:
                        abandon_surely(run)
                    raise
                finally:  # the run directory's lock goes however train() ends (start_run took it)
                    call.release_lock()

    return wrapper
