"""Environment variables set for the time of a block and put back after: what a library reads
while it is built (vLLM's multiprocessing switch, the GL backend MuJoCo's renderer picks).

It sits at the bottom of the layers, apart from ``process.py`` (one run's scope, which starts
Ray trainers and so sits above ``runtime/``), because envs and inference engines need it."""

from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def environment(variables: dict[str, str]):
    """``variables`` set in ``os.environ`` for the time of a block (a library that reads them
    while it is built), and what was there before put back after."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
