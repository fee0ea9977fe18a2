"""Progress a person can see: a live bar (rich) on a terminal, and elsewhere (CI, nohup,
a notebook's captured output) a plain line every ``line_every`` seconds."""

from __future__ import annotations

import math
import sys
import time


class ProgressBar:
    def __init__(self, total: int, description: str, start: int = 0, enabled: bool = True, line_every: float = 30.0):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self.bar = enabled and console.is_terminal
        self.lines = enabled and not console.is_terminal
        self.total, self.description, self.line_every = total, description, line_every
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeRemainingColumn(), TextColumn("{task.fields[stats]}"),
                                  console=console, disable=not self.bar, transient=False)
        self._task = self._progress.add_task(description, total=total, completed=start, stats="")
        self._last = 0.0
        self._completed, self._stats = start, {}
        self._printed: tuple[int, str] | None = None
        """the step and figures of the last line printed: ``close`` does not print them again (only its
        total would differ: an on-policy run counts fewer steps than its rollouts stepped, by the autoresets)"""
        self._start, self._last_line = time.monotonic(), time.monotonic()
        if self.bar:
            self._progress.start()

    def update(self, completed: int, **stats) -> None:
        """``stats`` that are None or NaN are not measured yet (an accuracy before the first
        evaluation): the last measured value stays on the line, and none is shown before it."""
        now = time.monotonic()
        self._completed = completed
        self._stats.update({k: v for k, v in stats.items() if v is not None and not (isinstance(v, float) and math.isnan(v))})
        if self.lines and now - self._last_line >= self.line_every:
            self._last_line = now
            self._print_line(now)
        if not self.bar or now - self._last < 0.2:
            return
        self._last = now
        self._progress.update(self._task, completed=completed, stats=self._text())

    def close(self, finished: bool = True) -> None:
        """The work is done: the last step counted is the total (a stage that reached its
        target early has nothing still to come), and the line says so at 100%, unless the last
        line printed already showed this step with these figures (once is enough). ``finished``
        False (a stop or an error): the line stays at the step reached, of the total it had."""
        if finished:
            self.total = max(self._completed, 1)
        if self.lines and self._printed != (self._completed, self._text()):  # the last update's line said this
            self._print_line(time.monotonic())
        if self.bar:
            self._progress.update(self._task, total=self.total, completed=self._completed, stats=self._text())
            self._progress.stop()

    def _text(self) -> str:
        return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self._stats.items())

    def _print_line(self, now: float) -> None:
        self._printed = (self._completed, self._text())
        print(f"{self.description}: {self._completed}/{self.total} ({100 * self._completed / max(self.total, 1):.0f}%) "
              f"{self._text()}  [{now - self._start:.0f} s]", file=sys.stderr, flush=True)


class Clock:
    """Steps per second since the (re)start of this process."""

    def __init__(self, start_step: int):
        self.start_step, self.start_time = start_step, time.perf_counter()

    def sps(self, step: int) -> float:
        return (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)


class Laps:
    """Wall-clock seconds of a step's phases, as ``time/<phase>`` metrics: ``lap(name)`` ends the
    phase that began at the previous lap (or at construction)."""

    def __init__(self):
        self.times: dict[str, float] = {}
        self._started = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times[f"time/{name}"] = now - self._started
        self._started = now


def whole_rollouts(total_timesteps: int, num_envs: int, num_steps: int) -> int:
    """An on-policy run's number of rollouts: ``--total-timesteps`` rounded down to whole ones, at
    least one, as CleanRL counts its iterations. Where that is not the total, the run's closing
    line says what was trained and why (``track.episodes.steps_trained``): a line at the start
    too was one more line on every default run whose total is not a multiple of its batch."""
    return max(total_timesteps // (num_envs * num_steps), 1)


def crossed_multiple(step: int, previous_step: int, every: int) -> bool:
    """Did the step count pass a multiple of ``every`` (0 means never) since ``previous_step``?
    A previous step below 0 counts as 0: PPO's first update counts fewer env steps than its
    batch (autoreset steps are not steps), and -10 // every is -1, which checkpointed every
    run at its first update whatever --checkpoint-every said."""
    return every > 0 and step // every > max(previous_step, 0) // every
