"""A trained model as a Hugging Face folder (``model/`` of a language run, a pipeline stage's
model), written whole or not at all.

The folder is written under a temporary name beside it (``model.partial``) and renamed into
place only once every file is written, so a ``model/`` that exists is complete: a run whose
final save failed (a full disk, a kill) has none, is not finished, and ``--resume`` saves it
again. What crosses this module: a model (LoRA merged into a copy), its tokenizer, the folder
and any extra small files (the reward model's marker); out comes the folder, or a
``DiskFault`` naming it.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

from omnigym.track.files import write_fault

PARTIAL_SUFFIX = ".partial"
REPLACED_SUFFIX = ".replaced"


def save_model_folder(model, tokenizer, folder: Path, extra_files: dict[str, str] | None = None) -> Path:
    """``model`` and ``tokenizer`` (and ``extra_files``, name -> text) in ``folder``, whole or absent;
    a folder already there is replaced only by a complete one."""
    folder = Path(folder)
    plain = copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    partial = folder.with_name(folder.name + PARTIAL_SUFFIX)
    replaced = folder.with_name(folder.name + REPLACED_SUFFIX)
    try:
        with write_fault(folder):
            shutil.rmtree(partial, ignore_errors=True)
            plain.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            for name, text in (extra_files or {}).items():
                (partial / name).write_text(text)
            sync_folder(partial)  # the files reach the disk before the rename makes them "the model"
            if folder.exists():  # set aside first: a rename cannot replace a folder that holds files
                shutil.rmtree(replaced, ignore_errors=True)
                folder.rename(replaced)
            partial.rename(folder)
            shutil.rmtree(replaced, ignore_errors=True)
    except BaseException:  # a full disk, Ctrl-C: no half folder is left, and a model folder set aside comes back
        shutil.rmtree(partial, ignore_errors=True)
        if replaced.exists() and not folder.exists():
            replaced.rename(folder)
        raise
    return folder


def sync_folder(folder: Path) -> None:
    """fsync every file in ``folder`` and the folder itself: after a power cut, a renamed ``model/``
    must not hold files the kernel had not written yet."""
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


RESUMED_MARKER = "omnigym_resumed.txt"
"""in a finished run's ``model/`` once the run is resumed to train on: the model is from the run's
earlier end, not from where it now stands (a resume stopped early left it looking finished, and
``eval`` and ``--model RUN`` used it in silence). The final save replaces the folder, marker and all."""


def mark_resumed(folder: Path, algo: str, run_dir: Path) -> None:
    """``folder`` (a resumed run's ``model/``) is from before the resume; the line says what to do."""
    if complete_model(folder):
        (Path(folder) / RESUMED_MARKER).write_text(
            f"the run was resumed and has not finished: its model/ is from its earlier end, not from its last "
            f"checkpoint; finish it with: omnigym train {algo} --resume {run_dir}\n")


def resumed_line(folder: Path) -> str | None:
    """What a resumed, unfinished run's ``model/`` says of itself (``mark_resumed``), or None."""
    try:
        return (Path(folder) / RESUMED_MARKER).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def complete_model(folder: Path) -> bool:
    """``folder`` is a model this module wrote whole (or a folder saved by hand with its config)."""
    return (Path(folder) / "config.json").is_file()


WEIGHT_SUFFIXES = (".safetensors", ".bin")
SAMPLES, SAMPLE_BYTES = 16, 1 << 16


def weights_fingerprint(folder: Path) -> str | None:
    """What identifies the weights a model folder holds (its own, or a run directory's ``model/``),
    wherever it lies: each weight file's name and size, and a SHA-256 of its bytes, sampled at
    ``SAMPLES`` places in a large file (training changes nearly every byte of a tensor, so a
    retrained model differs at the samples; a 14 GB model is not read whole at each start).
    None when the folder holds no weights (a hub id, a built-in model)."""
    import hashlib

    files = [file for place in (folder, folder / "model") if place.is_dir()
             for file in sorted(place.iterdir()) if file.suffix in WEIGHT_SUFFIXES and file.is_file()]
    if not files:
        return None
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(folder)}\0{size}\0".encode())
        with open(file, "rb") as handle:
            if size <= SAMPLES * SAMPLE_BYTES:
                digest.update(handle.read())
                continue
            for k in range(SAMPLES):  # the first and last bytes among them
                handle.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
                digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()
