"""A scheduler's SIGTERM (or a closed terminal's SIGHUP) while a run trains: a checkpoint
first, then the stop.

Raising at the signal, wherever the run is, keeps only the newest checkpoint, and a run that
has not reached its first one (``--checkpoint-every`` is 25,000 env steps for control runs: an
hour of SAC on a CPU) loses everything. So while a run that can save is under way
(``Run.begin`` to ``Run.close``), the first signal only marks a stop as
requested: every training loop asks ``checkpoint_due`` where it decides to checkpoint, which
says yes from then on, and ``Run.save`` raises ``Stopped`` once that checkpoint is on disk.
The CLI then says how to continue, as after any stop with a checkpoint.

A loop may not reach its checkpoint soon (a long evaluation, a generation, a save already
under way): ``OMNIGYM_STOP_GRACE`` seconds (default 10) after the signal the stop comes anyway,
as it did before, keeping the newest checkpoint or putting the directory back. A second signal
stops at once. Schedulers give 30 s or more before SIGKILL (Slurm's KillWait, Kubernetes'
terminationGracePeriodSeconds), so 10 s leaves the save time to finish.

Not deferred: Ctrl-C (a person at the terminal wants it now), a data-parallel run (its processes
would reach the save at different steps and wait on each other in it), and runs outside the
main thread (``omnigym serve``'s, which handles its own shutdown).

A SIGKILL, the OOM killer or a grace too short for the step under way (a 135M model's GRPO step
took 3 minutes here) leaves only the last checkpoint, and ``--checkpoint-every`` counts steps,
whatever a step costs. So ``checkpoint_due`` also says yes once ``--checkpoint-minutes`` have
passed since the run began or last saved: a run loses at most that much work to anything. The
clock runs where stops are deferred (a single process, the CLI's main thread), for the same
reason: every process of a data-parallel run must decide alike, and elapsed time is not alike.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager

from omnigym.track.progress import crossed_multiple

DEFAULT_GRACE_SECONDS = 10.0


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a scheduler, ``timeout``, systemd, a closed terminal): handled as
    Ctrl-C is, so a run without a checkpoint is put back and one with says how to continue."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _State:
    deferring = False
    """a run that can checkpoint is under way in the main thread"""
    requested: int | None = None
    """the signal that asked for a stop, until the stop is raised"""
    previous_alarm = None
    """SIGALRM's handler before the run's: the grace is an interval timer, not a thread, because a
    thread started in a signal handler can wait forever on a lock the interrupted code holds"""
    checkpoint_seconds = 0.0
    """the deferring run's ``--checkpoint-minutes`` in seconds (0: by its step count alone)"""
    last_checkpoint = 0.0
    """``time.monotonic()`` when the deferring run began or last saved"""


_state = _State()


def grace_seconds() -> float:
    try:
        return max(float(os.environ.get("OMNIGYM_STOP_GRACE", DEFAULT_GRACE_SECONDS)), 0.0)
    except ValueError:
        return DEFAULT_GRACE_SECONDS


def on_stop_signal(signum: int, frame) -> None:
    """The handler of SIGTERM and SIGHUP in the CLI's main thread."""
    if _state.deferring and _state.requested is None and grace_seconds() > 0:
        _state.requested = signum
        signal.setitimer(signal.ITIMER_REAL, grace_seconds())  # then _grace_over
        return
    _clear()
    raise Stopped(signum)


def _grace_over(signum: int, frame) -> None:
    stop_if_requested()


def stop_requested() -> bool:
    return _state.requested is not None


def checkpoint_due(step: int, previous_step: int, every: int) -> bool:
    """Is a checkpoint due at ``step``: a multiple of ``every`` crossed since ``previous_step``
    (``crossed_multiple``), a stop requested, or ``--checkpoint-minutes`` passed since the last?"""
    return crossed_multiple(step, previous_step, every) or stop_requested() or _checkpoint_time_passed()


def _checkpoint_time_passed() -> bool:
    return (_state.deferring and _state.checkpoint_seconds > 0
            and time.monotonic() - _state.last_checkpoint >= _state.checkpoint_seconds)


def checkpoint_written() -> None:
    """A checkpoint is on disk: the ``--checkpoint-minutes`` clock starts again."""
    _state.last_checkpoint = time.monotonic()


def saving_for_stop() -> None:
    """The checkpoint a stop waited for has begun: it may take longer than the grace."""
    if _state.requested is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)


def stop_if_requested(where: str | None = None) -> None:
    """After a checkpoint is on disk: the requested stop, now (``where``: what the stop line
    says of the run, when not where its last checkpoint stands)."""
    if _state.requested is not None:
        _stop_now(where)


def _stop_now(where: str | None = None) -> None:
    stop = Stopped(_state.requested)
    _clear()
    if where:
        stop.where = where
    raise stop


def _clear() -> None:
    if _state.requested is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
    _state.requested = None


def begin_deferring(can_defer: bool, checkpoint_seconds: float = 0.0) -> bool:
    """From now on a stop signal waits for the next checkpoint, where ``can_defer`` (a writing
    run of a single process), this is the CLI's main thread and SIGALRM is free, and a checkpoint
    is due every ``checkpoint_seconds`` as well (0: never by time). True when it does."""
    if not can_defer or threading.current_thread() is not threading.main_thread() or _state.deferring:
        return False
    if signal.getsignal(signal.SIGTERM) is not on_stop_signal:  # not the CLI's (train() from Python)
        return False
    if signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL:  # somebody else's timer: not ours to take
        return False
    _state.previous_alarm = signal.signal(signal.SIGALRM, _grace_over)
    _state.deferring = True
    _state.checkpoint_seconds = checkpoint_seconds
    checkpoint_written()  # the clock starts with the run
    return True


def end_deferring(finished: str | None = None) -> None:
    """The run has closed (``finished``: what to say of it; a stop requested since its last
    checkpoint comes now, so the process does not go on to what follows the run) or was
    abandoned (its error or stop is already on its way)."""
    _state.deferring = False
    try:
        if finished:
            stop_if_requested(finished)
    finally:
        _clear()
        signal.signal(signal.SIGALRM, _state.previous_alarm)


@contextmanager
def signals_held():
    """Ctrl-C, SIGTERM, SIGHUP and the grace's SIGALRM do nothing inside the block (this
    thread, the main one: signals go to no other), and what arrived is dropped: the block puts
    a run directory back after a stop or an error that ends the run anyway, and a second Ctrl-C
    in it left the directory half restored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
        if signal.getsignal(signum) is not None:  # None: a handler not set from Python, left alone
            previous[signum] = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
