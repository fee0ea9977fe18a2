"""Stopping a run part-way, as Ctrl-C would, for the resume tests."""

import pytest

from omnigym.track.run import Run


def interrupt_at_log(monkeypatch, start, n: int) -> None:
    """``start()`` stopped by Ctrl-C right after its ``n``-th metrics line is written (the
    resume tests then check that ``--resume`` redoes the lost work to the same numbers)."""
    original_log, calls = Run.log, {"n": 0}

    def interrupting_log(self, step, values):
        original_log(self, step, values)
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(Run, "log", interrupting_log)
    with pytest.raises(KeyboardInterrupt):
        start()
    monkeypatch.setattr(Run, "log", original_log)
