"""Hostile programs in the code sandbox: the trainer lives, the reward is 0 (or the graded
score of what passed before the limit) and nothing outside the sandbox changes."""

import os
import socket
import sys
import threading

import pytest

from omnigym.rewards import get_reward
from omnigym.rewards.sandbox import SandboxLimits, run_python

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's limits are Linux's")

QUICK = SandboxLimits(cpu_seconds=2, wall_seconds=4, memory_mb=512, max_processes=16, max_file_mb=1)
isolated = pytest.mark.skipif(os.geteuid() != 0, reason="uid and namespace isolation need root")


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

    assert code_score(code, {"tests": tests}, QUICK) == 0.5


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
    assert result.isolated
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
