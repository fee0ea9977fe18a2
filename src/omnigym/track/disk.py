"""What a failed write says: ``DiskFault``, one line naming the file, for the errors a user fixes
outside omnigym (``WRITE_FAULTS``: a full disk, a quota, a failing device). Apart from
``files.py`` so that the run lock, which ``files.py`` uses, can say it too."""

from __future__ import annotations

import errno
import re
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType

from omnigym.errors import OmnigymError

WRITE_FAULTS = MappingProxyType({errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                                 errno.EIO: "input/output error", errno.EFBIG: "file too large (a file size limit)",
                                 errno.EROFS: "the file system is read-only"})
"""The errors of a write that the user fixes outside omnigym (free space, raise a quota, fix
the disk); any other OSError is a bug and keeps its traceback."""


class DiskFault(OmnigymError):
    """A file of the run could not be written; ``path`` names it, ``then`` says what to do once
    there is space again (``Run`` says it from where the run stands: resume, or start again)."""

    def __init__(self, path, reason: str, then: str = "run the command again"):
        super().__init__(f"cannot write {path}: {reason}; free some space, then {then}")
        self.path, self.reason = Path(path), reason

    def then(self, then: str) -> DiskFault:
        return DiskFault(self.path, self.reason, then)


def as_disk_fault(exc: BaseException, path) -> DiskFault | None:
    """``exc`` as the one line of a failed write of ``path``, or None when it is no such failure.
    torch.save reports a failed write as a RuntimeError ("unexpected pos", "file write failed")
    with the errno lost: callers that catch one pass the OSError their file saw instead.
    safetensors (Rust) raises a ``SafetensorError`` whose text ends in Rust's "(os error 28)"."""
    if isinstance(exc, DiskFault):
        return exc
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and isinstance(exc, Exception):
        found = re.search(r"\(os error (\d+)\)", str(exc))
        code = int(found.group(1)) if found else None
    if code in WRITE_FAULTS:
        return DiskFault(path, f"{WRITE_FAULTS[code]} ({errno.errorcode[code]})")
    return None


@contextmanager
def write_fault(path):
    """Inside the block, a failed write (``WRITE_FAULTS``) raises a ``DiskFault`` naming ``path``."""
    try:
        yield
    except Exception as exc:
        fault = as_disk_fault(exc, path)
        if fault is None:
            raise
        raise fault from None
