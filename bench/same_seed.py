"""Same seed, same metrics: proof that a refactor changed no numbers, for every algorithm and serve.

Each algorithm that ``omnigym list`` prints is trained once through the CLI (``omnigym train NAME``
as a subprocess, seed 1, one torch thread, OMP_NUM_THREADS=1) on a budget of a few seconds to a
minute, into ``OUT_DIR/NAME``; the Tinker server's hub (``serve/hub.py``) is driven in process
through its public methods, and its losses and a checksum of the trained adapter go to
``OUT_DIR/serve/metrics.jsonl``. Run it on the tree before the refactor and on the tree after,
then compare the two folders row by row:

    PYTHONPATH=/work/baseline/src python bench/same_seed.py run /tmp/same_seed/before
    python bench/same_seed.py run /tmp/same_seed/after
    python bench/same_seed.py compare /tmp/same_seed/before /tmp/same_seed/after

``PYTHONPATH`` picks the tree: the subprocesses inherit it, and ``OUT_DIR/source.txt`` records
which ``omnigym/__init__.py`` they imported. ``--only NAME ...`` runs some of the rows (an
algorithm's prerequisites run too: dpo trains from sft's model, rlhf and online_dpo score with
rm's, the offline algorithms read the Minari dataset this script collects first).

``compare`` reads every ``metrics.jsonl`` under each row's folder (GRPO's warm-up stage has its
own), leaves out wall-clock values (``WALL_CLOCK`` below), and prints per row: the rows compared,
how many rows and values are identical, the largest absolute difference and the first key that
differs. It exits 1 when anything differs, except rows named in ``EXPECTED_TO_CHANGE`` (sampling
with top-k, whose recorded log-probs issue 39 corrects on purpose), which are printed as such.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

SEED = 1
COMMON = ["--seed", str(SEED), "--no-progress", "--no-plot", "--no-tensorboard", "--torch-threads", "1"]
DATASET = "pendulum/random-v0"
OFFLINE = ["--dataset", DATASET, "--total-timesteps", "60", "--hidden", "32", "32", "--batch-size", "32",
           "--eval-every", "30", "--log-every", "10", "--eval-episodes", "2", "--checkpoint-every", "20"]
LM_SMALL = ["--max-new-tokens", "12", "--eval-prompts", "8", "--eval-every", "2", "--checkpoint-every", "2"]
EXPECTED_TO_CHANGE = {"serve_topk": "sampled with top_k=5: issue 39 makes the recorded log-probs the truncated "
                                    "distribution's"}
# wall-clock values: two runs of the same tree differ in these and nothing else (checked by a
# run of one tree twice); perf/ holds steps per second, time/ elapsed seconds, and the async
# runtimes' idle fractions measure waiting
WALL_CLOCK_PREFIXES = ("perf/", "time/", "async/generator_idle", "async/trainer_idle")
WALL_CLOCK_WORDS = ("sps", "seconds", "elapsed")


def train_args(out: Path) -> dict[str, list[str]]:
    """Each algorithm's flags beyond ``COMMON`` and ``--run-dir``: the tests' small settings."""
    pairs = str(out / "pairs.jsonl")
    return {
        "reinforce": ["--total-timesteps", "4096", "--num-envs", "4", "--num-steps", "128"],
        "ppo": ["--total-timesteps", "4096", "--num-envs", "4", "--num-steps", "64"],
        "dqn": ["--total-timesteps", "3000", "--learning-starts", "500", "--train-frequency", "64",
                "--gradient-steps", "8", "--log-every", "250", "--buffer-size", "2000"],
        "sac": ["--total-timesteps", "1500", "--learning-starts", "300", "--batch-size", "64", "--hidden", "64", "64",
                "--buffer-size", "5000", "--log-every", "200"],
        "td3": ["--total-timesteps", "1500", "--learning-starts", "300", "--batch-size", "64", "--hidden", "64", "64",
                "--buffer-size", "5000", "--log-every", "200"],
        # DrQ on dm_control's cartpole, rendered 16 pixels square (tests/test_pixels.py's small_drq)
        "drq": ["--env-id", "dm_control/cartpole-swingup-v0", "--total-timesteps", "600", "--learning-starts", "300",
                "--image-size", "16", "--frame-stack", "2", "--batch-size", "16", "--hidden", "32", "32",
                "--features", "8", "--buffer-size", "2000", "--log-every", "100", "--action-repeat", "2"],
        "bc": OFFLINE,
        "td3_bc": OFFLINE,
        "iql": OFFLINE,
        "cql": OFFLINE,
        "grpo": ["--sft-steps", "20", "--sft-target-accuracy", "1.1", "--sft-eval-every", "10", "--steps", "6",
                 "--prompts-per-step", "2", "--group-size", "4", "--eval-size", "20", "--eval-every", "3",
                 "--checkpoint-every", "2"],
        "text_reinforce": ["--keywords", "z", "--steps", "5"],
        "sft": ["--steps", "20", "--eval-size", "50", "--batch-size", "8", "--eval-every", "10"],
        "rm": ["--data", pairs, "--eval-size", "50", "--steps", "20", "--batch-size", "16", "--eval-every", "10",
               "--learning-rate", "1e-3"],
        "dpo": ["--model", str(out / "sft"), "--data", pairs, "--eval-size", "40", "--steps", "4", "--batch-size", "8",
                "--eval-every", "2"],
        "online_dpo": ["--rewards", f"rm:{out / 'rm'}:1.0", "--data", pairs, "--steps", "4", "--prompts-per-step", "6",
                       "--samples-per-prompt", "3", "--gold-reward", "gold_vowels:1.0", "--learning-rate", "1e-3",
                       *LM_SMALL],
        "rlhf": ["--reward-model", str(out / "rm"), "--data", pairs, "--steps", "3", "--prompts-per-step", "8",
                 "--minibatches", "2", "--ppo-epochs", "2", "--target-kl", "0.5", *LM_SMALL],
        "prm": ["--operations", "+-", "--steps", "12", "--batch-size", "8", "--eval-size", "40", "--eval-every", "6"],
        # the grpo row's model teaches the sft row's (a saved student: no warm-up, no demo stages)
        "distill": ["--teacher", str(out / "grpo"), "--model", str(out / "sft"), "--steps", "4",
                    "--prompts-per-step", "4", "--samples-per-prompt", "2", "--max-new-tokens", "6", "--eval-size", "8",
                    "--eval-every", "2", "--checkpoint-every", "2"],
        "ppo_lstm": ["--total-timesteps", "2048", "--num-envs", "4", "--num-steps", "64"],
        "mappo": ["--total-timesteps", "400", "--num-envs", "2", "--num-steps", "25", "--checkpoint-every", "200"],
        # tests/test_alphazero.py's small settings, on tic-tac-toe
        "alphazero": ["--iterations", "3", "--games-per-iteration", "4", "--simulations", "8", "--train-steps", "4",
                      "--batch-size", "16", "--eval-every", "1", "--eval-games", "2", "--eval-random-games", "2",
                      "--checkpoint-every", "1", "--hidden", "16"],
    }


NEEDS = {"rm": ["pairs"], "dpo": ["sft", "pairs"], "distill": ["grpo", "sft"], "online_dpo": ["rm", "pairs"],
         "rlhf": ["rm", "pairs"], "bc": ["dataset"], "td3_bc": ["dataset"], "iql": ["dataset"], "cql": ["dataset"]}
"""what each row reads from rows before it in OUT_DIR"""


def child_env(out: Path) -> dict[str, str]:
    """The subprocesses' environment: this one's (PYTHONPATH included: it picks the tree), one
    thread, offline, headless rendering, and the Minari datasets in OUT_DIR."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               MINARI_DATASETS_PATH=str(out / "minari"))
    env.setdefault("MUJOCO_GL", "egl")
    return env


def omnigym_command() -> list[str]:
    """The ``omnigym`` entry point of this interpreter's environment."""
    script = Path(sys.executable).parent / "omnigym"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "omnigym.cli"]


def algorithms(out: Path) -> list[str]:
    """The algorithms the tree registers, as ``omnigym list`` prints them."""
    listing = subprocess.run([*omnigym_command(), "list"], env=child_env(out), capture_output=True, text=True,
                             check=True).stdout
    line = next(line for line in listing.splitlines() if line.startswith("algorithms:"))
    return [name.strip() for name in line.split(":", 1)[1].split(",")]


def run_logged(name: str, command: list[str], out: Path, log: Path) -> float:
    """Run ``command`` with its output in ``log``; print and record the command and its time."""
    shown = ["'...'" if "\n" in part else part for part in command]  # inline code: in commands.jsonl
    print(f"[{name}] {' '.join(shown)}", flush=True)
    start = time.monotonic()
    with open(log, "w") as handle:
        done = subprocess.run(command, env=child_env(out), stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    with open(out / "commands.jsonl", "a") as handle:
        handle.write(json.dumps({"name": name, "command": command, "seconds": round(seconds, 1),
                                 "returncode": done.returncode}) + "\n")
    if done.returncode:
        print(f"[{name}] FAILED (exit {done.returncode}) after {seconds:.1f} s; the last lines of {log}:", flush=True)
        print("".join(log.read_text().splitlines(True)[-15:]), flush=True)
    else:
        print(f"[{name}] {seconds:.1f} s", flush=True)
    return seconds


def write_pairs(out: Path) -> None:
    """400 gold-labelled pairs of random-word replies (tests/test_rlhf.py's): rm, dpo, online_dpo
    and rlhf read them, so none of them needs the demo's SFT stage."""
    code = ("import json, random, sys\n"
            "from omnigym.tasks.gold_world import label_pairs, prompts, reply\n"
            "rng = random.Random(0)\n"
            "rows = prompts(400, 0)\n"
            "pairs = label_pairs(rows, [(reply(rng), reply(rng)) for _ in rows])\n"
            "open(sys.argv[1], 'w').write(''.join(json.dumps(p) + '\\n' for p in pairs))\n")
    run_logged("pairs", [sys.executable, "-c", code, str(out / "pairs.jsonl")], out, out / "pairs.log")


def collect_dataset(out: Path) -> None:
    """The offline algorithms' Minari dataset, as tests/test_offline.py makes it: 4 episodes of a
    random policy in Pendulum, episode i reset with seed 3 + i, reference returns measured."""
    shutil.rmtree(out / "minari", ignore_errors=True)  # collect refuses to overwrite: a rerun starts afresh
    (out / "dataset").mkdir(exist_ok=True)
    run_logged("dataset", [*omnigym_command(), "collect", "random", "--env-id", "Pendulum-v1", "--episodes", "4",
                           "--dataset", DATASET, "--seed", "3", "--ref-max-score", "-150", "--reference-episodes",
                           "4"], out, out / "dataset" / "output.log")
    # the dataset's contents as a metrics row, so a difference in the data shows apart from training
    code = ("import json, sys, minari, numpy as np\n"
            f"d = minari.load_dataset({DATASET!r})\n"
            "row = {'episodes': d.total_episodes, 'steps': d.total_steps}\n"
            "for i, e in enumerate(d.iterate_episodes()):\n"
            "    for k in ('observations', 'actions', 'rewards'):\n"
            "        row[f'episode{i}/{k}_sum'] = float(np.asarray(getattr(e, k), dtype=np.float64).sum())\n"
            "row |= {k: d.storage.metadata[k] for k in ('ref_min_score', 'ref_max_score')}\n"
            "open(sys.argv[1], 'w').write(json.dumps(row) + '\\n')\n")
    run_logged("dataset-sums", [sys.executable, "-c", code, str(out / "dataset" / "metrics.jsonl")], out,
               out / "dataset" / "sums.log")


def train(name: str, out: Path, args: list[str]) -> None:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    log = out / "logs" / f"{name}.log"
    run_logged(name, [*omnigym_command(), "train", name, "--run-dir", str(run_dir), *COMMON, *args], out, log)


def plan(out: Path, only: list[str] | None, known: list[str]) -> list[str]:
    """The rows to run, in order, prerequisites first."""
    wanted = list(only) if only else ["pairs", "dataset", *known, "serve"]
    order: list[str] = []

    def add(name: str) -> None:
        for need in NEEDS.get(name, []):
            add(need)
        if name not in order:
            order.append(name)

    for name in wanted:
        add(name)
    return order


def run(out: Path, only: list[str] | None) -> None:
    known = algorithms(out)  # checked before OUT_DIR is made: a refused run writes nothing
    flags = train_args(out)
    missing = sorted(set(known) - set(flags))
    if missing:  # a new algorithm needs a small budget chosen here before it can be compared
        sys.exit(f"same_seed.py: no small settings for {', '.join(missing)}: add them to train_args()")
    rows = set(known) | {"pairs", "dataset", "serve"}
    unknown = sorted(set(only or []) - rows)
    if unknown:
        sys.exit(f"same_seed.py: error: unknown row(s) {', '.join(unknown)}; choose from {', '.join(sorted(rows))}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    env = child_env(out)
    source = subprocess.run([sys.executable, "-c", "import omnigym; print(omnigym.__file__)"], env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    (out / "source.txt").write_text(source + "\n")
    print(f"the subprocesses import {source}", flush=True)
    for name in plan(out, only, known):
        if name == "pairs":
            write_pairs(out)
        elif name == "dataset":
            collect_dataset(out)
        elif name == "serve":
            run_logged("serve", [sys.executable, __file__, "serve", str(out)], out, out / "logs" / "serve.log")
        else:
            train(name, out, flags[name])


# -- the serve row: the hub in process, through its public methods --------------------------------

def adapter_checksum(folder: Path) -> dict:
    """The saved adapter's tensors: a sha256 of their bytes in name order (bit-identical or not) and
    two float sums (how far apart, when not)."""
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors |= load_file(str(file))
    digest = hashlib.sha256()
    total, absolute = 0.0, 0.0
    for key in sorted(tensors):
        value = tensors[key].contiguous()
        digest.update(key.encode() + value.numpy().tobytes())
        total += float(value.double().sum())
        absolute += float(value.double().abs().sum())
    return {"params/sha256": digest.hexdigest()[:16], "params/sum": total, "params/abs_sum": absolute,
            "params/tensors": len(tensors)}


def drive_hub(out: Path) -> None:
    """Three cross-entropy steps, a seeded sample from the saved weights, an importance-sampling
    step and a PPO step on those samples, and (into ``serve_topk``) a top-k sample. Every call is
    one of ``ModelHub``'s public methods; the adapter is read back from what ``save`` wrote."""
    import torch

    from omnigym.models.lm import build_tiny_model
    from omnigym.serve.contract import AdamStep, DatumIn, SampleParams, SamplerSource
    from omnigym.serve.hub import ModelHub

    torch.manual_seed(SEED)
    folder = out / "serve"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    hub = ModelHub(str(build_tiny_model(folder / "tiny", seed=0)), folder / "store")
    hub.create_model("a", 4, seed=SEED)
    rows = []

    def record(phase: str, **values) -> None:
        hub.save("a", phase, "sampler")  # the documented layout: root/models/<id>/sampler/<name>/
        saved = folder / "store" / "models" / "a" / "sampler" / phase
        rows.append({"phase": phase, **values, **adapter_checksum(saved)})

    def step(phase: str, data: list, loss: str, config: dict | None = None) -> None:
        result = hub.forward_backward("a", data, loss, config)
        stepped = hub.optim_step("a", AdamStep(learning_rate=1e-2))
        record(phase, **{f"loss/{k}": v for k, v in sorted(result.metrics.items())},
               logprob_sum=sum(float(o["logprobs"].double().sum()) for o in result.outputs),
               **{f"optim/{k}": v for k, v in sorted(stepped.items())})

    g = torch.Generator().manual_seed(SEED)
    for s in range(3):
        data = []
        for n in (12, 7, 20):
            tokens = torch.randint(7, 100, (n,), generator=g).tolist()
            data.append(DatumIn(tokens, {"target_tokens": torch.tensor(tokens[1:] + [2]), "weights": torch.ones(n)}))
        step(f"cross_entropy{s}", data, "cross_entropy")

    prompt = [10, 20, 30, 40]
    sampled = hub.sample(SamplerSource("a", "cross_entropy2"), prompt, 4, SampleParams(max_tokens=12, seed=5))
    rows.append({"phase": "sample", "tokens": [s.tokens for s in sampled.sequences],
                 "logprobs": [[round(x, 6) for x in s.logprobs] for s in sampled.sequences],
                 "logprob_sum": sum(sum(s.logprobs) for s in sampled.sequences)})
    # the samples as RL data, Tinker's way: the prompt's positions carry no advantage
    rl = []
    for i, seq in enumerate(sampled.sequences):
        tokens = prompt + seq.tokens[:-1]
        pad = [0.0] * (len(prompt) - 1)
        advantage = 1.0 if i % 2 else -0.5
        rl.append(DatumIn(tokens, {"target_tokens": torch.tensor(prompt[1:] + seq.tokens),
                                   "logprobs": torch.tensor(pad + list(seq.logprobs)),
                                   "advantages": torch.tensor(pad + [advantage] * len(seq.tokens))}))
    step("importance_sampling", rl, "importance_sampling")
    step("ppo", rl, "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    write_rows(folder, rows)

    topk = hub.sample(SamplerSource("a", "ppo"), prompt, 4, SampleParams(max_tokens=12, seed=5, top_k=5))
    (out / "serve_topk").mkdir(exist_ok=True)
    write_rows(out / "serve_topk", [{"phase": "sample_top_k5", "tokens": [s.tokens for s in topk.sequences],
                                     "logprob_sum": sum(sum(s.logprobs) for s in topk.sequences)}])


def write_rows(folder: Path, rows: list[dict]) -> None:
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


# -- compare ----------------------------------------------------------------------------------------

def wall_clock(key: str) -> bool:
    return key.startswith(WALL_CLOCK_PREFIXES) or any(word in key for word in WALL_CLOCK_WORDS) or \
        key.endswith("_s")


def read_runs(out: Path) -> dict[str, list[dict]]:
    """Row name (an algorithm, ``grpo/stages/warmup``, ``serve``, ...) -> its metrics rows, wall-clock
    values left out and the folder's own path written as OUT (runs name their files)."""
    found = {}
    for path in sorted(out.rglob("metrics.jsonl")):
        name = str(path.parent.relative_to(out))
        rows = []
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows.append({k: (v.replace(str(out), "OUT") if isinstance(v, str) else v)
                         for k, v in row.items() if not wall_clock(k)})
        found[name] = rows
    return found


def difference(a, b) -> float | None:
    """|a - b| for numbers, the largest element's for lists of the same shape (sampled log-probs),
    0 for equal values and None for unequal values that have no distance (a checksum, a token
    list of another length)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if math.isnan(a) and math.isnan(b):
            return 0.0
        return abs(a - b)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a != b:
        gaps = [difference(x, y) for x, y in zip(a, b)]
        return None if None in gaps else max(gaps)
    return 0.0 if a == b else None


def compare_rows(rows_a: list[dict], rows_b: list[dict]) -> tuple[int, int, int, int, float, str]:
    """(rows identical, rows compared, values identical, values compared, largest |difference|
    between numbers, the first key that differs or '')."""
    same_rows, same_values, values, largest, first = 0, 0, 0, 0.0, ""
    for index, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        row_same = True
        for key in sorted(set(ra) | set(rb)):
            values += 1
            gap = difference(ra[key], rb[key]) if key in ra and key in rb else None
            if gap == 0:
                same_values += 1
                continue
            row_same = False
            largest = max(largest, gap) if gap is not None else largest
            if not first:
                where = "" if key in ra and key in rb else f" (only {'before' if key in ra else 'after'})"
                first = f"row {index}: {key}{where}"
        same_rows += row_same
    if len(rows_a) != len(rows_b) and not first:
        first = f"row {min(len(rows_a), len(rows_b))}: missing"
    return same_rows, max(len(rows_a), len(rows_b)), same_values, values, largest, first


def compare(before: Path, after: Path, only: list[str] | None = None) -> bool:
    a, b = read_runs(before), read_runs(after)
    if only:  # a row's stages (grpo/stages/warmup) go with it
        a, b = ({k: v for k, v in runs.items() if k.split("/")[0] in only} for runs in (a, b))
    ok = True
    print(f"{'row':<24} {'rows':>7} {'same rows':>10} {'same values':>12} {'max |diff|':>11}  first difference")
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name:<24} only in {'before' if name in a else 'after'}")
            ok = False
            continue
        same_rows, rows, same_values, values, largest, first = compare_rows(a[name], b[name])
        identical = same_rows == rows and len(a[name]) == len(b[name])
        counts = f"{len(a[name])}/{len(b[name])}"
        note = "-" if identical else first
        if not identical and name in EXPECTED_TO_CHANGE:
            note += f"  [expected: {EXPECTED_TO_CHANGE[name]}]"
        else:
            ok &= identical
        print(f"{name:<24} {counts:>7} {same_rows:>4}/{rows:<5} {same_values:>5}/{values:<6} {largest:>11.3g}  {note}")
    print("identical" if ok else "DIFFERENT")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="train every algorithm (and drive serve's hub) into OUT_DIR")
    run_parser.add_argument("out", type=Path, metavar="OUT_DIR")
    run_parser.add_argument("--only", nargs="+", metavar="NAME", help="these rows (and what they need) only")
    serve_parser = commands.add_parser("serve", help="the serve row alone, in this process (run calls it)")
    serve_parser.add_argument("out", type=Path, metavar="OUT_DIR")
    compare_parser = commands.add_parser("compare", help="compare two OUT_DIRs row by row; exit 1 if any differs")
    compare_parser.add_argument("before", type=Path, metavar="BEFORE_DIR")
    compare_parser.add_argument("after", type=Path, metavar="AFTER_DIR")
    compare_parser.add_argument("--only", nargs="+", metavar="NAME", help="compare these rows only")
    args = parser.parse_args()
    if args.command == "compare":
        for path in (args.before, args.after):
            if not path.is_dir():
                parser.error(f"compare: {path} is not a folder")
        sys.exit(0 if compare(args.before, args.after, args.only) else 1)
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported (serve), and for the subprocesses
    if args.command == "serve":
        import torch

        torch.set_num_threads(1)
        drive_hub(args.out)
    else:
        run(args.out.resolve(), args.only)


if __name__ == "__main__":
    main()
