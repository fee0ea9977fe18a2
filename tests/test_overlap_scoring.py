"""--overlap-scoring K (generators/text_env.py): a batch played in K parts, each part's replies
scored in a thread while the next part generates. The rollouts are those of playing the parts
one after another; the scoring really runs while generation goes on; a reward that fails still
fails the batch, in one error; and GRPO runs with it, on the sync and the Ray runtime."""

import json
import threading

import pytest
import torch

pytest.importorskip("transformers")

from omnigym.envs.text import TextEnv  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.generators.text_env import TextEnvGenerator  # noqa: E402
from omnigym.inference import make_engine  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.models.lm import build_tiny_model, load_tokenizer  # noqa: E402

EXAMPLES = [{"question": f"Say {word}.", "answer": word} for word in ("rain", "sun", "snow", "wind", "fog", "hail")]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(str(path)).eval(), load_tokenizer(str(path))


def vowels(completions, examples):
    """A reward with a spread: the share of vowels in the reply (no random numbers drawn)."""
    return torch.tensor([sum(c in "aeiou" for c in text) / max(len(text), 1) for text in completions])


def generator(tiny, reward, overlap: int) -> TextEnvGenerator:
    model, tokenizer = tiny
    return TextEnvGenerator(TextEnv(EXAMPLES, reward), make_engine(model, tokenizer), tokenizer,
                            SamplingParams(max_new_tokens=12, temperature=1.0), max_turns=1, overlap_scoring=overlap)


def test_the_rollouts_are_those_of_the_parts_played_in_turn(tiny):
    torch.manual_seed(3)
    overlapped = generator(tiny, vowels, overlap=3).generate(EXAMPLES, 2)
    torch.manual_seed(3)
    plain = generator(tiny, vowels, overlap=1)
    in_turn = [t for start in (0, 2, 4) for t in plain.generate(EXAMPLES[start:start + 2], 2).items]
    assert len(overlapped) == len(in_turn) == 12
    for start, group in zip(range(0, 12, 4), (0, 2, 4)):  # the plain parts number their groups from 0
        for t in in_turn[start:start + 4]:
            t.group_id += group
    for mine, theirs in zip(overlapped.items, in_turn):
        assert (mine.response_ids, mine.logprobs, mine.group_id) == (theirs.response_ids, theirs.logprobs, theirs.group_id)
        assert mine.reward == theirs.reward and mine.info["reward_parts"] == theirs.info["reward_parts"]
        assert mine.example == EXAMPLES[mine.group_id]
    assert overlapped.rewards().std() > 0  # the scores are the replies' own, not one value


def test_a_part_is_scored_while_the_next_one_generates(tiny):
    """The first part's scoring waits until the engine is asked for the second part: without
    the overlap it would wait for nothing (the second part starts after it) and say so."""
    model, tokenizer = tiny
    second_part_started, seen_while_scoring = threading.Event(), []

    def waiting_reward(completions, examples):
        if not seen_while_scoring:
            seen_while_scoring.append(second_part_started.wait(timeout=60))
        return vowels(completions, examples)

    gen = generator(tiny, waiting_reward, overlap=2)
    engine_generate, calls = gen.engine.generate, []

    def counted(*args, **kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 2:
            second_part_started.set()
        return engine_generate(*args, **kwargs)

    gen.engine.generate = counted
    torch.manual_seed(0)
    out = gen.generate(EXAMPLES[:4], 2)
    assert seen_while_scoring == [True] and len(calls) == 2 and len(out) == 8
    assert all(name == threading.current_thread().name for name in calls)  # generation stays on the caller's thread


def test_a_failing_reward_fails_the_batch_in_one_error(tiny):
    def broken(completions, examples):
        raise OmnigymError("the judge is down")

    for overlap in (1, 3):
        with pytest.raises(OmnigymError, match="the judge is down"):
            generator(tiny, broken, overlap).generate(EXAMPLES, 2)


def small_grpo(run_dir, **extra):
    from omnigym.algos import grpo

    flags = dict(sft_steps=0, steps=2, prompts_per_step=4, group_size=2, eval_size=4, eval_every=10,
                 checkpoint_every=10, progress=False, plot=False, tensorboard=False, rewards="keyword:1.0",
                 max_new_tokens=8, seed=5)
    return grpo.GRPOConfig(run_dir=str(run_dir), **{**flags, **extra})


def metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in open(f"{run_dir}/metrics.jsonl")]
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "time/", "async/"))} for row in rows]


def test_grpo_trains_with_overlapped_scoring_on_both_runtimes(tmp_path):
    """A step's 4 prompts in 2 parts, in this process and on a Ray generator actor (its job
    played in parts there): each run trains its steps and logs the rewards of every reply."""
    pytest.importorskip("ray")
    from omnigym.algos import grpo

    for runtime in ("sync", "ray"):
        grpo.train(small_grpo(tmp_path / runtime, overlap_scoring=2, runtime=runtime,
                              **({"max_staleness": 1} if runtime == "ray" else {})))
        rows = [row for row in metrics(tmp_path / runtime) if "reward/mean" in row]
        assert [row["global_step"] for row in rows] == [1, 2], runtime
        assert all(0 <= row["reward/mean"] <= 1 for row in rows)
    config = json.loads((tmp_path / "ray" / "config.json").read_text())
    assert config["overlap_scoring"] == 2 and config["runtime"] == "ray"
