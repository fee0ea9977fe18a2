"""A live progress bar (rich) with the numbers that matter; silent when not on a terminal."""

from __future__ import annotations

import time


class ProgressBar:
    def __init__(self, total: int, description: str, start: int = 0, enabled: bool = True):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self.enabled = enabled and console.is_terminal
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
                                  console=console, disable=not self.enabled, transient=False)
        self._task = self._progress.add_task(description, total=total, completed=start, stats="")
        self._last = 0.0
        if self.enabled:
            self._progress.start()

    def update(self, completed: int, **stats) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.2:
            return
        self._last = now
        text = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items())
        self._progress.update(self._task, completed=completed, stats=text)

    def close(self) -> None:
        if self.enabled:
            self._progress.stop()


class Clock:
    """Steps per second since the (re)start of this process."""

    def __init__(self, start_step: int):
        self.start_step, self.start_time = start_step, time.perf_counter()

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)


def crossed_multiple(step: int, previous_step: int, every: int) -> bool:
    """Did the step count pass a multiple of ``every`` (0 means never) since ``previous_step``?"""
    return every > 0 and step // every > previous_step // every
