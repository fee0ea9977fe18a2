"""Your own code named on the command line as ``module:name``, the way gymnasium names
entry points (``--env-id my_envs:Maze-v0``, ``--rewards my_rewards:exact:1.0``,
``--task my_tasks:capitals``).

The module is imported with the current directory on the import path, as ``python -m``
would, so a file beside you works without installing it. A module that fails to import is
reported in one line naming the file and line, not as a traceback.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from types import ModuleType

from omnigym.errors import OmnigymError

REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.\-]*$")


def is_reference(spec) -> bool:
    """Does ``spec`` look like ``module:name``?"""
    return isinstance(spec, str) and REFERENCE.match(spec) is not None


def import_reference(spec: str, what: str) -> tuple[ModuleType, str]:
    """Import the module of ``module:name``; returns it and ``name``. ``what`` names the flag."""
    module_name, _, name = spec.partition(":")
    if module_name.endswith(".py"):
        raise OmnigymError(f"{what} {spec}: name the module without .py: {module_name[:-3]}:{name}")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(module_name), name
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise OmnigymError(f"{what} {spec}: no module named {exc.name!r} here; run from the folder that holds "
                               f"{exc.name.replace('.', '/')}.py, or install it") from None
        raise _import_failed(spec, what, exc) from None
    except Exception as exc:  # the user's module raised while importing
        raise _import_failed(spec, what, exc) from None


def _import_failed(spec: str, what: str, exc: Exception) -> OmnigymError:
    return OmnigymError(f"{what} {spec}: importing it failed at {where(exc)}: {type(exc).__name__}: {exc}")


def where(exc: BaseException) -> str:
    """``file:line`` of the code that raised ``exc`` (a syntax error: the line it is on)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{frame.filename}:{frame.lineno}"


def at(exc: BaseException) -> str:
    """`` (at file:line)`` of your code that raised ``exc``: the innermost frame outside omnigym's
    own files. Where there is none, the call itself failed (a TypeError for an argument your env
    lacks or does not take), and omnigym's line that made the call would only mislead."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {where(exc)})"
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    yours = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(package)]
    if not yours:
        return " (in the call itself, with the arguments given)"
    return f" (at {yours[-1].filename}:{yours[-1].lineno})"


def call_user_code(what: str, fn, *args):
    """``fn(*args)``; an exception in it becomes one line naming ``what``, the error and where."""
    try:
        return fn(*args)
    except OmnigymError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() in your code ends a call of it, not the run, silently
        raise OmnigymError(f"{what} raised {type(exc).__name__}: {exc}{at(exc)}") from None


def import_object(spec: str, what: str):
    """The object named by ``module:name`` (``name`` may be dotted: ``module:Class.attr``)."""
    module, name = import_reference(spec, what)
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise OmnigymError(f"{what} {spec}: module {module.__name__} has no {name!r}")
        obj = getattr(obj, part)
    return obj
