"""Discrete-event model of an RL post-training loop: N generator workers, M trainer workers.

One step: the generators turn S prompts into S samples, the trainers take one clipped policy
step on them, and the new weights (version v+1) are pushed to the generators. Modelled:

  generation  a generator decodes C (``gen_concurrency``) sequences at once; a sample takes
              C * g * L seconds (g: seconds per sample at full throughput, L: its length
              factor): a busy generator yields 1/g samples/s and a straggler decodes at the
              per-sequence speed (memory-bound decoding: more sequences, same step time).
  training    sum(L) * t / M (t: seconds per sample on one trainer) plus U updates x a ring
              all-reduce of the gradients, 2 (M-1)/M * param_bytes / bandwidth, not overlapped.
  weight sync param_bytes / bandwidth + a fixed latency. It occupies the trainer; generators
              keep decoding and take the new version between samples.
  jitter      L ~ lognormal with mean 1 (sigma ``jitter``, seeded), optionally capped.
  sync        step k trains only on samples of version k: step = gen + train + sync.
  async K     a sample starts only while (started - dropped) < (version + K + 1) * S; the
              trainer takes the oldest versions first and drops a sample once step - version
              > K. K = 0 is sync. Rates and idle shares exclude the first ``warmup`` steps.

``--validate runs.json`` compares measured runs (bench/async_vs_sync.py) with predictions; ``--predict``
prints 8- and 64-GPU figures for a 7B model from published numbers (PUB below, docs/scaling.md).

    python bench/scaling_sim.py --generators 4 --trainers 2 --samples-per-step 64 \\
        --gen-seconds-per-sample 0.5 --train-seconds-per-sample 0.25 --sync-seconds 1 --mode async
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import sys
from collections import Counter

import numpy as np

PROG = "scaling_sim.py"


def _int(name, v, lo=1):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _num(name, v, lo=0.0, strict=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < lo or (strict and v == lo):
        raise ValueError(f"{name} must be a number {'>' if strict else '>='} {lo:g}, got {v!r}")
    return float(v)


def simulate(*, generators, trainers, samples_per_step, gen_s_per_sample=None, tokens_per_sample=None,
             gen_tokens_per_s=None, gen_concurrency=1, train_s_per_sample=None, prompt_tokens=0,
             train_tokens_per_s=None, param_bytes=0.0, allreduce_gbps=50.0, updates_per_step=1,
             sync_s=None, sync_gbps=50.0, sync_latency_s=0.0, jitter=0.0, jitter_cap=0.0, seed=0,
             mode="sync", max_staleness=1, steps=40, warmup=None) -> dict:
    """Simulate ``steps`` RL steps; raises ValueError on bad input."""
    N, M, S, C, U, steps = (_int(k, v) for k, v in (
        ("generators", generators), ("trainers", trainers), ("samples_per_step", samples_per_step),
        ("gen_concurrency", gen_concurrency), ("updates_per_step", updates_per_step), ("steps", steps)))
    if mode not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    K = 0 if mode == "sync" else _int("max_staleness", max_staleness, 0)
    warmup = min(steps // 4, 10) if warmup is None else _int("warmup", warmup, 0)
    if warmup >= steps or steps * S > 3_000_000:
        raise ValueError(f"need warmup < steps and steps * samples_per_step <= 3e6 ({warmup}, {steps}, {S})")

    def per_sample(name, direct, rate_name, rate, extra=0.0):  # seconds per sample
        if direct is not None:
            return _num(name, direct, strict=True)
        if tokens_per_sample is None or rate is None:
            raise ValueError(f"give {name}, or tokens_per_sample and {rate_name}")
        return (_num("tokens_per_sample", tokens_per_sample, strict=True) + extra) / _num(
            rate_name, rate, strict=True)

    g = per_sample("gen_s_per_sample", gen_s_per_sample, "gen_tokens_per_s", gen_tokens_per_s)
    t = per_sample("train_s_per_sample", train_s_per_sample, "train_tokens_per_s", train_tokens_per_s,
                   _num("prompt_tokens", prompt_tokens))
    pb = _num("param_bytes", param_bytes)
    allreduce = U * 2 * (M - 1) / M * pb / (_num("allreduce_gbps", allreduce_gbps, strict=True) * 1e9)
    W = _num("sync_s", sync_s) if sync_s is not None else \
        pb / (_num("sync_gbps", sync_gbps, strict=True) * 1e9) + _num("sync_latency_s", sync_latency_s)
    sigma, cap = _num("jitter", jitter), _num("jitter_cap", jitter_cap)
    rng, pool = np.random.default_rng(_int("seed", seed, 0)), []

    def length() -> float:  # lognormal, mean 1 before the cap; drawn in blocks
        if not pool:
            z = np.exp(sigma * rng.standard_normal(4096) - sigma * sigma / 2)
            pool.extend((np.minimum(z, cap) if cap > 0 else z).tolist())
        return pool.pop()

    events: list = []  # (time, tie, kind, payload): kind 0 = sample done, 1 = train + sync done
    tie = itertools.count()
    now, done, started, dropped, free = 0.0, 0, 0, 0, N * C  # done = steps trained = weights version
    buffer: dict[int, list] = {}  # version -> lengths of finished, unconsumed samples
    trainer_idle, gen_busy, train_busy, ends, hist, T_all = True, [], [], [], Counter(), []

    def admit():
        nonlocal free, started
        while free and started - dropped < (done + K + 1) * S:
            heapq.heappush(events, (now + C * g * (L := length()), next(tie), 0, (done, L, now)))
            free, started = free - 1, started + 1

    def try_train():
        nonlocal trainer_idle, dropped
        if not trainer_idle or done == steps:
            return
        for v in [v for v in buffer if done - v > K]:
            dropped += len(buffer.pop(v))
        if sum(map(len, buffer.values())) < S:
            return
        batch: list = []
        for v in sorted(buffer):
            take = buffer[v][:S - len(batch)]
            del buffer[v][:len(take)]
            batch += take
            hist[done - v] += len(take) if done >= warmup else 0
            if not buffer[v]:
                del buffer[v]
        T_all.append(sum(batch) * t / M + allreduce)
        trainer_idle = False
        heapq.heappush(events, (now + T_all[-1] + W, next(tie), 1, T_all[-1]))

    admit()
    while done < steps:
        now, _, kind, data = heapq.heappop(events)
        if kind == 0:
            free += 1
            gen_busy.append((data[2], now))
            buffer.setdefault(data[0], []).append(data[1])
        else:
            train_busy.append((now - data - W, now))
            done, trainer_idle = done + 1, True
            ends.append(now)
        try_train()
        admit()
    gen_busy += [(d[2], tm) for tm, _, k, d in events if k == 0]  # still decoding at the end
    t0, t1 = (ends[warmup - 1] if warmup else 0.0), ends[-1]

    def idle_pct(intervals, workers):
        a = np.asarray(intervals, dtype=float).reshape(-1, 2)
        busy = np.clip(np.minimum(a[:, 1], t1) - np.maximum(a[:, 0], t0), 0, None).sum()
        return max(0.0, 100 * (1 - busy / (workers * (t1 - t0))))

    sps, hist = (steps - warmup) / (t1 - t0), {k: v for k, v in sorted(hist.items()) if v}
    return {"steps_per_s": sps, "samples_per_s": sps * S, "step_s": 1 / sps,
            "gen_idle_pct": idle_pct(gen_busy, N * C), "trainer_idle_pct": idle_pct(train_busy, 1),
            "staleness_hist": hist, "mean_staleness": sum(k * c for k, c in hist.items()) / sum(hist.values()),
            "dropped_pct": 100 * dropped / max(started, 1), "gen_s_per_step": S * g / N,
            "train_s_per_step": float(np.mean(T_all)), "sync_s": W, "mode": mode, "max_staleness": K}


def report(r: dict) -> str:
    hist = ", ".join(f"{k}: {v}" for k, v in r["staleness_hist"].items())
    return (f"mode {r['mode']} (K={r['max_staleness']})  step {r['step_s']:.3f} s  "
            f"{r['steps_per_s']:.4f} steps/s  {r['samples_per_s']:.2f} samples/s\n"
            f"ideal gen {r['gen_s_per_step']:.3f} s/step  train {r['train_s_per_step']:.3f} s/step  "
            f"sync {r['sync_s']:.3f} s\ngenerator idle {r['gen_idle_pct']:.1f}%  trainer idle "
            f"{r['trainer_idle_pct']:.1f}%  dropped {r['dropped_pct']:.1f}%\n"
            f"staleness (steps: samples) {{{hist}}}  mean {r['mean_staleness']:.3f}")


def validate(path: str) -> None:
    """Runs: gen/train seconds per step measured apart (N gens, M trainers), sync seconds, results."""
    try:
        with open(path) as f:
            runs = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    runs = runs.get("runs") if isinstance(runs, dict) else runs
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise ValueError(f"{path} must hold a non-empty JSON list of run objects")
    rows = []
    for i, r in enumerate(runs):
        try:
            need = ("mode", "samples_per_step", "gen_seconds_per_step", "train_seconds_per_step", "sync_seconds",
                    "samples_per_s")
            if missing := [k for k in need if k not in r]:
                raise ValueError(f"missing {', '.join(missing)}")
            N, M, S = (_int(k, r.get(k, 1)) for k in ("generators", "trainers", "samples_per_step"))
            gen, train = (_num(k, r[k], strict=True) for k in need[2:4])
            pred = simulate(generators=N, trainers=M, samples_per_step=S, mode=r["mode"],
                            gen_s_per_sample=gen * N / S, train_s_per_sample=train * M / S,
                            sync_s=r["sync_seconds"], max_staleness=r.get("max_staleness", 1),
                            gen_concurrency=r.get("gen_concurrency", 1), jitter=r.get("jitter", 0.0),
                            seed=r.get("seed", 0), steps=r.get("steps", 40))
            meas, ms = _num("samples_per_s", r["samples_per_s"], strict=True), r.get("mean_staleness")
            ms_txt = "-" if ms is None else f"{_num('mean_staleness', ms):.2f}"
        except ValueError as e:
            raise ValueError(f"{path}: run {i}: {e}") from None
        rows.append(f"{str(r.get('name', i))[:21]:<22}{pred['mode']:>6}{pred['max_staleness']:>3}"
                    f"{pred['samples_per_s']:>16.3f}{meas:>10.3f}{pred['samples_per_s'] / meas:>7.2f}"
                    f"{pred['mean_staleness']:>12.2f}{ms_txt:>10}")
    print(f"{'run':<22}{'mode':>6}{'K':>3}{'pred samples/s':>16}{'measured':>10}{'ratio':>7}"
          f"{'pred stale':>12}{'measured':>10}", *rows, sep="\n")


# --predict: a 7B model on H100s, vLLM generators. [n]: title and URL under "Sources" in docs/scaling.md.
PUB = {
    "params": 7e9,                 # "7B"; bf16 weights and gradients: 2 bytes/param
    "prompts": 512, "n": 16,       # [1] verl recipe/dapo/test_dapo_7b_math.sh: train_prompt_bsz=512,
    "updates": 512 // 32,          # n_resp_per_prompt=16, train_prompt_mini_bsz=32, 8k max response
    "response": 2048, "prompt": 256, "cap": 4.0,  # ASSUMED mean lengths; cap = 8192 / 2048
    "gen_tok_s": 5000,             # ASSUMED per H100; [2] Red Hat MLPerf v5.1: 5,777 tok/s offline,
    "concurrency": 64,             # Llama-3.1-8B FP8, vLLM, one H100. ASSUMED: 78 tok/s/sequence
    "train_tok_s": 5762 * 3 / 4,   # [4] torchtitan performance.md: Llama 3.1 8B FSDP on 8 H100,
                                   # 5,762 tok/s/GPU; x3/4 for the old-log-prob forward
    "nvlink_gbps": 450,            # [5] H100 SXM NVLink 900 GB/s bidirectional: 450 each way
    "ib_gbps": 50,                 # [4][6] one 400 Gb/s InfiniBand NIC per GPU
    "sync_latency": 0.5,           # ASSUMED: 14 GB / 50 GB/s + 0.5 s = 0.78 s ([7] SkyRL: 14B 1.6 s)
    "jitter": 0.6,                 # ASSUMED lognormal sigma of the response length
}


def predict(measured=6) -> None:  # async fills its K-step buffer first: warm up 4 + 4K steps
    p = PUB
    print(f"7B model, {p['prompts']} prompts x {p['n']} samples/step, {p['response']}+{p['prompt']} "
          f"tokens/sample (lognormal sigma {p['jitter']}, cap {p['cap']:g}x), vLLM {p['gen_tok_s']} tok/s "
          f"per GPU ({p['concurrency']} sequences), training {p['train_tok_s']:.0f} tok/s per GPU, "
          f"{p['updates']} updates/step\n\n| GPUs | layout | gen + train GPUs | K | step s | samples/s "
          f"| gen idle % | trainer idle % | GPU idle % | mean staleness | dropped % |\n" + "|---" * 11 + "|")
    for gpus in (8, 64):
        def run(N, M, mode, K=1):
            return simulate(generators=N, trainers=M, samples_per_step=p["prompts"] * p["n"],
                            tokens_per_sample=p["response"], gen_tokens_per_s=p["gen_tok_s"],
                            gen_concurrency=p["concurrency"], prompt_tokens=p["prompt"],
                            train_tokens_per_s=p["train_tok_s"], param_bytes=2 * p["params"],
                            allreduce_gbps=p["nvlink_gbps"] if M <= 8 else p["ib_gbps"],
                            updates_per_step=p["updates"], sync_gbps=p["ib_gbps"],
                            sync_latency_s=p["sync_latency"], jitter=p["jitter"], jitter_cap=p["cap"],
                            mode=mode, max_staleness=K, steps=4 + 4 * K + measured, warmup=4 + 4 * K)
        unit = 1 if gpus == 8 else 8  # split a node by GPU, a cluster by 8-GPU node
        split = {n: run(n, gpus - n, "async") for n in range(unit, gpus, unit)}
        best = max(split, key=lambda n: split[n]["samples_per_s"])
        half, rest = gpus // 2, gpus - best
        rows = [("colocated", gpus, gpus, "sync", run(gpus, gpus, "sync"))] + (
            [("split, even", half, half, 1, split[half])] if best != half else []) + [
            ("split, best", best, rest, 1, split[best]), ("split, best", best, rest, 4, run(best, rest, "async", 4))]
        for layout, N, M, K, r in rows:
            gi, ti = r["gen_idle_pct"], r["trainer_idle_pct"]  # colocated: the roles share the GPUs
            idle = max(gi + ti - 100, 0.0) if K == "sync" else (N * gi + M * ti) / (N + M)
            print(f"| {gpus} | {layout} | {N} + {M} | {K} | {r['step_s']:.0f} | {r['samples_per_s']:.1f} "
                  f"| {gi:.0f} | {ti:.0f} | {idle:.0f} | {r['mean_staleness']:.2f} | {r['dropped_pct']:.1f} |")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"{PROG}: error: {message}\n")
        sys.exit(2)


FLAGS = [  # flag, simulate() keyword, type, default, help
    ("generators", "generators", int, 1, "N"), ("trainers", "trainers", int, 1, "M"),
    ("samples-per-step", "samples_per_step", int, 64, "S"), ("seed", "seed", int, 0, "rng seed"),
    ("gen-seconds-per-sample", "gen_s_per_sample", float, None, "g: seconds per sample, busy generator"),
    ("tokens-per-sample", "tokens_per_sample", float, None, "generated tokens/sample (instead of g, t)"),
    ("gen-tokens-per-s", "gen_tokens_per_s", float, None, "generation tokens/s per generator"),
    ("gen-concurrency", "gen_concurrency", int, 1, "C: sequences decoded at once per generator"),
    ("train-seconds-per-sample", "train_s_per_sample", float, None, "t: seconds per sample, one trainer"),
    ("prompt-tokens", "prompt_tokens", float, 0, "prompt tokens per sample (trained, not generated)"),
    ("train-tokens-per-s", "train_tokens_per_s", float, None, "training tokens/s per trainer"),
    ("param-bytes", "param_bytes", float, 0, "bytes of weights (and of gradients)"),
    ("allreduce-gbps", "allreduce_gbps", float, 50, "GB/s"), ("sync-gbps", "sync_gbps", float, 50, "GB/s"),
    ("updates-per-step", "updates_per_step", int, 1, "optimizer updates (all-reduces) per RL step"),
    ("sync-seconds", "sync_s", float, None, "weight-sync seconds (instead of bytes/bandwidth + latency)"),
    ("sync-latency", "sync_latency_s", float, 0, "fixed weight-sync seconds"),
    ("jitter", "jitter", float, 0, "lognormal sigma of the per-sample length"),
    ("jitter-cap", "jitter_cap", float, 0, "cap on the length factor (0: none)"),
    ("max-staleness", "max_staleness", int, 1, "K for --mode async"), ("steps", "steps", int, 40, "steps"),
    ("warmup", "warmup", int, None, "steps left out of the rates (default min(steps/4, 10))")]


def main(argv=None) -> None:
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--validate", metavar="FILE.json", help="compare measured runs with predictions")
    ap.add_argument("--predict", action="store_true", help="8- and 64-GPU table, 7B model, published figures")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--mode", choices=("sync", "async"), default="sync")
    for flag, _, typ, default, what in FLAGS:
        ap.add_argument(f"--{flag}", type=typ, default=default, help=what)
    args = ap.parse_args(argv)
    try:
        if args.predict:
            return predict()
        if args.validate is not None:
            return validate(args.validate)
        r = simulate(mode=args.mode, **{kw: getattr(args, f.replace("-", "_")) for f, kw, *_ in FLAGS})
    except ValueError as e:
        ap.error(str(e))
    print(json.dumps(r) if args.json else report(r))


if __name__ == "__main__":
    main()
