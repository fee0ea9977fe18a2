"""Run untrusted Python (model-written code) where it cannot reach the trainer.

The isolation is bubblewrap's (``bwrap``, Debian package ``bubblewrap``, the sandbox
Flatpak uses); this file only chooses its flags and the limits around it. With it, each
program gets:

- its own user, PID, IPC, UTS, network and cgroup namespaces: no network (only a
  loopback of its own), no view of the trainer's processes or ``/proc``, no SysV IPC shared with
  anyone; ``--die-with-parent`` and a PID namespace, so nothing it starts outlives the call;
- a filesystem made of ``/usr`` (and the interpreter's prefix) read-only, a fresh ``/proc``
  and ``/dev``, and two private tmpfs, ``/tmp`` (the working directory, ``HOME``,
  ``TMPDIR``) and ``/dev/shm``, each capped at ``disk_mb``; no home, no ``/etc``, no
  ``/run``, no project files;
- when the trainer runs as root (containers, CI): a fresh unprivileged uid before bwrap
  starts, so even a kernel-level escape from the namespaces lands as nobody, and a cgroup
  that caps the memory (tmpfs included) and the process count of the whole sandbox.

Around it, in every mode: an environment rebuilt from nothing, ``python -I -S``, resource
limits (CPU seconds, address space per process, processes, file size, open files, no
core), a wall-clock limit after which the sandbox is killed, and stdout/stderr written to
unnamed files the trainer opened itself and reads back capped through its own
descriptors. The trainer never opens a path the program could have written.

Without bwrap (or where the kernel refuses it user namespaces) the program runs with the
limits only: ``isolation().lost`` says what that gives up, and ``omnigym list`` shows it.

What is learnt about the machine (the interpreter the sandbox may run, the isolation it gets,
the warning said once, the count of the user's processes) is kept on a ``Sandbox`` object,
not in this process: whoever runs programs (the code reward, the tool env) holds one.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field

KILL_MARGIN_SECONDS = 2.0
"""A call returns at most this long after ``wall_seconds``: killing, reaping, reading back."""


@dataclass
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_mb: int = 1024
    """Per process always; for the whole sandbox too where a cgroup can be made (root)."""
    max_processes: int = 16
    max_file_mb: int = 8
    disk_mb: int = 64
    """Size of each private tmpfs (the working directory and /dev/shm)."""
    max_output_bytes: int = 64_000


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    isolation: str
    channels: list[bytes] = field(default_factory=list)
    """What the program wrote to each ``writable`` descriptor handed to ``run_sandboxed``."""
    blocked: tuple[str, ...] = ()
    """What the sandbox stopped, as the trainer saw it (the program cannot write any of it):
    ``timeout`` (killed at ``wall_seconds``), ``processes`` (a fork the sandbox's cgroup refused:
    ``pids.events``), ``memory`` (a process the cgroup's memory limit killed: ``oom_kill``); the
    last two only where a cgroup is made (root)."""


@dataclass(frozen=True)
class Isolation:
    kind: str  # "bubblewrap" or "limits only"
    summary: str
    lost: str = ""

    def line(self) -> str:
        return f"{self.summary}" + (f"; {self.lost}" if self.lost else "")


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
    if os.geteuid() != 0:  # the base interpreter: a venv's is a link bwrap would not find
        return os.path.realpath(sys.executable)
    candidates = [sys.executable] + [shutil.which(n) or "" for n in ("python3", "python")]
    candidates += ["/usr/bin/python3", "/usr/local/bin/python3"]
    runnable = [c for c in candidates if c and _world_runnable(c)]
    return os.path.realpath(runnable[0] if runnable else sys.executable)


def _bwrap_args(limits: SandboxLimits, python: str) -> list[str]:
    prefix = os.path.dirname(os.path.dirname(python))
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1",
            "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if not python.startswith("/usr/"):  # pyenv, conda, a venv's base: that prefix only
        args += ["--ro-bind", prefix, prefix]
    size = str(limits.disk_mb * 1024 * 1024)
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--proc", "/proc", "--dev", "/dev",
             "--remount-ro", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--size", size, "--tmpfs", "/tmp",
             "--remount-ro", "/", "--chdir", "/tmp"]  # the root bwrap builds is a tmpfs too: read-only
    return args


class _Cgroup:
    """A memory + pids cgroup for one sandbox (v2, or v1's memory and pids hierarchies),
    where the trainer may make one; otherwise nothing, and the per-process limits stand."""

    def __init__(self, limits: SandboxLimits | None):
        self.dirs: list[str] = []
        if limits is None:
            return
        name = f"omnigym-sandbox-{os.getpid()}-{random.SystemRandom().randrange(1 << 40):x}"
        memory = str(limits.memory_mb * 1024 * 1024)
        for parent, settings in _cgroup_parents(memory, str(limits.max_processes)):
            path = os.path.join(parent, name)
            try:
                os.mkdir(path)
                self.dirs.append(path)
                for file, value in settings:
                    if os.path.exists(os.path.join(path, file)):
                        with open(os.path.join(path, file), "w") as f:
                            f.write(value)
            except OSError:
                self.remove()
                self.dirs = []
                return

    def blocked(self) -> tuple[str, ...]:
        """What the kernel counted against this cgroup's limits: ``processes`` (forks refused at
        ``pids.max``), ``memory`` (processes killed at the memory limit)."""
        counts = {}
        for path in self.dirs:
            for file in ("pids.events", "memory.events", "memory.oom_control"):
                try:
                    with open(os.path.join(path, file)) as f:
                        counts.update(line.split()[:2] for line in f if len(line.split()) >= 2)
                except OSError:
                    continue
        found = [kind for kind, key in (("processes", "max"), ("memory", "oom_kill")) if counts.get(key, "0") != "0"]
        return tuple(found)

    def remove(self) -> None:
        for path in self.dirs:
            for _ in range(50):  # the killed processes leave within milliseconds
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    import time

                    time.sleep(0.01)


def _cgroup_parents(memory: str, pids: str) -> list[tuple[str, list[tuple[str, str]]]]:
    if os.geteuid() != 0:
        return []
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return []
    own = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers") and "" in own:
        parent = "/sys/fs/cgroup" + own[""]
        enabled = open(os.path.join(parent, "cgroup.subtree_control")).read().split() \
            if os.path.exists(os.path.join(parent, "cgroup.subtree_control")) else []
        if {"memory", "pids"} <= set(enabled):
            return [(parent, [("memory.max", memory), ("memory.swap.max", "0"), ("pids.max", pids)])]
        return []
    found = []
    if "memory" in own and os.path.isdir("/sys/fs/cgroup/memory"):
        found.append(("/sys/fs/cgroup/memory" + own["memory"],
                      [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)]))
    if "pids" in own and os.path.isdir("/sys/fs/cgroup/pids"):
        found.append(("/sys/fs/cgroup/pids" + own["pids"], [("pids.max", pids)]))
    return found if len(found) == 2 else []


def _launcher(uid: int | None, limits: SandboxLimits, cgroup: _Cgroup, user_tasks: int) -> list[str]:
    """The programs that put the sandbox in its cgroup, drop to its uid and set its limits,
    each exec-ing the next: util-linux's ``setpriv`` and ``prlimit``, so the trainer can
    spawn without running Python between fork and exec (which costs ~25 ms in a process
    the size of a trainer, more than bwrap itself)."""
    join = "".join(f'echo $$ > "{os.path.join(d, "cgroup.procs")}" && ' for d in cgroup.dirs)
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid is not None else []
    mb = 1024 * 1024
    # RLIMIT_NPROC counts every task of the real uid: a fresh uid's are the sandbox's alone,
    # but without root they include the user's own (a desktop has hundreds), so allow those.
    processes = limits.max_processes + (0 if uid is not None else user_tasks)
    limit = ["prlimit", f"--cpu={limits.cpu_seconds}", f"--as={limits.memory_mb * mb}",
             f"--nproc={processes}", f"--fsize={limits.max_file_mb * mb}", "--nofile=64", "--core=0", "--"]
    return ["sh", "-c", join + 'exec "$@"', "sh"] + drop + limit


def _check_platform() -> None:
    from omnigym.errors import OmnigymError

    if sys.platform != "linux":
        raise OmnigymError(f"the code sandbox runs on Linux only (namespaces, rlimits, pidfds); this is {sys.platform}")
    missing = [tool for tool in ("sh", "prlimit") + (("setpriv",) if os.geteuid() == 0 else ()) if not shutil.which(tool)]
    if missing:
        raise OmnigymError(f"the code sandbox needs {' and '.join(missing)} (Debian/Ubuntu: apt-get install util-linux)")


def _tasks_of_uid(uid: int) -> int:
    """Threads of all processes of ``uid`` (what RLIMIT_NPROC counts); a scan of /proc costs a few ms."""
    tasks = 0
    for status in os.listdir("/proc"):
        if status.isdigit():
            try:
                fields = dict(line.split(":", 1) for line in open(f"/proc/{status}/status") if ":" in line)
            except OSError:
                continue
            if fields.get("Uid", "").split()[:1] == [str(uid)]:
                tasks += int(fields.get("Threads", "1"))
    return tasks


class Sandbox:
    """Where untrusted programs run. It learns about the machine once, on first use (the
    interpreter, running as root or not, the isolation, probed with a real program) and
    keeps it here, with the warning it says once and the user's process count (re-counted
    at most every 5 s); a copy sent to another process (pickled) learns again there."""

    def __init__(self):
        self._interpreter: str | None = None
        self._isolation: Isolation | None = None
        self._warned = False
        self._tasks_counted = (float("-inf"), 0)

    def __getstate__(self):
        return {**self.__dict__, **Sandbox().__dict__}

    @property
    def interpreter(self) -> str:
        if self._interpreter is None:
            self._interpreter = sandbox_interpreter()
        return self._interpreter

    def python_argv(self, source: str) -> list[str]:
        """The sandbox's interpreter running ``source``: isolated mode, no site (stdlib only)."""
        return [self.interpreter, "-I", "-S", "-c", source]

    def as_root(self) -> bool:
        return os.geteuid() == 0 and _world_runnable(self.interpreter)

    def isolation(self) -> Isolation:
        """Which isolation a sandboxed program gets here, tried once with a real program."""
        if self._isolation is None:
            self._isolation = self._probe()
        return self._isolation

    def _probe(self) -> Isolation:
        from omnigym.errors import OmnigymError

        try:
            _check_platform()
        except OmnigymError as exc:
            return Isolation("unavailable", f"sandbox: unavailable: {exc}")
        if self.as_root():
            lost = ("it runs as a fresh uid but shares /tmp, /dev/shm, the network, SysV IPC and the process "
                    "table with the host, and memory is capped per process only")
        else:
            lost = ("it can read and write what your user can, reach the network, see your processes "
                    "(and /proc/PID/environ) and leave daemons behind")
        if not shutil.which("bwrap"):
            return Isolation("limits only", "sandbox: resource limits only, bubblewrap is not installed "
                             "(apt-get install bubblewrap)", lost)
        probe = self._run(self.python_argv("print('ok')"), SandboxLimits(), "", (), True)
        if probe.stdout.strip() != "ok":
            why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
            return Isolation("limits only", f"sandbox: resource limits only: bubblewrap failed here ({why})", lost)
        uid = "a fresh unprivileged uid" if self.as_root() else "your uid mapped into a user namespace"
        cap = "memory and processes capped for the whole sandbox (cgroup)" if _cgroup_parents("1", "1") \
            else "memory capped per process"
        return Isolation("bubblewrap", f"sandbox: bubblewrap: read-only /usr, private capped tmpfs, no network, "
                         f"own PID/IPC/UTS/user namespaces, {uid}, {cap}")

    def run(self, argv: list[str], limits: SandboxLimits | None = None, stdin: str = "",
            readable: tuple[bytes, ...] = (), writable: int = 0) -> SandboxResult:
        """Run ``argv`` (an interpreter command line) in the sandbox. Each of ``readable`` is
        handed to it as an open descriptor on an unnamed file holding those bytes, then
        ``writable`` descriptors on empty unnamed files; their numbers are appended to ``argv``
        in that order, and what it wrote to the writable ones comes back in ``channels``."""
        limits = limits or SandboxLimits()
        _check_platform()
        use_bwrap = self.isolation().kind == "bubblewrap"
        if not use_bwrap and not self._warned:
            print(f"omnigym: warning: {self.isolation().line()}", file=sys.stderr)
            self._warned = True
        return self._run(argv, limits, stdin, readable, use_bwrap, writable)

    def run_python(self, code: str, limits: SandboxLimits | None = None, stdin: str = "") -> SandboxResult:
        """Run ``code`` as a script (``__main__``) and return its output."""
        # A lone surrogate (which a model can write) crosses as such, so that compiling it is the
        # program's own error, as under a plain python; encoding it strictly would raise here.
        runner = ("import os, sys\nfd = int(sys.argv[1])\nsource = os.read(fd, 1 << 26).decode(errors='surrogatepass')\n"
                  "os.close(fd)\ndel fd, os, sys\nexec(compile(source, 'main.py', 'exec'), {'__name__': '__main__'})")
        return self.run(self.python_argv(runner), limits, stdin, (code.encode(errors="surrogatepass"),))

    def _user_tasks(self) -> int:
        import time

        if time.monotonic() - self._tasks_counted[0] > 5:
            self._tasks_counted = (time.monotonic(), _tasks_of_uid(os.getuid()))
        return self._tasks_counted[1]

    def _run(self, argv, limits, stdin, readable, use_bwrap, writable=0) -> SandboxResult:
        root = self.as_root()
        uid = 3_000_000 + random.SystemRandom().randrange(1_000_000) if root else None
        cgroup = _Cgroup(limits) if root else _Cgroup(None)
        workdir = None if use_bwrap else tempfile.mkdtemp(prefix="omnigym-sandbox-")
        files, ours, info = [], [], None
        try:
            if workdir and uid is not None:
                os.chown(workdir, uid, uid)
            for data in readable:
                files.append(tempfile.TemporaryFile())
                files[-1].write(data)
                files[-1].seek(0)
            # Each writable channel is a socket pair, not a file: without bubblewrap or root the
            # program runs as the trainer's user and may open /proc/<trainer>/fd/N, which for a
            # file (or a pipe) would let it write there; a socket cannot be opened that way.
            channels = [socket.socketpair() for _ in range(writable)]
            ours = [mine for mine, _ in channels]
            files += [theirs for _, theirs in channels]
            fds = tuple(f.fileno() for f in files)
            info = tempfile.TemporaryFile() if use_bwrap else None  # bwrap writes its first process's pid here
            home = "/tmp" if use_bwrap else workdir
            env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
            bwrap = _bwrap_args(limits, self.interpreter) + ["--info-fd", str(info.fileno())] if use_bwrap else []
            command = _launcher(uid, limits, cgroup, 0 if root else self._user_tasks()) + bwrap + list(argv) \
                + [str(fd) for fd in fds]
            with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
                proc = subprocess.Popen(command, cwd=workdir or "/", env=env, stdin=subprocess.PIPE if stdin else
                                        subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                                        pass_fds=fds + ((info.fileno(),) if info else ()), start_new_session=True)
                # The child has its copies (Popen returns once it has exec'd, long before the
                # program runs): the trainer's go now, so no program finds the tests or its code
                # among the trainer's descriptors, and a channel ends when the sandbox's copies do.
                for f in files:
                    f.close()
                received = [bytearray() for _ in ours]
                timed_out = not _wait(proc, stdin.encode(), limits.wall_seconds, ours, received, limits)
                _kill_all(proc, None if use_bwrap else uid, _sandbox_init(info) if info else None)
                _drain(ours, received, limits)
                return SandboxResult(None if timed_out else proc.returncode, _read_capped(out, limits),
                                     _read_capped(err, limits), timed_out, "bubblewrap" if use_bwrap else "limits only",
                                     [bytes(r) for r in received], ("timeout",) * timed_out + cgroup.blocked())
        finally:
            for f in files + ours + ([info] if info else []):
                f.close()
            cgroup.remove()
            if workdir:
                _remove_tree(workdir)
                if uid is not None:
                    _remove_owned(uid)

def isolation() -> Isolation:
    """The isolation a fresh ``Sandbox`` gets here (probed now): for reports (``omnigym list``)."""
    return Sandbox().isolation()


def _wait(proc: subprocess.Popen, stdin: bytes, seconds: float, channels=(), received=(),
          limits: SandboxLimits | None = None) -> bool:
    """Feed stdin, read the channels as they fill (so a writer never blocks on a full socket)
    and wait for the exit, at most ``seconds``; True if it exited. (A pidfd wakes us at the
    exit itself: ``Popen.wait(timeout)`` polls with sleeps.)"""
    import time

    if stdin:
        threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
    pidfd = os.pidfd_open(proc.pid)
    deadline = time.monotonic() + seconds
    poller = select.poll()  # not select.select: a trainer's descriptors may number past 1024
    for fd in [pidfd] + [c.fileno() for c in channels]:
        poller.register(fd, select.POLLIN)
    kept = dict(zip(channels, received))
    exited = False
    try:
        while not exited:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = {fd for fd, _ in poller.poll(left * 1000)}
            exited = pidfd in ready
            waiting = [c for c in kept if c.fileno() in ready]
            for ended in _drain(waiting, [kept[c] for c in waiting], limits):
                poller.unregister(ended.fileno())
                del kept[ended]
    finally:
        os.close(pidfd)
    if exited:
        proc.wait()
    return exited


def _drain(channels, received, limits) -> list:
    """Read what is waiting on each channel, keeping up to ``max_output_bytes`` (the rest is
    read and dropped). Returns the channels whose writers have all gone."""
    ended = []
    for channel, kept in zip(channels, received):
        while True:
            try:
                chunk = channel.recv(1 << 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                ended.append(channel)
                break
            kept += chunk[:max(0, limits.max_output_bytes - len(kept))]
    return ended


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:  # the program closed stdin or ended
        pass


def _sandbox_init(info) -> int | None:
    import json

    info.seek(0)
    try:
        return int(json.loads(info.read(4096) or b"{}").get("child-pid", 0)) or None
    except (ValueError, TypeError, AttributeError):
        return None


def _kill_all(proc: subprocess.Popen, uid: int | None, sandbox_init: int | None) -> None:
    """With bwrap, kill the first process of its PID namespace: the kernel then kills every
    other one and reaps them all before bwrap sees it exit, so when ``proc`` is reaped
    nothing of the sandbox is left (nor counts against the next one's process limit).
    Without bwrap the process group goes, and as root every process of the sandbox's
    ``uid``, wherever it forked to."""
    if sandbox_init is not None and proc.poll() is None:
        try:
            os.kill(sandbox_init, signal.SIGKILL)
            proc.wait(timeout=KILL_MARGIN_SECONDS)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid is not None:
        # kill(-1) from a process with the sandbox's uid reaches exactly the sandbox's processes.
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    try:
        proc.wait(timeout=KILL_MARGIN_SECONDS)
    except subprocess.TimeoutExpired:
        pass


def _read_capped(file, limits: SandboxLimits) -> str:
    file.seek(0)
    return file.read(limits.max_output_bytes).decode("utf-8", errors="replace")


SHARED_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
"""world-writable: without bubblewrap a program's files there outlive it, for the next to run"""


def _remove_owned(uid: int) -> None:
    """Remove what the sandbox's (fresh, now dead) uid left at the top of the shared temp dirs:
    it can write nowhere deeper but in what it made there."""
    for parent in SHARED_TEMP_DIRS:
        try:
            entries = list(os.scandir(parent))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
            except OSError:
                pass


def _remove_tree(path: str) -> None:
    """Remove the fallback's working directory, whatever the program left in it (links are
    removed, never followed; a tree deeper than Python's recursion limit goes to ``rm -rf``)."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        pass
    if os.path.lexists(path):
        try:
            subprocess.run(["rm", "-rf", "--one-file-system", path], check=False, timeout=KILL_MARGIN_SECONDS)
        except subprocess.TimeoutExpired:
            pass
