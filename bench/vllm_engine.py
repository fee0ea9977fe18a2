"""Tokens per second: omnigym's ``hf``, ``kv`` and ``vllm`` engines on the same prompts.

Loads ``--model`` (a local folder saved with save_pretrained) once in bfloat16 on the GPU
for the ``hf`` and ``kv`` engines, and builds the ``vllm`` engine (the ``[vllm]`` extra)
from the same folder, as ``make_engine(model, tokenizer, "vllm")`` does. Every engine
samples the same ``--prompts`` arithmetic questions (the chat template applied when the
tokenizer has one), ``--n`` samples each, up to ``--max-new-tokens`` at ``--temperature``,
with one ``generate`` call per repetition; a warm-up call per engine is not timed. The
engines take turns within each repetition, in a rotating order. Tokens are the generated
ones up to and including the end-of-sequence token, so an engine whose samples stop
earlier is not credited for tokens it did not make; the median over ``--reps`` is
reported, with each engine's ratio to ``hf`` and to ``kv``. ``kv`` is left out, with its
reason, for models it cannot run.

Needs a CUDA GPU and vLLM. Without vLLM it prints one line saying so and exits 2 (as a
bad flag does), so that a CPU machine fails fast rather than benchmarks nothing.

    python bench/vllm_engine.py --model PATH [--prompts 64] [--n 8] [--max-new-tokens 128]
        [--temperature 1.0] [--reps 3] [--gpu-memory-utilization 0.5]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import time
from pathlib import Path


def arithmetic_prompts(tokenizer, count: int) -> list[list[int]]:
    rng = random.Random(0)
    prompts = []
    for _ in range(count):
        question = f"What is {rng.randint(10, 999)} + {rng.randint(10, 999)}? Answer with the number."
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = tokenizer(question)["input_ids"]
        prompts.append(list(ids))
    return prompts


def timed(engine, prompts, n, params) -> tuple[float, int]:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    groups = engine.generate(prompts, n, params)
    torch.cuda.synchronize()
    return time.perf_counter() - start, sum(len(s.completion_ids) for g in groups for s in g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a local model folder (config.json, weights, tokenizer)")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="the share of the GPU vLLM takes for its weights and KV cache")
    args = parser.parse_args()
    if min(args.prompts, args.n, args.max_new_tokens, args.reps) < 1:
        parser.error("--prompts, --n, --max-new-tokens and --reps must be 1 or more, got "
                     f"{args.prompts}, {args.n}, {args.max_new_tokens} and {args.reps}")
    if args.temperature <= 0:
        parser.error(f"--temperature must be positive, got {args.temperature:g}")
    if not 0 < args.gpu_memory_utilization < 1:
        parser.error(f"--gpu-memory-utilization must be between 0 and 1, got {args.gpu_memory_utilization:g}")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there; give a folder saved with save_pretrained")
    if importlib.util.find_spec("vllm") is None:
        parser.exit(2, f"{parser.prog}: error: vllm is not installed (the GPU-only extra: pip install "
                       "'omnigym[vllm]' on a CUDA machine); nothing to compare\n")

    import torch

    if not torch.cuda.is_available():
        parser.exit(2, f"{parser.prog}: error: no CUDA GPU here: the vllm engine needs one; nothing to compare\n")

    import vllm

    from omnigym.errors import OmnigymError
    from omnigym.inference.engine import SamplingParams
    from omnigym.inference.hf import HFEngine
    from omnigym.inference.kv import LlamaFamilyEngine
    from omnigym.inference.vllm import VLLMEngine
    from omnigym.models.lm import load_model, load_tokenizer

    tokenizer = load_tokenizer(args.model, need_chat_template=False)
    model = load_model(args.model, dtype="bfloat16", device="cuda").eval()
    prompts = arithmetic_prompts(tokenizer, args.prompts)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
    rows = args.prompts * args.n
    engines = {"hf": HFEngine(model, tokenizer, batch_size=rows)}
    try:
        engines["kv"] = LlamaFamilyEngine(model, tokenizer, batch_size=rows)
    except OmnigymError as exc:
        print(f"kv: left out ({exc})")
    engines["vllm"] = VLLMEngine(args.model, tokenizer, gpu_memory_utilization=args.gpu_memory_utilization,
                                 dtype="bfloat16")
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, vllm {vllm.__version__}; {args.model}: "
          f"{args.prompts} prompts x {args.n} samples, up to {args.max_new_tokens} new tokens, "
          f"temperature {args.temperature:g}", flush=True)

    for engine in engines.values():
        engine.generate(prompts, args.n, params)  # warm-up: compilation, CUDA graphs, allocator
    rates: dict[str, list[float]] = {name: [] for name in engines}
    lengths: dict[str, list[float]] = {name: [] for name in engines}
    names = list(engines)
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            seconds, tokens = timed(engines[name], prompts, args.n, params)
            rates[name].append(tokens / seconds)
            lengths[name].append(tokens / rows)
            print(f"rep {rep + 1} {name:5s} {tokens:7d} tokens in {seconds:7.2f} s: {tokens / seconds:9.0f} tokens/s",
                  flush=True)

    median = {name: statistics.median(r) for name, r in rates.items()}
    print("\nengine  tokens/s (median)  tokens/sample  x hf   x kv")
    for name in names:
        vs_kv = f"{median[name] / median['kv']:5.2f}" if "kv" in median else "    -"
        print(f"{name:6s}  {median[name]:17.0f}  {statistics.mean(lengths[name]):13.1f}  "
              f"{median[name] / median['hf']:5.2f}  {vs_kv}")


if __name__ == "__main__":
    main()
