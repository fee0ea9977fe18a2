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


def as_from_a_terminal() -> None:
    """``preexec_fn`` of a child a test will signal: the stop signals at their defaults."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
