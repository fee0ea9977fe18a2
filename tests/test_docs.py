"""docs/bring_your_own.md, run as a new user would: write its files, run its commands.

Each ```python block that starts with ``# file: NAME`` is written to NAME; every other
```python block is run as a script; each line of a ```bash block is a command, run with
this interpreter's ``omnigym``. All in one empty folder, in the page's order.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).parent.parent / "docs" / "bring_your_own.md"
BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.DOTALL)


def steps(page: str):
    for kind, body in BLOCK.findall(page):
        first = body.splitlines()[0]
        if kind == "python" and first.startswith("# file: "):
            yield "file", (first.removeprefix("# file: ").strip(), body)
        elif kind == "python":
            yield "script", body
        else:
            yield from (("command", line) for line in body.splitlines() if line.strip())


@pytest.mark.slow
def test_bring_your_own_page_runs_as_written(tmp_path):
    omnigym = str(Path(sys.executable).parent / "omnigym")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    outputs = []
    for kind, step in steps(PAGE.read_text()):
        if kind == "file":
            (tmp_path / step[0]).write_text(step[1])
            continue
        argv = [sys.executable, "-c", step] if kind == "script" else \
            [omnigym if shlex.split(step)[0] == "omnigym" else shlex.split(step)[0], *shlex.split(step)[1:]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (step, done.stderr[-2000:])
        outputs.append((step, done.stdout + done.stderr))
    text = dict(outputs)
    # The page's claims: the walk is solved (best return -5), and GRPO reports accuracy with the task's own reward.
    assert "mean return -5.00" in text["omnigym eval runs/walk --episodes 5 --greedy"]
    grpo = next(out for step, out in outputs if "word_tasks:reverse_words" in step)
    assert "held-out accuracy before GRPO" in grpo and "completions cut off by --max-new-tokens 24" in grpo
    assert (tmp_path / "runs" / "walk.png").stat().st_size > 1000
    assert (tmp_path / "runs" / "walk-api" / "checkpoint.pt").exists()
