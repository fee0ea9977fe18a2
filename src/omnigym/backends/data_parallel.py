"""Data-parallel training under ``torchrun``: DDP or FSDP2 (gloo on CPU, NCCL on GPU).

Every process runs the whole algorithm file with the same seed, so each one draws the same
global batch; the backend hands each process its rows and their share of the global batch
(``local_part``: rows, or loss tokens for a token-mean loss), which the algorithm passes back.
The backend scales the local loss by ``share * world_size`` before backward; since DDP and
FSDP2 average gradients over the processes, the step is the step of the global batch's
loss, as one process would take it, up to float rounding (tests/test_data_parallel.py
measures it). Logged statistics are share-weighted sums over the processes, so they read
as one process's too.

Checkpoints hold whole tensors in the single-process layout (``LocalBackend.state_dict``):
FSDP2 gathers them (``torch.distributed.checkpoint.state_dict``, full state dict) and its
optimizer state is turned from parameter names into positions, so a distributed run
resumes in one process, and a single-process run resumes on several.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

import torch
import torch.distributed as dist

from omnigym.backends.base import part_of_process
from omnigym.backends.local import frozen


MODES = ("ddp", "fsdp2")


class DataParallelBackend:
    def __init__(self, model: torch.nn.Module, make_optimizer, max_grad_norm: float | None = None,
                 mode: str = "ddp"):
        self.rank, self.world_size, self.mode = dist.get_rank(), dist.get_world_size(), mode
        self.max_grad_norm = max_grad_norm
        self.model = model
        """the module itself, for passes that take no gradient (every process makes them alike)"""
        if mode == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            # the layout of the whole model, without its weights, to export it from gathered ones
            self.skeleton = copy.deepcopy(model).to("meta")
            self.root = fully_shard(LossModule(model))  # shards the parameters in place
        else:
            on_gpu = next(model.parameters()).device.type == "cuda"
            self.root = torch.nn.parallel.DistributedDataParallel(
                LossModule(model), device_ids=[torch.cuda.current_device()] if on_gpu else None)
        self.optimizer = make_optimizer(model)
        self.names = self._names(self.optimizer)
        self._gather()

    def _names(self, optimizer) -> list[str]:
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]

    def _gather(self) -> None:
        """FSDP2: between updates the whole weights stay gathered, so that the algorithm's
        passes without gradient (evaluation, sampling, old log-probs) run on the plain model;
        the update itself (gradients, optimizer state) stays sharded."""
        if self.mode == "fsdp2":
            self.root.unshard()

    def local_part(self, rows, weights=None) -> tuple[list, float]:
        return part_of_process(rows, weights, self.rank, self.world_size)

    def forward_backward(self, batch, loss_fn, share: float | None = None) -> dict:
        share = 1.0 / self.world_size if share is None else float(share)
        loss, stats = self.root(loss_fn, batch)
        (loss * (share * self.world_size)).backward()
        return summed_stats({"loss": loss.detach(), **stats}, share)

    def optim_step(self) -> dict:
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        self.optimizer.step()
        self.optimizer.zero_grad()
        self._gather()
        return {} if grad_norm is None else {"grad_norm": grad_norm}

    def state_dict(self) -> dict:
        """Whole tensors, in the single-process layout (every process must call it)."""
        return {"model": self.model_state_dict(), "optimizer": self.optimizer_state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.load_model_state_dict(state["model"])
        self.load_optimizer_state_dict(state["optimizer"])

    # FSDP2's state-dict helpers work on the sharded root, whose names start with "model."

    def model_state_dict(self) -> dict:
        if self.mode == "ddp":
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        with self._sharded():
            whole = get_model_state_dict(self.root, options=_whole(cpu_offload=True))
        return {name.removeprefix("model."): tensor for name, tensor in whole.items()}

    def optimizer_state_dict(self) -> dict:
        """``torch.optim``'s layout (parameters by position); FSDP2's gathered state is keyed by
        parameter name."""
        if self.mode == "ddp":
            return self.optimizer.state_dict()
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        with self._sharded():
            by_name = get_optimizer_state_dict(self.root, self.optimizer, options=_whole(cpu_offload=True))
        if self.rank != 0:  # gathered into the first process only
            return {}
        position = {"model." + name: i for i, name in enumerate(self.names)}
        return {"state": {position[name]: state for name, state in by_name["state"].items()},
                "param_groups": [{**group, "params": [position[name] for name in group["params"]]}
                                 for group in by_name["param_groups"]]}

    def load_model_state_dict(self, state: dict) -> None:
        if self.mode == "ddp":
            self.model.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        with self._sharded():  # every process read the whole file: each keeps its shard
            set_model_state_dict(self.root, {"model." + k: v for k, v in state.items()}, options=_whole())

    def load_optimizer_state_dict(self, state: dict) -> None:
        if self.mode == "ddp":
            self.optimizer.load_state_dict(state)
            return
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        by_name = {"state": {"model." + self.names[i]: s for i, s in state["state"].items()},
                   "param_groups": [{**group, "params": ["model." + self.names[i] for i in group["params"]]}
                                    for group in state["param_groups"]]}
        with self._sharded():
            set_optimizer_state_dict(self.root, self.optimizer, by_name, options=_whole())

    @contextmanager
    def _sharded(self):
        """FSDP2's own layout (shards) for the time of an operation on it, gathered again after."""
        if self.mode == "fsdp2":
            self.root.reshard()
        try:
            yield
        finally:
            self._gather()

    def frozen_copy(self) -> torch.nn.Module:
        """A plain copy of the model as it is now, in every process (a reference model). FSDP2's
        hooks sit on the model's modules, and a deep copy would carry them along: a copy's
        state_dict would reshard the original. It is built from the skeleton instead."""
        if self.mode == "ddp":
            return frozen(copy.deepcopy(self.model))
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        with self._sharded():
            whole = get_model_state_dict(self.root, options=_whole())  # every process gets it all
        return frozen(rebuilt(self.skeleton, {k.removeprefix("model."): v for k, v in whole.items()}, self.model))

    def full_model(self) -> torch.nn.Module | None:
        """The trained model, whole, in the first process (None in the others); every process
        must call it (FSDP2 gathers the shards)."""
        if self.mode == "ddp":
            return self.model if self.rank == 0 else None
        whole = self.model_state_dict()
        if self.rank != 0:
            return None
        return rebuilt(self.skeleton, whole, self.model)



def rebuilt(skeleton: torch.nn.Module, state: dict, like: torch.nn.Module) -> torch.nn.Module:
    """A plain model from a weightless ``skeleton`` and a whole ``state``; buffers a state dict
    leaves out (rotary tables) come from the live model ``like``."""
    plain = copy.deepcopy(skeleton).to_empty(device=next(iter(state.values())).device)
    plain.load_state_dict(state, strict=False)
    live = dict(like.named_buffers())
    for name, buffer in plain.named_buffers():
        if name in live:
            buffer.copy_(live[name].to(buffer.device))
    return plain


def summed_stats(stats: dict, share: float) -> dict:
    """Each scalar statistic as the share-weighted sum over the processes: what one process
    would have measured on the whole batch (for means over rows or tokens)."""
    scalars = [k for k, v in stats.items() if torch.is_tensor(v) and v.numel() == 1]
    summed = torch.stack([stats[k].detach().float().reshape(()).cpu() for k in scalars]) * share
    on_gpu = dist.get_backend() == "nccl"
    summed = summed.to(torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    dist.all_reduce(summed)
    return {**stats, **{k: summed[i].cpu() for i, k in enumerate(scalars)}}


def _whole(cpu_offload: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)


class LossModule(torch.nn.Module):
    """The model and its loss as one module. DDP arms its gradient reduction, and FSDP2 gathers
    the weights, around a module's forward: with the loss inside it, a loss may reach into any
    part of the model (a reward model's backbone and head) and still be synchronised."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, loss_fn, batch):
        return loss_fn(self.model, batch)
