"""Sampling with vLLM, in the trainer's process and on the trainer's GPU (the ``[vllm]`` extra).

``VLLMEngine`` implements the engine contract of ``engine.py`` on vLLM's offline ``LLM``:
``generate`` sends every prompt in one ``LLM.generate`` call with ``n`` samples each (vLLM
schedules, batches and caches the shared prompt itself); ``update_weights`` streams the
trainer's ``(name, tensor)`` pairs into vLLM's copy of the model through the model's own
checkpoint loader (which fuses q/k/v and gate/up as it does when loading from disk);
``sleep``/``wake_up`` hand the GPU memory of the weights and the KV cache back to the
trainer between samplings (``enable_sleep_mode=True``).

Written against vLLM's public offline API (``LLM``, ``TokensPrompt``, ``SamplingParams``,
``LLM.collective_rpc``, ``LLM.sleep``/``wake_up``, ``LLM.reset_prefix_cache``), checked
against the source of vllm 0.33.0, with a fallback where 0.10.2 (the oldest it accepts)
lacks a call. It has not run
on the CPU machine it was written on: vLLM needs a CUDA GPU; ``tests/test_vllm_engine.py``
runs the real engine where there is one and skips otherwise. The pure parts (sampling
parameters, outputs to ``Sample``, weight names) are plain functions, tested without vLLM.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Iterable

import torch

from omnigym.errors import OmnigymError
from omnigym.inference.engine import Sample, SamplingParams, check_samples_asked
from omnigym.scoped_env import environment

MISSING = "the vllm engine needs the [vllm] extra: pip install 'omnigym[vllm]' (a CUDA GPU; see docs/vllm.md)"
IN_PROCESS = "VLLM_ENABLE_V1_MULTIPROCESSING"
MIN_VERSION = (0, 10, 2)
"""``logprobs_mode="processed_logprobs"`` came in 0.10.0 without the temperature; 0.10.2
applies it (what TRL's GRPO moved to, huggingface/trl#4163)"""
PEFT_PREFIX = "base_model.model."


LORA_REFUSED = ("--engine vllm takes the model's full weights, not a LoRA adapter: train without --lora-r, or use "
                "--engine hf")


def import_vllm():
    """The ``vllm`` module, or one line saying how to get it."""
    try:
        import vllm
    except ImportError as exc:
        if exc.name == "vllm":  # the package itself is absent, not one of its own imports
            raise OmnigymError(MISSING) from None
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OmnigymError(f"vllm is installed but does not import ({first}); reinstall it for this "
                           "machine's torch and CUDA (docs/vllm.md)") from None
    return vllm


def _require_version(vllm) -> None:
    from packaging.version import InvalidVersion, Version

    text = getattr(vllm, "__version__", "0")
    try:
        release = Version(text).release
    except InvalidVersion:
        return  # a source build with its own version string: trusted
    if release < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        raise OmnigymError(f"vllm {text} is too old for --engine vllm: before {wanted} its log-probs leave out the "
                           f"temperature; pip install 'vllm>={wanted}'")


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise OmnigymError("the vllm engine needs a CUDA GPU and torch sees none; use --engine hf or kv here")


# --- pure mapping: plain objects in, plain objects out (unit-tested without vLLM) ---


def sampling_kwargs(params: SamplingParams, n: int, eos_id: int | None) -> dict:
    """Keyword arguments of ``vllm.SamplingParams`` for omnigym's ``params`` and ``n``
    samples per request.

    Greedy is temperature 0 in vLLM (which then takes only ``n=1``: ``VLLMEngine.generate``
    repeats the prompt instead). ``logprobs=0`` returns the sampled token's log-prob only.
    The engine stops at the tokenizer's end-of-sequence token and nowhere else, as the
    ``hf`` and ``kv`` engines do: ``ignore_eos`` keeps vLLM from adding the
    ``eos_token_id`` list of the model's generation_config.json, and ``stop_token_ids``
    names ours. No per-request ``seed``: vLLM would reuse it at every call, so a prompt
    seen twice would get the same samples; the engine's ``seed`` seeds vLLM once instead.
    """
    if n < 1:
        raise OmnigymError(f"n must be at least 1, got {n}")
    if params.max_new_tokens < 1:
        raise OmnigymError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}")
    kwargs = dict(n=n, max_tokens=params.max_new_tokens, logprobs=0, detokenize=False, ignore_eos=True,
                  stop_token_ids=([] if eos_id is None else [eos_id]) + list(params.stop_ids))
    if params.greedy:
        return {**kwargs, "temperature": 0.0, "top_p": 1.0, "top_k": 0}
    # (a temperature of 0 without greedy is refused by SamplingParams itself)
    # top_k 0 is "no top-k" in omnigym and in vLLM (0 or -1 since 0.8)
    return {**kwargs, "temperature": float(params.temperature), "top_p": float(params.top_p),
            "top_k": max(int(params.top_k), 0)}


def _sampled_logprob(position, token: int) -> float:
    """The log-prob of ``token`` in one position of ``CompletionOutput.logprobs``: a mapping
    from token id to a ``Logprob`` (``.logprob``) that holds at least the sampled token."""
    entry = position[token]
    return float(getattr(entry, "logprob", entry))


def completion_sample(prompt: list[int], completion, eos_id: int | None) -> Sample:
    """One ``CompletionOutput`` (``token_ids``, ``logprobs``, ``finish_reason``) as a
    ``Sample``: cut after the first end-of-sequence token as ``BatchedEngine._samples``
    does, finished when vLLM stopped on it (finish_reason "stop")."""
    tokens = [int(t) for t in completion.token_ids]
    if completion.logprobs is None:
        raise RuntimeError("vLLM returned no log-probs; the engine asks for logprobs=0")
    cut = eos_id is not None and eos_id in tokens
    length = tokens.index(eos_id) + 1 if cut else len(tokens)
    logprobs = [_sampled_logprob(completion.logprobs[i], tokens[i]) for i in range(length)]
    finished = cut or completion.finish_reason == "stop"
    return Sample(list(prompt), tokens[:length], logprobs, finished)


def samples_from_outputs(prompts: list[list[int]], outputs, n: int, eos_id: int | None) -> list[list[Sample]]:
    """``LLM.generate``'s ``RequestOutput`` list as ``n`` samples of each prompt. The
    requests were each prompt ``copies`` times in a row (1, or ``n`` for greedy), with
    ``n / copies`` completions each: their completions, in order, are the prompt's ``n``."""
    if not prompts or len(outputs) % len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    copies = len(outputs) // len(prompts)
    groups = []
    for i, prompt in enumerate(prompts):
        completions = [c for output in outputs[i * copies:(i + 1) * copies]
                       for c in sorted(output.outputs, key=lambda c: c.index)]
        if len(completions) != n:
            raise RuntimeError(f"vLLM returned {len(completions)} completions of a prompt, not n={n}")
        groups.append([completion_sample(prompt, c, eos_id) for c in completions])
    return groups


def vllm_weight_name(name: str) -> str:
    """The checkpoint name vLLM's ``load_weights`` takes for a trainer parameter's name.

    A PEFT-wrapped model's base weights are named ``base_model.model.<name>`` with a
    ``.base_layer`` inside each adapted module: both are dropped. Its adapter tensors
    (``lora_A``, ``lora_B``, ...) have no place in vLLM's plain model and are refused: the
    adapter must be merged into the weights first.
    """
    if any(part.startswith("lora_") for part in name.split(".")):
        raise OmnigymError(f"--engine vllm takes the model's full weights, but {name!r} is a LoRA adapter tensor: "
                           "train without --lora-r, merge the adapter first, or use --engine hf")
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")


def model_source(model, tokenizer, keep: list) -> str:
    """The folder or hub id vLLM loads ``model`` from: its ``config.name_or_path`` when that
    is still there (a folder, or a hub id), else the model and tokenizer saved to a
    temporary folder (``--model tiny`` is built in one that is gone by now), kept alive by
    appending it to ``keep``."""
    config = getattr(model, "config", None)
    source = getattr(config, "name_or_path", "") or ""
    path = Path(source).expanduser()
    looks_like_path = source.startswith(("/", ".", "~")) or path.exists()
    if source and (path.is_dir() if looks_like_path else True):
        return str(path) if looks_like_path else source
    folder = tempfile.TemporaryDirectory(prefix="omnigym-vllm-")
    keep.append(folder)
    model.save_pretrained(folder.name)
    tokenizer.save_pretrained(folder.name)
    return folder.name


def _load_weights_on_worker(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Runs on vLLM's worker (``LLM.collective_rpc`` passes the worker first), in this
    process. Where the model runner has an in-place ``reload_weights`` that takes a weights
    iterator (vllm 0.33.0 has it), that: the model's checkpoint loader inside vLLM's
    layerwise-reload lifecycle, so that weights processed after loading are processed
    again, and the caches derived from the weights are reset. Otherwise (0.10-era vLLM) the
    model's ``load_weights`` copies each tensor into its parameters, as TRL's colocate mode
    does through ``llm.llm_engine.model_executor.driver_worker.model_runner.model``."""
    runner = worker.model_runner
    reload = getattr(runner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        worker.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        return
    model = worker.get_model() if hasattr(worker, "get_model") else runner.model
    model.load_weights(weights=weights)


class VLLMEngine:
    """vLLM's ``LLM`` behind omnigym's engine contract; see the module docstring."""

    def __init__(self, model_path_or_id: str, tokenizer, *, gpu_memory_utilization: float = 0.5,
                 enable_sleep_mode: bool = False, dtype: str = "auto", seed: int = 0, **llm_kwargs):
        self._vllm = import_vllm()
        _require_version(self._vllm)
        _require_cuda()
        if not 0 < gpu_memory_utilization <= 1:
            raise OmnigymError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        # The engine core must live in this process: update_weights hands it the trainer's
        # tensors (GPU to GPU, no copy through a pipe), as TRL's colocate mode does. vLLM's
        # V1 engine otherwise runs its core in a child process.
        mode = os.environ.get(IN_PROCESS, "0")
        if mode != "0":
            raise OmnigymError(f"{IN_PROCESS}={mode} runs vLLM's engine in another process, where "
                               "update_weights cannot reach its model; unset it for --engine vllm")
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.enable_sleep_mode = enable_sleep_mode
        self.version = 0
        self._asleep = False
        self._keep: list = []  # a temporary model folder, if one was written
        # token ids in and out, nothing to decode; log-probs of the distribution sampled from
        # (after temperature, and after top-k/top-p when those are set: see docs/vllm.md)
        options = dict(skip_tokenizer_init=True, logprobs_mode="processed_logprobs")
        options.update(llm_kwargs)
        with environment({IN_PROCESS: "0"}):  # vLLM reads it while it builds the engine, and only then
            self.llm = self._vllm.LLM(model=model_path_or_id, gpu_memory_utilization=gpu_memory_utilization,
                                      enable_sleep_mode=enable_sleep_mode, dtype=dtype, seed=seed, **options)
        if enable_sleep_mode:
            self.sleep()  # the trainer has the GPU until the first generate

    @classmethod
    def for_model(cls, model, tokenizer, **kwargs) -> "VLLMEngine":
        """The engine ``make_engine(model, tokenizer, "vllm")`` builds: vLLM loads the
        checkpoint ``model`` came from (``model_source``), and from then on takes the
        trainer's weights through ``update_weights``."""
        import_vllm()  # the missing extra is the first thing to say
        if hasattr(model, "peft_config"):
            raise OmnigymError(LORA_REFUSED)
        keep: list = []
        engine = cls(model_source(model, tokenizer, keep), tokenizer, **kwargs)
        engine._keep += keep
        return engine

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        check_samples_asked(n)
        if not prompts:
            return []
        vllm = self._vllm
        copies = n if params.greedy else 1  # vLLM refuses n > 1 at temperature 0
        sampling = vllm.SamplingParams(**sampling_kwargs(params, n // copies, self.eos_id))
        requests = [vllm.TokensPrompt(prompt_token_ids=list(p)) for p in prompts for _ in range(copies)]
        self.wake_up()
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        if self.enable_sleep_mode:
            self.sleep()  # give the weights' and the KV cache's memory back to the trainer's step
        return samples_from_outputs(prompts, outputs, n, self.eos_id)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy the trainer's tensors into vLLM's model and sample as ``version`` from now on.

        Call path (vLLM >= 0.10, V1 engine with its core in this process, as set up in
        ``__init__``): ``LLM.collective_rpc(fn, args=(weights,))`` runs
        ``fn(worker, weights)`` on the worker directly, no serialization; ``fn`` is
        ``_load_weights_on_worker``. The list holds references to the trainer's tensors
        (no copies) and every name is checked before anything is loaded. The prefix cache is
        dropped afterwards: its KV blocks were computed with the old weights.
        """
        weights = [(vllm_weight_name(name), tensor.detach()) for name, tensor in named_tensors]
        if not weights:  # the trainer's step changed nothing: the same weights under a new version
            self.version = version
            return
        self.wake_up()  # writing into offloaded (unmapped) weights would crash
        self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()
        self.version = version

    def sleep(self) -> None:
        """Level-1 sleep: the weights go to CPU memory and the KV cache is dropped, so the
        trainer has the GPU; ``generate`` and ``update_weights`` wake the engine first."""
        if not self.enable_sleep_mode:
            raise OmnigymError("VLLMEngine.sleep needs enable_sleep_mode=True when the engine is built")
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Weights back to the GPU and a fresh KV cache (a no-op when awake)."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
