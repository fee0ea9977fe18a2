"""GRPO samples/s with a served reward model (``rm:http://...``) vs the reward model loaded in
every process that scores (``rm:RUN_DIR``), and with the served model's scoring overlapped with
generation (``--overlap-scoring K``), side by side in one run.

The reward model is the tiny Llama backbone widened to ``--rm-hidden`` x ``--rm-layers`` with
a seeded random scalar head, saved as ``omnigym train rm`` saves one (throughput does not depend
on what the head learned). The policy is the ~1M-parameter tiny model on the arithmetic task,
``--prompts-per-step`` x ``--group-size`` replies a step, no warm-up. Each mode is a fresh
process, one after another on the same cores:

  folder   --rewards rm:RUN_DIR:1.0: each generator (Ray actor, or the trainer in sync) loads
           the reward model and scores its own replies
  served   --rewards rm:http://127.0.0.1:PORT:1.0: one `omnigym serve-rm` process holds it; the
           generators send each batch in one POST and the server merges concurrent batches
  overlap  served, with --overlap-scoring K (--overlap): each generator plays its batch in K
           parts and the server scores a part while the generator samples the next

samples/s is measured between step ends, leaving out the first and last steps (they evaluate).
The server's counters (requests, rows, forward passes) are read from its /info afterwards,
and the folder and served runs' per-step mean rewards compared (the overlapped run samples its
parts one after another, so its replies, and rewards, are other ones) (same seed: equal in sync, equal to float32
rounding on Ray, where the server may merge two actors' batches).

    python bench/rm_service.py [--runtime ray|sync] [--steps 12] [--num-generators 2]
                               [--rm-hidden 512 --rm-layers 8] [--batch-size 32] [--overlap 4]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

RESULT = "RESULT "


def build_reward_model(folder: str, hidden: int, layers: int, seed: int) -> tuple[str, int]:
    """A reward-model run directory (``run/model`` with its marker) on a random backbone, and its
    parameter count."""
    import torch

    from omnigym.models.lm import build_tiny_model, load_tokenizer
    from omnigym.models.scalar_head import load_scalar_model, save_reward_model

    base = build_tiny_model(os.path.join(folder, "base"), hidden=hidden, layers=layers, seed=seed)
    tokenizer = load_tokenizer(str(base))
    torch.manual_seed(seed)
    model = load_scalar_model(str(base), tokenizer.pad_token_id)
    save_reward_model(Path(folder) / "run" / "model", model, tokenizer,
                      {"base_model": "bench", "conversational": True, "max_length": 256})
    return os.path.join(folder, "run"), sum(p.numel() for p in model.parameters())


def one_run(reward: str, overlap: int, args) -> dict:
    """One mode in this process; prints its figures as JSON."""
    from omnigym.algos import grpo
    from omnigym.track.run import Run

    stamps, original_log = [], Run.log

    def timed_log(self, step, metrics):
        original_log(self, step, metrics)
        stamps.append((time.perf_counter(), metrics))

    Run.log = timed_log
    runtime = dict(runtime="ray", max_staleness=1, num_generators=args.num_generators) if args.runtime == "ray" else {}
    cfg = grpo.GRPOConfig(rewards=f"{reward}:1.0", seed=args.seed, sft_steps=0, steps=args.steps,
                          prompts_per_step=args.prompts_per_step, group_size=args.group_size,
                          max_new_tokens=args.max_new_tokens, eval_size=8, eval_every=args.steps,
                          checkpoint_every=args.steps, skip_equal_groups=False, run_dir=tempfile.mkdtemp(),
                          overlap_scoring=overlap, progress=False, plot=False, tensorboard=False, **runtime)
    grpo.train(cfg)
    intervals = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])][1:-1]  # the first and last steps evaluate
    rows = [m for _, m in stamps]
    step_s = statistics.mean(intervals)
    samples = cfg.prompts_per_step * cfg.group_size
    out = {"samples_per_s": samples / step_s, "step_seconds": step_s, "samples_per_step": samples,
           "rewards": [m["reward/mean"] for m in rows if "reward/mean" in m]}
    print(RESULT + json.dumps(out), flush=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run_dir: str, batch_size: int, env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = Path(run_dir).parent / "serve-rm.log"  # a file, not a pipe: nobody reads it while the run goes on
    server = subprocess.Popen([sys.executable, "-m", "omnigym.cli", "serve-rm", run_dir, "--port", str(port),
                               "--batch-size", str(batch_size)], env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            info(url)
            return server, url
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"serve-rm did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.5)


def info(url: str) -> dict:
    with urllib.request.urlopen(url + "/info", timeout=10) as response:
        return json.loads(response.read())


def run_mode(reward: str, args, env: dict, overlap: int = 1) -> dict:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("one", "reward", "overlap")]
    done = subprocess.run([sys.executable, __file__, "--one", "--reward", reward, "--overlap", str(overlap), *flags],
                          env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        sys.exit(f"{reward} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(RESULT):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", default="ray", choices=("ray", "sync"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--num-generators", type=int, default=2)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--rm-hidden", type=int, default=512)
    parser.add_argument("--rm-layers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="the server's --batch-size (and the folder's)")
    parser.add_argument("--overlap", type=int, default=4, help="--overlap-scoring of the third run (1: no third run)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reward", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 4:
        parser.error(f"--steps must be at least 4 (the first and last steps evaluate), got {args.steps}")
    if args.one:
        one_run(args.reward, args.overlap, args)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    folder = tempfile.mkdtemp(prefix="rm-bench-")
    run_dir, parameters = build_reward_model(folder, args.rm_hidden, args.rm_layers, args.seed)
    print(f"reward model: {parameters / 1e6:.1f}M parameters in {run_dir}", flush=True)
    runs = {"folder": run_mode(f"rm:{run_dir}", args, env)}
    print(f"folder  {runs['folder']['samples_per_s']:7.1f} samples/s", flush=True)
    server, url = start_server(run_dir, args.batch_size, env)
    try:
        runs["served"] = run_mode(f"rm:{url}", args, env)
        counts = info(url)
        print(f"served  {runs['served']['samples_per_s']:7.1f} samples/s", flush=True)
        if args.overlap > 1:
            runs["overlap"] = run_mode(f"rm:{url}", args, env, args.overlap)
            print(f"overlap {runs['overlap']['samples_per_s']:7.1f} samples/s", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    where = (f"--runtime ray --max-staleness 1, {args.num_generators} generator actors" if args.runtime == "ray"
             else "--runtime sync")
    print(f"\n{args.steps} GRPO steps x {runs['folder']['samples_per_step']} samples ({where}), "
          f"{parameters / 1e6:.1f}M-parameter reward model, seed {args.seed}\n")
    print("| reward | samples/s | s/step | vs folder | vs served | copies of the reward model |")
    print("|---|---|---|---|---|---|")
    copies = {"folder": args.num_generators if args.runtime == "ray" else 1, "served": 1, "overlap": 1}
    label = {"folder": "rm:RUN_DIR", "served": "rm:URL", "overlap": f"rm:URL --overlap-scoring {args.overlap}"}
    for name, r in runs.items():
        print(f"| {label[name]} | {r['samples_per_s']:.1f} | {r['step_seconds']:.2f} "
              f"| {r['samples_per_s'] / runs['folder']['samples_per_s']:.2f}x "
              f"| {r['samples_per_s'] / runs['served']['samples_per_s']:.2f}x | {copies[name]} |")
    gap = max(abs(a - b) for a, b in zip(runs["served"]["rewards"], runs["folder"]["rewards"]))
    print(f"\nsame seed: the steps' mean rewards with rm:URL and rm:RUN_DIR differ by at most {gap:.2e} "
          f"({len(runs['folder']['rewards'])} steps)")
    print(f"server: {counts['requests']} requests, {counts['rows']} rows in {counts['forward_passes']} forward passes "
          f"of up to {counts['batch_size']} rows ({counts['rows'] / max(1, counts['forward_passes']):.1f} rows a pass)")


if __name__ == "__main__":
    main()
