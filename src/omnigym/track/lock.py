"""One process per run directory: an exclusive lock on a file inside it.

Two processes writing one run (two ``--resume`` at once, a new run started on a directory a
run is training in) interleave their metrics and checkpoints. The lock is ``flock`` on
``RUN/.omnigym.lock``: the kernel releases it when its holder's last descriptor closes, so a
process killed by SIGKILL (or the OOM killer) never leaves it stuck; the file it leaves behind
is taken over by the next process. The holder writes its pid and command into the file, so
that a refused process can say who holds the run.

What crosses this module: a directory goes in; ``acquire`` takes the lock (creating the
directory when asked) or raises one ``OmnigymError`` line naming the holder; ``release``
removes the lock file and the folders ``acquire`` created, if they are empty by then. It knows
nothing about what a run writes.

Making and removing the lock file moves its directory's modification time. A process that
wrote nothing else there (a resume refused after the lock, for a budget already spent) puts
that time back, so a refused start leaves the run as it found it to the nanosecond.
"""

from __future__ import annotations

import errno
import os
import shlex
import sys
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.disk import as_disk_fault

LOCK_NAME = ".omnigym.lock"
"""hidden, and not one of a run's files: it never makes a directory look like a run"""


def holder_of(lock_file: Path) -> str:
    """What the holder wrote into ``lock_file``: 'pid N: COMMAND', or less when it is unreadable."""
    try:
        pid, _, command = lock_file.read_text().partition("\n")
    except OSError:
        return "another process"
    if not pid.strip().isdigit():  # the holder is between taking the lock and writing it
        return "another process"
    return f"pid {pid.strip()}: {command.strip()}" if command.strip() else f"pid {pid.strip()}"


def this_command() -> str:
    """The command line of this process, as a person would type it."""
    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("__main__.py", "omnigym"):  # python -m omnigym, or the console script
        argv[0] = "omnigym"
    return shlex.join(argv) if argv else sys.executable


class RunLock:
    """The lock on one run directory; ``acquire`` once, ``release`` any number of times."""

    def __init__(self, run_dir: Path, name: str = LOCK_NAME, what: str | None = None):
        """``name``: the lock file's, in ``run_dir``; ``what``: what the refusal says is in use
        (``run_dir``'s path when None). Another name guards something else in a shared folder:
        ``omnigym collect``'s one dataset id in the datasets folder."""
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / name
        self.what = what or str(self.run_dir)
        self._fd: int | None = None
        self._created: list[Path] = []
        self._found: tuple | None = None
        """the directory as ``acquire`` found it, where it made the lock file in an existing one:
        (its names, its access and modification times, its modification time with the lock made)"""

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, create: bool = False) -> bool:
        """Take the lock, or raise naming its holder. Returns False, holding nothing, where no
        lock can be made (the directory is missing and ``create`` is False, the path is a file,
        the directory is not writable): the caller's own checks say what is wrong then."""
        try:
            import fcntl
        except ImportError:  # not POSIX (Windows): runs are not guarded
            return False
        if create and not self.run_dir.exists():
            self._created = [p for p in [self.run_dir, *self.run_dir.parents] if not p.exists()]
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
            except OSError:
                self._remove_created()
                return False
        while True:
            found = self._look() if not self._created and not self.path.exists() else None
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError:
                self._remove_created()
                return False
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OmnigymError(f"{self.what} is in use by another omnigym process ({holder_of(self.path)}); "
                                   "one process writes it at a time: wait for it to end, or stop it "
                                   "and try again") from None
            # A holder that released between our open and our flock removed the file we opened:
            # a lock on that file guards nothing, so open the path again.
            try:
                current = os.stat(self.path)
                opened = os.fstat(fd)
                same = (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev)
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        try:
            self._found = found and (*found, os.stat(self.run_dir).st_mtime_ns)
        except OSError:
            self._found = None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n{this_command()}\n".encode())
        except OSError as exc:  # a full disk: it was a traceback, and left the lock file and the folder made
            self.release()
            fault = as_disk_fault(exc, self.path)
            if fault is None:
                raise
            raise fault from None
        return True

    def _look(self) -> tuple | None:
        """The directory's names and times, or None where they cannot be read."""
        try:
            names = sorted(os.listdir(self.run_dir))
            st = os.stat(self.run_dir)
        except OSError:
            return None
        return names, (st.st_atime_ns, st.st_mtime_ns)

    def release(self) -> None:
        """Remove the lock file, then let the lock go, and the folders ``acquire`` made if they
        are empty now. Nothing when not held."""
        if self._fd is None:
            return
        found, self._found = self._found, None
        now = self._look() if found else None
        # untouched: the same names (the lock's aside) and no entry made, removed or renamed over since the lock's
        untouched = now is not None and now[0] == sorted([*found[0], self.path.name]) and now[1][1] == found[2]
        try:
            self.path.unlink(missing_ok=True)
            if untouched:
                os.utime(self.run_dir, ns=found[1])
        except OSError:  # a directory made read-only meanwhile: the lock still goes with the descriptor
            pass
        fd, self._fd = self._fd, None  # first: a signal landing after the close must not make a second one
        os.close(fd)
        self._remove_created()

    def _remove_created(self) -> None:
        for folder in self._created:  # innermost first
            try:
                folder.rmdir()
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENAMETOOLONG):  # never made (a name too long), or gone
                    continue
                break  # not empty: a run's files, or another process's lock
        self._created = []
