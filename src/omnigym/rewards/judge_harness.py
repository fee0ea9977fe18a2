"""The judge that runs inside the sandbox: standard library only, never imported by the
trainer (``code.py`` sends this file's text as ``python -c``).

Messages are Python literals read with ``ast.literal_eval``, which builds plain objects and
runs no code (``json`` would cost its import of ``re``, 9 ms a program).

Two processes, so that nothing the candidate's code does can write the verdict:

- **the judge** (this process: PID 1 of the sandbox, so its siblings cannot signal it, and
  non-dumpable, so they cannot read its memory or descriptors through ``/proc`` or
  ptrace) forks the candidate first, while it still knows nothing; only then reads the
  tests and the verdict descriptor, which the trainer handed to it alone;
- **the candidate** (the fork) closes those descriptors before running a line of the
  model's code, runs that code as its own module ``solution`` (so ``if __name__ ==
  "__main__"`` blocks stay quiet and it shadows none of the judge's names), then answers
  calls over a pipe: the function named, with arguments the judge sent, and the result
  sent back as plain data.

The judge runs the tests itself, with stubs in place of the candidate's functions. A
result comes back as tagged plain data of exact built-in types (None, bool, int, float,
complex, str, bytes, list, tuple, dict, set, frozenset) that the judge decodes into new
objects of its own, so no ``__eq__``, ``__hash__`` or ``__str__`` of the candidate's ever
runs where the tests are decided; an object that is not plain data fails the call. The
verdict is one line per test, written by the judge to a descriptor the candidate never
had: printing, exiting early, excepthook and atexit tricks reach only stdout.

The candidate's process is the program's to rewrite (it can replace any function of this
file there, or write to its pipe directly), so the judge trusts nothing it sends. It names
no names up front: the candidate lists its globals, and the judge takes only those the
tests read and define nowhere, which neither the task's own code nor Python's builtins
define (then asks for the values of those that are constants). It reads each reply
strictly; one it cannot read fails the test it came in and every later one, whatever the
test catches. It ignores every signal it can be sent.
"""

import ast
import builtins
import ctypes
import os
import signal
import struct
import sys

PR_SET_DUMPABLE = 4
MAX_MESSAGE = 1 << 26
MAX_DEPTH = 200
PLAIN = "only None, bool, int, float, complex, str, bytes and lists, tuples, dicts and sets of them"


class CandidateFailed(Exception):
    """The candidate's call raised something that is not a built-in exception."""


class BrokenReply(Exception):
    """The candidate sent what the judge cannot read, or ended. Raised in the test, but the
    judge fails the test whatever it caught (``except Exception`` must not make it a pass)."""


NOT_RAISED = ("StopIteration", "StopAsyncIteration")
"""raised by the candidate, these would end the test's loop or ``map`` early, not fail it"""


# -- plain data, both ways -------------------------------------------------------------

def encode(value, depth=0):
    if depth > MAX_DEPTH:
        raise ValueError("nested too deep")
    kind = type(value)
    if value is None:
        return ["N"]
    if kind is bool:
        return ["b", value]
    if kind is int:
        return ["i", str(value)]
    if kind is float:
        return ["f", repr(value)]
    if kind is complex:
        return ["c", repr(value.real), repr(value.imag)]
    if kind is str:
        return ["s", value]
    if kind in (bytes, bytearray):
        return ["y" if kind is bytes else "Y", value.hex()]
    if kind in (list, tuple, set, frozenset):
        tag = {list: "l", tuple: "t", set: "S", frozenset: "F"}[kind]
        return [tag, [encode(item, depth + 1) for item in value]]
    if kind is dict:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    raise TypeError(f"a {kind.__name__} is not plain data ({PLAIN})")


def decode(message, depth=0):
    if depth > MAX_DEPTH or type(message) is not list or not message or type(message[0]) is not str:
        raise ValueError("malformed value")
    tag, rest = message[0], message[1:]
    if tag == "N":
        return None
    if tag == "b" and rest and type(rest[0]) is bool:
        return rest[0]
    if tag in "ifsyY" and len(tag) == 1 and rest and type(rest[0]) is str:
        return {"i": int, "f": float, "s": str, "y": bytes.fromhex, "Y": lambda h: bytearray.fromhex(h)}[tag](rest[0])
    if tag == "c" and len(rest) == 2:
        return complex(float(rest[0]), float(rest[1]))
    if tag in ("l", "t", "S", "F") and rest and type(rest[0]) is list:
        items = [decode(item, depth + 1) for item in rest[0]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and rest and type(rest[0]) is list:
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in rest[0]}
    raise ValueError(f"malformed value tagged {tag!r}")


def send(fd, obj):
    data = repr(obj).encode()
    data = struct.pack("<I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def receive(fd):
    head = read_exactly(fd, 4)
    size = struct.unpack("<I", head)[0]
    if size > MAX_MESSAGE:
        raise ValueError("message too large")
    return ast.literal_eval(read_exactly(fd, size).decode())


def read_exactly(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the candidate's process ended")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# -- the candidate's side --------------------------------------------------------------

def serve_candidate(code_fd, requests, replies):
    source = read_all(code_fd)
    os.close(code_fd)
    for stream in (sys.stdout, sys.stderr):  # the judge's exit ends this process unflushed
        stream.reconfigure(line_buffering=True)
    module = type(sys)("solution")
    sys.modules["solution"] = module
    try:
        exec(compile(source, "solution.py", "exec"), module.__dict__)
        loaded = ["ok"]
    except BaseException as exc:  # the judge hears of it; every call then fails
        loaded = ["raise", type(exc).__name__, str(exc)[:500]]
    while True:
        try:
            request = receive(requests)
        except EOFError:
            os._exit(0)
        if loaded[0] != "ok":
            send(replies, loaded)
        elif request[0] == "lookup":
            send(replies, ["ok", lookup(module)])
        elif request[0] == "value":
            send(replies, value_of(module, request[1]))
        else:
            send(replies, call(module, *request[1:]))


def lookup(module):
    """The kind of each of the program's globals, ``callable`` or ``value``: the judge names
    none, so the program does not learn which names the tests read (values are sent only
    when the judge asks for one, which costs nothing for a large table the tests never read)."""
    return {name: ["callable" if callable(value) else "value"]
            for name, value in module.__dict__.items() if not name.startswith("__")}


def value_of(module, name):
    try:
        return ["ok", encode(module.__dict__[name])]
    except BaseException as exc:
        return ["raise", type(exc).__name__, str(exc)[:500]]


def call(module, name, args, kwargs):
    try:
        args = [decode(a) for a in args]
        result = module.__dict__[name](*args, **{k: decode(v) for k, v in kwargs.items()})
        return ["ok", encode(result), [encode(a) if type(a) in (list, dict, set, bytearray) else None for a in args]]
    except BaseException as exc:
        return ["raise", type(exc).__name__, str(exc)[:500]]


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks).decode("utf-8", errors="replace")
        chunks.append(chunk)


# -- the judge's side ------------------------------------------------------------------

class Candidate:
    def __init__(self, requests, replies):
        self.requests, self.replies = requests, replies
        self.broken = False
        """set when a reply could not be read: the pipe is out of step, every later call fails"""

    def ask(self, *request):
        if self.broken:
            raise BrokenReply("an earlier reply could not be read")
        try:
            send(self.requests, list(request))
            reply = receive(self.replies)
            if type(reply) is not list or not reply or reply[0] not in ("ok", "raise"):
                raise ValueError("not a reply")
            if reply[0] == "raise" and not (len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str):
                raise ValueError("not a reply")
        except BaseException as exc:  # unreadable, too deep, too large, or the candidate ended
            self.broken = True
            raise BrokenReply(type(exc).__name__) from None
        if reply[0] == "raise":
            raise candidate_exception(reply[1], reply[2])
        return reply

    def stub(self, name):
        def candidate_function(*args, **kwargs):
            reply = self.ask("call", name, [encode(a) for a in args], {k: encode(v) for k, v in kwargs.items()})
            try:
                if len(reply) != 3 or type(reply[2]) is not list:
                    raise ValueError("not a call's reply")
                result = decode(reply[1])
                for original, after in zip(args, reply[2]):
                    # a list, dict, set or bytearray argument the candidate changed in place
                    if after is not None and type(original) in (list, dict, set, bytearray):
                        new = decode(after)
                        if type(new) is not type(original):
                            raise ValueError("an argument came back as another type")
                        if type(original) in (list, bytearray):
                            original[:] = new
                        else:
                            original.clear()
                            original.update(new)
            except BaseException as exc:
                self.broken = True
                raise BrokenReply(type(exc).__name__) from None
            return result

        candidate_function.__name__ = candidate_function.__qualname__ = name
        return candidate_function

    def provide(self, namespace, sources, required=()):
        """Put the candidate's definitions of the names the tests need into ``namespace``:
        ``required`` (the entry point, which may be named like a builtin, ``max``) and the
        names the tests read but define nowhere, which neither the task's own code (already
        in ``namespace``) nor Python's builtins define. The candidate's reply lists all its
        globals; only those names are taken from it, whatever else it holds. Asked even when
        there are none: a program that does not load passes nothing."""
        wanted = needed_names(sources) - set(namespace) - set(dir(builtins)) | set(required)
        reply = self.ask("lookup")
        offered = reply[1] if len(reply) == 2 and type(reply[1]) is dict else {}
        for name in sorted(wanted):
            found = offered.get(name)
            if found == ["callable"]:
                namespace[name] = self.stub(name)
            elif found == ["value"]:  # a constant the tests read (LIMIT): its value, as plain data
                value = self.ask("value", name)
                try:
                    namespace[name] = decode(value[1])
                except BaseException as exc:
                    self.broken = True
                    raise BrokenReply(type(exc).__name__) from None


def candidate_exception(name, message):
    """The judge's own instance of the built-in exception the candidate's call raised."""
    exception = getattr(builtins, name, None)
    if isinstance(exception, type) and issubclass(exception, Exception) and name not in NOT_RAISED:
        try:
            return exception(message)
        except Exception:  # one that needs other arguments (UnicodeDecodeError)
            pass
    return CandidateFailed(f"{name}: {message}")


def needed_names(sources):
    """Names the tests read and bind nowhere (no assignment, def, parameter, import, loop or
    except target), dunders aside: a name the tests bind is theirs even where it is read
    before (a test that failed early, a loop that did not run)."""
    read, bound = set(), set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.alias):
                bound.add(node.asname or node.name.split(".")[0])
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
    return {name for name in read - bound if not name.startswith("__")}


def judge(job, candidate, verdict_fd):
    namespace = {"__name__": "judge"}
    if job.get("prelude"):  # the task's own code (HumanEval's prompt): its helpers are trusted
        try:
            exec(compile(job["prelude"], "prompt.py", "exec"), namespace)
        except Exception:
            namespace = {"__name__": "judge"}
    if "check" in job:
        tests = [job["check"] + f"\n\ncheck({job['entry_point']})\n"]
        namespace.pop(job["entry_point"], None)
        sources = tests
    else:
        tests, sources = job["tests"], job["tests"]
    try:
        candidate.provide(namespace, sources, [job["entry_point"]] if "check" in job else [])
    except Exception as exc:  # the type only: a message can carry the candidate's text
        os.write(verdict_fd, f"error {type(exc).__name__}\n".encode())
        return
    for index, test in enumerate(tests):
        try:
            exec(compile(test, f"test_{index}", "exec"), namespace)
            line = f"pass {index}\n"
        except BaseException as exc:
            name = type(exc).__name__
            line = f"fail {index} {name if name.isidentifier() and name.isascii() else 'Exception'}\n"
        if candidate.broken:  # whatever the test caught: the reply was not the program's answer
            line = f"fail {index} BrokenReply\n"
        os.write(verdict_fd, line.encode())
    os.write(verdict_fd, b"done\n")


def ignore_signals():
    """Ignore every signal that can be ignored, before the fork (so there is no moment when
    the candidate exists and the judge still has Python's SIGINT handler): as the sandbox's
    PID 1 the judge then gets no signal from inside it (the kernel drops those sent to a
    PID 1 without a handler, SIGKILL and SIGSTOP included), and without bubblewrap none but
    those two. Returns the handlers to put back in the candidate."""
    before = {}
    for number in signal.valid_signals():
        if number in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue  # the first two cannot be ignored; SIGCHLD does nothing by default already
        try:
            before[number] = signal.signal(number, signal.SIG_IGN)
        except (OSError, ValueError, TypeError):  # glibc's reserved real-time signals
            pass
    return before


def main():
    job_fd, code_fd, verdict_fd = (int(a) for a in sys.argv[1:4])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    handlers = ignore_signals()
    packets = packets_sent()  # before the candidate exists
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        for number, handler in handlers.items():  # the program runs as under a plain python
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        for fd in (job_fd, verdict_fd, requests_write, replies_read):
            os.close(fd)
        serve_candidate(code_fd, requests_read, replies_write)
    for fd in (code_fd, requests_read, replies_write):
        os.close(fd)
    job = ast.literal_eval(read_all(job_fd))
    os.close(job_fd)
    judge(job, Candidate(requests_write, replies_read), verdict_fd)
    os.close(requests_write)  # the candidate reads the end of its calls and exits
    report_blocked(pid, packets, verdict_fd)
    os._exit(0)


LIMIT_SIGNALS = ((signal.SIGXCPU, "cpu"), (signal.SIGXFSZ, "file size"), (signal.SIGKILL, "killed"))
"""how the kernel ends a process at a limit: CPU seconds, file size, memory (the OOM killer)"""


def packets_sent():
    """IP packets this network namespace sent or refused for want of a route (v4 and v6), from
    the kernel's counters; None outside bubblewrap, where the namespace is the host's."""
    if os.getpid() != 1:
        return None
    total = 0
    try:
        with open("/proc/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Ip:")]
        names, values = rows[0], rows[1]
        total += sum(int(values[names.index(key)]) for key in ("OutRequests", "OutNoRoutes"))
        with open("/proc/net/snmp6") as f:
            total += sum(int(line.split()[1]) for line in f if line.split()[0] in ("Ip6OutRequests", "Ip6OutNoRoutes"))
    except (OSError, ValueError, IndexError):
        pass
    return total


def report_blocked(pid, packets, verdict_fd):
    """After the verdict, one ``blocked KIND`` line for what the sandbox stopped the candidate
    doing, as the kernel saw it (the candidate can add to these counts only by trying, and take
    from them never): ``network`` (a packet sent or refused in the sandbox's own network namespace,
    which has nothing to reach), ``cpu``/``file size``/``killed`` (the candidate's process ended by
    a limit's signal). The candidate exits as soon as its calls end (or is dead already); one that
    does not within a second is not waited for (the sandbox ends with the judge)."""
    import time

    status, deadline = 0, time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        if done:
            break
        status = 0
        time.sleep(0.002)
    for number, kind in LIMIT_SIGNALS:
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == number:
            os.write(verdict_fd, f"blocked {kind}\n".encode())
    after = packets_sent()
    if packets is not None and after is not None and after > packets:
        os.write(verdict_fd, b"blocked network\n")


if __name__ == "__main__":
    main()
