"""Timings of omnigym serve's compute (serve/hub.py ModelHub) in process, no HTTP: one
forward_backward (cross_entropy, 8 sequences x 128 tokens, LoRA rank 32), one optim_step, and
sampling 8 x 64 new tokens from saved sampler weights (first call: the merge; then cached) and
from the base, with the kv and the hf engine.

    python bench/serve_hub_timing.py                      # the tiny model, built in a temporary folder
    python bench/serve_hub_timing.py models/smollm2-135m-instruct
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

from omnigym.models.lm import build_tiny_model
from omnigym.serve.contract import AdamStep, DatumIn, SampleParams, SamplerSource
from omnigym.serve.hub import ModelHub


def mean_seconds(fn, reps: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def bench(model: str, engine: str, store: Path) -> str:
    hub = ModelHub(model, store / engine, engine=engine)
    hub.create_model("a", 32, seed=0)
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8):
        tokens = torch.randint(10, min(hub.vocab_size, 90), (128,), generator=g).tolist()
        data.append(DatumIn(tokens, {"target_tokens": torch.tensor(tokens[1:] + [5]), "weights": torch.ones(128)}))

    def train_step():
        hub.forward_backward("a", data, "cross_entropy")
        hub.optim_step("a", AdamStep(learning_rate=1e-4))

    step = mean_seconds(train_step, 2)
    hub.forward_backward("a", data, "cross_entropy")
    start = time.perf_counter()
    hub.optim_step("a", AdamStep(learning_rate=1e-4))
    optim = time.perf_counter() - start
    hub.save("a", "w", "sampler")
    prompt, params, source = data[0].tokens[:32], SampleParams(max_tokens=64, seed=1), SamplerSource("a", "w")
    start = time.perf_counter()
    hub.sample(source, prompt, 8, params)
    first = time.perf_counter() - start
    cached = mean_seconds(lambda: hub.sample(source, prompt, 8, params), 2)
    base = mean_seconds(lambda: hub.sample(SamplerSource(), prompt, 8, params), 2)
    return (f"{Path(model).name} engine={engine}: forward_backward+optim_step 8x128 tokens {step * 1000:.0f} ms "
            f"({8 * 128 / step:.0f} tokens/s; optim_step alone {optim * 1000:.1f} ms); sample 8 x 64 tokens: "
            f"first {first * 1000:.0f} ms (with the merge), cached {cached * 1000:.0f} ms "
            f"({8 * 64 / cached:.0f} tokens/s), base {base * 1000:.0f} ms")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = sys.argv[1] if len(sys.argv) > 1 else str(build_tiny_model(Path(tmp) / "tiny"))
        for engine in ("kv", "hf"):
            print(bench(model, engine, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
