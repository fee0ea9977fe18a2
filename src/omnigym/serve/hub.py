"""The compute behind ``omnigym serve`` (the contract is ``serve/contract.py``): one base model,
loaded once; per training run a LoRA adapter on it, trained through the stack ``omnigym
train`` uses: a ``backends.lora`` adapter backend (its own AdamW from ``optim.adamw``, the other
runs' adapters out of its passes), log-probs from ``models.tokens`` and the Tinker losses of
``serve/losses.py`` (``rl/losses.py``'s objectives with Tinker's conventions). What is the
hub's own is Tinker's side: its request checks, which layers its flags train, its
``adam_params`` per call, and the checkpoint files.

LoRA's ``alpha`` is 32 for every rank, as Tinker's cookbook assumes (``hyperparam_utils``: a
LoRA learning rate that does not depend on the rank needs a fixed alpha, so the update scale is
``32 / rank``).

Files: ``root/models/<id>/state/<name>/`` (adapter, optimizer state, step) and
``root/models/<id>/sampler/<name>/`` (adapter only), each written into a temporary folder and
renamed into place, so a crash leaves the old checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from omnigym.backends.lora import AdapterBackend, LoRAAdapters, linear_layers
from omnigym.errors import OmnigymError
from omnigym.models.tokens import make_sequence_batch, target_logprobs, token_budget_batches
from omnigym.optim import adamw
from omnigym.serve.contract import (AdamStep, DatumIn, ForwardResult, RequestError, SampleParams, SampleResult,
                                    SamplerSource)
from omnigym.serve.losses import loss_spec
from omnigym.serve.sampler import SamplerPool, read_adapter

LORA_ALPHA = 32
NAME = re.compile(r"[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,199}")
"""model ids (the HTTP layer's ``<session>:train:<n>``) and checkpoint names: they become folder
names under ``root``, so no '/', no '..', and no leading '.' (the hub's temporary folders)"""
KINDS = ("state", "sampler")


@dataclass
class _Run:
    adapter: str
    rank: int
    seed: int
    targets: list[str]
    backend: AdapterBackend
    steps: int = 0

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self.backend.params

    @property
    def names(self) -> list[str]:
        """the adapter's parameters' names relative to the plain model (``...q_proj.lora_A``)"""
        return self.backend.names

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.backend.optimizer


def new_optimizer(params) -> torch.optim.Optimizer:
    """Tinker's AdamW defaults; each ``optim_step`` sets the request's own."""
    return adamw(params, 1e-4, weight_decay=0.0, betas=(0.9, 0.95), eps=1e-12)


def _check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value) or ".." in value:
        raise RequestError(f"{what} {value!r} is not a valid name (letters, digits, '_', ':', '-', and '.' but "
                           "not first; at most 200)")
    return value


def _tinker_loss(rows: list, spec, config: dict, model, batch) -> tuple[torch.Tensor, dict]:
    """The summed Tinker loss of one micro-batch (``rows``: each datum's tokens, targets and loss
    inputs) and, in the statistics, each datum's outputs and the loss's metrics."""
    logprobs = target_logprobs(model, batch, [targets for _, targets, _ in rows])
    total, outputs, metrics = 0.0, [], []
    for logp, (_, _, inputs) in zip(logprobs, rows):
        loss, elementwise, extra = spec.fn(logp, inputs, config)
        total = total + loss
        out = {"logprobs": logp.detach().float()}
        if elementwise is not None:
            out["elementwise_loss"] = elementwise.detach().float()
        outputs.append(out)
        metrics.extend(extra.items())
    return total, {"outputs": outputs, "metrics": metrics}


class ModelHub:
    def __init__(self, base_model: str, root: Path, max_batch_tokens: int = 2048, engine: str = "auto",
                 sampler_cache: int = 2, device: str = "cpu", activation_budget: float = 2 * 2**30,
                 prefix_cache_bytes: int = 256 * 2**20):
        from omnigym.models.lm import LoadFailed, load_model, load_tokenizer, resolve_model

        path = resolve_model(base_model)
        try:
            self.tokenizer = load_tokenizer(path, need_chat_template=False)
            model = load_model(path, device=device)
        except LoadFailed as exc:
            raise OmnigymError(f"--base-model {base_model}: {exc}") from None
        self.base_model = base_model
        self.root = Path(root)
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.max_length = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
        self.max_batch_tokens = max_batch_tokens
        self.device = device
        self._layers = linear_layers(model)
        self._adapters = LoRAAdapters(model, activation_budget)  # freezes the base weights
        self._sampler = SamplerPool(model, self.tokenizer, engine, sampler_cache, prefix_cache_bytes)
        self._runs: dict[str, _Run] = {}
        self._made = 0
        self._files = threading.Lock()
        """held while save swaps a checkpoint's folder (the old one aside, then the new one in) and
        while a sampling thread reads sampler weights: between the two renames the folder is
        absent, and a request that looked then failed for weights that exist"""

    # -- training runs ------------------------------------------------------------------------

    def _targets(self, train_mlp: bool, train_attn: bool, train_unembed: bool) -> list[str]:
        chosen = set()
        for kind, wanted in (("mlp", train_mlp), ("attn", train_attn), ("unembed", train_unembed)):
            if wanted:
                chosen |= self._layers[kind]
        return sorted(chosen)

    def create_model(self, model_id: str, lora_rank: int, seed: int = 0, train_mlp: bool = True,
                     train_attn: bool = True, train_unembed: bool = True) -> None:
        _check_name(model_id, "model id")
        if model_id in self._runs:
            raise RequestError(f"model {model_id!r} exists already")
        if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or not 1 <= lora_rank <= 1024:
            raise RequestError(f"LoRA rank must be an integer from 1 to 1024, got {lora_rank!r}")
        targets = self._targets(train_mlp, train_attn, train_unembed)
        if not targets:
            raise RequestError("train_mlp, train_attn and train_unembed are all false (or this model has none of "
                               "those layers): nothing to train")
        self._add_run(model_id, lora_rank, int(seed), targets)

    def _add_run(self, model_id: str, rank: int, seed: int, targets: list[str]) -> _Run:
        self._made += 1
        adapter = f"run{self._made}"  # peft names sit in module paths: a model id may not fit there
        with self._sampler.global_rng:  # seeds the process-wide RNG, which a sampling thread may be using
            backend = self._adapters.add(adapter, rank, LORA_ALPHA, targets, seed, new_optimizer)
        run = _Run(adapter, rank, seed, targets, backend)
        self._runs[model_id] = run
        return run

    def _run(self, model_id: str) -> _Run:
        if model_id not in self._runs:
            raise RequestError(f"unknown model id {model_id!r}", status=404)
        return self._runs[model_id]

    def drop(self, model_id: str) -> None:
        self._adapters.remove(self._run(model_id).adapter)
        del self._runs[model_id]
        self._sampler.forget(model_id)

    # -- forward and backward ------------------------------------------------------------------

    def _check_ids(self, ids: torch.Tensor, what: str) -> None:
        if ids.numel() and (bool((ids < 0).any()) or bool((ids >= self.vocab_size).any())):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0].item()
            raise RequestError(f"{what}: token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")

    def _prepare(self, i: int, datum: DatumIn, spec) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Check one datum against the loss before anything runs: a refused request changes nothing."""
        n = len(datum.tokens)
        if n == 0:
            raise RequestError(f"datum {i}: the model input is empty")
        if n > self.max_length:
            raise RequestError(f"datum {i}: {n} tokens is longer than the model's {self.max_length}", status=413)
        tokens = torch.tensor(datum.tokens, dtype=torch.long)
        self._check_ids(tokens, f"datum {i}")
        missing = [k for k in spec.required if k not in datum.inputs]
        if missing:
            raise RequestError(f"datum {i}: loss_fn_inputs lacks {', '.join(missing)} (this loss needs "
                               f"{', '.join(spec.required)})")
        extra = sorted(set(datum.inputs) - set(spec.required) - set(spec.optional))
        if extra:
            raise RequestError(f"datum {i}: loss_fn_inputs has {', '.join(extra)}, which this loss does not take "
                               f"(it takes {', '.join(spec.required + spec.optional)})")
        targets = torch.as_tensor(datum.inputs["target_tokens"])
        if targets.dim() not in (1, 2) or targets.shape[0] != n or targets.dim() == 2 and spec.optional != ("weights",):
            raise RequestError(f"datum {i}: target_tokens has shape {tuple(targets.shape)}; it needs one per input "
                               f"position ({n},)" + (" or (n, k) for cross_entropy" if targets.dim() == 2 else ""))
        if targets.is_floating_point():
            if not bool((targets == targets.round()).all()):
                raise RequestError(f"datum {i}: target_tokens are not whole numbers")
        targets = targets.long()
        self._check_ids(targets, f"datum {i} target_tokens")
        inputs = {}
        for key, value in datum.inputs.items():
            if key == "target_tokens":
                continue
            value = torch.as_tensor(value).float()
            if tuple(value.shape) != tuple(targets.shape):
                raise RequestError(f"datum {i}: {key} has shape {tuple(value.shape)}, target_tokens "
                                   f"{tuple(targets.shape)}; they need one value per target")
            if not bool(torch.isfinite(value).all()):
                raise RequestError(f"datum {i}: {key} holds NaN or infinite values")
            inputs[key] = value
        if "weights" in spec.optional and "weights" not in inputs and spec.required == ("target_tokens",):
            inputs["weights"] = torch.ones(targets.shape)
        return tokens, targets, inputs

    def forward_backward(self, model_id: str, data: list[DatumIn], loss_fn: str, loss_fn_config: dict | None = None,
                         forward_only: bool = False) -> ForwardResult:
        run = self._run(model_id)
        spec, config = loss_spec(loss_fn, loss_fn_config)
        if not data:
            raise RequestError("no data: forward_backward needs at least one datum")
        prepared = [self._prepare(i, d, spec) for i, d in enumerate(data)]
        kept = None if forward_only else run.backend.gradients()  # a refused request leaves no gradient
        try:
            outputs, metrics = self._passes(run, prepared, spec, config, forward_only)
            if not math.isfinite(metrics["loss:sum"]) or not (forward_only or run.backend.all_finite("gradients")):
                # finite inputs can still overflow (weights of 1e38): the loss went into the gradients
                # the next optim_step would take, and its NaN into JSON the SDK cannot read
                raise RequestError(f"the loss or its gradients are not finite (loss:sum {metrics['loss:sum']}): "
                                   "nothing of this request was kept; inputs this large overflow float32 (weights, "
                                   "advantages or logprobs near 1e38)")
        except BaseException:
            if kept is not None:
                run.backend.put_gradients(kept)
            raise
        return ForwardResult(outputs, metrics)

    def _passes(self, run, prepared, spec, config, forward_only: bool) -> tuple[list[dict], dict]:
        """Each micro-batch's forward (and backward) of the prepared data; its outputs and metrics."""
        outputs: list[dict] = [{} for _ in prepared]
        total, sums, means = 0.0, {}, {}
        for micro in token_budget_batches([len(p[0]) for p in prepared], self.max_batch_tokens):
            batch = make_sequence_batch([(prepared[i][0].tolist(), [0] * len(prepared[i][0])) for i in micro], 0,
                                        self.device)
            loss = partial(_tinker_loss, [prepared[i] for i in micro], spec, config)
            if forward_only:
                batch_loss, stats = run.backend.forward(batch, loss)
            else:
                stats = run.backend.forward_backward(batch, loss)
                batch_loss = stats["loss"]
            total += float(batch_loss)
            for i, out in zip(micro, stats["outputs"]):
                outputs[i] = out
            for key, value in stats["metrics"]:
                (means if key.endswith(":mean") else sums).setdefault(key, []).append(value)
        metrics = {"loss:sum": total}
        metrics |= {k: float(sum(v)) for k, v in sums.items()}
        metrics |= {k: float(sum(v) / len(v)) for k, v in means.items()}
        return outputs, metrics

    # -- optimizer -------------------------------------------------------------------------------

    def optim_step(self, model_id: str, adam: AdamStep) -> dict[str, float]:
        run = self._run(model_id)
        values = {"learning_rate": adam.learning_rate, "beta1": adam.beta1, "beta2": adam.beta2, "eps": adam.eps,
                  "weight_decay": adam.weight_decay, "grad_clip_norm": adam.grad_clip_norm}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise RequestError(f"adam_params.{key} must be a finite number, got {value!r}")
        if adam.learning_rate < 0 or adam.eps <= 0 or adam.weight_decay < 0 or adam.grad_clip_norm < 0:
            raise RequestError("adam_params: learning_rate, weight_decay and grad_clip_norm must be >= 0 and eps > 0")
        if not (0 <= adam.beta1 < 1 and 0 <= adam.beta2 < 1):
            raise RequestError(f"adam_params: beta1 ({adam.beta1}) and beta2 ({adam.beta2}) must be in [0, 1)")
        for group in run.optimizer.param_groups:
            group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                         weight_decay=adam.weight_decay)
        run.backend.max_grad_norm = adam.grad_clip_norm  # 0: not clipped
        # Adam moves a weight by about the learning rate a step (decay by lr * weight_decay of it):
        # only a step larger than 1 can overflow finite weights, so only then is it undoable
        kept = copy.deepcopy(run.backend.state_dict()) if adam.learning_rate * max(1.0, adam.weight_decay) > 1 else None
        stats = run.backend.optim_step()
        if kept is not None and not run.backend.all_finite("weights"):
            run.backend.load_state_dict(kept)
            raise RequestError(f"learning_rate {adam.learning_rate} made the weights overflow float32: the step was "
                               "undone and its gradients dropped; send them again with a smaller learning_rate")
        run.steps += 1
        return {"grad_norm:mean": float(stats["grad_norm"]), "step:max": float(run.steps)}

    # -- checkpoints -----------------------------------------------------------------------------

    def _folder(self, model_id: str, kind: str, name: str) -> Path:
        if kind not in KINDS:
            raise RequestError(f"checkpoint kind {kind!r}: choose state or sampler")
        return self.root / "models" / _check_name(model_id, "model id") / kind / _check_name(name, "checkpoint name")

    def save(self, model_id: str, name: str, kind: str) -> None:
        run = self._run(model_id)
        final = self._folder(model_id, kind, name)
        from safetensors.torch import save_file

        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".tmp-{name}-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            state = run.backend.state_dict()
            save_file(state["model"], str(tmp / "adapter.safetensors"))
            meta = {"base_model": self.base_model, "rank": run.rank, "lora_alpha": LORA_ALPHA, "seed": run.seed,
                    "targets": run.targets, "steps": run.steps}
            (tmp / "adapter.json").write_text(json.dumps(meta))
            if kind == "state":
                torch.save(state["optimizer"], tmp / "optimizer.pt")
            for file in tmp.iterdir():  # on disk before the rename makes the folder visible
                with open(file, "rb") as f:
                    os.fsync(f.fileno())
            old = final.with_name(f".old-{name}-{os.getpid()}")
            with self._files:
                if final.exists():
                    os.replace(final, old)
                os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if kind == "sampler":
            self._sampler.forget(model_id, name)

    def load(self, model_id: str, source_model_id: str, name: str, with_optimizer: bool = True) -> None:
        """Restore ``source_model_id``'s state checkpoint ``name`` into ``model_id``; a model id
        the hub does not hold yet is created with the checkpoint's rank and layers."""
        folder = self._folder(source_model_id, "state", name)
        if not (folder / "adapter.safetensors").is_file():
            other = self._folder(source_model_id, "sampler", name)
            hint = " (there are sampler weights of that name: load_state needs save_state's)" if other.is_dir() else ""
            raise RequestError(f"no saved state {name!r} of model {source_model_id!r}{hint}", status=404)
        try:
            tensors, meta = read_adapter(folder)
            saved_optimizer = torch.load(folder / "optimizer.pt", weights_only=True) if with_optimizer else None
        except (OSError, ValueError, RuntimeError) as exc:
            raise RequestError(f"saved state {name!r} of model {source_model_id!r} cannot be read: "
                               f"{type(exc).__name__}", status=500) from None
        if model_id in self._runs:
            run = self._runs[model_id]
            if run.rank != meta["rank"] or run.targets != meta["targets"]:
                raise RequestError(f"saved state {name!r} has LoRA rank {meta['rank']} on {meta['targets']}; model "
                                   f"{model_id!r} has rank {run.rank} on {run.targets}")
        else:
            _check_name(model_id, "model id")
            run = self._add_run(model_id, int(meta["rank"]), int(meta.get("seed", 0)), list(meta["targets"]))
        if sorted(tensors) != sorted(run.names):
            raise RequestError(f"saved state {name!r} does not fit this base model")
        run.backend.load_state_dict({"model": tensors, "optimizer": saved_optimizer})
        run.steps = int(meta.get("steps", 0)) if with_optimizer else 0

    # -- sampling ----------------------------------------------------------------------------------

    def sample(self, source: SamplerSource, prompt: list[int], n: int, params: SampleParams) -> SampleResult:
        if not prompt:
            raise RequestError("the prompt is empty")
        self._check_ids(torch.tensor(prompt, dtype=torch.long), "prompt")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
            raise RequestError(f"num_samples must be from 1 to 256, got {n!r}")
        if not isinstance(params.max_tokens, int) or params.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {params.max_tokens!r}")
        if len(prompt) + params.max_tokens > self.max_length:
            raise RequestError(f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                               f"model's context of {self.max_length}", status=413)
        if not (params.temperature >= 0 and 0 < params.top_p <= 1 and math.isfinite(params.temperature)):
            raise RequestError("temperature must be >= 0 and top_p in (0, 1]")
        self._check_ids(torch.tensor(params.stop_tokens, dtype=torch.long), "stop tokens")
        if source.model_id is None:
            return self._sampler.sample_from(None, None, None, prompt, n, params, source.session)
        folder = self._folder(source.model_id, "sampler", source.name or "")
        with self._files:
            found = (folder / "adapter.safetensors").is_file()
        if not found:
            raise RequestError(f"no sampler weights {source.name!r} of model {source.model_id!r}", status=404)

        def load():
            with self._files:
                tensors, meta = read_adapter(folder)
            return tensors, meta["lora_alpha"] / meta["rank"]

        return self._sampler.sample_from(source.model_id, source.name, load, prompt, n, params, source.session)
