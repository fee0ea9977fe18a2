"""What ``omnigym serve`` costs: one pig-Latin training step and one sample batch through the
tinker SDK and the HTTP API vs the same work on the hub in process, in one run.

- **step**: ``forward_backward`` (``cross_entropy`` on the pig-Latin walk-through's 7 examples,
  docs/serve.md) + ``optim_step``, waited for, as the walk-through does it each step;
- **sample**: ``n`` samples of ``max_tokens`` from the weights the run saved for sampling.

The in-process side is ``ModelHub`` (serve/hub.py) itself, the code the server runs on its
worker thread; the API side is ``python -m omnigym serve`` in a subprocess on 127.0.0.1 and the
official SDK in this process. Both use the same model, LoRA rank, seed, data and thread count,
one side after the other (the server first, so two copies of the model never compete for the
cores); medians are printed with two ratios:

- API overhead share of a step: (API step - in-process step) / API step;
- sampling throughput, API / in-process (sampled tokens per second).

    python bench/serve_overhead.py [--model PATH] [--reps 5] [--samples 8] [--max-tokens 16]

Without ``--model`` the tiny test model is built in a temporary folder; ``--model
models/smollm2-135m-instruct`` (``make smollm2``) measures a real one.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

PIG_LATIN = [
    ("banana split", "anana-bay plit-say"),
    ("quantum physics", "uantum-qay ysics-phay"),
    ("donut shop", "onut-day op-shay"),
    ("pickle jar", "ickle-pay ar-jay"),
    ("space exploration", "ace-spay exploration-way"),
    ("rubber duck", "ubber-ray uck-day"),
    ("coding wizard", "oding-cay izard-way"),
]
PROMPT = "English: coffee break\nPig Latin:"


def examples(tokenizer) -> list[tuple[list[int], list[int], list[float]]]:
    """(input tokens, target tokens, weights) per example: the answer's tokens weigh 1."""
    rows = []
    for english, pig in PIG_LATIN:
        prompt = tokenizer.encode(f"English: {english}\nPig Latin:", add_special_tokens=True)
        answer = tokenizer.encode(f" {pig}\n\n", add_special_tokens=False)
        tokens, weights = prompt + answer, [0.0] * len(prompt) + [1.0] * len(answer)
        rows.append((tokens[:-1], tokens[1:], weights[1:]))
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_process(model: str, store: Path, rows, args) -> dict[str, list[float]]:
    import torch

    from omnigym.serve.contract import AdamStep, DatumIn, SampleParams, SamplerSource
    from omnigym.serve.hub import ModelHub

    hub = ModelHub(model, store)
    hub.create_model("bench", args.rank, 0, True, True, True)  # the SDK's defaults: mlp, attn, unembed
    data = [DatumIn(tokens=list(inp), inputs={"target_tokens": torch.tensor(tgt), "weights": torch.tensor(w)})
            for inp, tgt, w in rows]
    prompt = hub_tokenizer(model).encode(PROMPT)
    times: dict[str, list[float]] = {"step": [], "sample_tok_s": []}
    for rep in range(args.warmup + args.reps):
        start = time.perf_counter()
        hub.forward_backward("bench", data, "cross_entropy", None, False)
        hub.optim_step("bench", AdamStep(learning_rate=1e-4))
        step = time.perf_counter() - start
        hub.save("bench", f"s{rep}", "sampler")
        start = time.perf_counter()
        out = hub.sample(SamplerSource("bench", f"s{rep}"), prompt, args.samples,
                         SampleParams(max_tokens=args.max_tokens, temperature=1.0, seed=rep))
        tokens = sum(len(s.tokens) for s in out.sequences)
        if rep >= args.warmup:
            times["step"].append(step)
            times["sample_tok_s"].append(tokens / (time.perf_counter() - start))
    return times


def hub_tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def through_api(model: str, store: Path, rows, args) -> dict[str, list[float]]:
    import tinker
    from tinker import types

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "omnigym", "serve", "--base-model", model, "--host", "127.0.0.1",
                               "--port", str(port), "--store", str(store)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if server.poll() is not None:
                raise SystemExit(f"omnigym serve exited: {server.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base_url}/api/v1/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("omnigym serve did not start in 180 s") from None
                time.sleep(0.5)
        os.environ.setdefault("TINKER_API_KEY", "tml-local-bench")
        service = tinker.ServiceClient(base_url=base_url)
        training = service.create_lora_training_client(base_model=model, rank=args.rank, seed=0).result()
        data = [types.Datum(model_input=types.ModelInput.from_ints(list(inp)),
                            loss_fn_inputs={"target_tokens": list(tgt), "weights": list(w)}) for inp, tgt, w in rows]
        prompt = types.ModelInput.from_ints(hub_tokenizer(model).encode(PROMPT))
        times: dict[str, list[float]] = {"step": [], "sample_tok_s": []}
        for rep in range(args.warmup + args.reps):
            start = time.perf_counter()
            fb = training.forward_backward(data, "cross_entropy")
            opt = training.optim_step(types.AdamParams(learning_rate=1e-4))
            fb.result()
            opt.result()
            step = time.perf_counter() - start
            sampler = training.save_weights_and_get_sampling_client().result()
            start = time.perf_counter()
            out = sampler.sample(prompt=prompt, num_samples=args.samples,
                                 sampling_params=types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0,
                                                                      seed=rep)).result()
            tokens = sum(len(s.tokens) for s in out.sequences)
            if rep >= args.warmup:
                times["step"].append(step)
                times["sample_tok_s"].append(tokens / (time.perf_counter() - start))
        return times
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model folder (default: the tiny test model, built here)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same on both sides")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    sys.path.insert(0, str(SRC))
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from omnigym.models.lm import build_tiny_model

            model = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        model = str(Path(model).resolve())
        rows = examples(hub_tokenizer(model))
        # the server's subprocess first, so the in-process hub is not in memory while it runs
        api = through_api(model, Path(tmp) / "api_store", rows, args)
        local = in_process(model, Path(tmp) / "local_store", rows, args)
    med = {side: {k: statistics.median(v) for k, v in t.items()} for side, t in (("api", api), ("local", local))}
    tokens = sum(len(w) for _, _, w in rows)
    print(f"model {model}: {len(rows)} examples, {tokens} tokens a step; {args.samples} samples x {args.max_tokens} "
          f"tokens; LoRA rank {args.rank}; {args.threads} torch thread(s); median of {args.reps}")
    print(f"step (forward_backward + optim_step): in process {med['local']['step'] * 1e3:.1f} ms, "
          f"API {med['api']['step'] * 1e3:.1f} ms")
    print(f"sampling: in process {med['local']['sample_tok_s']:.1f} tokens/s, API {med['api']['sample_tok_s']:.1f} tokens/s")
    share = (med["api"]["step"] - med["local"]["step"]) / med["api"]["step"]
    print(f"API overhead share of a step: {share:.1%}")
    print(f"sampling throughput API / in process: {med['api']['sample_tok_s'] / med['local']['sample_tok_s']:.2f}")


if __name__ == "__main__":
    main()
