"""The optimizers: torch.optim optimizers, one of which is made cheap to start.

``Adam`` (control networks) is a real ``torch.optim.Optimizer``: param groups, state,
``state_dict`` in torch.optim.Adam's layout, LR schedulers, DDP and ZeRO wrappers all see
an ordinary optimizer. Its step calls ``torch.optim.adam.adam``, the functional kernel
``torch.optim.Adam`` runs (its fused variant), so the numbers agree with
``torch.optim.Adam``'s to float rounding (tests/test_buffers_optim.py).
Why not torch.optim.Adam itself: its ``step`` and the base class's ``add_param_group``,
``zero_grad``, ``state_dict`` and ``load_state_dict`` are wrapped to switch off
torch.compile, and the first call of such a wrapper imports ``torch._dynamo``: 3.4 s added to a
9.7 s CartPole run (docs/benchmarks.md, bench/cartpole_vs_anchors.py; torch 2.13). An eager optimizer
never runs under torch.compile, so this class calls torch's own undecorated methods
(``__wrapped__``): the same code without that import.

``adamw`` (language models) is torch's AdamW with the fused kernel.
"""

from __future__ import annotations

import torch
from torch.optim.adam import adam
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks


class Adam(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        torch.optim.Optimizer.add_param_group.__wrapped__(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            torch.optim.Optimizer.zero_grad.__wrapped__(self, set_to_none)
            return
        # torch's own opens a profiler range on every call: a fifth of a SAC step on 64x64 networks
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def state_dict(self) -> dict:
        return torch.optim.Optimizer.state_dict.__wrapped__(self)

    def load_state_dict(self, state_dict: dict) -> None:
        torch.optim.Optimizer.load_state_dict.__wrapped__(self, state_dict)
        # torch moves a loaded step count to its parameter's device only for a group marked fused;
        # this class decides fused at each step, so a CUDA run resumed from a checkpoint (loaded on
        # the CPU) would hand the fused kernel CPU step counts: "state_steps is on cpu" (seen on an H100)
        for group in self.param_groups:
            params = [p for p in group["params"] if "step" in self.state.get(p, {})]
            fused = _fused(params)
            for p in params:
                self.state[p]["step"] = self.state[p]["step"].to(p.device if fused else "cpu", torch.float32)

    def step(self, closure=None):
        # torch.optim wraps each optimizer class's step in a profiler range and a walk over step hooks
        # (Optimizer.profile_hook_step) unless it is marked ``hooked``; that costs as much as the fused
        # kernel itself on SAC's networks. This step is marked, and goes through the wrapper only when
        # a step hook is registered, so hooks still run.
        if (self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks or _global_optimizer_pre_hooks
                or _global_optimizer_post_hooks):
            return _hooked_step(self, closure)
        return self.step_without_hooks(closure)

    step.hooked = True

    @torch.no_grad()
    def step_without_hooks(self, closure=None):
        """The step itself: no profiler range, no step hooks."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            # torch's fused kernel (one call for all parameters) where it exists: on PPO's
            # 64x64 MuJoCo networks it takes a step in 0.2 ms against foreach's 0.6.
            fused = _fused(params)
            for p in params:
                if not self.state[p]:  # the fused kernel keeps its step count beside the parameter
                    self.state[p] = {"step": torch.tensor(0.0, device=p.device if fused else "cpu"),
                                     "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
            states = [self.state[p] for p in params]
            grads, exp_avgs, exp_avg_sqs, steps = ([p.grad for p in params], [s["exp_avg"] for s in states],
                                                   [s["exp_avg_sq"] for s in states], [s["step"] for s in states])
            beta1, beta2 = group["betas"]
            if fused and params and _one_device_and_dtype(params, grads):
                # what torch.optim.adam's fused path does once it has grouped the tensors by device and
                # dtype (here one group: the grouping alone took as long as the kernel)
                torch._foreach_add_(steps, 1)
                torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                                   beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"], eps=group["eps"],
                                   maximize=False, grad_scale=None, found_inf=None)
                continue
            adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=not fused, fused=fused, amsgrad=False,
                 beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
                 maximize=False)
        return loss


_hooked_step = torch.optim.Optimizer.profile_hook_step(Adam.step_without_hooks)


def _one_device_and_dtype(params, grads) -> bool:
    device, dtype = params[0].device, params[0].dtype
    return all(t.device == device and t.dtype == dtype and not t.is_sparse for t in (*params, *grads))


def _fused(params) -> bool:
    """Whether torch's fused Adam kernel takes these parameters (it keeps each step count on its parameter's device)."""
    return all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``'s arithmetic (one norm over all gradients, scaled
    down to ``max_norm``) in four calls: torch's version spends ~150 us grouping tensors by
    device and dtype, as long as the rest of a minibatch step of PPO's 64x64 networks.
    All gradients on one device. Returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp_(max=1.0))
    return total


def trainable(params) -> list[torch.nn.Parameter]:
    return [p for p in params if p.requires_grad]


def adamw(model, learning_rate: float, weight_decay: float = 0.0, betas=(0.9, 0.999),
          eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW over the trainable weights of ``model``, or over the parameters ``model`` is a list
    of, as given (one LoRA adapter of several: peft sets requires_grad on the active adapter's
    alone); torch's fused kernel (CPU and CUDA) takes a third of the time of the per-tensor loop
    on a small model."""
    params = trainable(model.parameters()) if isinstance(model, torch.nn.Module) else list(model)
    return torch.optim.AdamW(params, lr=learning_rate, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                             fused=_fused(params))


def flush_denormals(on: bool = True) -> bool:
    """Floats too small for their exponent (below 1.2e-38 in float32) read and written as zero,
    in this thread and the threads it starts: a CPU takes many times longer over an arithmetic
    op on one. Adam's second moment of a parameter whose gradient went to zero (a dead ReLU
    unit) decays by 0.999 a step and spends ~16,000 steps in that range. Measured on the Intel
    Xeon (one thread): this class's step on DQN's 4-256-256-2 network with its state there,
    1.5 ms against 0.11 flushed; DQN on CartPole, 20k steps, 38.1 and 46.5 s against 33.1 and
    33.4 (runs alternated), to identical metrics: the updates lost are below a float32
    parameter's rounding (bench/same_seed.py: all 26 rows identical). Returns what it was in
    this thread, for a scope to put back."""
    before = flushing_denormals()
    torch.set_flush_denormal(on)
    return before


def flushing_denormals() -> bool:
    """Whether this thread flushes denormals now. torch has no getter, so it is measured: a
    denormal times one is zero only when flushed. Read, not remembered, because the setting is
    per thread and a user may have set it themselves (torch.set_flush_denormal): a run then
    puts back their setting, not a guess of it."""
    # float32 and the CPU named: a user's torch.set_default_dtype(float64) or default device
    # would otherwise measure a float that is not denormal, or another device
    return (torch.tensor([1e-40], dtype=torch.float32, device="cpu") * 1.0).item() == 0.0
