"""IFEval-style instructions: the procedural task, the rewards, and omnigym's checkers against
lm-eval's (the reference) on generated responses that follow, break and sit at the edge of each
instruction, plus replies written to fool a checker."""

from __future__ import annotations

import importlib.util
import pickle
import random

import pytest

from omnigym.envs.task_spec import load_task
from omnigym.errors import OmnigymError
from omnigym.rewards import parse_weights
from omnigym.rewards.instructions import (CHECKERS, capital_words, check, count_sentences, followed, ifeval_all,
                                          ifeval_loose, ifeval_strict)
from omnigym.tasks.instructions import INSTRUCTIONS, InstructionTask

ADVERSARIAL = ["", "   \n ", "all constraints satisfied", "All instructions followed. Score: 1.0 </answer>",
               "```json\n{\"a\": {\"b\": [1, {\"c\": \"```\"}]}}\n```", "```json\n{\"outer\": {\"inner\": 1}}\n```",
               "Here is JSON:\n```json\n{\"a\": 1}\n```", "Ünïcödé ümläut naïve café 日本語 Ж Ω",
               "ÉCOLE ÜBER ΑΒΓ", "\"\"", "\"", "* * *\n***\n******", "<<>>\n<< >>", "[]", "P.S.", "p. p. s done",
               "SECTION1 Section 2", "a,b", "‚ no ascii comma", "**bold** *it* ** **",
               "Mr. Smith went to Washington. He saw the U.S. Capitol!",
               "I DON'T KNOW. WELL-KNOWN FACT", "the quick brown fox jumps over the lazy dog",
               "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG", "- one\n- two\n* three\n*four*\n  - five"]
"""replies tried against every instruction: empty, unicode, a reply that claims success, JSON
nested in code fences, and markers at the edge of their patterns"""


def filler(words: int, word: str = "tree") -> str:
    return " ".join([word] * words)


def following(instruction_id: str, kw: dict, rng: random.Random) -> list[str]:
    """Replies built to follow the instruction, at its boundary where it has one, and just past it."""
    n = {"keywords:frequency": "frequency", "keywords:letter_frequency": "let_frequency",
         "length_constraints:number_words": "num_words", "change_case:capital_word_frequency": "capital_frequency"}
    if instruction_id == "keywords:existence":
        words = kw["keywords"]
        return [" and ".join(words) + ".", words[0], words[0].upper() + "S " + words[1]]
    if instruction_id == "keywords:forbidden_words":
        return ["nothing here", f"{kw['forbidden_words'][0]}s and more", kw["forbidden_words"][1].upper()]
    if instruction_id == "keywords:frequency":
        k = kw[n[instruction_id]]
        word = kw["keyword"]
        return [filler(k, word), filler(k - 1, word) or "none", filler(k, word.upper() + "ish")]
    if instruction_id == "keywords:letter_frequency":
        k, letter = kw["let_frequency"], kw["letter"]
        return [letter * k, letter.upper() * (k - 1) + "!", "x" + letter * (k + 1)]
    if instruction_id == "length_constraints:number_words":
        k = kw["num_words"]
        return [filler(k), filler(k - 1), "don't-stop " * (k // 2) + "ok_go 12"]
    if instruction_id == "change_case:capital_word_frequency":
        k = kw["capital_frequency"]
        return [filler(k, "YES"), filler(k - 1, "NO") + " fine", "WELL-KNOWN " * k]
    if instruction_id == "length_constraints:number_paragraphs":
        k = kw["num_paragraphs"]
        return ["\n***\n".join(["para"] * k), "***\n" + " *** ".join(["p"] * k) + "\n***", "a\n***\n\n***\nb",
                "\n***\n".join(["para"] * (k + 1))]
    if instruction_id == "detectable_content:number_placeholders":
        k = kw["num_placeholders"]
        return ["[x] " * k, "[x] " * (k - 1), "[[nested]] [a" * k]
    if instruction_id == "detectable_content:postscript":
        return ["Text.\nP.S. more", "Text.\np.p.s. more", "Text.\nPS no dots", "Text. P. S. inline"]
    if instruction_id == "detectable_format:number_bullet_lists":
        k = kw["num_bullets"]
        return ["\n".join(["* item"] * k), "\n".join(["- item"] * k) + "\n**bold line**",
                "\n".join(["* item"] * (k + 1))]
    if instruction_id == "detectable_format:number_highlighted_sections":
        k = kw["num_highlights"]
        return [" ".join(["*part*"] * k), " ".join(["**bold**"] * k), "*\n* ** *  *", " ".join(["*a*"] * (k - 1))]
    if instruction_id == "detectable_format:multiple_sections":
        k, s = kw["num_sections"], kw["section_spliter"]
        return ["\n".join(f"{s} {i}\ntext" for i in range(1, k + 1)), f"{s.lower()} 1\nx",
                "\n".join(f"{s}{i}" for i in range(k - 1))]
    if instruction_id == "startend:end_checker":
        return [f"Fine. {kw['end_phrase']}", f"\"Fine. {kw['end_phrase'].upper()}\"", f"{kw['end_phrase']} ok"]
    return ["\"Quoted reply.\"", "<<A title>> then text", "{\"answer\": [1, 2]}", "my answer is yes. lower words",
            "UPPER WORDS ONLY HERE", "no commas at all"]


def examples(n: int):
    """IFEval examples of the task, with kwargs as lm-eval's schema has them."""
    task = InstructionTask()
    return task.sample(n, seed=7) + task.sample(n // 4, seed=8, split="heldout")


def test_examples_carry_ifevals_schema():
    rows = examples(200)
    assert {i for row in rows for i in row["instruction_id_list"]} == set(INSTRUCTIONS)
    for row in rows:
        assert 1 <= len(row["instruction_id_list"]) == len(row["kwargs"]) <= 3
        assert len(set(row["instruction_id_list"])) == len(row["instruction_id_list"])
        assert all(i in CHECKERS for i in row["instruction_id_list"])
        assert row["question"] == row["prompt"]
    assert InstructionTask().sample(5, 3) == InstructionTask().sample(5, 3)
    train = {r["prompt"] for r in InstructionTask().sample(300, 1)}
    assert not train & {r["prompt"] for r in InstructionTask().sample(100, 2, split="heldout")}


def test_no_drawn_pair_contradicts():
    for row in examples(400):
        ids = set(row["instruction_id_list"])
        assert not {"change_case:english_lowercase", "change_case:english_capital"} <= ids
        assert "detectable_format:json_format" not in ids or not ids & {"startend:quotation", "detectable_format:title"}


def test_rewards_strict_loose_all():
    example = {"instruction_id_list": ["punctuation:no_comma", "detectable_format:title"], "kwargs": [{}, {}]}
    assert ifeval_strict("<<Title>> no commas", example) == 1.0
    assert ifeval_strict("**<<Title>>** a, b", example) == 0.5
    assert ifeval_all("**<<Title>>** a, b", example) == 0.0
    assert ifeval_loose("<<Title>>\nbody\na, b", example) == 1.0  # loose drops the last line
    assert ifeval_strict("", example) == ifeval_loose("  ", example) == 0.0  # an empty reply follows nothing
    # a reply that claims success is checked as text
    assert ifeval_strict("All constraints satisfied, reward 1.0", example) == 0.0
    reward = pickle.loads(pickle.dumps(parse_weights("ifeval:1,ifeval_loose:0,ifeval_all:0")))  # a worker gets one
    scored = reward.score(["<<T>>\nx, y"], [example])
    assert scored[1]["ifeval"].item() == 0.5 and scored[1]["ifeval_loose"].item() == 1.0


def test_own_sentence_and_capital_word_counts():
    """The two checkers lm-eval runs with punkt (not comparable here without its data), by hand."""
    assert count_sentences("") == 0 and count_sentences("One. Two! Three? four") == 4
    assert count_sentences("He said \"stop.\" Then left...  Why?!") == 3
    assert count_sentences("Version 3.5 is out. Dr. Smith agrees.") == 3  # an abbreviation ends one here
    assert capital_words("I SAW A WELL-KNOWN CAT, don't Stop") == 5  # I, SAW, A, WELL-KNOWN, CAT
    two_at_most = {"num_sentences": 2, "relation": "less than"}
    assert check("length_constraints:number_sentences", two_at_most, "One. Two.") is False


def test_bad_examples_are_one_line_errors():
    with pytest.raises(OmnigymError, match="instruction_id_list"):
        ifeval_strict("x", {"question": "q"})
    with pytest.raises(OmnigymError, match="unknown IFEval instruction"):
        check("keywords:nope", {}, "x")
    with pytest.raises(OmnigymError, match="one each"):
        followed({"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}, {}]}, "x")
    with pytest.raises(OmnigymError, match="relation"):
        check("length_constraints:number_words", {"num_words": 3, "relation": "more than"}, "x")


def test_task_ifeval_is_scored_by_the_ifeval_reward():
    task = load_task("ifeval", seed=0, eval_size=20)
    assert len(task.heldout) == 20 and task.env.reward.weights == {"ifeval": 1.0, "ifeval_loose": 0.0}
    assert not {r["prompt"] for r in task.heldout} & {r["prompt"] for r in task.train[:2000]}


# ---- the reference: lm-eval's own checkers ----

def _punkt_installed() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        nltk.data.find("tokenizers/punkt/english.pickle")
    except LookupError:
        return False
    return True


NEEDS_PUNKT = {"length_constraints:number_sentences", "change_case:capital_word_frequency"}


@pytest.fixture(scope="module")
def lm_eval_ifeval():
    if importlib.util.find_spec("lm_eval") is None or importlib.util.find_spec("langdetect") is None:
        pytest.skip("the [eval] extra (lm-eval[ifeval]) is not installed: it is the reference")
    import langdetect

    from lm_eval.tasks.ifeval import instructions_registry, utils

    langdetect.DetectorFactory.seed = 0  # lm-eval calls langdetect unseeded; omnigym's checker seeds it with 0
    return instructions_registry, utils


def reference_cases():
    rng, cases = random.Random(0), []
    for row in examples(240):
        for instruction_id, kw in zip(row["instruction_id_list"], row["kwargs"]):
            for reply in following(instruction_id, kw, rng) + ADVERSARIAL:
                cases.append((instruction_id, kw, reply))
    return cases


def _compare_with_reference(registry, ids: set[str]) -> tuple[int, list, set]:
    compared, differences, verdicts = 0, [], set()
    for instruction_id, kw, reply in reference_cases():
        if instruction_id not in ids:
            continue
        reference = registry.INSTRUCTION_DICT[instruction_id](instruction_id)
        reference.build_description(**{k: v for k, v in kw.items() if v})
        mine = check(instruction_id, kw, reply)
        compared += 1
        verdicts.add((instruction_id, mine))
        if mine != bool(reference.check_following(reply)):
            differences.append((instruction_id, kw, reply, mine))
    return compared, differences, verdicts


def test_checkers_agree_with_lm_eval(lm_eval_ifeval):
    registry, _ = lm_eval_ifeval
    ids = set(INSTRUCTIONS) - NEEDS_PUNKT
    compared, differences, verdicts = _compare_with_reference(registry, ids)
    assert compared >= 2000 and not differences, differences[:5]
    # each instruction was seen both followed and broken
    assert {(i, v) for i in ids for v in (True, False)} <= verdicts


def test_punkt_checkers_agree_with_lm_eval(lm_eval_ifeval):
    """Sentences and capital words: lm-eval splits them with punkt, omnigym with its own rule
    (rewards/instructions.py says how they differ); compared only where punkt's data is installed."""
    if not _punkt_installed():
        pytest.skip(f"{', '.join(sorted(NEEDS_PUNKT))}: lm-eval needs NLTK's punkt_tab and punkt data, which is not "
                    "installed (and is never downloaded here)")
    compared, differences, _ = _compare_with_reference(lm_eval_ifeval[0], NEEDS_PUNKT)
    assert compared >= 200 and not differences, differences[:5]


def test_strict_and_loose_agree_with_lm_eval(lm_eval_ifeval):
    _, utils = lm_eval_ifeval
    rng, n = random.Random(1), 0
    replies = [reply for instruction_id, kw, reply in reference_cases()[::7]]
    for row in examples(120):
        if set(row["instruction_id_list"]) & NEEDS_PUNKT and not _punkt_installed():
            continue
        inp = utils.InputExample(key=0, instruction_id_list=row["instruction_id_list"], prompt=row["prompt"],
                                 kwargs=row["kwargs"])
        for reply in rng.sample(replies, 8) + ["Title line\n" + reply for reply in rng.sample(replies, 4)]:
            n += 1
            assert followed(row, reply) == utils.test_instruction_following_strict(inp, reply).follow_instruction_list
            assert followed(row, reply, loose=True) == \
                utils.test_instruction_following_loose(inp, reply).follow_instruction_list
    assert n >= 600
