"""Several LoRA adapters on one frozen base model, each trained as a backend of its own (the
``AdapterBackends`` contract of ``base.py``): what ``omnigym serve`` holds, one adapter per
training run of its clients, on one copy of the base weights.

Each adapter sits in a peft model of its own, wrapped around a module tree of its own whose
weights are the base model's own tensors (shared, never copied): a pass of one adapter touches
no module another adapter's pass uses, so passes of different adapters can run at once on
different threads (``omnigym serve`` runs two runs' forward_backward side by side on two cores),
the other adapters take no part in a pass and get no gradient, and each adapter has its own
optimizer over its own parameters: runs end bit for bit where each ends alone. (One peft model
holding every adapter, switched by ``set_adapter`` before each pass, allowed one pass at a time.)

A micro-batch whose activations would pass ``activation_budget`` is run with gradient
checkpointing (a long multi-turn datum on SmolLM2 held 15.7 GB without it): each layer's
activations are recomputed in the backward pass instead, about a third more compute with one
layer's activations held at a time. Transformers checkpoints only in train mode; LoRA dropout
is 0 here, so train mode changes nothing else.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from contextlib import contextmanager

import torch

from omnigym.optim import clip_grad_norm


def linear_layers(model) -> dict[str, set[str]]:
    """The model's linear layers by kind (``attn``, ``mlp``, ``unembed``: the output head), as
    full module paths: peft matches target names as suffixes, and a leaf name alone
    (``dense``) may be both an attention and an MLP layer's."""
    kinds = {"attn": set(), "mlp": set(), "unembed": set()}
    head = model.get_output_embeddings()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        parents = name.lower().split(".")[:-1]
        if module is head:
            kinds["unembed"].add(name)
        elif any("attn" in p or "attention" in p for p in parents):
            kinds["attn"].add(name)
        elif any("mlp" in p or "feed_forward" in p for p in parents):
            kinds["mlp"].add(name)
    return kinds


class LoRAAdapters:
    def __init__(self, model: torch.nn.Module, activation_budget: float = 2 * 2**30):
        model.eval()
        model.requires_grad_(False)
        self.base = model
        """the plain model: peft never wraps it, each adapter wraps a shell of it (``_shell``)"""
        self.activation_budget = activation_budget
        self.adapters: dict[str, AdapterBackend] = {}

    @property
    def model(self) -> torch.nn.Module:
        return self.base

    def _shell(self) -> torch.nn.Module:
        """A copy of the base model's modules that holds the base model's own weight and buffer
        tensors (deepcopy's memo maps each to itself): an adapter's own tree, no weight copied."""
        shared = {id(t): t for t in itertools.chain(self.base.parameters(), self.base.buffers())}
        return copy.deepcopy(self.base, memo=shared)

    def add(self, name: str, rank: int, alpha: float, targets: list[str], seed: int, make_optimizer,
            max_grad_norm: float | None = None) -> "AdapterBackend":
        """A new adapter (rank, alpha, the module paths it adapts), initialised from ``seed``:
        the same seed gives the same adapter. ``make_optimizer(params)`` gets its parameters.
        ``name`` becomes part of module paths: no dots."""
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=targets, bias="none")
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")  # peft warns about tied embeddings under a LoRA'd head
            torch.manual_seed(seed)
            peft = get_peft_model(self._shell(), config, adapter_name=name)
        peft.eval()
        marker = f".{name}."
        params, names = [], []
        for full, param in peft.named_parameters():
            if marker in full:
                params.append(param)
                names.append(full.replace("base_model.model.", "", 1).replace(marker, ".").removesuffix(".weight"))
        backend = AdapterBackend(self, name, peft, params, names, make_optimizer, max_grad_norm)
        self.adapters[name] = backend
        return backend

    def remove(self, name: str) -> None:
        for p in self.adapters.pop(name).params:
            p.grad = None

    def activation_bytes(self, rows: int, width: int) -> float:
        """About what a backward pass keeps of one micro-batch's activations in float32: each
        layer's hidden states and MLP (linear in tokens) and its attention weights (quadratic in
        the width: with a padding mask attention takes the plain, not the flash, path)."""
        config = self.base.config
        layers = getattr(config, "num_hidden_layers", 1)
        hidden = getattr(config, "hidden_size", 1)
        inner = getattr(config, "intermediate_size", 4 * hidden)
        heads = getattr(config, "num_attention_heads", 1)
        per_token = 12 * hidden + 4 * inner
        return 4.0 * layers * rows * (width * per_token + 2 * heads * width * width)

    @contextmanager
    def recomputing(self, peft, batch):
        """Gradient checkpointing of an adapter's ``peft`` model for the time of one micro-batch
        whose activations would pass the budget (its shape read from ``batch.input_ids``,
        ``[rows, width]``)."""
        ids = getattr(batch, "input_ids", None)
        if ids is None or self.activation_bytes(*ids.shape) <= self.activation_budget:
            yield
            return
        model = peft.get_base_model()
        # transformers 5 renamed gradient_checkpointing_* to activation_checkpointing_*
        renamed = hasattr(model, "activation_checkpointing_enable")
        if renamed:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        peft.train()
        try:
            yield
        finally:
            peft.eval()
            (model.activation_checkpointing_disable if renamed else model.gradient_checkpointing_disable)()


class AdapterBackend:
    """One adapter of a ``LoRAAdapters`` as a ``TrainingBackend`` of one process: its passes go
    through its own peft model; the optimizer and the state are its parameters' alone."""

    def __init__(self, adapters: LoRAAdapters, name: str, peft, params: list, names: list[str], make_optimizer,
                 max_grad_norm: float | None = None):
        self.adapters, self.name, self.peft = adapters, name, peft
        self.params, self.names = params, names
        """the adapter's parameters and their names relative to the plain model (``...q_proj.lora_A``)"""
        self.make_optimizer, self.max_grad_norm = make_optimizer, max_grad_norm
        self.optimizer = make_optimizer(params)

    @property
    def model(self) -> torch.nn.Module:
        """the peft model of this adapter alone, over the shared base weights"""
        return self.peft

    def local_part(self, rows, weights=None) -> tuple[list, float]:
        return list(rows), 1.0

    def forward(self, batch, loss_fn) -> tuple[torch.Tensor, dict]:
        """``loss_fn(model, batch)`` through this adapter, without gradient."""
        with torch.no_grad():
            return loss_fn(self.model, batch)

    def forward_backward(self, batch, loss_fn, share: float | None = None) -> dict:
        with self.adapters.recomputing(self.peft, batch):
            loss, stats = loss_fn(self.model, batch)
            if loss.requires_grad:
                loss.backward()
        return {"loss": loss.detach(), **stats}

    def optim_step(self) -> dict:
        """One step over this adapter's gradients, clipped to ``max_grad_norm`` when set (0 or
        None: not clipped); ``grad_norm`` is their norm before clipping either way."""
        with_grad = [p for p in self.params if p.grad is not None]
        if not with_grad:
            norm = torch.zeros(())
        elif self.max_grad_norm:
            norm = clip_grad_norm(with_grad, self.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm([p.grad for p in with_grad])))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm}

    def gradients(self) -> list:
        """A copy of the gradients gathered since the last step (None where there are none yet):
        what ``put_gradients`` returns to when a pass must leave no trace."""
        return [None if p.grad is None else p.grad.clone() for p in self.params]

    def put_gradients(self, grads: list) -> None:
        for p, grad in zip(self.params, grads):
            p.grad = grad

    def all_finite(self, what: str) -> bool:
        """Are the adapter's weights (``what="weights"``) or gathered gradients all finite? Their norm
        overflowing counts as not: a clipped step divides by it."""
        tensors = [p.detach() for p in self.params] if what == "weights" else [p.grad for p in self.params
                                                                               if p.grad is not None]
        return not tensors or bool(torch.isfinite(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))))

    def state_dict(self) -> dict:
        """The adapter's tensors by name and its optimizer's state."""
        return {"model": {n: p.detach().cpu().contiguous() for n, p in zip(self.names, self.params)},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """``state["optimizer"]`` None: the weights with a fresh optimizer."""
        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p.copy_(state["model"][n])
                p.grad = None
        self.optimizer = self.make_optimizer(self.params)
        if state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def full_model(self) -> torch.nn.Module:
        """The model with this adapter in it."""
        return self.model

    def frozen_copy(self) -> torch.nn.Module:
        """A plain model with this adapter merged into a copy of the base weights."""
        from omnigym.backends.local import frozen

        clone = copy.deepcopy(self.peft)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return frozen(clone.merge_and_unload(adapter_names=[self.name]))
