"""IFEval's verifiable instructions, checked by omnigym's own code (Zhou et al. 2023, "Instruction-
Following Evaluation for Large Language Models"; ``lm-eval``'s ``tasks/ifeval`` is the reference).

An example carries IFEval's schema: ``instruction_id_list`` (``"punctuation:no_comma"``, ...) and
``kwargs``, one dict per instruction with the arguments of lm-eval's ``build_description``. Each
checker here reads the same arguments and decides as lm-eval's ``check_following`` does (the same
regular expressions); tests/test_instructions.py checks the two agree on generated responses.
Where they cannot agree offline, it is said at the checker:

- ``length_constraints:number_sentences`` and ``change_case:capital_word_frequency``: lm-eval
  splits sentences and words with NLTK's punkt models, data that is downloaded, not installed.
  Here sentences end at ``.``, ``!`` or ``?`` (runs of them, closing quotes and brackets
  included) before whitespace or the end; words are ``\\w+`` joined by ``-`` or ``'``. They differ
  from punkt on abbreviations ("Dr. Smith" is two sentences here) and contractions ("DON'T" is
  one capital word here, two for NLTK's tokenizer).
- ``language:response_language`` and the English half of ``change_case:english_*`` need
  ``langdetect`` (the ``[eval]`` extra), run with a fixed seed so a verdict does not change from
  call to call; without it ``english_*`` check the case alone and ``response_language`` is an error.

Strict and loose are IFEval's: strict checks the reply as written; loose also tries it without
its first line, its last line, both, and each of those without ``*``. An empty reply follows
nothing. Rewards (registered in ``omnigym.rewards``): ``ifeval`` is the fraction of the
example's instructions followed, strict (IFEval's instruction-level strict accuracy);
``ifeval_loose`` the same, loose; ``ifeval_all`` 1 when every one is followed, strict
(prompt-level). A reply scores as text: nothing it says about the checks changes them.
"""

from __future__ import annotations

import collections
import json
import re
from types import MappingProxyType

from omnigym.errors import OmnigymError

RELATIONS = ("less than", "at least")
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


def _compare(count: int, relation: str, threshold: int) -> bool:
    if relation not in RELATIONS:
        raise OmnigymError(f"an IFEval relation must be one of {RELATIONS}, got {relation!r}")
    return count < threshold if relation == RELATIONS[0] else count >= threshold


def count_words(text: str) -> int:
    """lm-eval's count: NLTK's ``RegexpTokenizer(r"\\w+")``, which is ``re.findall``."""
    return len(re.findall(r"\w+", text))


def count_sentences(text: str) -> int:
    """Sentences ending in ``.``, ``!`` or ``?`` before whitespace or the end of the text, and a
    last one with no end mark (lm-eval uses punkt: see the module's docstring)."""
    ends = re.split(r"(?<=[.!?])[\"'”’)\]]*\s+", text.strip())
    return sum(1 for part in ends if re.search(r"\w", part))


def capital_words(text: str) -> int:
    """Words all in capitals (``isupper``), hyphenated words counted once."""
    return sum(1 for word in re.findall(r"\w+(?:[-']\w+)*", text) if word.isupper())


def _detect_language(text: str) -> str | None:
    """langdetect's language with a fixed seed, None when it cannot tell (lm-eval counts that as
    followed); raises ImportError without the [eval] extra."""
    from langdetect.detector_factory import init_factory
    from langdetect.lang_detect_exception import LangDetectException

    init_factory()
    from langdetect.detector_factory import _factory

    detector = _factory.create()
    detector.seed = 0
    try:
        detector.append(text)
        return detector.detect()
    except LangDetectException:
        return None


def _english(text: str) -> bool:
    try:
        language = _detect_language(text)
    except ImportError:  # without langdetect the case is checked alone (the module's docstring)
        return True
    return language in (None, "en")


def _sections(text, section_spliter, num_sections):
    return len(re.split(r"\s?" + section_spliter.strip() + r"\s?\d+\s?", text)) - 1 >= num_sections


def _paragraphs(text, num_paragraphs):
    parts = re.split(r"\s?\*\*\*\s?", text)
    count = len(parts)
    for index, part in enumerate(parts):
        if not part.strip():
            if index in (0, len(parts) - 1):
                count -= 1
            else:  # an empty paragraph between two dividers breaks the instruction
                return False
    return count == num_paragraphs


def _nth_paragraph_first_word(text, num_paragraphs, nth_paragraph, first_word):
    parts = re.split(r"\n\n", text)
    count = len(parts) - sum(1 for part in parts if not part.strip())
    if nth_paragraph > count:
        return False
    paragraph = parts[nth_paragraph - 1].strip()
    if not paragraph:
        return False
    word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
    first = ""
    for letter in word:
        if letter in {".", ",", "?", "!", "'", '"'}:
            break
        first += letter.lower()
    return count == num_paragraphs and first == first_word.lower()


def _postscript(text, postscript_marker):
    marker = postscript_marker.strip()
    if marker == "P.P.S":
        pattern = r"\s*p\.\s?p\.\s?s.*$"
    elif marker == "P.S.":
        pattern = r"\s*p\.\s?s\..*$"
    else:
        pattern = r"\s*" + marker.lower() + r".*$"
    return bool(re.findall(pattern, text.lower(), flags=re.MULTILINE))


def _bullets(text, num_bullets):
    stars = re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE)
    dashes = re.findall(r"^\s*-.*$", text, flags=re.MULTILINE)
    return len(stars) + len(dashes) == num_bullets


def _highlights(text, num_highlights):
    single = [h for h in re.findall(r"\*[^\n\*]*\*", text) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", text) if h.removeprefix("**").removesuffix("**").strip()]
    return len(single) + len(double) >= num_highlights


def _json(text):
    text = text.strip()
    for prefix in ("```json", "```Json", "```JSON", "```"):
        text = text.removeprefix(prefix)
    try:
        json.loads(text.removesuffix("```").strip())
    except ValueError:
        return False
    return True


def _two_responses(text):
    parts = text.split("******")
    valid = []
    for index, part in enumerate(parts):
        if part.strip():
            valid.append(part)
        elif index not in (0, len(parts) - 1):
            return False
    return len(valid) == 2 and valid[0].strip() != valid[1].strip()


def _response_language(text, language):
    try:
        detected = _detect_language(text)
    except ImportError:
        raise OmnigymError("language:response_language needs langdetect: pip install 'omnigym[eval]'") from None
    return detected is None or detected == language


def _keyword_frequency(text, keyword, frequency, relation):
    return _compare(len(re.findall(keyword.strip(), text, flags=re.IGNORECASE)), relation, frequency)


def _letter_frequency(text, letter, let_frequency, let_relation):
    return _compare(collections.Counter(text.lower())[letter.strip().lower()], let_relation, let_frequency)


CHECKERS = MappingProxyType({
    "keywords:existence": lambda t, keywords: all(re.search(k, t, flags=re.IGNORECASE) for k in keywords),
    "keywords:frequency": _keyword_frequency,
    "keywords:forbidden_words": lambda t, forbidden_words: not any(
        re.search(r"\b" + w + r"\b", t, flags=re.IGNORECASE) for w in forbidden_words),
    "keywords:letter_frequency": _letter_frequency,
    "language:response_language": _response_language,
    "length_constraints:number_sentences": lambda t, num_sentences, relation: _compare(
        count_sentences(t), relation, num_sentences),
    "length_constraints:number_paragraphs": _paragraphs,
    "length_constraints:number_words": lambda t, num_words, relation: _compare(count_words(t), relation, num_words),
    "length_constraints:nth_paragraph_first_word": _nth_paragraph_first_word,
    "detectable_content:number_placeholders": lambda t, num_placeholders: len(
        re.findall(r"\[.*?\]", t)) >= num_placeholders,
    "detectable_content:postscript": _postscript,
    "detectable_format:number_bullet_lists": _bullets,
    "detectable_format:constrained_response": lambda t: any(r in t.strip() for r in CONSTRAINED_RESPONSES),
    "detectable_format:number_highlighted_sections": _highlights,
    "detectable_format:multiple_sections": _sections,
    "detectable_format:json_format": _json,
    "detectable_format:title": lambda t: any(
        title.lstrip("<").rstrip(">").strip() for title in re.findall(r"<<[^\n]+>>", t)),
    "combination:two_responses": _two_responses,
    "combination:repeat_prompt": lambda t, prompt_to_repeat: t.strip().lower().startswith(
        prompt_to_repeat.strip().lower()),
    "startend:end_checker": lambda t, end_phrase: t.strip().strip('"').lower().endswith(end_phrase.strip().lower()),
    "change_case:capital_word_frequency": lambda t, capital_frequency, capital_relation: _compare(
        capital_words(t), capital_relation, capital_frequency),
    "change_case:english_capital": lambda t: t.isupper() and _english(t),
    "change_case:english_lowercase": lambda t: t.islower() and _english(t),
    "punctuation:no_comma": lambda t: "," not in t,
    "startend:quotation": lambda t: len(t.strip()) > 1 and t.strip()[0] == '"' and t.strip()[-1] == '"',
})
"""instruction id -> ``check(text, **kwargs) -> bool``, lm-eval's ``check_following``"""


def check(instruction_id: str, kwargs: dict | None, text: str) -> bool:
    """Whether ``text`` follows one instruction, as lm-eval's ``check_following`` decides (no
    empty-reply rule: that is ``followed``'s). Arguments lm-eval drops (None, 0, "") are dropped."""
    checker = CHECKERS.get(instruction_id)
    if checker is None:
        raise OmnigymError(f"unknown IFEval instruction {instruction_id!r}; known: {', '.join(sorted(CHECKERS))}")
    args = {key: value for key, value in (kwargs or {}).items() if value}
    try:
        return bool(checker(text, **args))
    except TypeError as exc:
        raise OmnigymError(f"IFEval instruction {instruction_id}: bad arguments {args} ({exc})") from None


def loose_variants(text: str) -> list[str]:
    """IFEval's loose variants: the reply, without its first line, its last, both; each also without ``*``."""
    lines = text.split("\n")
    cut = [text, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return cut + [variant.replace("*", "") for variant in cut]


def followed(example: dict, text: str, loose: bool = False) -> list[bool]:
    """One verdict per instruction of ``example`` (IFEval's schema), strict or loose."""
    ids, kwargs = example.get("instruction_id_list"), example.get("kwargs")
    if not isinstance(ids, list) or not ids:
        raise OmnigymError("an IFEval example needs instruction_id_list (a non-empty list) and kwargs; "
                           f"this one has {', '.join(example) or 'no fields'}")
    kwargs = kwargs if isinstance(kwargs, list) else [{}] * len(ids)
    if len(kwargs) != len(ids):
        raise OmnigymError(f"an IFEval example has {len(ids)} instructions and {len(kwargs)} kwargs; give one each")
    texts = loose_variants(text) if loose else [text]
    return [any(t.strip() and check(i, k, t) for t in texts) for i, k in zip(ids, kwargs)]


def ifeval_strict(completion: str, example: dict) -> float:
    """The fraction of the example's instructions followed, strict."""
    verdicts = followed(example, completion)
    return sum(verdicts) / len(verdicts)


def ifeval_loose(completion: str, example: dict) -> float:
    """The fraction of the example's instructions followed, loose."""
    verdicts = followed(example, completion, loose=True)
    return sum(verdicts) / len(verdicts)


def ifeval_all(completion: str, example: dict) -> float:
    """1 when every instruction is followed, strict (IFEval's prompt-level accuracy)."""
    return float(all(followed(example, completion)))
