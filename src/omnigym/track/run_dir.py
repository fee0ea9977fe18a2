"""A run directory as a transaction: created, or taken over from a run it replaces, and put
back as it was when the run fails before its first checkpoint.

What crosses this module: a path and two facts about it (the log offset of the checkpoint
being resumed, whether a run there is being replaced) go in when the run is built;
``open`` (before the first file is written), ``commit`` (a checkpoint is on disk) and
``roll_back`` (a failure before that) are called by ``Run``, and ``set_aside_stage`` by a demo
pipeline about to make one of its stages again. It writes no run file itself
and knows nothing about the config or the metrics.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import time
from pathlib import Path

from omnigym.errors import OmnigymError
from omnigym.track.checkpoint import CHECKPOINT_NAME
from omnigym.track.files import CONFIG_NAME, METRICS_NAME, NAME_MAX, describe, name_too_long, write_atomically  # noqa: F401 (NAME_MAX: its callers')
from omnigym.track.lock import LOCK_NAME
from omnigym.track.metrics import SAMPLES_NAME
from omnigym.track.model_folder import PARTIAL_SUFFIX, REPLACED_SUFFIX

MODEL_FOLDER = "model"
STAGES_FOLDER = "stages"
EXPORTED_POLICIES = ("policy.onnx", "policy.pt")
"""``omnigym export``'s files in a run directory by default (export.py's ``FORMATS``)"""
EVALS_FOLDER = "evals"
"""``omnigym eval``'s reports of a language run (evaluation/language.py)"""
RUN_FILES = (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME, CHECKPOINT_NAME + ".tmp", "curve.png", SAMPLES_NAME,
             MODEL_FOLDER, "videos", EVALS_FOLDER, CONFIG_NAME + ".tmp", MODEL_FOLDER + PARTIAL_SUFFIX,
             MODEL_FOLDER + REPLACED_SUFFIX, *EXPORTED_POLICIES)
"""What a run writes (besides TensorBoard's events files); ``--overwrite`` removes exactly these.
The exported policies are the run's too: an old run's ``policy.onnx`` was left beside the new run,
taken for its policy, and so are ``evals/`` (a replaced model's reports were left beside the new one).
``videos/`` holds ``--capture-video``'s and ``omnigym eval --video``'s videos (envs/video.py).
``model/`` is the trained model as a Hugging Face folder (language runs), written as
``model.partial/`` and renamed when whole (``model_folder.py``; ``model.replaced/`` is the one it
replaces, for the moment of the swap); the ``.tmp`` files are those of atomic writes that a kill
interrupted. ``stages/`` holds the
finished runs a demo pipeline made on the way (``omnigym train rlhf`` with no flags); they are
reused by ``--overwrite``, kept by a run that stops before its first checkpoint, and reused by
a new start in a directory that holds only them (``resume.py``)."""
EVENTS_GLOB = "events.out.tfevents.*"
REPLACED_RUN = ".replaced-run"
"""where ``--overwrite`` keeps the run it replaces until the new run has a checkpoint"""


class RunDirectory:
    """The directory one run writes to, and how to undo what the run did to it."""

    def __init__(self, path: Path, resumed_log_offset: int | None = None, replace: bool = False):
        self.path = path
        self._resumed_log_offset = resumed_log_offset
        """where the resumed checkpoint's metrics.jsonl ends (None for a new run)"""
        self._replace = replace
        self._created = [p for p in [path, *path.parents] if not p.exists()]
        """the directories ``open`` will create (``roll_back`` removes them again)"""
        self._set_aside: Path | None = None
        self._stages_aside: list[Path] = []
        """the stages ``set_aside_stage`` moved aside, to put back or delete"""
        self._config_before: bytes | None = None
        self._events_before: set[Path] = set()
        self.opened = False
        self.committed = False

    def open(self) -> None:
        """Note what is there, set a replaced run aside (``--overwrite``) and create the directory."""
        self._events_before = set(self.path.glob(EVENTS_GLOB))
        if self._resumed_log_offset is not None:
            self._config_before = (self.path / CONFIG_NAME).read_bytes()
        self.opened = True  # from here on, roll_back has what it needs to undo
        if self._replace:
            self._set_aside = set_aside_run_files(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

    def commit(self) -> None:
        """A checkpoint of this run is on disk: nothing is undone any more."""
        self.committed = True
        self.drop_replaced()

    def drop_replaced(self) -> None:
        """The replaced run (``--overwrite``) and the stages made again are deleted once the new
        run has a checkpoint or ends."""
        if self._set_aside is not None:
            shutil.rmtree(self._set_aside, ignore_errors=True)
            self._set_aside = None
        for stage in self._stages_aside:
            remove_path(aside_of(stage))
        self._stages_aside = []

    def set_aside_stage(self, stage: Path) -> None:
        """Before a demo stage in ``stages/`` is made again (its settings differ: another
        ``--seed`` under ``--overwrite``, or a kept stage started again with other flags), the old
        one waits beside it as ``.replaced-NAME``: a start undone puts it back
        (``put_back_stages``), a run with a checkpoint deletes it (``drop_replaced``). Made in
        place, a stop before the first checkpoint brought the replaced run back beside the new
        run's stage, its own lost. (Beside it, not in ``REPLACED_RUN``: a rename never crosses
        file systems, whatever ``stages/`` links to.)"""
        if stage.exists() or stage.is_symlink():  # no older one aside: checked_run_dir refused that start
            stage.rename(aside_of(stage))
            self._stages_aside.append(stage)

    def put_back_stages(self) -> list[str]:
        """The stages ``set_aside_stage`` moved, back in place of what this start made of them
        (whole or not); returns their names. Does nothing after ``commit``."""
        if self.committed:
            return []
        for stage in self._stages_aside:
            remove_path(stage)
            aside_of(stage).rename(stage)
        names = [stage.name for stage in self._stages_aside]
        self._stages_aside = []
        return names

    def roll_back(self) -> None:
        """Put the directory back as it was before ``open``: a resumed run gets its config.json
        and its log up to the checkpoint back; a new run's files and the folders it made go,
        and a run it was replacing comes back. Does nothing after ``commit`` or before ``open``."""
        if self.committed or not self.opened:
            return
        self.opened = False  # once: begin's abandon, then scoped_run's, removed what the first put back
        for events in set(self.path.glob(EVENTS_GLOB)) - self._events_before:
            events.unlink()
        if self._resumed_log_offset is not None:
            config = self.path / CONFIG_NAME
            if not config.is_file() or config.read_bytes() != self._config_before:  # a full disk allows no rewrite
                write_atomically(config, self._config_before)
            with open(self.path / METRICS_NAME, "r+b") as log:
                log.truncate(self._resumed_log_offset)
            return
        remove_run_files(self.path)  # not stages/: they are whole (they were finished before ``open``)
        if self._set_aside is not None:
            for kept in self._set_aside.iterdir():
                kept.rename(self.path / kept.name)
            self._set_aside.rmdir()
            self._set_aside = None
        for folder in self._created:
            if folder.exists() and not any(folder.iterdir()):
                folder.rmdir()


def is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in (CONFIG_NAME, METRICS_NAME, CHECKPOINT_NAME))


def check_out_of_other_runs(out: Path, run_dirs, flag: str, unrelated: str, what: str, example: str,
                            folder: bool = False) -> None:
    """What a command writes (``out``: a file, or a ``folder``) is not put in the folder of a run it
    is not about: ``plot --out runs/sac/curve.png`` replaced that SAC run's own curve, and ``export
    --out runs/sac/policy.onnx`` put a PPO policy under the SAC run's own export name. The runs it
    is about (``run_dirs``) may hold it. ``unrelated``: how the line says the run is not one of them."""
    start = out.absolute() if folder else out.absolute().parent
    owner = next((p for p in [start, *start.parents] if is_run_dir(p)), None)
    if owner is not None and owner.resolve() not in {Path(r).resolve() for r in run_dirs}:
        raise OmnigymError(f"{flag} {out} is inside the run {owner}, {unrelated} (a run's folder holds its own "
                           f"files); write {what} elsewhere, e.g. {example}")


def refuse_run_files(out: Path, flag: str, command: str, own_runs=(), allowed=()) -> None:
    """``out``, followed through links, is neither one of a run's own files (its config, log,
    checkpoint, lock, curve, events, model, evaluations) nor in a run ``command`` is not about
    (``own_runs``; ``allowed``: the names it may write in them). ``sample --out runs/sft/config.json
    --overwrite`` replaced a run's config; ``plot --out link.svg``, a link to another run's
    config.json, wrote an image into it; ``export --out RUN/.omnigym.lock`` raised."""
    target = Path(os.path.realpath(out))  # not Path.resolve: a link loop raises there
    owner = next((folder for folder in target.parents if is_run_dir(folder)), None)
    if owner is None:
        return
    name = target.relative_to(owner).parts[0]
    mine = owner in {Path(os.path.realpath(run)) for run in own_runs}
    linked = " (through a link)" if target != Path(os.path.abspath(out)) else ""
    if mine and name in allowed:
        return
    if name in RUN_FILES or name in (LOCK_NAME, STAGES_FOLDER, REPLACED_RUN) or \
            fnmatch.fnmatch(name, EVENTS_GLOB):
        raise OmnigymError(f"{flag} {out} is the run {owner}'s own {name}{linked}; {command} never replaces a run's "
                           "files: write elsewhere")
    if not mine:
        raise OmnigymError(f"{flag} {out} is inside the run {owner}{linked}, which this {command} is not about; "
                           "write elsewhere")


def set_aside_run_files(path: Path) -> Path:
    """Move a run's files into a hidden folder of its directory (``--overwrite``), from which
    ``RunDirectory.roll_back`` can bring them back."""
    aside = path / REPLACED_RUN
    aside.mkdir(exist_ok=True)
    for name in [*RUN_FILES, "wandb", *(p.name for p in path.glob(EVENTS_GLOB))]:
        if (path / name).exists():
            (path / name).rename(aside / name)
    return aside


def left_set_aside(path: Path) -> list[Path]:
    """What a start killed before its first checkpoint (SIGKILL, the OOM killer) had set aside
    and nothing put back: ``REPLACED_RUN`` and ``stages/.replaced-NAME``. A new start there
    would mix them with its own (``set_aside_run_files`` moves into ``REPLACED_RUN`` whatever is
    there), so ``checked_run_dir`` refuses until the user chooses."""
    found = [path / REPLACED_RUN] if (path / REPLACED_RUN).exists() else []
    if (path / STAGES_FOLDER).is_dir():
        found += sorted((path / STAGES_FOLDER).glob(".replaced-*"))
    return found


def aside_of(stage: Path) -> Path:
    return stage.with_name(".replaced-" + stage.name)


def remove_path(path: Path) -> None:
    """``path`` gone, whatever it is (a folder, a file, a link; nothing)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def remove_run_files(path: Path) -> None:
    for name in RUN_FILES:
        remove_path(path / name)
    for events in path.glob(EVENTS_GLOB):
        events.unlink()
    shutil.rmtree(path / "wandb", ignore_errors=True)


def default_run_dir(algo: str, label, seed: int) -> str:
    label = re.sub(r"[^\w.\-]+", "-", label if isinstance(label, str) else describe(label).split(":")[-1])
    label = label[-80:]  # a name's end (a model path's last folder): one longer than a file name can be was an error
    base = os.path.join("runs", f"{algo}__{label}__{seed}__{int(time.time())}")
    name, n = base, 1
    while os.path.exists(name):  # two runs started in the same second
        n += 1
        name = f"{base}-{n}"
    return name


def check_name_lengths(flag: str, path) -> None:
    """A run directory's path whose names fit the file system, else one line before anything is made:
    a longer one failed only once the directory was being made, and left its parents behind."""
    if path is not None and max((len(os.fsencode(part)) for part in Path(path).parts), default=0) > NAME_MAX:
        raise OmnigymError(f"{flag} {name_too_long(path)}")


def refuse_a_broken_link(path: Path, flag: str) -> None:
    """A symbolic link on the way to ``path`` that leads nowhere (a missing target, or a loop):
    making the run's folder there said "File exists"."""
    for link in (path, *path.parents):
        if link.is_symlink() and not link.exists():
            raise OmnigymError(f"{flag} {path}: {link} is a symbolic link to {os.readlink(link)}, which does not "
                               f"exist or leads back to itself; make its target, or choose another {flag}")


def check_writable(path: Path) -> None:
    """``path`` can be created: its nearest existing ancestor is a writable directory."""
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        why = "is not a directory" if not parent.is_dir() else "is not writable"
        raise OmnigymError(f"cannot write to run directory {path}: {parent} {why}; choose another --run-dir")
