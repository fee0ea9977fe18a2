"""Loaders for prompt/answer data: GSM8K, HumanEval, generic jsonl, Hugging Face datasets.

A malformed row fails with an error naming the file and line and what is missing.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from omnigym.errors import OmnigymError, missing_extra


def read_jsonl(path: str | Path, required: tuple[str, ...] = ()) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise OmnigymError(f"no such file: {path}")
    if path.is_dir():
        raise OmnigymError(f"{path} is a folder, not a JSON lines file; give the .jsonl file itself "
                           "(a dataset folder is read by --data when its name has no .jsonl)")
    if path.is_char_device() or path.is_block_device():  # /dev/zero reads without end (a pipe, <(zcat ...), is fine)
        raise OmnigymError(f"{path} is a device, not a JSON lines file; give a .jsonl file")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    try:
        f = opener(path, "rt", encoding="utf-8")
    except OSError as exc:  # no permission, a broken link
        raise OmnigymError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    with f:
        try:
            lines = list(f)
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise OmnigymError(f"{path} is not UTF-8 JSON lines text ({type(exc).__name__})") from None
        for line_number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise OmnigymError(f"{path}:{line_number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise OmnigymError(f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}")
            if "\\ud" in line.lower():  # JSON escapes an unpaired surrogate, which no tokenizer can encode
                try:
                    json.dumps(row, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError:
                    raise OmnigymError(f"{path}:{line_number}: a string holds an unpaired surrogate escape (such as "
                                       "\\ud800), which is not text; write the character itself, or its pair") from None
            missing = [k for k in required if k not in row]
            if missing:
                raise OmnigymError(f"{path}:{line_number}: missing field(s) {', '.join(missing)}; "
                                   f"the row has {', '.join(row) or 'none'}")
            rows.append(row)
    return rows


def load_gsm8k(path: str | Path) -> list[dict]:
    """GSM8K rows as ``{"question", "answer", "solution"}``: ``answer`` is what follows ``####``."""
    examples = []
    for i, row in enumerate(read_jsonl(path, ("question", "answer")), 1):
        if "####" not in row["answer"]:
            raise OmnigymError(f"{path}: row {i}: GSM8K answer has no '####' final answer")
        solution, final = row["answer"].rsplit("####", 1)
        examples.append({"question": row["question"], "answer": final.strip().replace(",", ""),
                         "solution": solution.strip()})
    return examples


HUMANEVAL_INSTRUCTION = ("Complete this Python function. Reply with the whole function, or its body only, "
                         "in a ```python block.\n\n```python\n{prompt}```")


def load_humaneval(path: str | Path) -> list[dict]:
    """HumanEval rows, ready for the ``code`` reward (``prompt``, ``test``, ``entry_point``)
    and for a ``TextEnv`` (``question``: the prompt with an instruction; ``answer``: the
    canonical body, for reference only: the reward runs the tests)."""
    rows = read_jsonl(path, ("task_id", "prompt", "test", "entry_point"))
    return [{**row, "question": HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"]),
             "answer": row.get("canonical_solution", "")} for row in rows]


def load_prompt_answer(source: str, prompt_field: str = "prompt", answer_field: str = "answer",
                       split: str = "train", **load_kwargs) -> list[dict]:
    """A jsonl file, or anything ``datasets.load_dataset`` loads, as ``{"question", "answer"}``."""
    if source.endswith((".jsonl", ".jsonl.gz")):
        rows = read_jsonl(source, (prompt_field, answer_field))
    else:
        try:
            from datasets import load_dataset
        except ImportError:
            raise missing_extra("datasets", "llm") from None
        data = load_dataset(source, split=split, **load_kwargs)
        missing = [k for k in (prompt_field, answer_field) if k not in data.column_names]
        if missing:
            raise OmnigymError(f"dataset {source} has no column(s) {', '.join(missing)}; it has "
                               f"{', '.join(data.column_names)} (choose them with prompt_field/answer_field)")
        rows = list(data)
    for number, row in enumerate(rows, 1):
        # null, "" or [] were trained on and scored as the prompt "None" (and an answer "None")
        question, answer = row[prompt_field], row[answer_field]
        if not isinstance(question, str) or not question.strip():
            raise OmnigymError(f"{source}: row {number}: {prompt_field} must be a non-empty string, got {question!r}")
        if answer is None or isinstance(answer, (dict, list)) or not str(answer).strip():
            raise OmnigymError(f"{source}: row {number}: {answer_field} must be a non-empty string or number, got "
                               f"{answer!r}")
    return [{**row, "question": row[prompt_field], "answer": str(row[answer_field])} for row in rows]


def read_rows(source: str, split: str = "train") -> list[tuple[str, dict]]:
    """The rows of a ``.jsonl``/``.jsonl.gz`` file, a ``.json`` file, a dataset folder or an
    offline hub id, as (where, row) pairs: ``where`` names the file and line (or dataset and
    index) for errors. A path that is not there fails at once (no hub retries)."""
    if source.endswith((".jsonl", ".jsonl.gz")):
        return [(f"{source}:{i}", row) for i, row in enumerate(read_jsonl(source), 1)]
    path = Path(source).expanduser()
    if not path.exists() and (source.startswith((".", "/", "~")) or source.count("/") != 1):
        raise OmnigymError(f"--data {source}: no such file or folder (a hub dataset id looks like org/name)")
    try:
        import datasets
    except ImportError:
        raise missing_extra("datasets", "llm") from None
    datasets.disable_progress_bars()  # one line per error, none per split it generates
    try:
        if path.is_file():  # a .json file: JSON lines or one array, as datasets' json builder reads it
            data = datasets.load_dataset("json", data_files=str(path), split="train")
        else:
            data = datasets.load_dataset(source, split=split)
    except Exception as exc:  # offline hub misses and unreadable folders raise many types
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OmnigymError(f"--data {source}: not a .jsonl file, a built-in set, or a dataset that loads offline "
                           f"({detail[:200]})") from None
    return [(f"{source}[{split}][{i}]", dict(row)) for i, row in enumerate(data)]
