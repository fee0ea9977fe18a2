"""``omnigym serve`` under 1 and 4 Tinker SDK clients, and skyrl-tx on the same loop where it runs.

Each client runs the Tinker RL loop against its own LoRA run on one shared base model: save the
weights for sampling, sample ``--samples`` completions of ``--max-tokens`` tokens, then
``forward_backward`` (cross-entropy on the sampled sequences) and ``optim_step``. The warm-up
iterations (``--warmup``, 1) are not timed. Printed per configuration: the tokens sampled per second,
all tokens (sampled + trained) per second, the wall time, and the 4-client / 1-client ratio
(issue 41's goal: >= 2.5x). The machine's load average is printed with every line: other work
on the cores moves these figures more than anything measured here.

skyrl-tx (PyPI ``skyrl-tx`` 0.3.0, SkyRL's Tinker-API server on JAX) runs the same loop on the same
model from the same client counts, and the omnigym / skyrl-tx ratio is printed in the same run. It
loads Hugging Face Llama, Qwen3 and DeepSeek-V3 folders, so omnigym's tiny Llama loads in both; its
transformers (<5) gets a copy whose config names two fields the 4.x way (same weights, same
tokenizer.json). It lives in its own venv, ``bench/.cache/skyrl-venv`` (``--build-skyrl-venv``
builds it): skyrl-tx requires ``peft`` and so torch; a constraints file pins ``torch==2.13.0`` so pip
takes the CPU wheel already on disk and never resolves a newer (CUDA) torch, and JAX comes without
its CUDA extra. Its API server starts its engine with ``uv run ... -m tx.tinker.engine``; the bench
puts a two-line ``uv`` in front of ``PATH`` that runs that module with the venv's python. With
``OMP_NUM_THREADS=1`` XLA is asked for one thread too (``XLA_FLAGS``), as torch gets. Each
side's clients run in a subprocess of their own venv: omnigym's with its Tinker SDK (0.38), skyrl-tx's
with tinker 0.12.0, the SDK of its release (0.38 needs endpoints and protobuf answers it lacks).
Without the venv the script says so where the skyrl-tx figures would be.

    OMP_NUM_THREADS=1 python bench/serve_vs_skyrl_tx.py [--quick] [--model PATH] [--clients 1 4] [--build-skyrl-venv]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKYRL_VENV = ROOT / "bench" / ".cache" / "skyrl-venv"
SKYRL_PYTHON = SKYRL_VENV / "bin" / "python"
# pip takes the CPU wheel on disk for this pin (PIP_FIND_LINKS) and never resolves a newer torch,
# whose Linux wheels from PyPI pull CUDA; jax, flax and optax are skyrl-tx's "jax" extra without
# its jax[cuda12], so JAX runs on the CPU.
# tinker 0.12.0 is the last Tinker SDK released before skyrl-tx 0.3.0 (2026-02-06, 2026-02-09): newer
# SDKs (0.38 here) first ask for /api/v1/client/config and want sample results as protobuf, which
# skyrl-tx 0.3.0 does not serve, so its clients run this script in its venv with that SDK.
SKYRL_PACKAGES = ["skyrl-tx[tinker]==0.3.0", "tinker==0.12.0", "jax>=0.8,<1.0", "flax>=0.12.2", "optax>=0.2.5"]
SKYRL_ABSENT = (f"skyrl-tx 0.3.0 not measured: no venv at {SKYRL_VENV.relative_to(ROOT)} "
                "(build it with --build-skyrl-venv: torch==2.13.0 CPU, skyrl-tx[tinker] 0.3.0, jax CPU)")
# skyrl-tx's API server starts its engine as `uv run --extra tinker --extra jax -m tx.tinker.engine ARGS`;
# the venv has no uv, so this stand-in drops everything before -m and runs the module with its python.
UV_SHIM = '#!/bin/sh\nwhile [ "$#" -gt 0 ] && [ "$1" != "-m" ]; do shift; done\nexec "{python}" "$@"\n'


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} cores"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skyrl_ready() -> bool:
    """The venv holds skyrl-tx's server (a build that failed half-way leaves only a python)."""
    return SKYRL_PYTHON.exists() and any(SKYRL_VENV.glob("lib/python3*/site-packages/tx/tinker/api.py"))


def build_skyrl_venv() -> None:
    """The separate venv skyrl-tx runs in; omnigym's own venv is never touched."""
    if skyrl_ready():
        print(f"{SKYRL_VENV.relative_to(ROOT)} is built; remove it to rebuild", flush=True)
        return
    constraints = SKYRL_VENV.parent / "skyrl-constraints.txt"
    SKYRL_VENV.parent.mkdir(parents=True, exist_ok=True)
    constraints.write_text("torch==2.13.0\n")
    pip = [str(SKYRL_PYTHON), "-m", "pip", "install", "-q", "-c", str(constraints)]
    for cmd in ([sys.executable, "-m", "venv", str(SKYRL_VENV)], pip + ["torch==2.13.0"], pip + SKYRL_PACKAGES):
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode:
            raise SystemExit(f"building {SKYRL_VENV.relative_to(ROOT)} failed at: {' '.join(cmd)}")
    cuda = subprocess.run([str(SKYRL_PYTHON), "-c", "import torch; print(torch.version.cuda)"],
                          capture_output=True, text=True).stdout.strip()
    if cuda != "None":
        raise SystemExit(f"{SKYRL_VENV.relative_to(ROOT)} got a CUDA torch ({cuda}); remove it")


def spawn(cmd: list[str], log: Path, **kw) -> subprocess.Popen:
    """A server in its own process group, its output to `log`: a pipe nobody reads fills up and stalls it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kw)


def wait_listening(proc: subprocess.Popen, port: int, name: str, seconds: int, log: Path) -> str:
    for _ in range(seconds * 5):
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise SystemExit(f"{name} did not start listening within {seconds} s")


def start_omnigym(model: str, store: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    exe = Path(sys.executable).parent / "omnigym"
    log = store.parent / f"{store.name}.log"
    proc = spawn([str(exe), "serve", "--base-model", model, "--store", str(store), "--port", str(port)], log)
    return proc, wait_listening(proc, port, "omnigym serve", 120, log)


def start_skyrl(model: str, work: Path, clients: int) -> tuple[subprocess.Popen, str]:
    """skyrl-tx's API server (which starts its engine) on `model`, its database and checkpoints under `work`."""
    port = free_port()
    shim = work / "bin"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "uv").write_text(UV_SHIM.format(python=SKYRL_PYTHON))
    (shim / "uv").chmod(0o755)
    # COLUMNS: its rich log handler wraps at 80 columns otherwise
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}", "JAX_PLATFORMS": "cpu",
           "COLUMNS": "200"}
    if os.environ.get("OMP_NUM_THREADS") == "1":  # the same one thread omnigym's torch gets
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()
    backend = {"max_lora_adapters": clients + 1, "max_lora_rank": 8}
    cmd = [str(SKYRL_PYTHON), "-m", "tx.tinker.api", "--base-model", model, "--host", "127.0.0.1",
           "--port", str(port), "--database-url", f"sqlite:///{work / 'tinker.db'}",
           "--checkpoints-base", str(work / "checkpoints"), "--backend-config", json.dumps(backend)]
    log = work / "server.log"
    proc = spawn(cmd, log, cwd=work, env=env)
    return proc, wait_listening(proc, port, "skyrl-tx's API server", 300, log)


def skyrl_model_copy(model: str, dest: Path) -> str:
    """`model` as skyrl-tx's transformers (<5) reads it. omnigym's transformers 5 writes the tokenizer class
    as ``TokenizersBackend`` (4.x lacks it; the same tokenizer.json loads as ``PreTrainedTokenizerFast``)
    and RoPE's base under ``rope_parameters`` (4.x and skyrl-tx read ``rope_theta``). The weights and the
    tokenizer file are the same bytes; only those two names are written the 4.x way."""
    src = Path(model)
    tokenizer, config = (json.loads((src / name).read_text()) if (src / name).exists() else {}
                         for name in ("tokenizer_config.json", "config.json"))
    if tokenizer.get("tokenizer_class") != "TokenizersBackend" and "rope_parameters" not in config:
        return model
    shutil.copytree(src, dest)
    if tokenizer.get("tokenizer_class") == "TokenizersBackend":
        tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and rope.get("rope_type", "default") == "default":
        config["rope_theta"] = rope["rope_theta"]
        del config["rope_parameters"]
    for name, fields in (("tokenizer_config.json", tokenizer), ("config.json", config)):
        if fields:
            (dest / name).write_text(json.dumps(fields, indent=2))
    return str(dest)


def stop(proc: subprocess.Popen) -> None:
    """The server and what it started (skyrl-tx's engine runs as a child of its API server)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def resolved(value):
    """The SDK's answer whether it is a future (tinker 0.38) or the client itself (0.12, skyrl-tx's side)."""
    return value.result() if hasattr(value, "result") else value


def client_loop(url: str, base: str, index: int, args, barrier: threading.Barrier, counts: dict) -> None:
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=f"tml-bench-client-{index}")
    tc = resolved(service.create_lora_training_client(base_model=base, rank=8, seed=index))
    prompt = [10 + index, 20, 30, 40, 50, 60, 70, 80]
    sampled = trained = 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:  # the warm-up iterations are over for every client: the clock starts
            barrier.wait()
            sampled = trained = 0
        sampler = resolved(tc.save_weights_and_get_sampling_client())
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


class ClientFailed(Exception):
    pass


def measure(url: str, base: str, clients: int, args) -> dict:
    barrier = threading.Barrier(clients + 1)
    counts: dict = {}

    def client(i: int) -> None:
        try:
            client_loop(url, base, i, args, barrier, counts)
        except BaseException:
            barrier.abort()  # the others and the clock do not wait for a client that is gone
            raise

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        raise ClientFailed("a client failed before the clock started (see above)") from None
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if len(counts) != clients:
        raise ClientFailed("a client failed (see above)")
    sampled = sum(c[0] for c in counts.values())
    total = sampled + sum(c[1] for c in counts.values())
    return {"clients": clients, "wall": wall, "sampled_per_s": sampled / wall, "tokens_per_s": total / wall}


def run_server(name: str, start, python: str, clients: int, base: str, args) -> dict:
    """A fresh server for each count (no warm caches); its clients run this script under `python`, the
    interpreter of the venv whose Tinker SDK speaks to that server."""
    proc, url = start(clients)
    try:
        cmd = [python, __file__, "--measure-url", url, "--model", base, "--clients", str(clients), "--steps",
               str(args.steps), "--warmup", str(args.warmup), "--samples", str(args.samples),
               "--max-tokens", str(args.max_tokens)]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    finally:
        stop(proc)
    if out.returncode:
        raise ClientFailed(f"{name}: its clients failed (exit {out.returncode}): {out.stdout.strip()[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{name:14s} {clients} client(s): {r['sampled_per_s']:8.1f} sampled tokens/s  "
          f"{r['tokens_per_s']:8.1f} tokens/s (sampled + trained)  {r['wall']:6.1f} s  {load()}", flush=True)
    return r


def print_scaling(name: str, results: dict) -> None:
    if 1 not in results:
        return
    for clients, r in results.items():
        if clients != 1:
            print(f"{name} {clients} clients / 1 client: "
                  f"{r['sampled_per_s'] / results[1]['sampled_per_s']:.2f}x sampled tokens/s, "
                  f"{r['tokens_per_s'] / results[1]['tokens_per_s']:.2f}x tokens/s (goal >= 2.5x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer steps: omnigym's side under 3 minutes on 2 shared cores, about 5 with skyrl-tx")
    p.add_argument("--model", help="base model (default: omnigym's tiny Llama, built in a temporary folder)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=None, help="timed iterations per client (default 6, quick 3)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed iterations per client first (skyrl-tx compiles for each new batch shape in them)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--build-skyrl-venv", action="store_true",
                   help=f"build {SKYRL_VENV.relative_to(ROOT)} (torch 2.13.0 CPU, skyrl-tx 0.3.0, jax CPU) first")
    p.add_argument("--skip-skyrl", action="store_true", help="measure omnigym serve only")
    p.add_argument("--measure-url", help=argparse.SUPPRESS)  # internal: run the clients against this server
    args = p.parse_args()
    for flag, values, least in (("--clients", args.clients, 1), ("--steps", [1 if args.steps is None else args.steps], 1),
                                ("--warmup", [args.warmup], 0), ("--samples", [args.samples], 1),
                                ("--max-tokens", [args.max_tokens], 1)):
        if min(values) < least:
            p.error(f"{flag} must be at least {least}")
    if args.model and not Path(args.model).is_dir():
        p.error(f"--model {args.model}: no such folder")
    args.steps = args.steps or (3 if args.quick else 6)
    if args.measure_url:
        print(json.dumps(measure(args.measure_url, args.model, args.clients[0], args)), flush=True)
        return
    if args.build_skyrl_venv:
        build_skyrl_venv()
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        base = args.model
        if base is None:
            from omnigym.models.lm import build_tiny_model

            base = str(build_tiny_model(Path(tmp) / "tiny", seed=0))
        print(f"model {args.model or 'tiny Llama (~1M parameters)'}; {args.warmup} warm-up and {args.steps} timed "
              f"steps per client, {args.samples} samples x {args.max_tokens} tokens each; {load()}", flush=True)
        ours = {c: run_server("omnigym serve", lambda c: start_omnigym(base, Path(tmp) / f"store-{c}"),
                              sys.executable, c, base, args) for c in args.clients}
        print_scaling("omnigym serve", ours)
        if args.skip_skyrl or not skyrl_ready():
            print("skyrl-tx not measured: --skip-skyrl" if args.skip_skyrl else SKYRL_ABSENT)
            print("omnigym / skyrl-tx ratio: not available (skyrl-tx not measured, see above)")
            return
        skyrl_base = skyrl_model_copy(base, Path(tmp) / "model-for-skyrl")
        theirs = {c: run_server("skyrl-tx 0.3.0", lambda c: start_skyrl(skyrl_base, Path(tmp) / f"skyrl-{c}", c),
                                str(SKYRL_PYTHON), c, skyrl_base, args) for c in args.clients}
        print_scaling("skyrl-tx", theirs)
        for c in args.clients:
            print(f"omnigym / skyrl-tx, {c} client(s): "
                  f"{ours[c]['sampled_per_s'] / theirs[c]['sampled_per_s']:.2f}x sampled tokens/s, "
                  f"{ours[c]['tokens_per_s'] / theirs[c]['tokens_per_s']:.2f}x tokens/s (goal >= 2x)")


if __name__ == "__main__":
    try:
        main()
    except ClientFailed as e:
        # The Tinker SDK's heartbeat threads of a failed client keep the interpreter alive; the servers are
        # already stopped, so leave at once.
        print(e, flush=True)
        os._exit(1)
