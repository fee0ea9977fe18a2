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
"""

import ast
import builtins
import ctypes
import os
import struct
import sys

PR_SET_DUMPABLE = 4
MAX_MESSAGE = 1 << 26
MAX_DEPTH = 200
PLAIN = "only None, bool, int, float, complex, str, bytes and lists, tuples, dicts and sets of them"


class CandidateFailed(Exception):
    """The candidate's call raised something that is not a built-in exception."""


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
            send(replies, ["ok", lookup(module, request[1])])
        else:
            send(replies, call(module, *request[1:]))


def lookup(module, names):
    found = {}
    for name in names:
        value = module.__dict__.get(name)
        if callable(value):
            found[name] = ["callable"]
        elif name in module.__dict__:
            try:
                found[name] = ["value", encode(value)]
            except (TypeError, ValueError):
                pass
    return found


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

    def ask(self, *request):
        send(self.requests, list(request))
        reply = receive(self.replies)
        if reply[0] == "raise":
            exception = getattr(builtins, str(reply[1]), None)
            if not (isinstance(exception, type) and issubclass(exception, Exception)):
                exception = CandidateFailed
            raise exception(f"{reply[1]}: {reply[2]}" if exception is CandidateFailed else reply[2])
        return reply

    def stub(self, name):
        def candidate_function(*args, **kwargs):
            reply = self.ask("call", name, [encode(a) for a in args], {k: encode(v) for k, v in kwargs.items()})
            for original, after in zip(args, reply[2]):
                if after is not None:  # a list, dict or set argument the candidate changed in place
                    new = decode(after)
                    if type(new) is type(original):
                        if type(original) is list or type(original) is bytearray:
                            original[:] = new
                        else:
                            original.clear()
                            original.update(new)
            return decode(reply[1])

        candidate_function.__name__ = candidate_function.__qualname__ = name
        return candidate_function

    def provide(self, namespace, sources, required=()):
        """Put the candidate's definitions of the names the tests use (and neither they nor
        the task's own code define, nor Python's built-ins) into ``namespace``. Asked even
        when there are none: a program that does not load (raises, loops, dies) passes
        nothing, not even a test that never calls it."""
        wanted = set()
        for source in sources:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    wanted.add(node.id)
        wanted = (wanted - set(namespace) - set(dir(builtins))) | set(required)  # an entry point may be `max`
        for name, found in self.ask("lookup", sorted(wanted))[1].items():
            namespace[name] = self.stub(name) if found[0] == "callable" else decode(found[1])


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
        os._exit(0)
    for index, test in enumerate(tests):
        try:
            exec(compile(test, f"test_{index}", "exec"), namespace)
            line = f"pass {index}\n"
        except BaseException as exc:
            name = type(exc).__name__
            line = f"fail {index} {name if name.isidentifier() and name.isascii() else 'Exception'}\n"
        os.write(verdict_fd, line.encode())
    os.write(verdict_fd, b"done\n")


def main():
    job_fd, code_fd, verdict_fd = (int(a) for a in sys.argv[1:4])
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    if os.fork() == 0:
        for fd in (job_fd, verdict_fd, requests_write, replies_read):
            os.close(fd)
        serve_candidate(code_fd, requests_read, replies_write)
    for fd in (code_fd, requests_read, replies_write):
        os.close(fd)
    job = ast.literal_eval(read_all(job_fd))
    os.close(job_fd)
    judge(job, Candidate(requests_write, replies_read), verdict_fd)
    os._exit(0)


if __name__ == "__main__":
    main()
