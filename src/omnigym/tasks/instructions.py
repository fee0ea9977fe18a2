"""Procedural IFEval-style prompts, offline: a short writing request and 1-3 verifiable
instructions, each example carrying IFEval's ``instruction_id_list`` and ``kwargs`` (the
arguments of lm-eval's ``build_description``), scored by ``omnigym.rewards.instructions``.

The instruction texts are IFEval's own templates. Instructions that contradict each other
(all lowercase and all capitals, JSON and a title, ...) are not drawn together. Train and
held-out examples are disjoint: each prompt's text is hashed and the hash decides its split.
``language:response_language`` is left out (it needs langdetect to check; the checker has it).
"""

from __future__ import annotations

import hashlib
import random
from types import MappingProxyType

from omnigym.errors import OmnigymError

TOPICS = ("the sea", "a rainy day", "your favourite food", "a small town", "the moon", "a lost key", "trains",
          "a garden", "winter", "a good friend", "the city at night", "a cat", "learning to swim", "a market",
          "an old bridge", "coffee", "a mountain walk", "the first day of school", "a library", "music")
REQUESTS = ("Write a short note about {}.", "Describe {}.", "Tell me about {}.", "Write a few lines on {}.")
WORDS = ("river", "light", "stone", "green", "window", "bread", "quiet", "paper", "summer", "bird", "table",
         "story", "friend", "road", "cloud", "apple", "chair", "smile", "water", "garden")
RELATIONS = ("less than", "at least")


def _words(rng, n):
    return rng.sample(WORDS, n)


# instruction id -> (draw kwargs, IFEval's description template)
INSTRUCTIONS = MappingProxyType({
    "keywords:existence": (lambda r: {"keywords": _words(r, 2)}, "Include keywords {keywords} in the response."),
    "keywords:frequency": (lambda r: {"keyword": _words(r, 1)[0], "frequency": r.randint(1, 3),
                                      "relation": r.choice(RELATIONS)},
                           "In your response, the word {keyword} should appear {relation} {frequency} times."),
    "keywords:forbidden_words": (lambda r: {"forbidden_words": sorted(_words(r, 2))},
                                 "Do not include keywords {forbidden_words} in the response."),
    "keywords:letter_frequency": (lambda r: {"letter": r.choice("abcdefghijklmnopqrstuvwxyz"),
                                             "let_frequency": r.randint(1, 10), "let_relation": r.choice(RELATIONS)},
                                  "In your response, the letter {letter} should appear {let_relation} {let_frequency} "
                                  "times."),
    "length_constraints:number_sentences": (lambda r: {"num_sentences": r.randint(1, 6),
                                                       "relation": r.choice(RELATIONS)},
                                            "Your response should contain {relation} {num_sentences} sentences."),
    "length_constraints:number_words": (lambda r: {"num_words": r.choice((5, 10, 15, 20, 40, 80)),
                                                   "relation": r.choice(RELATIONS)},
                                        "Answer with {relation} {num_words} words."),
    "length_constraints:number_paragraphs": (lambda r: {"num_paragraphs": r.randint(1, 4)},
                                             "There should be {num_paragraphs} paragraphs. Paragraphs are separated "
                                             "with the markdown divider: ***"),
    "detectable_content:number_placeholders": (lambda r: {"num_placeholders": r.randint(1, 3)},
                                               "The response must contain at least {num_placeholders} placeholders "
                                               "represented by square brackets, such as [address]."),
    "detectable_content:postscript": (lambda r: {"postscript_marker": r.choice(("P.S.", "P.P.S"))},
                                      "At the end of your response, please explicitly add a postscript starting "
                                      "with {postscript_marker}"),
    "detectable_format:number_bullet_lists": (lambda r: {"num_bullets": r.randint(1, 4)},
                                              "Your answer must contain exactly {num_bullets} bullet points. Use the "
                                              "markdown bullet points such as:\n* This is point 1. \n"
                                              "* This is point 2"),
    "detectable_format:title": (lambda r: {}, "Your answer must contain a title, wrapped in double angular brackets, "
                                              "such as <<poem of joy>>."),
    "detectable_format:number_highlighted_sections": (lambda r: {"num_highlights": r.randint(1, 3)},
                                                      "Highlight at least {num_highlights} sections in your answer "
                                                      "with markdown, i.e. *highlighted section*."),
    "detectable_format:multiple_sections": (lambda r: {"section_spliter": r.choice(("Section", "SECTION")),
                                                       "num_sections": r.randint(1, 3)},
                                            "Your response must have {num_sections} sections. Mark the beginning of "
                                            "each section with {section_spliter} X, such as:\n{section_spliter} 1\n"
                                            "[content of section 1]\n{section_spliter} 2\n[content of section 2]"),
    "detectable_format:json_format": (lambda r: {}, "Entire output should be wrapped in JSON format. You can use "
                                                    "markdown ticks such as ```."),
    "startend:quotation": (lambda r: {}, "Wrap your entire response with double quotation marks."),
    "startend:end_checker": (lambda r: {"end_phrase": r.choice(("Any other questions?",
                                                                "Is there anything else I can help with?"))},
                             "Finish your response with this exact phrase {end_phrase}. No other words should follow "
                             "this phrase."),
    "change_case:english_lowercase": (lambda r: {}, "Your entire response should be in English, and in all lowercase "
                                                    "letters. No capital letters are allowed."),
    "change_case:english_capital": (lambda r: {}, "Your entire response should be in English, and in all capital "
                                                  "letters."),
    "change_case:capital_word_frequency": (lambda r: {"capital_frequency": r.randint(1, 5),
                                                      "capital_relation": r.choice(RELATIONS)},
                                           "In your response, words with all capital letters should appear "
                                           "{capital_relation} {capital_frequency} times."),
    "punctuation:no_comma": (lambda r: {}, "In your entire response, refrain from the use of any commas."),
})
"""the families drawn, with IFEval's description of each"""

_CASE = frozenset({"change_case:english_lowercase", "change_case:english_capital",
                   "change_case:capital_word_frequency"})
_WRAP = frozenset({"detectable_format:json_format", "startend:quotation", "startend:end_checker",
                   "detectable_content:postscript",
         "detectable_format:title", "detectable_format:number_bullet_lists", "detectable_format:multiple_sections",
         "length_constraints:number_paragraphs", "detectable_format:number_highlighted_sections"})
CONFLICTS = (_CASE, _WRAP, frozenset({"startend:quotation", "startend:end_checker", "detectable_content:postscript"}))
"""groups of which at most one is drawn for a prompt (JSON wraps the reply: nothing else may; a
quoted reply cannot end with a phrase or a postscript after the quote)"""


def _conflict(a: str, b: str) -> bool:
    if "json_format" in a or "json_format" in b:
        return a in CONFLICTS[1] and b in CONFLICTS[1]
    return any(a in group and b in group for group in (CONFLICTS[0], CONFLICTS[2]))


def draw_instructions(rng: random.Random, n: int) -> tuple[list[str], list[dict]]:
    """``n`` compatible instruction ids and their kwargs."""
    ids: list[str] = []
    for candidate in rng.sample(sorted(INSTRUCTIONS), len(INSTRUCTIONS)):
        if not any(_conflict(candidate, chosen) for chosen in ids):
            ids.append(candidate)
        if len(ids) == n:
            break
    return ids, [INSTRUCTIONS[i][0](rng) for i in ids]


def describe(instruction_id: str, kwargs: dict) -> str:
    return INSTRUCTIONS[instruction_id][1].format(**kwargs)


class InstructionTask:
    """Prompts with ``min_constraints`` to ``max_constraints`` instructions each."""

    def __init__(self, min_constraints: int = 1, max_constraints: int = 3, heldout_fraction: float = 0.2):
        if not 1 <= min_constraints <= max_constraints <= 3:
            raise OmnigymError(f"instruction prompts carry 1 to 3 constraints, "
                               f"got {min_constraints}..{max_constraints}")
        self.min_constraints, self.max_constraints = min_constraints, max_constraints
        self.heldout_fraction = heldout_fraction

    def draw(self, rng: random.Random) -> dict:
        ids, kwargs = draw_instructions(rng, rng.randint(self.min_constraints, self.max_constraints))
        request = rng.choice(REQUESTS).format(rng.choice(TOPICS))
        prompt = " ".join([request, *(describe(i, k) for i, k in zip(ids, kwargs))])
        return {"question": prompt, "answer": "", "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs}

    def split_of(self, example: dict) -> str:
        digest = hashlib.sha256(example["prompt"].encode()).digest()
        return "heldout" if digest[0] / 256 < self.heldout_fraction else "train"

    def sample(self, n: int, seed: int, split: str = "train") -> list[dict]:
        """``n`` prompts of ``split``, the same for the same seed (duplicates are possible)."""
        if split not in ("train", "heldout"):
            raise OmnigymError(f"split must be 'train' or 'heldout', got {split!r}")
        rng, out = random.Random(seed), []
        while len(out) < n:
            example = self.draw(rng)
            if self.split_of(example) == split:
                out.append(example)
        return out
