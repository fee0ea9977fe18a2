"""Loaders for prompt/answer data: GSM8K, HumanEval, generic jsonl, Hugging Face datasets.

A malformed row fails with an error naming the file and line and what is missing.
"""

from __future__ import annotations

import gzip
import json
import re
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
        f = opener(path, "rt", encoding="utf-8-sig")  # a byte-order mark (Windows' editors) is not text
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


def check_example(where: str, question, answer, question_field: str = "question", answer_field: str = "answer",
                  answer_optional: bool = False):
    """A question is a non-empty string, an answer a non-empty string or number: null, "" or []
    were trained on and scored as the prompt "None" (and an answer "None"). ``answer_optional``:
    an IFEval row's, which its rewards never read, may be "" (``INSTRUCTIONS_FIELD``)."""
    if not isinstance(question, str) or not question.strip():
        raise OmnigymError(f"{where}: {question_field} must be a non-empty string, got {question!r:.80}")
    if answer_optional and answer == "":
        return
    if answer is None or isinstance(answer, (dict, list, tuple, bool)) or not str(answer).strip():
        raise OmnigymError(f"{where}: {answer_field} must be a non-empty string or number, got {answer!r:.80}")


def check_messages(where: str, messages, name: str, empty_ok: bool = False) -> None:
    """Chat messages as a chat template reads them: a list of dicts, each with a string ``role`` and
    string ``content``. A message that was a list was a transformers TypeError; content that was a
    list of parts, None or a number reached the model as its Python repr ("[{'type': ...") or "None"."""
    if not isinstance(messages, list) or not (messages or empty_ok):
        raise OmnigymError(f"{where}: {name} must be a list of {{'role', 'content'}} messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OmnigymError(f"{where}: {name}[{i}] is not a {{'role', 'content'}} message (got {message!r:.60})")
        content = message.get("content")
        if content is None and message.get("tool_calls"):  # an assistant turn that only calls tools (OpenAI's form)
            continue
        if not isinstance(content, str):
            parts = " (a list of content parts is not read: give its text as one string)" if isinstance(content, list) else ""
            raise OmnigymError(f"{where}: {name}[{i}]'s content must be text, got {type(content).__name__}{parts}")


def check_held_out(label: str, count: int, noun: str, eval_size: int, flag: str = "--eval-size") -> None:
    """``label`` (``--data FILE``) has more than ``eval_size`` ``noun``s, so that some are left to train
    on; too few is one line with a size that would do (none does below two: "below 0" and "below 1"
    named sizes the flag refuses)."""
    if count <= eval_size:
        fix = f"use {flag} below {count}" if count >= 2 else f"give at least 2 {noun} (one held out, one to train on)"
        raise OmnigymError(f"{label} has {count} {noun} and {flag} {eval_size} holds out that many or more; {fix}")


def load_prompt_answer(source: str, prompt_field: str = "prompt", answer_field: str = "answer",
                       split: str = "train", **load_kwargs) -> list[dict]:
    """A jsonl file, or anything ``datasets.load_dataset`` loads, as ``{"question", "answer"}``."""
    if source.endswith((".jsonl", ".jsonl.gz")):
        rows = read_jsonl(source, (prompt_field,))
        for number, row in enumerate(rows, 1):
            if answer_field not in row and INSTRUCTIONS_FIELD not in row:
                raise OmnigymError(f"{source}:{number}: missing field(s) {answer_field}; the row has {', '.join(row)}")
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
        optional = INSTRUCTIONS_FIELD in row
        if optional and row.get(answer_field) is None:  # left out or null: the instruction rewards never read it
            row[answer_field] = ""
        check_example(f"{source}: row {number}", row[prompt_field], row[answer_field], prompt_field, answer_field,
                      optional)
    return [{**row, "question": row[prompt_field], "answer": str(row[answer_field])} for row in rows]


INSTRUCTIONS_FIELD = "instruction_id_list"
"""an IFEval row's instructions: its reward checks the reply against them, and its answer may be
empty or left out (docs/instructions.md)"""


PARQUET = ".parquet"
"""the data file besides JSON and CSV that ``datasets`` reads (its ``parquet`` builder)"""


def read_csv_file(source: str, path: Path) -> list[tuple[str, dict]]:
    """A ``.csv`` file with a header row, every cell as text: ``datasets`` typed a column of numbers
    as int, and a reply of "4" was refused as not a string (an empty cell is "", not NaN)."""
    import pandas

    try:
        table = pandas.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # pandas' ParserError is a ValueError
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise OmnigymError(f"--data {source} cannot be read as CSV ({type(exc).__name__}: {detail})") from None
    return [(f"{source}:{i + 2}", row) for i, row in enumerate(table.to_dict("records"))]  # line 1 is the header


def read_json_file(source: str, path: Path) -> list[tuple[str, dict]]:
    """A ``.json`` file: one array of objects, or JSON lines (read as ``read_jsonl`` reads them).
    Through ``datasets``' json builder, bytes that were not UTF-8 were a pyarrow traceback and a
    syntax error was named nowhere."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as f:  # a byte-order mark (Windows' editors) is not text
            text = f.read()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise OmnigymError(f"--data {source} is not UTF-8 JSON text ({type(exc).__name__})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as exc:
        if text.lstrip().startswith("["):  # an array with a mistake in it: where the whole parse stopped
            raise OmnigymError(f"{source}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        return [(f"{source}:{i}", row) for i, row in enumerate(read_jsonl(path), 1)]  # JSON lines, or the error
    if not isinstance(whole, list):
        kind = {"dict": "object", "str": "string", "int": "number", "float": "number"}.get(type(whole).__name__, "value")
        raise OmnigymError(f"--data {source} holds one JSON {kind}; a .json file holds an array of rows (objects) or "
                           "JSON lines")
    for i, row in enumerate(whole):
        if not isinstance(row, dict):
            raise OmnigymError(f"--data {source}[{i}]: expected a JSON object, got {type(row).__name__}")
        try:
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise OmnigymError(f"--data {source}[{i}]: a string holds an unpaired surrogate escape (such as \\ud800), "
                               "which is not text") from None
    return [(f"{source}[{i}]", row) for i, row in enumerate(whole)]


def read_rows(source: str, split: str = "train") -> list[tuple[str, dict]]:
    """The rows of a ``.jsonl``/``.jsonl.gz`` file, a ``.json`` file, a dataset folder or an
    offline hub id, as (where, row) pairs: ``where`` names the file and line (or dataset and
    index) for errors. A path that is not there fails at once (no hub retries)."""
    if source.lower().endswith((".jsonl", ".jsonl.gz")):  # d.JSONL was read before the suffixes were looked at
        return [(f"{source}:{i}", row) for i, row in enumerate(read_jsonl(source), 1)]
    path = Path(source).expanduser()
    try:
        is_file, exists = path.is_file(), path.exists()
    except OSError as exc:  # a symlink loop (ELOOP) was read as a hub id: "couldn't reach ... on the Hub"
        raise OmnigymError(f"--data {source}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not exists and path.is_symlink():
        raise OmnigymError(f"--data {source}: a link to nothing (or a loop of links)")
    if not exists and (source.startswith((".", "/", "~")) or source.count("/") != 1):
        raise OmnigymError(f"--data {source}: no such file or folder (a hub dataset id looks like org/name)")
    name = path.name.lower()
    if is_file and name.endswith((".json", ".json.gz")):
        return read_json_file(source, path)
    if is_file and name.endswith(".csv"):
        return read_csv_file(source, path)
    if is_file and path.suffix.lower() != PARQUET:
        raise OmnigymError(f"--data {source}: give a .jsonl, .json (or either .gz), .csv or .parquet file, a "
                           "dataset folder or an offline hub id")
    try:
        import datasets
    except ImportError:
        raise missing_extra("datasets", "llm") from None
    datasets.disable_progress_bars()  # one line per error, none per split it generates
    datasets.logging.set_verbosity_error()  # its "Failed to load ..." lines came before ours
    try:
        if is_file:
            data = datasets.load_dataset("parquet", data_files=str(path), split="train")
        else:
            data = datasets.load_dataset(source, split=split)
    except Exception as exc:  # offline hub misses and unreadable folders raise many types
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise OmnigymError(f"--data {source}: not a .jsonl file, a built-in set, or a dataset that loads offline "
                           f"({detail[:200]})") from None
    return [(f"{source}[{split}][{i}]", dict(row)) for i, row in enumerate(data)]


def first_refusal(rows: list[tuple[str, dict]], check, refused: OmnigymError) -> OmnigymError:
    """What to say when the rows, read in a seeded shuffle, were refused with ``refused``: the
    refusal of the first row in file order that ``check(where, row)`` refuses (a file with many
    bad rows named one chosen by the seed, and after it was fixed, another), else ``refused``
    (a refusal of the set as a whole). Only on this error path are the rows read again."""
    def place(item):
        found = re.search(r"^(.*?)(?::|\s#)(\d+)$", item[0])  # "data.jsonl:12", "gsm8k #3"
        return (found.group(1), int(found.group(2))) if found else (item[0], 0)

    for where, row in sorted(rows, key=place):
        try:
            check(where, row)
        except OmnigymError as exc:
            return exc
    return refused
