"""Attacks on the code verdict and on the sandbox, each run three ways: the ``code`` reward
(HumanEval's check), the ``code_graded`` reward (a list of asserts) and the tool env's
python tool. Every one must score 0 (the tool: leak nothing), return in time, change
nothing outside the sandbox, and leave the next correct program scoring 1."""

import glob
import os
import sys
import time

import pytest

from omnigym.envs.text import ToolEnv
from omnigym.rewards import get_reward
from omnigym.rewards.code import code_score
from omnigym.rewards.sandbox import KILL_MARGIN_SECONDS, Sandbox, SandboxLimits

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux's")
SANDBOX = Sandbox()  # one for the module: it probes the machine once
bubblewrap = pytest.mark.skipif(SANDBOX.isolation().kind != "bubblewrap", reason=SANDBOX.isolation().line())
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a fresh uid and the cgroup need the trainer to be root")

QUICK = SandboxLimits(cpu_seconds=2, wall_seconds=3, memory_mb=512, max_processes=16, max_file_mb=1)
SECRET = "omnigym-trainer-secret-4711"
MARK = "omnigym-attack-"
"""the start of every name an attack writes into /tmp or /dev/shm"""
HUMANEVAL = {"prompt": 'def add(a, b):\n    """The sum of a and b."""\n', "entry_point": "add",
             "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-4, 4) == 0\n"}
GRADED = {"tests": ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]}
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
# This verdict format, and the fixed marker the harness printed before (which the program
# could also read from its own main.py): printing either must win nothing.
FAKE_VERDICT = "pass 0\\npass 1\\ndone\\n" + "__omnigym_test_passed__\\n" * 2

ATTACKS = {
    # forging the verdict
    "print a pass verdict then exit 0": WRONG + f"import os\nprint('{FAKE_VERDICT}', end='', flush=True)\nos._exit(0)",
    "read the harness and print what it prints on a pass": WRONG + (
        "import glob, re\nfor p in glob.glob('/proc/*/cmdline') + glob.glob('*.py'):\n"
        "    for mark in re.findall(r'__\\w+_passed__', open(p, errors='replace').read()):\n"
        "        print(mark, mark, sep='\\n', flush=True)\nimport os\nos._exit(0)"),
    "a load error whose message is a pass verdict": "raise ValueError(''.join('\\npass %d' % i for i in range(60)) + '\\n')",
    "an exception class named like a pass verdict": WRONG + "raise type('E\\npass 0\\npass 1\\n', (Exception,), {})()",
    "write a pass verdict to every descriptor": WRONG + (
        f"import os\nfor fd in range(0, 256):\n    try: os.write(fd, b'{FAKE_VERDICT}')\n    except OSError: pass\n"),
    "write the verdict through /proc/1/fd": WRONG + (
        "import glob\nfor p in glob.glob('/proc/*/fd/*'):\n    try: open(p, 'w').write('pass 0\\npass 1\\ndone\\n')\n"
        "    except OSError: pass"),
    "excepthook prints a pass": WRONG + f"import sys\nsys.excepthook = lambda *a: print('{FAKE_VERDICT}')\nraise SystemExit",
    "atexit prints a pass": WRONG + f"import atexit\natexit.register(lambda: print('{FAKE_VERDICT}'))",
    "sys.exit(0) before the tests": WRONG + "import sys\nsys.exit(0)",
    "__main__ block": WRONG + f"if __name__ == '__main__':\n    print('{FAKE_VERDICT}')",
    "an __eq__ that is always True": "class Any:\n    def __eq__(self, other): return True\n    __hash__ = None\n"
                                     "def add(a, b):\n    return Any()",
    "an int subclass equal to everything": "class I(int):\n    def __eq__(self, other): return True\n"
                                           "def add(a, b):\n    return I(7)",
    "shadow exec, assert and the builtins": WRONG + "exec = lambda *a, **k: None\nimport builtins\n"
                                                    "builtins.exec = exec\nbuiltins.AssertionError = type(None)",
    "return the expected value read from the judge's memory": WRONG + (
        "import os\nfor p in ('/proc/1/mem', '/proc/1/fd/3', '/proc/1/environ', '/proc/1/maps'):\n"
        "    try: print('LEAK', open(p, 'rb').read(100))\n    except OSError: pass"),
    "kill the judge": WRONG + "import os, signal\nfor pid in (1, -1):\n    try: os.kill(pid, signal.SIGKILL)\n"
                              "    except OSError: pass",
    "stop the judge and loop": WRONG + "import os, signal\ntry: os.kill(1, signal.SIGSTOP)\nexcept OSError: pass\n"
                                       "while True: pass",
    "ptrace the judge": WRONG + "import ctypes\nlibc = ctypes.CDLL(None)\nprint('attach', libc.ptrace(16, 1, 0, 0))",
    "a generator instead of a value": "def add(a, b):\n    yield a + b",
    "a huge nesting instead of a value": "def add(a, b):\n    x = []\n    for _ in range(100000): x = [x]\n    return x",
    # escaping or harming the host
    "read the trainer's environment": f"import os, glob\nfor p in glob.glob('/proc/*/environ'):\n"
                                      f"    try: print(open(p).read())\n    except OSError: pass\n{WRONG}",
    "write to /run/lock, /var/tmp, /tmp, /dev/shm, home and the project": WRONG + (
        # /tmp and /dev/shm may be the sandbox's own (private) ones: no WROTE, the host's are compared
        f"for p in ('/tmp/{MARK}x', '/dev/shm/{MARK}x'):\n    try: open(p, 'w').write('x')\n    except OSError: pass\n"
        f"import os\nfor p in ('/run/lock/x', '/var/tmp/x', os.path.expanduser('~/../root/x'), {os.getcwd()!r} + '/x'):\n"
        "    try: open(p, 'w').write('x'); print('WROTE', p)\n    except OSError: pass"),
    "read the trainer's files and package": WRONG + (
        f"for p in ({os.path.abspath('pyproject.toml')!r}, '/root/.bashrc', '/etc/shadow', '/etc/passwd'):\n"
        "    try: print('FILE-LEAK', open(p).read()[:50])\n    except OSError: pass\n"
        "try:\n    import omnigym, torch\n    print('FILE-LEAK imported')\nexcept ImportError: pass"),
    "links to secrets, FIFOs and a 1,200-deep tree in its directory": WRONG + (
        "import os\nfor n in ('.stdout', '.stderr', 'main.py'):\n    try: os.symlink('/proc/1/environ', n)\n"
        "    except OSError: pass\nos.mkfifo('fifo')\nfor _ in range(1200):\n    os.mkdir('d'); os.chdir('d')"),
    "kill the trainer": WRONG + f"import os\nfor sig in (9, 15):\n    try: os.kill({os.getpid()}, sig)\n    except OSError: pass",
    "connect to the trainer over loopback": WRONG + (
        "import socket\ns = socket.socket()\ns.settimeout(1)\n"
        "try:\n    s.connect(('127.0.0.1', LISTENING_PORT)); print('WROTE connected')\nexcept OSError: pass"),
    "fill the disk": WRONG + "i = 0\ntry:\n    while True:\n        open(f'f{i}', 'wb').write(b'x' * 900_000); i += 1\n"
                             "except OSError: pass",
    "SysV shared memory": WRONG + "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.shmget(4711, 4096, 0o1666))",
    "a setsid daemon": WRONG + "import os\nif os.fork() == 0:\n    os.setsid()\n"
                               "    os.execv('/usr/bin/sleep', ['sleep', '47114711'])",
    "a fork bomb": WRONG + "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
    "a memory hog": WRONG + "x = bytearray(8 * 1024 ** 3)",
    "an infinite loop": WRONG + "while True: pass",
    "a stdout flood": WRONG + "while True: print('x' * 10000)",
}


def host_state():
    """What a sandbox must not change: shared temp dirs, SysV IPC, processes, the project. In
    /tmp and /dev/shm other test workers, Ray and torch create files at any moment, so there
    only the attacks' own names (``MARK``) are compared."""
    listing = {d: sorted(os.listdir(d)) for d in ("/var/tmp", "/run/lock", os.getcwd()) if os.path.isdir(d)}
    for d in ("/tmp", "/dev/shm"):
        if os.path.isdir(d):
            listing[d] = sorted(name for name in os.listdir(d) if name.startswith(MARK))
    listing["ipc"] = [open(p).read() for p in sorted(glob.glob("/proc/sysvipc/*"))]
    return listing


def sleepers():
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if b"47114711" in open(path, "rb").read():
                found.append(path)
        except OSError:
            pass
    return found


def run_route(route, program):
    if route == "code":
        return float(code_score(program, HUMANEVAL, SANDBOX, QUICK) == 1.0)
    if route == "code_graded":
        return code_score(program, GRADED, SANDBOX, QUICK)
    env = ToolEnv([{"question": "add", "answer": "3"}], lambda c, e: 0.0)
    env.reset(seed=0)
    messages, *_ = env.respond(f'<tool name="python">{program}\nprint(add(1, 2))</tool>')
    return messages[-1]["content"]


@pytest.fixture(scope="module")
def listening_port():
    """A server on the host's loopback that no sandbox may reach."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def accepted(server):
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


@pytest.mark.parametrize("route", ["code", "code_graded", "tool"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attack_scores_nothing_and_changes_nothing(attack, route, monkeypatch, listening_port):
    monkeypatch.setenv("OMNIGYM_TEST_SECRET", SECRET)
    before = host_state()
    start = time.monotonic()
    outcome = run_route(route, ATTACKS[attack].replace("LISTENING_PORT", str(listening_port.getsockname()[1])))
    took = time.monotonic() - start
    if route == "tool":
        assert SECRET not in outcome and "WROTE" not in outcome and "FILE-LEAK" not in outcome
        assert "candidate(" not in outcome  # the tests never reach the program
    else:
        assert outcome == 0.0
    limit = 5 if route == "tool" else QUICK.wall_seconds
    assert took < limit + KILL_MARGIN_SECONDS + 1.0
    deadline = time.monotonic() + 2
    while sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleepers() == []
    assert host_state() == before
    assert not accepted(listening_port)
    assert run_route(route, CORRECT) in (1.0, "3")


def test_correct_and_wrong_programs_are_told_apart_every_way():
    assert [run_route(r, CORRECT) for r in ("code", "code_graded", "tool")] == [1.0, 1.0, "3"]
    assert [run_route(r, WRONG) for r in ("code", "code_graded", "tool")] == [0.0, 0.0, "-1"]
    half = "def add(a, b):\n    return 3"
    assert code_score(half, GRADED, SANDBOX, QUICK) == 0.5 and code_score(half, HUMANEVAL, SANDBOX, QUICK) == 0.0


def test_values_cross_as_plain_data_with_in_place_changes_kept():
    example = {"tests": ["xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
                         "assert stats([1.5, 2.5]) == {'mean': 2.0, 'range': (1.5, 2.5), 'tags': {b'x'}}",
                         "assert isinstance(stats([1.0]), dict) and LIMIT == 10",
                         "try:\n    stats([])\n    assert False\nexcept ZeroDivisionError:\n    pass"]}
    program = ("LIMIT = 10\ndef sort_in_place(xs):\n    xs.sort()\n"
               "def stats(xs):\n    return {'mean': sum(xs) / len(xs), 'range': (min(xs), max(xs)), 'tags': {b'x'}}")
    assert code_score(program, example, SANDBOX, QUICK) == 1.0


def test_the_candidate_cannot_redefine_the_tasks_helpers():
    """HumanEval/32-style: the test calls a helper from the prompt; the program's own
    version of it is not the one the judge uses."""
    example = {"prompt": "def helper(x):\n    return x * 2\n\ndef solve(x):\n    \"\"\"helper(x) + 1\"\"\"\n",
               "entry_point": "solve", "test": "def check(candidate):\n    assert helper(candidate(1)) == 6\n"}
    assert code_score("def helper(x):\n    return 6\ndef solve(x):\n    return 0", example, SANDBOX, QUICK) == 0.0
    assert code_score("    return helper(x) + 1\n", example, SANDBOX, QUICK) == 1.0


@bubblewrap
def test_tests_and_verdict_are_out_of_the_programs_reach():
    program = WRONG + ("import os, glob\nseen = []\nfor p in glob.glob('/proc/*/fd/*') + glob.glob('/proc/*/cmdline'):\n"
                       "    if p.split('/')[2] not in ('self', 'thread-self', str(os.getpid())):\n"
                       "        try: seen.append(open(p, 'rb').read())\n        except OSError: pass\n"
                       "print(b'candidate(-4, 4)' in b''.join(seen))")
    from omnigym.rewards.code import HARNESS

    result = SANDBOX.run(SANDBOX.python_argv(HARNESS), QUICK, "",
                         (repr({"check": HUMANEVAL["test"], "entry_point": "add"}).encode(), program.encode()), 1)
    assert result.stdout == "False\n"
    assert result.channels[0].decode().splitlines() == ["fail 0 AssertionError", "done"]


@bubblewrap
def test_one_sandboxs_files_and_ipc_are_not_anothers():
    first = SANDBOX.run_python("import ctypes\nopen('/dev/shm/x', 'w').write('1')\nopen('x', 'w').write('1')\n"
                       "print(ctypes.CDLL(None).shmget(4711, 4096, 0o1666) >= 0)", QUICK)
    second = SANDBOX.run_python("import os, ctypes\nprint(os.listdir('.'), os.listdir('/dev/shm'), "
                        "ctypes.CDLL(None).shmget(4711, 0, 0))", QUICK)
    assert first.stdout == "True\n" and second.stdout == "[] [] -1\n"


@bubblewrap
@as_root
def test_memory_is_capped_for_the_whole_sandbox():
    """Eight processes of 200 MB each, under a 512 MB cap: the cgroup stops them together."""
    program = ("import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n        x = b'x' * (200 * 1024 * 1024)\n"
               "        time.sleep(2)\n        print('held 200 MB for 2 s', flush=True)\n        os._exit(0)\n"
               "for _ in range(8):\n    os.wait()")
    result = SANDBOX.run_python(program, SandboxLimits(cpu_seconds=5, wall_seconds=6, memory_mb=512, max_file_mb=1))
    assert 1 <= result.stdout.count("held") <= 2


def test_an_entry_point_named_like_a_builtin_is_the_programs():
    example = {"prompt": 'def max(xs):\n    """The smallest, despite the name."""\n', "entry_point": "max",
               "test": "def check(candidate):\n    assert candidate([3, 1]) == 1\n"}
    assert code_score("    return min(xs)\n", example, SANDBOX, QUICK) == 1.0
    assert code_score("    return sorted(xs)[-1]\n", example, SANDBOX, QUICK) == 0.0


# -- issue 25: names added to the judge, completions that made the reward raise, signals --

# A task whose tests lean on builtins (abs, range, all) and on a helper of its own prompt
# (double): WRONG passes it only if the judge takes the program's versions of those.
BENT = {"prompt": "def double(x):\n    return 2 * x\n\n\ndef add(a, b):\n    \"\"\"The sum of a and b.\"\"\"\n",
        "entry_point": "add",
        "test": "def check(candidate):\n    assert abs(candidate(1, 2) - 3) < 1e-9\n    for a in range(5):\n"
                "        assert candidate(a, 1) == a + 1\n    assert all([candidate(2, 2) == 4])\n"
                "    assert double(candidate(1, 1)) == 4\n"}
BENT_GRADED = {"tests": ["assert abs(add(1, 2) - 3) < 1e-9", "for a in range(5):\n    assert add(a, 1) == a + 1",
                         "assert all([add(2, 2) == 4])", "assert sorted([add(3, 1), 9]) == [4, 9]"]}
# the program's own versions of what the tests use, each making WRONG pass
OWN = ("def abs(x): return 0\ndef range(*a): return []\ndef all(x): return True\ndef double(x): return 4\n"
       "def sorted(x): return [4, 9]\ndef check(c): return None\ndef candidate(*a): return 3\n")
OFFER = "{n: ['callable'] for n in ('abs', 'range', 'all', 'double', 'sorted', 'check', 'candidate', 'add')}"
ADDING = {
    "replace the candidate's lookup": WRONG + OWN + f"import __main__\n__main__.lookup = lambda *a: {OFFER}\n",
    "wrap the candidate's send": WRONG + OWN + (
        "import __main__\nsend = __main__.send\n"
        f"def wrapped(fd, obj):\n    if obj[0] == 'ok' and type(obj[1]) is dict: obj = ['ok', {{**obj[1], **{OFFER}}}]\n"
        "    send(fd, obj)\n__main__.send = wrapped\n"),
    "offer __builtins__, exec and non-names with the rest": WRONG + OWN + (
        "import __main__\nsend = __main__.send\n"
        f"def wrapped(fd, obj):\n    if obj[0] == 'ok' and type(obj[1]) is dict:\n"
        f"        extra = {{'__builtins__': ['value', ['d', []]], 'exec': ['callable'], 'abs\\n': ['callable'],\n"
        f"                 7: ['callable'], 'add': ['callable', 'x', 'y'], '': ['value']}}\n"
        f"        obj = ['ok', {{**obj[1], **{OFFER}, **extra}}]\n    send(fd, obj)\n__main__.send = wrapped\n"),
    "a huge lookup reply": WRONG + OWN + (
        "import __main__\nsend = __main__.send\n"
        f"def wrapped(fd, obj):\n    if obj[0] == 'ok' and type(obj[1]) is dict:\n"
        f"        obj = ['ok', {{**{{f'n{{i}}' * 10: ['value'] for i in __import__('builtins').range(50000)}},"
        f" **obj[1], **{OFFER}}}]\n    send(fd, obj)\n__main__.send = wrapped\n"),
    "a reply that is not UTF-8": WRONG + OWN + (
        "import __main__, os, struct\ndef raw(fd, obj):\n    data = b'[\"ok\", {\"abs\": [\"callable\"]}] \\xff\\xfe'\n"
        "    os.write(fd, struct.pack('<I', len(data)) + data)\n__main__.send = raw\n"),
}


def adding_route(route, program):
    if route == "code":
        return float(code_score(program, BENT, SANDBOX, QUICK) == 1.0)
    if route == "code_graded":
        return code_score(program, BENT_GRADED, SANDBOX, QUICK)
    return run_route("tool", program)


@pytest.mark.parametrize("route", ["code", "code_graded", "tool"])
@pytest.mark.parametrize("attack", sorted(ADDING))
def test_the_program_cannot_add_or_replace_names_in_the_judge(attack, route):
    outcome = adding_route(route, ADDING[attack])
    if route == "tool":  # no judge there: the program's own names are its own business, and nothing raises
        assert isinstance(outcome, str)
    else:
        assert outcome == 0.0
    assert adding_route(route, CORRECT) in (1.0, "3")


def test_the_judge_asks_for_no_names():
    """The program learns nothing of which names the tests use (check, candidate, loop variables)."""
    program = CORRECT + ("import __main__\nseen = []\nreceive = __main__.receive\n"
                         "def spy(fd):\n    request = receive(fd)\n    seen.append(request)\n    return request\n"
                         "__main__.receive = spy\n"
                         "def add(a, b):\n    print(seen[0] if seen else None, flush=True)\n    return a + b\n")
    from omnigym.rewards.code import HARNESS

    job = {"check": BENT["test"], "entry_point": "add", "prelude": BENT["prompt"]}
    result = SANDBOX.run(SANDBOX.python_argv(HARNESS), QUICK, "", (repr(job).encode(), program.encode()), 1)
    assert result.channels[0].decode().splitlines() == ["pass 0", "done"]
    assert result.stdout.splitlines()[0] == "['lookup']"


@pytest.mark.parametrize("route", ["code", "code_graded"])
def test_a_broken_reply_is_not_an_exception_the_tests_can_catch(route):
    """A reply the judge cannot read fails the test, even inside ``except ValueError``; and a
    StopIteration from the program does not end the test's map early."""
    catching = {"prompt": "def add(a, b):\n    \"\"\"a + b; ValueError for a str.\"\"\"\n", "entry_point": "add",
                "test": "def check(candidate):\n    try:\n        candidate('x', 1)\n        raised = False\n"
                        "    except (ValueError, EOFError):\n        raised = True\n    assert raised\n"}
    graded = {"tests": ["try:\n    add('x', 1)\n    raised = False\nexcept (ValueError, EOFError):\n    raised = True\n"
                        "assert raised", "assert all(map(lambda x: add(x, 0) == x, [1, 2]))"]}
    garbled = ("import __main__, os, struct\nsend = __main__.send\ndef garble(fd, obj):\n"
               "    if obj[0] == 'ok' and type(obj[1]) is dict: return send(fd, obj)\n"
               "    os.write(fd, struct.pack('<I', 9) + b'[\"ok\", ,]')\n__main__.send = garble\n")
    for program in (WRONG + garbled, WRONG + "import os\nadd = lambda a, b: os._exit(0)",
                    "def add(a, b):\n    raise StopIteration"):
        score = code_score(program, catching if route == "code" else graded, SANDBOX, QUICK)
        assert score == 0.0, program
    right = "def add(a, b):\n    if type(a) is str: raise ValueError(a)\n    return a + b\n"
    assert code_score(right, catching if route == "code" else graded, SANDBOX, QUICK) == 1.0


DEEP = {"a sum 3,000 deep": "def add(a, b):\n    return a + b + " + "+".join(["1"] * 3000) + "\n",
        "unary minus 3,000 deep": "def add(a, b):\n    return a + b + " + "-" * 3000 + "1\n",
        "not 3,000 deep": "def add(a, b):\n    return a + b + 0 * (" + "not " * 3000 + "a)\n",
        "an attribute chain 30,000 long": "def add(a, b):\n    return a + b\nx = a" + ".b" * 30000 + "\n",
        "a subscript chain 30,000 long": "def add(a, b):\n    return a + b\nx = a" + "[0]" * 30000 + "\n",
        "a lone surrogate": "def add(a, b):\n    return a + b  # \ud800\n",
        "a lone surrogate in a string": "def add(a, b):\n    return a + b + len('\udfff') - 1\n",
        "a NUL byte": "def add(a, b):\n    return a + b\x00\n"}
REASONS = {"a lone surrogate": "surrogate", "a lone surrogate in a string": "surrogate", "a NUL byte": "no test ran"}


@pytest.mark.parametrize("route", ["code", "code_graded", "tool"])
@pytest.mark.parametrize("completion", sorted(DEEP))
def test_no_completion_makes_a_reward_raise(completion, route):
    """Each scores 0 with its reason recorded; through the batched reward too (a raise there
    stops a training run); the tool answers with an error line."""
    program = DEEP[completion]
    if route == "tool":
        outcome = run_route("tool", program)
        assert "Error" in outcome and "3" != outcome
        return
    from omnigym.rewards.code import verdict

    example = HUMANEVAL if route == "code" else GRADED
    found = verdict(program, example, SANDBOX, QUICK)
    assert found.passed == 0 and found.total in (1, 2)
    assert REASONS.get(completion, "no test ran: RecursionError") in found.reason
    assert get_reward(route)([program], [example]).tolist() == [0.0]


def test_a_deep_recursion_at_run_time_fails_only_its_tests():
    """A RecursionError fails its own test; a candidate's process that crashes (a segfault,
    as a C stack overflow gives) fails that test and the later ones; the judge stands."""
    deep = "def add(a, b):\n    return a + b if a <= 0 else add(a - 1, b + 1)\n"
    example = {"tests": ["assert add(1, 2) == 3", "assert add(10 ** 6, 0) == 10 ** 6", "assert add(-4, 4) == 0"]}
    assert code_score(deep, example, SANDBOX, QUICK) == 2 / 3
    crashing = deep.replace("return", "if a > 100: __import__('ctypes').string_at(0)\n    return")
    assert code_score(crashing, example, SANDBOX, QUICK) == 1 / 3


SIGNALLING = ("import os, signal\njudge = os.getppid()\n"
              "catchable = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)]\n"
              "def storm(pids):\n    for s in catchable:\n        for pid in pids:\n"
              "            try: os.kill(pid, s)\n            except OSError: pass\n"
              "storm([judge])\nif os.fork() == 0:\n    storm([1, judge])\n    os._exit(0)\nos.wait()\n"
              "import time\ntime.sleep(0.2)\n")


@pytest.mark.parametrize("route", ["code", "code_graded"])
def test_signals_from_the_program_do_not_reach_the_judge(route):
    """Every signal a process may send (all but SIGKILL and SIGSTOP, which the sandbox's
    PID 1 never gets from inside) sent to the judge by the program and by a child of its:
    a correct program still passes. (The tool env has no judge: its program is the PID 1.)"""
    assert run_route(route, CORRECT + SIGNALLING) == 1.0
    assert run_route(route, WRONG + SIGNALLING) == 0.0


# -- without bubblewrap and without root: the program runs as the trainer's own user ----

AS_THE_TRAINERS_USER = '''
import json, sys, types
src = sys.argv[1]
# the sandbox and the verdict only (the package's __init__ imports torch, which the
# interpreter this uid may run need not have)
for name in ("omnigym", "omnigym.rewards"):
    package = types.ModuleType(name)
    package.__path__ = [src + "/" + name.replace(".", "/")]
    sys.modules[name] = package
sys.path.insert(0, src)
import omnigym.rewards.sandbox as sandbox
from omnigym.rewards.code import HARNESS, _count_passed

which = sandbox.shutil.which
sandbox.shutil.which = lambda name: None if name == "bwrap" else which(name)
box = sandbox.Sandbox()
job = {"tests": ["assert add(1, 2) == 3", "assert add(-4, 4) == 0"]}
limits = sandbox.SandboxLimits(cpu_seconds=2, wall_seconds=3, memory_mb=512, max_processes=16, max_file_mb=1)
result = box.run(box.python_argv(HARNESS), limits, "", (repr(job).encode(), sys.argv[2].encode()), 1)
print(json.dumps({"isolation": result.isolation, "passed": _count_passed(result.channels[0], 2)[0],
                  "stdout": result.stdout}))
'''
# The trainer is the judge's parent: its descriptors (the tests, the verdict) are under
# /proc/<trainer>/fd, which a process of the same user may open. A daemon waits for the
# judge's verdict and writes a pass over it.
THROUGH_THE_TRAINER = WRONG + (
    "import os, time\nstat = open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()\n"
    "trainer = f'/proc/{stat[1]}/fd/'\nseen, targets = [], []\n"
    "for fd in os.listdir(trainer):\n    try: seen.append(open(trainer + fd, 'rb').read())\n    except OSError: pass\n"
    "    try: targets.append(os.open(trainer + fd, os.O_RDWR))\n    except OSError: pass\n"
    "print('TESTS-SEEN' if b'add(-4, 4)' in b''.join(seen) else 'tests not seen', flush=True)\n"
    "if os.fork() == 0:\n    os.setsid()\n    end = time.monotonic() + 2\n    while time.monotonic() < end:\n"
    "        for fd in targets:\n            if b'done' in os.pread(fd, 100, 0):\n"
    "                os.pwrite(fd, b'pass 0\\npass 1\\ndone\\n'.ljust(48, b'\\n'), 0)\n"
    "        time.sleep(0.001)\n    os._exit(0)\n")


@pytest.mark.skipif(os.geteuid() == 0 and not __import__("shutil").which("setpriv"), reason="needs setpriv")
def test_without_bubblewrap_or_root_the_program_cannot_read_the_tests_or_write_the_verdict():
    """Run as a user without root (as root: as nobody, through setpriv), with the limits only:
    the tests and the verdict are not among the descriptors of the trainer's that its
    programs can open."""
    import json
    import subprocess

    from omnigym.rewards.sandbox import sandbox_interpreter

    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    outcome = []
    for program in (THROUGH_THE_TRAINER, CORRECT):
        done = subprocess.run(drop + [sandbox_interpreter(), "-c", AS_THE_TRAINERS_USER, src, program], cwd="/",
                              capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": "/"})
        outcome.append(json.loads(done.stdout.strip().splitlines()[-1]))
    time.sleep(2)  # the attack's daemon (which nothing kills without root or bubblewrap) has ended
    attack, correct = outcome
    assert attack["isolation"] == correct["isolation"] == "limits only"
    assert attack["stdout"] == "tests not seen\n" and attack["passed"] == 0
    assert correct["passed"] == 2


def test_a_calculator_call_cannot_stall_the_trainer():
    """The calculator runs in the trainer, not the sandbox: a tower of powers, each exponent
    within its bound, took 21 s here (one level more: hours and gigabytes)."""
    env = ToolEnv([{"question": "q", "answer": "1"}], lambda c, e: 0.0)
    env.reset(seed=0)
    start = time.monotonic()
    messages, *_ = env.respond('<tool name="calculator">(((9**64)**64)**64)**64</tool>')
    assert time.monotonic() - start < 1.0
    assert messages[-1]["content"].startswith("error: ")
    assert env.use_tool("calculator", "(2**64)**64 - (2**64)**64 + 2**64") == str(2 ** 64)


@as_root
def test_without_bubblewrap_a_program_leaves_nothing_for_the_next_in_shared_temp_dirs(monkeypatch):
    """As root without bubblewrap, /tmp and /dev/shm are the host's: a correct program left
    its code there and a wrong one ran it (1.0). What a sandbox's uid owns there goes with it."""
    import omnigym.rewards.sandbox as sandbox

    which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else which(name))
    box = Sandbox()
    leave = "".join(f"open('{d}/{MARK}share', 'w').write({CORRECT!r})\n" for d in ("/tmp", "/dev/shm"))
    run = "".join(f"try: exec(open('{d}/{MARK}share').read())\nexcept OSError: pass\n" for d in ("/tmp", "/dev/shm"))
    try:
        assert code_score(CORRECT + leave, GRADED, box, QUICK) == 1.0
        assert glob.glob(f"/tmp/{MARK}*") + glob.glob(f"/dev/shm/{MARK}*") == []
        assert code_score(WRONG + run, GRADED, box, QUICK) == 0.0
    finally:
        for path in glob.glob(f"/tmp/{MARK}*") + glob.glob(f"/dev/shm/{MARK}*"):
            os.remove(path)
