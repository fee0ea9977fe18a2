import pytest

pytest.importorskip("transformers")

from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.models.lm import LoraSettings, build_tiny_model, load_model, load_tokenizer  # noqa: E402
from omnigym.systems.generation import HFEngine, SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def test_tiny_model_round_trips_through_from_pretrained(tiny):
    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.2e6
    text = "What is 12 + 30?  <answer>42</answer>"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text  # spaces survive
    assert tokenizer.padding_side == "left"


def test_model_without_chat_template_is_a_clear_error(tiny, tmp_path):
    import json
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny, bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in bare.glob("chat_template.*"):
        extra.unlink()
    with pytest.raises(OmnigymError, match="has no chat template; give one with --chat-template"):
        load_tokenizer(str(bare))
    assert load_tokenizer(str(bare), chat_template="{{ messages[0]['content'] }}").chat_template


def test_missing_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(OmnigymError, match="cannot load a tokenizer from"):
        load_tokenizer(str(tmp_path / "nope"))


def test_engine_returns_n_samples_with_logprobs_and_lora_wraps(tiny):
    import torch

    tokenizer, model = load_tokenizer(tiny), load_model(tiny, LoraSettings(r=4))
    assert any("lora" in name for name, _ in model.named_parameters())
    engine = HFEngine(model, tokenizer)
    torch.manual_seed(0)
    groups = engine.generate([[4, 65, 24], [4, 66]], 3, SamplingParams(max_new_tokens=8))
    assert [len(g) for g in groups] == [3, 3]
    for sample in groups[0] + groups[1]:
        assert 1 <= len(sample.completion_ids) <= 8
        assert len(sample.logprobs) == len(sample.completion_ids) and all(lp <= 0 for lp in sample.logprobs)


def test_multi_turn_rollout_masks_tool_tokens(tiny):
    from omnigym.envs.text import ToolEnv
    from omnigym.rewards import get_reward
    from omnigym.systems.generation import Sample
    from omnigym.systems.text_rollout import play

    tokenizer = load_tokenizer(tiny)
    replies = iter(['<tool name="calculator">6*7</tool>', "<answer>42</answer>"])

    class ScriptedEngine:
        def generate(self, prompts, n, params):
            ids = tokenizer(next(replies), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            return [[Sample(prompts[0], ids, [-0.5] * len(ids), True)]]

    env = ToolEnv([{"question": "What is 6*7?", "answer": "42"}], get_reward("math"))
    episode = play(env, ScriptedEngine(), tokenizer, SamplingParams())
    assert episode.reward == 1.0
    generated = tokenizer.decode([t for t, g in zip(episode.tokens, episode.generated) if g], skip_special_tokens=True)
    inserted = tokenizer.decode([t for t, g in zip(episode.tokens, episode.generated) if not g])
    assert generated == '<tool name="calculator">6*7</tool><answer>42</answer>'
    assert "<|tool|>42<|end|>" in inserted and "What is 6*7?" in inserted
    assert len(episode.tokens) == len(episode.generated) == len(episode.logprobs)
