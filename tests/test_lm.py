import pytest

pytest.importorskip("transformers")

from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.models.lm import LoraSettings, build_tiny_model, load_model, load_tokenizer  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.inference.hf import HFEngine  # noqa: E402


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


def test_past_learned_positions_is_one_line_and_a_rotary_model_runs_on(tiny):
    """GPT-2's positions are a learned table: a prompt and its new tokens past its end were an
    IndexError inside the model; a rotary Llama computes any position and has no such limit."""
    import transformers

    from omnigym.inference import make_engine
    from omnigym.models.lm import build_tiny_tokenizer, check_max_length, learned_position_limit

    tokenizer, vocab = build_tiny_tokenizer()
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=24, n_embd=16, n_layer=1, n_head=2, pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<|end|>"]))
    assert learned_position_limit(gpt2) == 24 and learned_position_limit(load_model(tiny)) is None
    engine = make_engine(gpt2, tokenizer)
    assert len(engine.generate([[5] * 16], 2, SamplingParams(max_new_tokens=8))[0]) == 2  # 24 positions: fits
    with pytest.raises(OmnigymError, match="a prompt of 17 tokens and up to 8 new ones need more than the "
                                           "model's 24 positions"):
        engine.generate([[5] * 4, [5] * 17], 1, SamplingParams(max_new_tokens=8))
    check_max_length(gpt2, 24)
    with pytest.raises(OmnigymError, match="--max-length 25 is more than the model's 24 positions"):
        check_max_length(gpt2, 25)  # SFT, DPO and the reward models' first forward pass was that IndexError
    check_max_length(load_model(tiny), 4096)
    rotary = make_engine(load_model(tiny), load_tokenizer(tiny))
    assert rotary.generate([[5] * 300], 1, SamplingParams(max_new_tokens=2))[0][0].completion_ids  # past its 256


def test_max_length_past_learned_positions_refuses_the_run_in_one_line(tmp_path, capsys):
    import json

    import transformers

    from omnigym.cli import main
    from omnigym.models.lm import build_tiny_tokenizer

    tokenizer, vocab = build_tiny_tokenizer()
    model_dir = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=32, n_embd=16, n_layer=1, n_head=2, pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<|end|>"])).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(20)))
    run_dir = tmp_path / "run"
    code = main(["train", "sft", "--model", str(model_dir), "--data", str(data), "--max-length", "64", "--steps", "1",
                 "--eval-size", "2", "--run-dir", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "--max-length 64 is more than the model's 32 positions" in err and "Traceback" not in err
    assert not run_dir.exists()


def test_multi_turn_rollout_masks_tool_tokens(tiny):
    from omnigym.envs.text import ToolEnv
    from omnigym.generators.text_env import TextEnvGenerator
    from omnigym.inference.engine import Sample
    from omnigym.rewards import get_reward

    tokenizer = load_tokenizer(tiny)
    scripts = {0: ['<tool name="calculator">6*7</tool>', "<answer>42</answer>"], 1: ["<answer>41</answer>"]}

    class ScriptedEngine:
        """Episode 0 calls the calculator, then answers; episode 1 answers wrong at once."""
        version = 3

        def generate(self, prompts, n, params):
            if len(prompts) == 1 and n == 2:  # first turn: one prompt, a group of two
                texts = [scripts[0][0], scripts[1][0]]
            else:
                texts = [scripts[0][1]]
            out = []
            for text in texts:
                ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                out.append(Sample(prompts[0], ids, [-0.5] * len(ids), True))
            return [out] if n == 2 else [[s] for s in out]

    env = ToolEnv([{"question": "What is 6*7?", "answer": "42"}], get_reward("math"))
    trajectories = TextEnvGenerator(env, ScriptedEngine(), tokenizer, SamplingParams()).generate(env.examples, 2)
    first, second = trajectories.items
    assert trajectories.rewards().tolist() == [1.0, 0.0] and trajectories.group_ids().tolist() == [0, 0]
    assert (first.info["turns"], second.info["turns"], first.policy_version) == (2, 1, 3)
    pairs = list(zip(first.response_ids, first.loss_mask))
    generated = tokenizer.decode([t for t, m in pairs if m], skip_special_tokens=True)
    inserted = tokenizer.decode([t for t, m in pairs if not m])
    assert generated == '<tool name="calculator">6*7</tool><answer>42</answer>'
    assert inserted.startswith("<|tool|>42<|end|>") and "What is 6*7?" in tokenizer.decode(first.prompt_ids)
    assert len(first.response_ids) == len(first.loss_mask) == len(first.logprobs)
    assert [lp for lp, m in zip(first.logprobs, first.loss_mask) if not m] == [0.0] * (len(pairs) - sum(first.loss_mask))


def test_episodes_cut_off_by_the_turn_limit_score_zero(tiny):
    from omnigym.envs.text import ToolEnv
    from omnigym.generators.text_env import TextEnvGenerator
    from omnigym.inference.engine import Sample
    from omnigym.rewards import WeightedSum

    tokenizer = load_tokenizer(tiny)
    call = tokenizer('<tool name="calculator">1+1</tool>', add_special_tokens=False)["input_ids"]
    answer = tokenizer("<answer>2</answer>", add_special_tokens=False)["input_ids"]

    class Engine:
        """Row 0 calls the calculator forever; row 1 answers at once."""
        version = 0

        def generate(self, prompts, n, params):
            if n == 2:
                return [[Sample(prompts[0], call, [-1.0] * len(call), True),
                         Sample(prompts[0], answer, [-1.0] * len(answer), True)]]
            return [[Sample(p, call, [-1.0] * len(call), True)] for p in prompts]

    env = ToolEnv([{"question": "1+1?", "answer": "2"}], WeightedSum({"math": 1.0, "format": 0.1}), max_turns=2)
    trajectories = TextEnvGenerator(env, Engine(), tokenizer, SamplingParams()).generate(env.examples, 2)
    looping, answered = trajectories.items
    assert (looping.info["truncated"], looping.info["turns"], looping.reward) == (True, 2, 0.0)
    assert answered.reward == pytest.approx(1.05)
    assert trajectories.reward_parts() == pytest.approx({"math": 0.5, "format": 0.25})


def test_language_forward_and_generation_use_no_deprecated_transformers_api(tiny, caplog):
    """transformers renamed ``past_key_values`` to ``cache`` and warns on every call made with
    the old name (a FutureWarning, and a logged warning for ``output.past_key_values``): the
    old name goes away in a later version, so our calls must use the name the installed
    version declares. Warnings are errors here, so any deprecated call we make fails."""
    import logging
    import warnings

    import torch

    from omnigym.models.tokens import completion_logprobs, make_batch, make_completion_batch, token_logprobs

    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    header = list(range(4, 16))  # a shared header (a context level of its own), then distinct prompts
    prompts = [header + [20, 21], header + [22], header + [20, 21], header + [23, 24, 25]]
    completions = [[30, 31, 32], [33], [34, 35], [36, 37, 38, 39]]
    with warnings.catch_warnings(), caplog.at_level(logging.WARNING):
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        batch = make_completion_batch(prompts, completions, tokenizer.pad_token_id)
        assert batch.packed is not None and len(batch.context) == 2
        packed = completion_logprobs(model, batch)
        batch.packed = None  # the padded-rows path
        unpacked = completion_logprobs(model, batch)
        HFEngine(model, tokenizer).generate([[4, 65, 24]], 2, SamplingParams(max_new_tokens=4))
    assert not [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    full = token_logprobs(model, make_batch(list(zip(prompts, completions)), tokenizer.pad_token_id))
    for i, (p, c) in enumerate(zip(prompts, completions)):  # the numbers did not change with the name
        expected = full[i, len(p) - 1:len(p) - 1 + len(c)]
        assert torch.allclose(packed[i, :len(c)], expected, atol=1e-5)
        assert torch.allclose(unpacked[i, :len(c)], expected, atol=1e-5)


def test_a_long_chat_template_given_inline_is_read_as_a_template(tmp_path):
    """A template longer than a file name may be (255 bytes) was tried as a path first and
    raised ENAMETOOLONG; a multi-line one could never be a path. A file that cannot be read is one line."""
    from omnigym.models.lm import read_chat_template

    long_template = "{% for m in messages %}" + "{{ m['content'] }}" * 40 + "{% endfor %}"
    assert len(long_template) > 300 and read_chat_template(long_template) == long_template
    multi_line = "{% for m in messages %}\n{{ m['content'] }}\n{% endfor %}"
    assert read_chat_template(multi_line) == multi_line
    unreadable = tmp_path / "template.jinja"
    unreadable.write_bytes(b"\xff\xfe{{ oops")
    with pytest.raises(OmnigymError, match="cannot be read"):
        read_chat_template(str(unreadable))


def test_a_reward_model_is_not_taken_for_a_language_model(tmp_path):
    """A train rm/prm run loaded as a policy, teacher or judge with its score head left out, in silence (distill
    logged a meaningless KL, a judge parsed nothing, eval wrote pass@k into the reward model's own run)."""
    import pytest

    from omnigym.errors import OmnigymError
    from omnigym.models.lm import build_tiny_model, resolve_model
    from omnigym.models.scalar_head import MARKER

    folder = build_tiny_model(tmp_path / "run" / "model")
    assert resolve_model(str(tmp_path / "run")) == str(folder)  # a language model's run
    (folder / MARKER).write_text("{}")
    with pytest.raises(OmnigymError, match=r"--teacher .*: .*model is a reward model \(a score head, no language-model "
                                           r"head\); give a language model: .* finished sft, grpo, dpo, online_dpo, "
                                           r"rlhf or distill run"):
        resolve_model(str(tmp_path / "run"), f"--teacher {tmp_path / 'run'}")


def test_models_omnigym_cannot_train_are_one_line_each(tmp_path):
    """A tokenizer without an end-of-sequence token, a BERT loaded as a causal LM (its attention reads later
    tokens: it trained and sampled in silence) and an embedding table shorter than the tokenizer were a
    traceback or wrong results in the first batch."""
    import transformers

    from omnigym.models.lm import build_tiny_tokenizer, load_policy_and_tokenizer

    def saved(name, model, tokenizer):
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        return str(tmp_path / name)

    tokenizer, vocab = build_tiny_tokenizer()
    llama = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                 pad_token_id=vocab["<pad>"], eos_token_id=vocab["<|end|>"])
    short = saved("short", transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=len(vocab) - 20, **llama)),
                  tokenizer)
    with pytest.raises(OmnigymError, match=f"its tokenizer has {len(vocab)} tokens and its embedding table "
                                           f"{len(vocab) - 20} rows"):
        load_policy_and_tokenizer(short)
    bert = saved("bert", transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        pad_token_id=vocab["<pad>"])), tokenizer)
    with pytest.raises(OmnigymError, match="a bert model reads all of its input at once"):
        load_policy_and_tokenizer(bert)
    tokenizer.eos_token = None
    no_end = saved("no-end", transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=len(vocab), **llama)),
                   tokenizer)
    with pytest.raises(OmnigymError, match="has no end-of-sequence token, which ends every reply"):
        load_policy_and_tokenizer(no_end)
    bare = tmp_path / "bare"  # transformers' sentence ended at "Couldn't instantiate the backend tokenizer from one of: "
    transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=len(vocab), **llama)).save_pretrained(bare)
    with pytest.raises(OmnigymError, match=f"{bare} has no tokenizer files"):
        load_policy_and_tokenizer(str(bare))


@pytest.mark.parametrize("algo", ["sft", "dpo"])
def test_a_model_with_dropout_resumes_to_the_same_numbers(algo, tmp_path):
    """A resumed run loaded its model in eval mode and trained without dropout until its next evaluation, where a
    new run's first evaluation had left it in train mode: step 4's loss differed (Llama, without dropout, did not)."""
    import json

    import transformers

    from omnigym.cli import main
    from omnigym.models.lm import build_tiny_tokenizer

    tokenizer, vocab = build_tiny_tokenizer()
    model_dir = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(vocab), n_positions=64, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.3,
        pad_token_id=vocab["<pad>"], eos_token_id=vocab["<|end|>"])).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)} if algo == "sft" else
                                       {"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)}) + "\n"
                            for i in range(30)))
    flags = ["--model", str(model_dir), "--data", str(data), "--batch-size", "4", "--eval-size", "4", "--eval-every",
             "3", "--checkpoint-every", "3", "--max-length", "32", "--no-progress", "--no-plot", "--no-tensorboard"]
    assert main(["train", algo, *flags, "--steps", "6", "--run-dir", str(tmp_path / "whole")]) == 0
    assert main(["train", algo, *flags, "--steps", "3", "--run-dir", str(tmp_path / "cut")]) == 0
    assert main(["train", algo, "--resume", str(tmp_path / "cut"), "--steps", "6", "--no-progress"]) == 0

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("perf/")}
                for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert rows("cut") == rows("whole") and len(rows("whole")) >= 7
