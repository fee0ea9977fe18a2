"""``omnigym serve`` under 1 and 4 Tinker SDK clients, and skyrl-tx on the same loop where it runs.

Each client runs the Tinker RL loop against its own LoRA run on one shared base model: save the
weights for sampling, sample ``--samples`` completions of ``--max-tokens`` tokens, then
``forward_backward`` (cross-entropy on the sampled sequences) and ``optim_step``. One warm-up
iteration per client is not timed. Printed per configuration: the tokens sampled per second,
all tokens (sampled + trained) per second, the wall time, and the 4-client / 1-client ratio
(issue 41's goal: >= 2.5x). The machine's load average is printed with every line: other work
on the cores moves these figures more than anything measured here.

skyrl-tx (PyPI ``skyrl-tx`` 0.3.0, SkyRL's JAX Tinker server) is not measured: it cannot be
installed without torch. Its wheel lists ``peft`` as a base requirement (not an extra), and
``tx/utils/models.py`` imports ``peft`` at module level (for ``peft.LoraConfig`` when it saves
an adapter); ``peft`` requires ``torch>=1.13``. A JAX-only environment for it, as this bench
was asked to build (a venv under ``bench/.cache/`` that does not pull torch), does not exist for
that release; the script prints this reason in place of its figures.

    OMP_NUM_THREADS=1 python bench/serve_vs_skyrl_tx.py [--quick] [--model PATH] [--clients 1 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKYRL_REASON = ("skyrl-tx 0.3.0 not measured: its wheel requires peft (a base dependency; tx/utils/models.py "
                "imports peft at module level for peft.LoraConfig), and peft requires torch>=1.13, so it cannot be "
                "installed into a torch-free JAX venv under bench/.cache/")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} cores"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, store: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    exe = Path(sys.executable).parent / "omnigym"
    proc = subprocess.Popen([str(exe), "serve", "--base-model", model, "--store", str(store), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"omnigym serve exited: {proc.stderr.read()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("omnigym serve did not start listening within two minutes")


def client_loop(url: str, base: str, index: int, args, barrier: threading.Barrier, counts: dict) -> None:
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=f"tml-bench-client-{index}")
    tc = service.create_lora_training_client(base_model=base, rank=8, seed=index).result()
    prompt = [10 + index, 20, 30, 40, 50, 60, 70, 80]
    sampled = trained = 0
    for step in range(args.steps + 1):
        if step == 1:  # the warm-up iteration is over for every client: the clock starts
            barrier.wait()
            sampled = trained = 0
        sampler = tc.save_weights_and_get_sampling_client().result()
        result = sampler.sample(types.ModelInput.from_ints(prompt), args.samples,
                                types.SamplingParams(max_tokens=args.max_tokens, seed=step, temperature=1.0)).result()
        data = []
        for seq in result.sequences:
            tokens = prompt + list(seq.tokens)
            sampled += len(seq.tokens)
            trained += len(tokens) - 1
            data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                    loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}))
        fb = tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
        fb.result()
    counts[index] = (sampled, trained)


def measure(url: str, base: str, clients: int, args) -> dict:
    barrier = threading.Barrier(clients + 1)
    counts: dict = {}
    threads = [threading.Thread(target=client_loop, args=(url, base, i, args, barrier, counts))
               for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if len(counts) != clients:
        raise SystemExit("a client failed (see above)")
    sampled = sum(c[0] for c in counts.values())
    total = sampled + sum(c[1] for c in counts.values())
    return {"clients": clients, "wall": wall, "sampled_per_s": sampled / wall, "tokens_per_s": total / wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps: under 3 minutes on 2 shared cores")
    p.add_argument("--model", help="base model (default: omnigym's tiny Llama, built in a temporary folder)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=None, help="timed iterations per client (default 6, quick 3)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    args.steps = args.steps or (3 if args.quick else 6)
    with tempfile.TemporaryDirectory() as tmp:
        base = args.model
        if base is None:
            from omnigym.models.lm import build_tiny_model

            base = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        print(f"model {args.model or 'tiny Llama (~1M parameters)'}; {args.steps} timed steps per client, "
              f"{args.samples} samples x {args.max_tokens} tokens each; {load()}", flush=True)
        results = {}
        for clients in args.clients:
            proc, url = start_server(base, Path(tmp) / f"store-{clients}")  # a fresh server each: no warm caches
            try:
                r = measure(url, base, clients, args)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            results[clients] = r
            print(f"omnigym serve  {clients} client(s): {r['sampled_per_s']:8.1f} sampled tokens/s  "
                  f"{r['tokens_per_s']:8.1f} tokens/s (sampled + trained)  {r['wall']:6.1f} s  {load()}", flush=True)
        if 1 in results and len(results) > 1:
            for clients, r in results.items():
                if clients != 1:
                    print(f"omnigym serve {clients} clients / 1 client: "
                          f"{r['sampled_per_s'] / results[1]['sampled_per_s']:.2f}x sampled tokens/s, "
                          f"{r['tokens_per_s'] / results[1]['tokens_per_s']:.2f}x tokens/s (goal >= 2.5x)")
        print(SKYRL_REASON)
        print("omnigym / skyrl-tx ratio: not available (skyrl-tx not measured, see above)")


if __name__ == "__main__":
    main()
