"""DeepSpeed ZeRO (stages 0-3) as a training backend, configured by its own JSON file.

DeepSpeed's engine holds the model and partitions the optimizer state (ZeRO-1), the
gradients (ZeRO-2) and the weights themselves (ZeRO-3) across the processes its launcher
(or torchrun) starts. omnigym keeps what the algorithm owns: the optimizer it builds, one
micro-batch per step, and gradient clipping at ``--max-grad-norm``; the config file says the
rest (stage, precision, offload to CPU, communication). As with DDP, each process trains its
rows weighed by their share, and the loss runs inside the engine's module
(``data_parallel.LossModule``).

ZeRO-3: between updates each process holds its partition of the weights only. The passes
without gradient (evaluation, the reference's and the old policy's log-probs, Hugging Face
``generate``) call the model's forward, on which DeepSpeed's hooks gather each layer's
weights for its own forward and free them after; nothing in the algorithms changes, and the
weights at rest stay partitioned. The one reader that takes weights without a forward, the
KV-cache sampler, asks ``whole_weights(model)`` (``backends/__init__.py``) for the time of one
batch: ``deepspeed.zero.GatheredParameters``. Every process makes these passes alike (they
are collectives), as every process already draws the same batch.

Checkpoints hold whole fp32 weights and the optimizer's moments in ``torch.optim``'s
layout, gathered with ``deepspeed.utils.safe_get_full_*``, so a DeepSpeed run of any stage
resumes in one process or under DDP/FSDP2 (or another stage, or another process count), and
the other way round.
"""

from __future__ import annotations

import copy
import json

import torch
import torch.distributed as dist

from omnigym.backends.base import part_of_process
from omnigym.backends.data_parallel import LossModule, rebuilt, summed_stats
from omnigym.backends.local import frozen
from omnigym.errors import OmnigymError

OWNED_BY_OMNIGYM = ("optimizer", "scheduler", "gradient_accumulation_steps", "gradient_clipping", "train_batch_size")


def read_config(path: str) -> dict:
    """The user's DeepSpeed config, checked: ZeRO 0-3, nothing that omnigym sets itself, offload
    only where the stage has the state it moves."""
    try:
        config = json.loads(open(path).read())
    except OSError as exc:
        raise OmnigymError(f"cannot read --deepspeed-config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise OmnigymError(f"--deepspeed-config {path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise OmnigymError(f"--deepspeed-config {path} must hold a JSON object")
    owned = [key for key in OWNED_BY_OMNIGYM if key in config]
    if owned:
        raise OmnigymError(f"--deepspeed-config {path} sets {', '.join(owned)}; omnigym sets those itself "
                           "(--learning-rate, --max-grad-norm, the batch flags): remove them from the file")
    zero = config.get("zero_optimization", {})
    stage = zero.get("stage", 0) if isinstance(zero, dict) else None
    if stage not in (0, 1, 2, 3):
        raise OmnigymError(f"--deepspeed-config {path} asks for ZeRO stage {stage}; DeepSpeed has stages 0-3")
    # said here, before the run directory is made, not by DeepSpeed once every process has started
    if offloaded(zero, "offload_param") and stage != 3:
        raise OmnigymError(f"--deepspeed-config {path} sets zero_optimization.offload_param with stage {stage}; "
                           "only ZeRO-3 partitions the weights it moves: set \"stage\": 3 "
                           "(configs/deepspeed/zero3-offload.json)")
    if offloaded(zero, "offload_optimizer") and stage == 0:
        raise OmnigymError(f"--deepspeed-config {path} sets zero_optimization.offload_optimizer with stage 0; "
                           "offload needs ZeRO stage 1, 2 or 3")
    return config


def offloaded(zero: dict, key: str) -> bool:
    """Whether the ``zero_optimization`` section moves ``key``'s state off the accelerator."""
    section = zero.get(key) if isinstance(zero, dict) else None
    return isinstance(section, dict) and section.get("device", "none") not in ("none", None)


class DeepSpeedBackend:
    def __init__(self, model: torch.nn.Module, make_optimizer, max_grad_norm: float | None, config_path: str):
        import deepspeed

        config = read_config(config_path)
        zero = config.setdefault("zero_optimization", {})
        self.stage = zero.get("stage", 0)
        config.update({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                       "gradient_clipping": max_grad_norm or 0.0})
        if offloaded(zero, "offload_optimizer"):
            # omnigym's optimizer is torch's AdamW; DeepSpeed refuses it with offload unless told
            # that the user knows (its own CPU Adam is faster: a compiled op this backend does not build)
            config.setdefault("zero_force_ds_cpu_optimizer", False)
        self.model, self.max_grad_norm = model, max_grad_norm
        self.skeleton = copy.deepcopy(model).to("meta")  # before DeepSpeed hooks the model's parameters
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        optimizer = make_optimizer(model)
        names = {id(p): n for n, p in model.named_parameters()}
        self.params = [(names[id(p)], p) for group in optimizer.param_groups for p in group["params"]]
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=LossModule(model), optimizer=optimizer,
                                                                 config=config, dist_init_required=False)

    def local_part(self, rows, weights=None) -> tuple[list, float]:
        return part_of_process(rows, weights, self.rank, self.world_size)

    def forward_backward(self, batch, loss_fn, share: float | None = None) -> dict:
        share = 1.0 / self.world_size if share is None else float(share)
        loss, stats = self.engine(loss_fn, batch)
        self.engine.backward(loss * (share * self.world_size))  # DeepSpeed averages over the processes
        return summed_stats({"loss": loss.detach(), **stats}, share)

    def optim_step(self) -> dict:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return {} if norm is None or self.max_grad_norm is None else {"grad_norm": torch.as_tensor(float(norm))}

    @staticmethod
    def _gathered(tensor: torch.Tensor, modifier_rank: int | None = None):
        """ZeRO-3: the whole ``tensor`` for the time of a block (with ``modifier_rank``: what that
        process writes into it is partitioned after); a no-op for a tensor DeepSpeed did not
        partition (any tensor at the other stages, a buffer)."""
        import deepspeed

        return deepspeed.zero.GatheredParameters([tensor] if hasattr(tensor, "ds_id") else [],
                                                 modifier_rank=modifier_rank)

    def _whole_model_state(self, fp32: bool, everywhere: bool = False) -> dict:
        """The model's state dict with whole tensors: the fp32 master weights where DeepSpeed
        keeps them (``fp32``), the working weights otherwise. A collective (every process must
        call it); one tensor is gathered at a time, and only the first process keeps them
        unless ``everywhere``, so that no other process ever holds the whole model."""
        from deepspeed.utils import safe_get_full_fp32_param

        keep = everywhere or self.rank == 0
        state = {}
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            trained = fp32 and isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad
            whole = safe_get_full_fp32_param(tensor) if trained else None  # None: a frozen weight, a buffer
            if whole is None:
                with self._gathered(tensor):
                    whole = tensor.detach().clone()
            if keep:
                state[name] = whole.cpu()
        return state

    def state_dict(self) -> dict:
        """Whole tensors in the single-process layout, in the first process (every process
        must call it; the others return theirs empty, as FSDP2's do, which ``Run.save`` drops)."""
        from deepspeed.utils import safe_get_full_optimizer_state

        model = self._whole_model_state(fp32=True)
        inner = self.optimizer.optimizer  # the torch optimizer on DeepSpeed's flat partitions
        steps = [s["step"] for s in inner.state.values() if "step" in s]
        state = {}
        # Before its first step DeepSpeed has linked no moments to the parameters (asking for
        # them raises inside DeepSpeed): a checkpoint then holds none, as a fresh AdamW's would.
        for i, (_, param) in enumerate(self.params if steps else ()):
            moments = {key: safe_get_full_optimizer_state(param, key) for key in ("exp_avg", "exp_avg_sq")}
            if self.rank == 0 and all(value is not None for value in moments.values()):
                state[i] = {"step": steps[0].clone().cpu(), **{k: v.cpu() for k, v in moments.items()}}
        groups = [{k: v for k, v in group.items() if k != "params"} for group in inner.param_groups[:1]]
        groups[0]["params"] = list(range(len(self.params)))
        return {"model": model, "optimizer": {"state": state, "param_groups": groups}}

    def load_state_dict(self, state: dict) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        # Every process read the whole file; one tensor at a time, ZeRO-3 keeps its partition of it.
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            if name in state["model"]:
                saved, shape = state["model"][name], getattr(tensor, "ds_shape", tensor.shape)
                if saved.shape != shape:  # as load_state_dict says it (copy_ would broadcast)
                    raise ValueError(f"size mismatch for {name}: the checkpoint has {tuple(saved.shape)}, "
                                     f"the model {tuple(shape)}")
                with self._gathered(tensor, modifier_rank=0), torch.no_grad():
                    tensor.copy_(saved)
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                safe_set_full_fp32_param(param, state["model"][name].to(param.device))
        saved = state["optimizer"]
        inner = self.optimizer.optimizer
        if saved["state"] and not inner.state:
            # Before its first step DeepSpeed has no moments to write into: it makes them at
            # that step (and ZeRO 1-2 link each parameter's view of them). Make them now. ZeRO-3
            # hands its flat partitions to the optimizer only for the time of a step.
            flats = (self.optimizer.fp32_partitioned_groups_flat if self.stage == 3 else
                     [flat for group in inner.param_groups for flat in group["params"]])
            for flat in flats:
                inner.state[flat] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(flat),
                                     "exp_avg_sq": torch.zeros_like(flat)}
            if self.stage < 3:
                # ZeRO 1-2 link each parameter to its moments in this private method, which DeepSpeed's
                # own checkpoint loading calls; DeepSpeed offers no public call that does it. Guarded, so a
                # release that renames it fails here in one line
                if not hasattr(self.optimizer, "_lazy_init_hp_params_optimizer_state"):
                    import deepspeed

                    raise OmnigymError(f"deepspeed {deepspeed.__version__}: ZeRO's optimizer no longer has "
                                       "_lazy_init_hp_params_optimizer_state, which resuming a --backend deepspeed run "
                                       "calls; install the deepspeed release this run trained with, or report it")
                self.optimizer._lazy_init_hp_params_optimizer_state()
        for i, moments in saved["state"].items():
            _, param = self.params[i]
            for key in ("exp_avg", "exp_avg_sq"):
                safe_set_full_optimizer_state(param, moments[key].to(param.device), key)
        if saved["state"]:
            step = next(iter(saved["state"].values()))["step"]
            for flat_state in inner.state.values():
                flat_state["step"] = step.clone().to(flat_state["step"].device) if torch.is_tensor(
                    flat_state.get("step")) else step.item()
        for group in inner.param_groups:
            group.update({k: v for k, v in saved["param_groups"][0].items() if k not in ("params",)})

    def frozen_copy(self) -> torch.nn.Module:
        """A plain copy of the model as it is now (a reference model), without DeepSpeed's hooks,
        in every process (every process must call it: ZeRO-3 gathers)."""
        return frozen(rebuilt(self.skeleton, self._whole_model_state(fp32=False, everywhere=True), self.model))

    def full_model(self) -> torch.nn.Module | None:
        """The trained model in the first process, None in the others. ZeRO 0-2 keep whole
        weights in each process; ZeRO-3's are gathered (every process must call it)."""
        if self.stage < 3:
            return self.model if self.rank == 0 else None
        whole = self._whole_model_state(fp32=True)
        return rebuilt(self.skeleton, whole, self.model) if self.rank == 0 else None
