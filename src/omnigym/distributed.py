"""The processes of a data-parallel run (``torchrun``): who they are, and what they share.

Every process runs the whole command; only the first writes the run directory and prints.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_process_group(device: str) -> None:
    """Join the processes ``torchrun`` started (once per process)."""
    if dist.is_initialized():
        return
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def leave_process_group() -> None:
    """At the end of a command under torchrun: the process group torn down before the interpreter
    exits. Left to exit, a gloo thread can be destroyed still running, and the process aborts
    ("terminate called without an active exception", exit -6) after its work is done, which
    torchrun reports as a failed run (seen once in a full test run)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Only the first process writes the run directory and prints."""
    return rank() == 0


def broadcast(value):
    """The first process's ``value`` in every process (a run directory named by the clock)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gathered(value) -> list:
    """Every process's ``value``, in rank order (``[value]`` in a run of one process): what each
    process measured on its share of a batch, for metrics of the whole batch."""
    if not (dist.is_available() and dist.is_initialized()):
        return [value]
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def share_random_state() -> None:
    """The first process's torch, numpy and python random states in every process."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    import random

    import numpy as np

    states = broadcast((torch.get_rng_state(), np.random.get_state(), random.getstate()))
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])
