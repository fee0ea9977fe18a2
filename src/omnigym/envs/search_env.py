"""Search-augmented QA over a local corpus: the model calls ``<tool name="search">query</tool>``,
reads the top-k passages BM25 ranks for it (``bm25s``, the ``[agents]`` extra), and answers
``<answer>…</answer>``; the answer is checked against the example's (case and spacing aside).

The built-in task (``search-v0``) is procedural: invented places with invented facts ("The
capital of Velmora is Drask."), so no model knows the answer without searching. A corpus of
your own is a JSON-lines file of ``{"text": ...}`` passages (``corpus=PATH``), with
questions of your own (``examples=[{"question", "answer"}, ...]``).

The query is text only: it is cut to ``MAX_QUERY_CHARS``, split into words by bm25s, and the
words the corpus never uses are dropped; the tool returns passages of the corpus and nothing
else (it opens no file and runs nothing), so no query reaches outside the index.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from omnigym.envs.text import ToolEnv
from omnigym.errors import OmnigymError

MAX_QUERY_CHARS = 256
SYSTEM_PROMPT = ("Answer the question from the documents. Search them with <tool name=\"search\">words</tool>; "
                 "you get back the best matching passages. Then reply with only <answer>ANSWER</answer>.")
RELATIONS = (("capital", "The capital of {e} is {v}."), ("river", "The longest river of {e} is the {v}."),
             ("founder", "{e} was founded by {v}."), ("export", "The main export of {e} is {v}."))
GOODS = ("copper", "salt", "amber", "wool", "tin", "indigo", "cedar", "pearls", "saffron", "glass", "silk", "marble")
SYLLABLES = ("ka", "lo", "mer", "dra", "vel", "sin", "tor", "qua", "bex", "ul", "ran", "zo", "fi", "mor", "the", "nap")


def bm25s_module():
    """bm25s, or one line naming the extra that brings it."""
    try:
        import bm25s
    except ImportError:
        raise OmnigymError("the search env needs bm25s: pip install 'omnigym[agents]'") from None
    return bm25s


class Index:
    """BM25 over ``passages`` (bm25s, English stop words dropped)."""

    def __init__(self, passages: list[str]):
        bm25s = bm25s_module()
        if not passages:
            raise OmnigymError("the search env's corpus has no passages")
        self.passages = passages
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(passages, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int) -> list[str]:
        """The top ``k`` passages sharing a word with ``query``, best first (none: an empty list)."""
        bm25s = bm25s_module()
        words = bm25s.tokenize([query[:MAX_QUERY_CHARS]], stopwords="en", return_ids=False, show_progress=False)
        known = [w for w in (words[0] if words else []) if w in self.retriever.vocab_dict]
        if not known:
            return []
        ids, scores = self.retriever.retrieve([known], k=min(k, len(self.passages)), show_progress=False)
        return [self.passages[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


class SearchEnv(ToolEnv):
    """``ToolEnv`` whose one tool searches ``index`` (shared by the per-episode copies: it is read-only)."""

    TOOLS = ("search",)

    def __init__(self, examples, reward, index: Index, system_prompt=None, max_turns: int = 4, top_k: int = 3):
        super().__init__(examples, reward, system_prompt, max_turns, tools=("search",))
        self.index, self.top_k = index, top_k

    def demonstration(self, example: dict) -> list[dict]:
        """Search with the question, read the passages, answer (GRPO's warm-up)."""
        return [{"role": "assistant", "content": f'<tool name="search">{example["question"]}</tool>'},
                {"role": "tool", "content": self.use_tool("search", example["question"])},
                {"role": "assistant", "content": f"<answer>{example['answer']}</answer>"}]

    def use_tool(self, name: str, arg: str) -> str:
        if name not in self.tools:
            return f"error: unknown tool {name}; the tool is search"
        found = self.index.search(arg, self.top_k)
        if not found:
            return "no passage matches those words"
        return "\n".join(f"[{i + 1}] {passage}" for i, passage in enumerate(found))


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def answer_match(completion: str, example: dict) -> float:
    """1 if the last ``<answer>`` equals ``example["answer"]`` (case, punctuation and spacing aside), else 0."""
    from omnigym.rewards.text import ANSWER

    found = ANSWER.findall(completion)
    return float(bool(found) and normalized(found[-1]) == normalized(str(example["answer"])) != "")


def invented_world(n_entities: int, seed: int) -> tuple[list[str], list[dict]]:
    """Passages and questions about ``n_entities`` invented places, four facts each."""
    rng = random.Random(seed)

    def name(parts):
        return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()

    entities = list(dict.fromkeys(name(3) for _ in range(n_entities * 2)))[:n_entities]
    passages, examples = [], []
    for entity in entities:
        for relation, template in RELATIONS:
            value = rng.choice(GOODS) if relation == "export" else name(2) + (" " + name(2) if relation == "founder" else "")
            passages.append(template.format(e=entity, v=value))
            question = {"capital": f"What is the capital of {entity}?",
                        "river": f"What is the longest river of {entity}?",
                        "founder": f"Who founded {entity}?",
                        "export": f"What is the main export of {entity}?"}[relation]
            examples.append({"question": question, "answer": value})
    rng.shuffle(passages)
    return passages, examples


def read_corpus(path: str) -> list[str]:
    """``{"text": ...}`` per line of a JSON-lines file; any fault is one line."""
    file = Path(path)
    if not file.is_file():
        raise OmnigymError(f"search corpus {path}: no such file (a JSON-lines file of {{\"text\": ...}} passages)")
    passages = []
    with file.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise OmnigymError(f"search corpus {path}: line {number} is not JSON") from None
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise OmnigymError(f"search corpus {path}: line {number} has no \"text\" string")
            passages.append(row["text"])
    if not passages:
        raise OmnigymError(f"search corpus {path} has no passages")
    return passages


def search_env(n_entities: int = 1500, seed: int = 0, corpus: str | None = None, examples: list[dict] | None = None,
               system_prompt: str | None = SYSTEM_PROMPT, **kwargs) -> SearchEnv:
    """``search-v0``: questions about an invented world (or ``examples``), answered from its
    passages (or the JSON-lines file ``corpus``)."""
    from omnigym.rewards import per_sample

    if corpus is not None and examples is None:
        raise OmnigymError("a search corpus of your own needs questions of your own (examples=[...])")
    passages, made = invented_world(n_entities, seed) if corpus is None else (read_corpus(corpus), examples)
    return SearchEnv(made, per_sample(answer_match), Index(passages), system_prompt, **kwargs)
