"""Children that a test stops with a signal start as a terminal would start them.

A shell that runs a command in the background without job control (``make test &`` in a
script, a CI runner) starts it with SIGINT ignored, and ``nohup`` starts it with SIGHUP
ignored; children inherit that. Python installs its KeyboardInterrupt handler only where
SIGINT is not ignored, and ``omnigym`` leaves an ignored SIGHUP or SIGTERM ignored (a user who
runs ``nohup omnigym train ...`` asked for that). So a test that sends Ctrl-C or SIGHUP to a
child inherited the runner's choice: the child trained on to the end. Such children get the
default dispositions back before they start, the state a person's terminal gives them."""

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
STACKS_SIGNAL = signal.SIGUSR2
"""what a forked child a test gave up on is sent: it writes its threads' stacks (omnigym uses no SIGUSR2)"""


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a child a test will signal: the stop signals at their defaults."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


# --- forked children: the imports paid once --------------------------------------------------
#
# A fault test starts ``omnigym train`` a hundred times, and every fresh interpreter spends
# 3-7 CPU-seconds importing torch and transformers before the run begins: on the suite's two
# cores that was minutes of imports. A *zygote* (the idea of multiprocessing's forkserver) imports
# them once, then forks one child per command. A child is a process of its own, with its own
# pid, environment, working directory, standard streams, signal dispositions (the defaults, as
# above) and exit status, and runs the same code as ``python -c CODE ARGS`` from there on; only
# the heavy third-party modules are already in memory. omnigym itself is imported by the child,
# after whatever the test's prelude patches. Tests about what happens *during* those imports
# (a Ctrl-C while torch loads) start real interpreters with ``subprocess`` instead.

import json
import os
import subprocess
import sys
import threading
import time

PRELOADED = ("numpy", "torch", "transformers", "gymnasium", "safetensors.torch", "tokenizers")

ZYGOTE = r"""
import faulthandler, json, os, select, signal, sys, traceback
for name in PRELOADED:
    __import__(name)
import transformers
# transformers imports lazily: touch what every language run loads, so the children find it imported
transformers.LlamaForCausalLM, transformers.PreTrainedTokenizerFast, transformers.PreTrainedTokenizerBase


def run_child(request):
    code = 1
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        # a child a test gave up waiting for writes where every thread stands to its stderr
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
        sys.argv = ["-c", *request["argv"]]
        try:
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
            code = 0
        except SystemExit as stop:  # what the interpreter does with it at the end of a script
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        import threading
        threading._shutdown()  # as at a normal exit: non-daemon threads finish first, then atexit
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def say(message):
    os.write(1, (json.dumps(message) + "\n").encode())


pending = b""
while True:
    readable, _, _ = select.select([0], [], [], 0.02)
    if readable:
        chunk = os.read(0, 65536)
        if not chunk:  # the test process has gone: so do we (children left run on, as orphans would)
            break
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            pid = os.fork()
            if pid == 0:
                run_child(json.loads(line))
            say({"started": pid})
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        say({"ended": pid, "returncode": os.waitstatus_to_exitcode(status)})
"""


class _Zygote:
    def __init__(self, env: dict):
        prelude = (f"PRELOADED = {PRELOADED!r}\nimport signal\nSTOP_SIGNALS = {[int(s) for s in STOP_SIGNALS]!r}\n"
                   f"STACKS_SIGNAL = {int(STACKS_SIGNAL)}\n")
        self.process = subprocess.Popen([sys.executable, "-c", prelude + ZYGOTE], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, preexec_fn=as_from_a_terminal)
        self.lock, self.changed = threading.Lock(), threading.Condition()
        self.started: list[int] = []
        self.ended: dict[int, int] = {}
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            with self.changed:
                if "started" in message:
                    self.started.append(message["started"])
                else:
                    self.ended[message["ended"]] = message["returncode"]
                self.changed.notify_all()
        with self.changed:  # the zygote died: nothing more will come
            self.started.append(-1)
            self.changed.notify_all()

    def spawn(self, request: dict) -> int:
        with self.lock:  # one request in flight, so the next "started" is ours
            with self.changed:
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.flush()
                self.changed.wait_for(lambda: self.started, timeout=60)
                if not self.started or self.started[0] == -1:
                    raise RuntimeError(f"the zygote did not start a child (exit {self.process.poll()})")
                return self.started.pop(0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.ended, timeout=timeout)
            return self.ended.get(pid)


_zygotes: dict[str, _Zygote] = {}
_outputs: list[str] = []


def _output_dir() -> str:
    """Where the children's stdout and stderr go: a folder of this test process's own."""
    if not _outputs:
        import tempfile

        _outputs.append(tempfile.mkdtemp(prefix="omnigym-forked-"))
    return _outputs[0]


class _Output:
    def __init__(self, path: str):
        self.path = path

    def read(self) -> str:
        with open(self.path, errors="replace") as file:
            return file.read()


class ForkedChild:
    """A child of the zygote, with the part of ``subprocess.Popen``'s interface the tests use:
    ``pid``, ``returncode`` (negative: the signal that ended it), ``poll``, ``wait``,
    ``send_signal``, ``kill``, ``communicate`` (its stdout and stderr as text) and ``stderr.read``."""

    def __init__(self, code: str, argv: list[str], env: dict, output_dir: str | None = None):
        key = json.dumps(sorted((k, v) for k, v in env.items() if k in ("PYTHONPATH", "OMP_NUM_THREADS",
                                                                         "HF_HUB_OFFLINE")))
        if key not in _zygotes or _zygotes[key].process.poll() is not None:
            _zygotes[key] = _Zygote(env)
        self._zygote = _zygotes[key]
        output_dir = output_dir or _output_dir()
        self.stdout, self.stderr = (_Output(os.path.join(output_dir, f"{os.getpid()}-{id(self)}.{name}"))
                                    for name in ("out", "err"))
        self.pid = self._zygote.spawn({"code": code, "argv": argv, "env": env, "cwd": os.getcwd(),
                                       "stdout": self.stdout.path, "stderr": self.stderr.path})
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._zygote.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}{self._stacks()}", timeout)
        return self.returncode

    def _stacks(self) -> str:
        """Where a child that has not ended stands (its threads' stacks, which it writes to its
        stderr on ``STACKS_SIGNAL``), and the rest of its stderr: what a hang in CI leaves to read."""
        try:
            os.kill(self.pid, STACKS_SIGNAL)
        except ProcessLookupError:
            return ""
        time.sleep(2)
        return "; its stderr, ending with its stacks:\n" + self.stderr.read()[-6000:]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()


def run_forked(code: str, argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)``, forked."""
    child = ForkedChild(code, argv, env)
    try:
        out, err = child.communicate(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise
    return subprocess.CompletedProcess([sys.executable, "-c", code, *argv], child.returncode, out, err)
