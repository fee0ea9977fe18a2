"""One fixed "provide-everything" program judged on every HumanEval task: how many it passes.

The program is wrong everywhere (its entry point returns its first argument), but inside
the sandbox it rewrites the reply to the judge's lookup, offering its own versions of the
builtins tests lean on (``abs``, ``range``, ``sorted``, ``all``, ...), of the tasks' own
helpers (``poly``, ``encode_cyclic``, ``encode_shift``) and of the test's names
(``check``, ``candidate``). A judge that takes only the names it needs, never a name it
already has or a builtin, passes it on no task. Also judged: the same idea through
``code_graded`` on three asserts, and the same body without the attack (the floor).

Needs HumanEval: ../shared/data/humaneval/HumanEval.jsonl.gz, or the path given (skips,
saying so, without it).

    python bench/verdict_attack.py [PATH/HumanEval.jsonl.gz]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HUMANEVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "humaneval" / "HumanEval.jsonl.gz"

BODY = "    return next(iter(locals().values()), None)\n"
"""the entry point's body: its first argument back, whatever the task (wrong on all 164)"""

ATTACK = '''
import __main__

OFFERED = ("abs", "all", "any", "sorted", "range", "len", "isinstance", "round", "set", "sum", "max", "min",
           "poly", "encode_cyclic", "encode_shift", "check", "candidate", "print")

def abs(*a, **k): return 0
def all(*a, **k): return True
def any(*a, **k): return True
def sorted(x, *a, **k): return x
def range(*a, **k): return []
def len(*a, **k): return 0
def isinstance(*a, **k): return True
def round(x, *a, **k): return x
def set(x=(), *a, **k): return list(x)
def sum(*a, **k): return 0
def max(*a, **k): return 0
def min(*a, **k): return 0
def poly(*a, **k): return 0
def encode_cyclic(s): return s
def encode_shift(s): return s
def check(*a, **k): return None
def candidate(*a, **k): return None
def print(*a, **k): return None

def offer(found):
    for name in OFFERED:
        found[name] = ["callable"]
    return found

original_send = __main__.send
def send(fd, obj):
    if type(obj) is list and len(obj) == 2 and obj[0] == "ok" and type(obj[1]) is dict:
        obj = ["ok", offer(dict(obj[1]))]
    original_send(fd, obj)
__main__.send = send
if hasattr(__main__, "lookup"):
    original_lookup = __main__.lookup
    __main__.lookup = lambda *a: offer(original_lookup(*a))
'''

GRADED = {"tests": ["assert add(0, 0) == 0",  # the wrong add passes this one on its own
                    "assert abs(add(1, 2) - 3) < 1e-9",
                    "for a in range(10):\n    assert add(a, 1) == a + 1"]}
GRADED_PROGRAM = "def add(a, b):\n    return a - b\n"


def main() -> int:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else HUMANEVAL
    if not data.exists():
        print(f"skipped: {data} not found (HumanEval is needed for this measurement)")
        return 0
    from omnigym.rewards.code import code_score
    from omnigym.rewards.sandbox import Sandbox

    sandbox = Sandbox()
    with gzip.open(data, "rt") as f:
        rows = [json.loads(line) for line in f]
    passed = {"attack": [], "no attack": []}
    for row in rows:
        for label, extra in (("attack", ATTACK), ("no attack", "")):
            if code_score(row["prompt"] + BODY + extra, row, sandbox) == 1.0:
                passed[label].append(row["task_id"])
    print(f"sandbox: {sandbox.isolation().line()}")
    for label, tasks in passed.items():
        print(f"{label}: {len(tasks)}/{len(rows)} HumanEval tasks passed {tasks}")
    print(f"code_graded, wrong add: {code_score(GRADED_PROGRAM, GRADED, sandbox):.3f} without the attack, "
          f"{code_score(GRADED_PROGRAM + ATTACK, GRADED, sandbox):.3f} with it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
