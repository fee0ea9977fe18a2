"""DeepSpeed ZeRO (stages 1 and 2) as a training backend, configured by its own JSON file.

DeepSpeed's engine holds the model and partitions the optimizer state (ZeRO-1) and the
gradients (ZeRO-2) across the processes its launcher (or torchrun) starts. omnigym keeps
what the algorithm owns: the optimizer it builds, one micro-batch per step, and gradient
clipping at ``--max-grad-norm``; the config file says the rest (stage, precision, offload,
communication). As with DDP, each process trains its rows weighed by their share, and the
loss runs inside the engine's module (``data_parallel.LossModule``).

Checkpoints hold whole fp32 weights and the optimizer's moments in ``torch.optim``'s
layout, gathered with ``deepspeed.utils.safe_get_full_*``, so a DeepSpeed run resumes in one
process or under DDP/FSDP2, and the other way round.

ZeRO-3 partitions the weights themselves, which the algorithms' passes without gradient
(sampling, evaluation) read directly; it is refused in one line, and ``--training-backend fsdp2``
shards weights instead.
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
    """The user's DeepSpeed config, checked: ZeRO 0-2, nothing that omnigym sets itself."""
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
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2):
        raise OmnigymError(f"--deepspeed-config {path} asks for ZeRO stage {stage}; omnigym runs stages 0-2 "
                           "(stage 3 partitions the weights that sampling reads: use --training-backend fsdp2 to "
                           "shard them)")
    return config


class DeepSpeedBackend:
    def __init__(self, model: torch.nn.Module, make_optimizer, max_grad_norm: float | None, config_path: str):
        import deepspeed

        config = {**read_config(config_path), "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "gradient_clipping": max_grad_norm or 0.0}
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

    def state_dict(self) -> dict:
        """Whole tensors in the single-process layout (every process must call it)."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        model = self.model.state_dict()
        for name, param in self.model.named_parameters():
            model[name] = safe_get_full_fp32_param(param).cpu()
        inner = self.optimizer.optimizer  # the torch optimizer on DeepSpeed's flat partitions
        steps = [s["step"] for s in inner.state.values() if "step" in s]
        state = {}
        # Before its first step DeepSpeed has linked no moments to the parameters (asking for
        # them raises inside DeepSpeed): a checkpoint then holds none, as a fresh AdamW's would.
        for i, (_, param) in enumerate(self.params if steps else ()):
            moments = {key: safe_get_full_optimizer_state(param, key) for key in ("exp_avg", "exp_avg_sq")}
            if all(value is not None for value in moments.values()):
                state[i] = {"step": steps[0].clone().cpu(), **{k: v.cpu() for k, v in moments.items()}}
        groups = [{k: v for k, v in group.items() if k != "params"} for group in inner.param_groups[:1]]
        groups[0]["params"] = list(range(len(self.params)))
        return {"model": model, "optimizer": {"state": state, "param_groups": groups}}

    def load_state_dict(self, state: dict) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        self.model.load_state_dict(state["model"], strict=False)
        params = dict(self.model.named_parameters())
        for name, param in params.items():
            safe_set_full_fp32_param(param, state["model"][name].to(param.device))
        saved = state["optimizer"]
        inner = self.optimizer.optimizer
        if saved["state"] and not inner.state:
            # Before its first step DeepSpeed has no moments to write into: it makes them and
            # links each parameter's view of them at that step. Make and link them now.
            for group in inner.param_groups:
                for flat in group["params"]:
                    inner.state[flat] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(flat),
                                         "exp_avg_sq": torch.zeros_like(flat)}
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
        """A plain copy of the model as it is now (a reference model), without DeepSpeed's hooks."""
        return frozen(rebuilt(self.skeleton, self.model.state_dict(), self.model))

    def full_model(self) -> torch.nn.Module | None:
        """The trained model in the first process (ZeRO 0-2 keep whole weights in each)."""
        return self.model if self.rank == 0 else None
