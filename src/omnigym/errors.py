"""One exception type for mistakes a user can fix; the CLI prints it as one line."""


class OmnigymError(Exception):
    """Bad input or state the user can act on. The message names the input and the fix."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise OmnigymError(message)


def missing_extra(package: str, extra: str) -> OmnigymError:
    return OmnigymError(f"{package} is not installed; install it with: pip install 'omnigym[{extra}]'")


def flag(name: str) -> str:
    """A config field as its flag: ``num_envs`` -> ``--num-envs``."""
    return "--" + name.replace("_", "-")


def show_flag(name: str, value) -> str:
    """A flag as it is typed: ``--hidden 64 64``, ``--clip-vloss``, ``--no-anneal-lr``."""
    if isinstance(value, bool):
        return flag(name) if value else "--no-" + name.replace("_", "-")
    return f"{flag(name)} {' '.join(map(str, value)) if isinstance(value, tuple) else value}"


def shown_value(value) -> str:
    """A flag's value as it is typed: a list or tuple space-separated (``64 64``), the rest as text."""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def a_run(algorithm) -> str:
    """"a ppo run", "an alphazero run", "an sft run": the article as the name is read aloud."""
    spoken_with_a_vowel = str(algorithm)[:1] in "aeiou" or str(algorithm) in ("sft", "rm", "rlhf")
    return f"{'an' if spoken_with_a_vowel else 'a'} {algorithm} run"


def path_name(value: str) -> str:
    """An argparse ``type`` for a file or folder argument: an empty or blank one is refused.
    ``""`` is ``Path(".")``: commands read the working directory as the run named, or wrote
    their output there, as if it had been given. ``..`` parts are resolved (``without_dots``)."""
    if not value.strip():
        import argparse

        raise argparse.ArgumentTypeError("is empty; give a file or folder")
    resolved = str(without_dots(value))  # (Path drops a trailing slash, which says "a folder": kept)
    return resolved + "/" if value.endswith("/") and not resolved.endswith("/") else resolved


def without_dots(path):
    """``path`` with its ``..`` parts resolved as the kernel would, those under a folder that does
    not exist yet dropped with it: making ``new/../runs/x``'s folders made a stray ``new``, and
    ``runs/a/../a/inner`` named its owner ``runs/a/..``. Any other path is returned as given."""
    from pathlib import Path

    return Path(path).resolve() if ".." in Path(path).parts else Path(path)
