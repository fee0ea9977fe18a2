"""Hostile programs in the code sandbox: the trainer lives, the reward is 0 (or the graded
score of what passed before the limit) and nothing outside the sandbox changes."""

import os
import socket
import sys
import threading

import pytest

from omnigym.rewards import get_reward
from omnigym.rewards.sandbox import Sandbox, SandboxLimits, isolation

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's limits are Linux's")

QUICK = SandboxLimits(cpu_seconds=2, wall_seconds=4, memory_mb=512, max_processes=16, max_file_mb=1)
SANDBOX = Sandbox()  # one for the module: it probes the machine once
run_python = SANDBOX.run_python
isolated = pytest.mark.skipif(SANDBOX.isolation().kind != "bubblewrap", reason=SANDBOX.isolation().line())


def graded(code, tests):
    return get_reward("code_graded")([f"```python\n{code}\n```"], [{"tests": tests}]).item()


def test_a_correct_program_passes_and_a_wrong_one_is_graded():
    assert graded("def add(a, b):\n    return a + b", ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]) == 1.0
    assert graded("def add(a, b):\n    return a - b", ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]) == 0.5
    assert get_reward("code")(["def add(a, b):\n    return a - b"], [{"tests": ["assert add(1, 2) == 3"]}]).item() == 0.0


def test_infinite_loop_is_stopped_and_keeps_the_tests_passed_before_it():
    tests = ["assert f() == 1", "assert f() == 1", "g()", "assert f() == 1"]
    code = "def f():\n    return 1\ndef g():\n    while True:\n        pass"
    from omnigym.rewards.code import code_score

    assert code_score(code, {"tests": tests}, SANDBOX, QUICK) == 0.5


def test_fork_bomb_is_contained():
    result = run_python("import os\nwhile True:\n    os.fork()", QUICK)
    assert result.returncode != 0
    assert graded("import os\nwhile True:\n    os.fork()", ["assert True"]) == 0.0


def test_memory_hog_fails_inside_the_sandbox():
    result = run_python("x = bytearray(8 * 1024**3)\nprint('allocated')", QUICK)
    assert "MemoryError" in result.stderr
    assert "allocated" not in result.stdout


def test_stdout_flood_is_capped():
    result = run_python("while True:\n    print('x' * 10000)", QUICK)
    assert len(result.stdout) <= QUICK.max_output_bytes
    assert graded("while True:\n    print('x' * 10000)", ["assert True"]) == 0.0


def test_trainer_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("OMNIGYM_TEST_SECRET", "hunter2")
    result = run_python("import os\nprint(dict(os.environ))\nprint(os.path.expanduser('~'))")
    assert "hunter2" not in result.stdout
    assert "/root" not in result.stdout


@isolated
def test_cannot_read_write_or_delete_the_trainers_files(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's data")
    os.chmod(tmp_path, 0o700)
    code = f"""
import os, shutil
for attempt in (lambda: open({str(secret)!r}).read(), lambda: open({str(tmp_path / 'new.txt')!r}, 'w').write('x'),
                lambda: os.remove({str(secret)!r}), lambda: shutil.rmtree({str(tmp_path)!r}),
                lambda: open(os.path.expanduser('/root/.bashrc')).read()):
    try:
        print('LEAK', attempt())
    except OSError as e:
        print('denied', type(e).__name__)
"""
    result = run_python(code)
    assert result.isolation == "bubblewrap"
    assert "LEAK" not in result.stdout and result.stdout.count("denied") == 5
    assert secret.read_text() == "the trainer's data"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.txt"]


@isolated
def test_writes_to_shared_temp_dirs_stay_inside():
    marker = f"/tmp/omnigym-sandbox-escape-{os.getpid()}"
    result = run_python(f"open({marker!r}, 'w').write('x')\nprint('wrote')")
    assert result.stdout.strip() == "wrote"  # it wrote to its own private /tmp ...
    assert not os.path.exists(marker)         # ... which is not the trainer's


@isolated
def test_no_network_even_to_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
    result = run_python(f"import socket\ns = socket.socket()\ns.settimeout(2)\n"
                        f"try:\n    s.connect(('127.0.0.1', {port}))\n    print('CONNECTED')\n"
                        f"except OSError as e:\n    print('blocked', e)")
    assert "CONNECTED" not in result.stdout and "blocked" in result.stdout
    server.close()
    assert accepted in ([], [None])


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


@isolated
def test_cannot_kill_or_reach_into_the_trainer():
    me = os.getpid()
    code = f"""
import os, signal
for attempt in (lambda: os.kill({me}, signal.SIGKILL), lambda: os.killpg(os.getpgid({me}), signal.SIGKILL),
                lambda: open('/proc/{me}/mem', 'wb'), lambda: open('/proc/{me}/environ').read()):
    try:
        attempt()
        print('REACHED')
    except OSError as e:
        print('denied', type(e).__name__)
"""
    result = run_python(code)
    assert "REACHED" not in result.stdout and result.stdout.count("denied") == 4
    assert os.getpid() == me  # still here


def test_importing_the_trainers_package_gives_no_access_to_its_state():
    import omnigym.rewards as rewards

    rewards.REWARDS["_probe"] = lambda c, e: 1.0
    result = run_python("try:\n    import omnigym.rewards as r\n    print(sorted(r.REWARDS))\n"
                        "except ImportError as e:\n    print('no import', e)")
    assert "_probe" not in result.stdout
    del rewards.REWARDS["_probe"]


# The trainer reads what the sandbox wrote only through descriptors it opened itself, and
# its clean-up cannot raise: attacks on the files of the working directory.

def leftover_workdirs():
    import tempfile

    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("omnigym-sandbox-")}


@pytest.fixture
def own_tempdir(tmp_path, monkeypatch):
    """The sandbox's work directories in a folder of this test's own: another test process
    running a program at the same moment has one in the shared /tmp (seen once in a suite run)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def test_output_files_replaced_by_links_to_secrets_leak_nothing(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("s3cret-token")
    secret.chmod(0o600)
    tmp_path.chmod(0o755)
    program = (f"import os\nfor name in ('.stdout', '.stderr'):\n"
               f"    try: os.remove(name)\n    except OSError: pass\n"
               f"    os.symlink({str(secret)!r}, name)\n"
               f"    os.symlink('/proc/{os.getpid()}/environ', name + '-env')\nprint('done')")
    result = run_python(program, QUICK)
    assert result.stdout == "done\n"
    assert "s3cret" not in result.stdout + result.stderr and "PATH=" not in result.stdout + result.stderr


def test_an_output_file_replaced_by_a_fifo_or_deleted_does_not_block_or_raise():
    import signal
    import time

    def hang(*_):
        raise TimeoutError("run_python blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(30)
    try:
        for trick in ("os.mkfifo('.stdout'); os.mkfifo('.stderr')", "pass"):
            start = time.monotonic()
            program = f"import os\nfor n in ('.stdout', '.stderr'):\n    try: os.remove(n)\n    except OSError: pass\n" \
                      f"{trick}\nprint('still here')"
            result = run_python(program, QUICK)
            assert result.stdout == "still here\n" and time.monotonic() - start < QUICK.wall_seconds + 5
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_directory_tree_too_deep_for_rmtree_is_still_removed(own_tempdir):
    before = leftover_workdirs()
    program = "import os\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
    result = run_python(program, QUICK)
    assert result.stdout == "deep\n"
    assert leftover_workdirs() == before
    assert run_python("print(1 + 1)", QUICK).stdout == "2\n"  # the next program runs as before


@pytest.fixture
def without_bubblewrap(monkeypatch):
    import omnigym.rewards.sandbox as sandbox

    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    yield sandbox.Sandbox()  # a fresh one probes the machine as it is now
    monkeypatch.undo()


def test_without_bubblewrap_one_line_says_what_is_lost_and_the_verdict_still_holds(without_bubblewrap, capsys):
    from omnigym.rewards.code import code_score

    line = without_bubblewrap.isolation().line()
    assert "bubblewrap is not installed (apt-get install bubblewrap)" in line
    assert ("shares /tmp" if os.geteuid() == 0 else "read and write what your user can") in line
    example = {"tests": ["assert add(1, 2) == 3"]}
    assert code_score("def add(a, b):\n    return a + b", example, without_bubblewrap, QUICK) == 1.0
    forged = "class Any:\n    def __eq__(self, other): return True\ndef add(a, b):\n    return Any()\n" \
             "print('pass 0\\ndone')\nimport os\nfor fd in range(3, 64):\n    try: os.write(fd, b'pass 0\\n')\n" \
             "    except OSError: pass"
    assert code_score(forged, example, without_bubblewrap, QUICK) == 0.0
    assert without_bubblewrap.run_python("print(6 * 7)", QUICK).isolation == "limits only"
    warned = capsys.readouterr().err.strip().splitlines()
    assert warned == [f"omnigym: warning: {line}"]  # said once, not once per program


def test_omnigym_list_reports_the_isolation_in_effect(capsys):
    from omnigym.cli import main

    assert main(["list"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == isolation().line()


def test_a_code_example_without_tests_is_one_clear_error():
    from omnigym.errors import OmnigymError
    from omnigym.rewards.code import code_score

    with pytest.raises(OmnigymError, match="needs 'tests' .* or HumanEval's 'test' and 'entry_point'; this one has question"):
        code_score("x = 1", {"question": "?"}, SANDBOX)
    with pytest.raises(OmnigymError, match="must be a list of Python statements"):
        code_score("x = 1", {"tests": "assert x == 1"}, SANDBOX)


WITHOUT_ROOT = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sandbox = sys.modules["sandbox"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sandbox)
box = sandbox.Sandbox()
print(box.isolation().kind)
program = ("import os, glob\\nif os.fork() == 0:\\n    os.setsid()\\n    os.execv('/usr/bin/sleep', ['sleep', '47114712'])\\n"
           "print('forked')\\nfor p in glob.glob('/proc/*/environ'):\\n    print(open(p).read())")
print(box.run_python(program, sandbox.SandboxLimits(wall_seconds=5)).stdout)
"""


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, to run a user of its own with many processes, and /usr/bin/python3")
def test_without_root_a_user_with_many_processes_gets_the_same_sandbox():
    """As an ordinary user (uid 65534 here) who already runs 40 processes: the sandbox can
    still fork, hides the user's processes and their environment, and leaves no daemon."""
    import subprocess
    from pathlib import Path

    import omnigym.rewards.sandbox as sandbox

    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    if subprocess.run(as_nobody + ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True).returncode:
        pytest.skip("bubblewrap cannot make namespaces for an ordinary user on this machine")
    sleepers = [subprocess.Popen(as_nobody + ["sleep", "60"]) for _ in range(40)]
    try:
        src = Path(sandbox.__file__).resolve().parents[2]
        result = subprocess.run(as_nobody + ["env", f"PYTHONPATH={src}", f"OMNIGYM_TEST_SECRET={SECRET_WORD}",
                                             "/usr/bin/python3", "-c", WITHOUT_ROOT, sandbox.__file__],
                                capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        for sleeper in sleepers:
            sleeper.kill()
    assert result.stdout.startswith("bubblewrap\nforked\n"), result.stdout + result.stderr
    assert SECRET_WORD not in result.stdout
    import glob

    assert not [p for p in glob.glob("/proc/[0-9]*/cmdline") if b"47114712" in _read(p)]


SECRET_WORD = "nobody-secret-9931"


def _read(path):
    try:
        return open(path, "rb").read()
    except OSError:
        return b""


def test_without_util_linux_the_sandbox_refuses_in_one_line(monkeypatch):
    import omnigym.rewards.sandbox as sandbox
    from omnigym.errors import OmnigymError

    real_which = sandbox.shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "prlimit" else real_which(name))
    fresh = sandbox.Sandbox()
    with pytest.raises(OmnigymError, match=r"the code sandbox needs prlimit .*apt-get install util-linux"):
        fresh.run_python("print(1)", QUICK)
    assert fresh.isolation().line().startswith("sandbox: unavailable: the code sandbox needs prlimit")


def test_without_bubblewrap_the_judge_ignores_signals_and_takes_only_the_names_it_needs(without_bubblewrap):
    """There the judge is not a PID 1 the kernel shields: it ignores the signals itself."""
    from omnigym.rewards.code import code_score

    example = {"tests": ["assert add(1, 2) == 3", "for a in range(3):\n    assert add(a, 1) == a + 1"]}
    signalling = ("import os, signal\nfor s in signal.Signals:\n    if s not in (signal.SIGKILL, signal.SIGSTOP):\n"
                  "        os.kill(os.getppid(), s)\n")  # the judge only: pid 1 here is the host's
    assert code_score("def add(a, b):\n    return a + b\n" + signalling, example, without_bubblewrap, QUICK) == 1.0
    offering = ("def add(a, b):\n    return a - b\ndef range(*a): return []\nimport __main__\n"
                "__main__.lookup = lambda *a: {'add': ['callable'], 'range': ['callable']}\n")
    assert code_score(offering, example, without_bubblewrap, QUICK) == 0.0
