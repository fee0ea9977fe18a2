"""Run untrusted Python (model-written code) in a separate, limited process.

What it does, in the child process before the program starts:
- a throw-away working directory, removed afterwards; ``HOME`` and ``TMPDIR`` point into
  it, and the environment is rebuilt from nothing (no trainer variables, no tokens);
- ``python -I``: no user site, no ``PYTHON*`` variables, the script's dir not on the path;
- resource limits: CPU seconds, address space, processes, file size, open files, no core;
- a wall-clock limit, after which every process of the sandbox is killed;
- stdout and stderr go to unnamed files the trainer opened (outside the working directory,
  already unlinked, so the program cannot replace them with a link or a FIFO), capped by the
  file-size limit, and are read back capped through the trainer's own descriptors;
- clean-up never raises: a tree too deep for ``shutil.rmtree`` is removed by ``rm -rf``;
- when the trainer runs as root (containers, CI): new network and mount namespaces (no
  network, not even loopback; private tmpfs over /tmp, /var/tmp and /dev/shm), and the
  program runs as a fresh unprivileged uid, so it cannot signal the trainer, read or write
  its files, or touch another sandbox. Killing is then by uid, so forks that escape the
  process group die too.

Without root only the limits, the scrubbed environment and the process group apply;
docs/rewards.md says what that leaves open.
"""

from __future__ import annotations

import ctypes
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

CLONE_NEWNS, CLONE_NEWNET = 0x00020000, 0x40000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
RUN_MAIN = "exec(compile(open('main.py').read(), 'main.py', 'exec'), {'__name__': '__main__'})"


@dataclass
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 16
    max_file_mb: int = 8
    max_output_bytes: int = 64_000


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    isolated: bool
    """True when namespaces and a separate uid were used (trainer running as root)."""


def _isolate(uid: int, limits: SandboxLimits, privileged: bool) -> None:
    """Runs in the child between fork and exec."""
    os.setsid()
    if privileged:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS | CLONE_NEWNET) == 0:
            libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
            for path in (b"/tmp", b"/var/tmp", b"/dev/shm"):
                libc.mount(b"tmpfs", path, b"tmpfs", 0, b"size=16m")
    mb = 1024 * 1024
    for limit, value in ((resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_AS, limits.memory_mb * mb),
                         (resource.RLIMIT_NPROC, limits.max_processes),
                         (resource.RLIMIT_FSIZE, limits.max_file_mb * mb), (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(limit, (value, value))
    if privileged:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def _kill_all(proc: subprocess.Popen, uid: int, privileged: bool) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if privileged:
        # kill(-1) from a process with the sandbox's uid reaches exactly the sandbox's processes.
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    proc.wait()


def _world_runnable(path: str) -> bool:
    """Can a uid with no rights of its own execute ``path`` (every parent dir searchable)?"""
    path = os.path.realpath(path)
    if not os.path.isfile(path) or not os.stat(path).st_mode & 0o001:
        return False
    parent = os.path.dirname(path)
    while True:
        if not os.stat(parent).st_mode & 0o001:
            return False
        if parent == os.path.dirname(parent):
            return True
        parent = os.path.dirname(parent)


def sandbox_interpreter() -> str:
    """The trainer's Python if an unprivileged uid may run it, else a system Python (the
    programs need only the standard library)."""
    candidates = [sys.executable] + [shutil.which(n) or "" for n in ("python3", "python")]
    candidates += ["/usr/bin/python3", "/usr/local/bin/python3"]
    return next((c for c in candidates if c and _world_runnable(c)), sys.executable)


def run_python(code: str, limits: SandboxLimits | None = None, stdin: str = "") -> SandboxResult:
    limits = limits or SandboxLimits()
    python = sandbox_interpreter()
    privileged = os.geteuid() == 0 and sys.platform == "linux" and _world_runnable(python)
    uid = 3_000_000 + random.SystemRandom().randrange(1_000_000)
    workdir = tempfile.mkdtemp(prefix="omnigym-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w") as f:
            f.write(code)
        if privileged:
            for path in (workdir, os.path.join(workdir, "main.py")):
                os.chown(path, uid, uid)
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            # main.py is opened relative to the working directory, which the child holds open:
            # by path it is hidden under the child's private /tmp.
            proc = subprocess.Popen([python, "-I", "-B", "-c", RUN_MAIN], cwd=workdir, env=env,
                                    stdin=subprocess.PIPE, stdout=out, stderr=err, close_fds=True,
                                    preexec_fn=lambda: _isolate(uid, limits, privileged))
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BrokenPipeError:
                pass
            _kill_all(proc, uid, privileged)
            return SandboxResult(None if timed_out else proc.returncode, _read_capped(out, limits),
                                 _read_capped(err, limits), timed_out, privileged)
    finally:
        _remove_tree(workdir)


def _read_capped(file, limits: SandboxLimits) -> str:
    file.seek(0)
    return file.read(limits.max_output_bytes).decode("utf-8", errors="replace")


def _remove_tree(path: str) -> None:
    """Remove the working directory, whatever the program left in it (links are removed, never
    followed; a tree deeper than Python's recursion limit goes to ``rm -rf``)."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        pass
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False, timeout=60)
