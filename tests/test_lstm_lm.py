"""The LSTM language model (``--model lstm``, ``models/lstm_lm.py``): a Hugging Face model that
saves and loads as one, reads padding as absent, carries its state between calls, has its
log-probs recomputed over whole sequences by ``completion_logprobs``, samples through the
engine seam (``inference/recurrent.py``; the recorded log-probs are checked with the other
engines' in ``test_sampled_logprobs.py``), and learns the keyword task by text REINFORCE."""

import json

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from omnigym.cli import main  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.inference import make_engine  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.inference.recurrent import RecurrentEngine  # noqa: E402
from omnigym.models.lm import load_policy_and_tokenizer  # noqa: E402
from omnigym.models.tokens import completion_logprobs, make_completion_batch  # noqa: E402


@pytest.fixture(scope="module")
def lstm():
    return load_policy_and_tokenizer("lstm", seed=0, lstm_hidden=32)


def test_padding_is_read_as_absent_and_the_state_carries_on(lstm):
    model, _ = lstm
    ids = torch.tensor([[10, 11, 12, 13, 14]])
    with torch.no_grad():
        whole = model(input_ids=ids).logits[0, -1]
        # left padding, then the same tokens: the state the pads found is the one they leave
        left = model(input_ids=torch.tensor([[0, 0, 0, 10, 11, 12, 13, 14]]),
                     attention_mask=torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])).logits[0, -1]
        first = model(input_ids=ids[:, :2])
        rest = model(input_ids=ids[:, 2:], cache=first.cache).logits[0, -1]
        fresh = model(input_ids=ids[:, 2:]).logits[0, -1]
    assert torch.allclose(left, whole, atol=1e-6)
    assert torch.allclose(rest, whole, atol=1e-6)
    assert not torch.allclose(fresh, whole, atol=1e-3)  # without the state it reads something else


def test_completion_logprobs_are_those_of_the_whole_sequence(lstm):
    """Prompts of different lengths sampled several times each, replies of different lengths:
    the shared-prefix pass (context once, then each reply from its state) gives each token's
    log-prob under one plain forward over prompt + reply."""
    model, _ = lstm
    prompts = [[4, 20, 21, 22, 5], [4, 30, 31, 5], [4, 20, 21, 22, 5], [4, 40, 5]]
    replies = [[50, 51, 52], [60], [53, 54, 55, 56, 57], [70, 71]]
    with torch.no_grad():
        got = completion_logprobs(model, make_completion_batch(prompts, replies, pad_id=0))
        for i, (p, r) in enumerate(zip(prompts, replies)):
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1:-1]
            want = logits.log_softmax(-1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
            assert torch.allclose(got[i, :len(r)], want, atol=1e-5)


def test_saved_and_loaded_it_is_the_same_model(lstm, tmp_path):
    from omnigym.track.model_folder import save_model_folder

    model, tokenizer = lstm
    save_model_folder(model, tokenizer, tmp_path / "model")
    loaded, _ = load_policy_and_tokenizer(str(tmp_path / "model"))
    assert type(loaded).__name__ == "LstmForCausalLM" and loaded.config.hidden_size == 32
    ids = torch.tensor([[10, 11, 12]])
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_the_engine_seam_gives_the_recurrent_sampler_and_refuses_the_others(lstm):
    model, tokenizer = lstm
    engine = make_engine(model, tokenizer)
    assert isinstance(engine, RecurrentEngine)
    samples = engine.generate([[4, 20, 5]], 3, SamplingParams(max_new_tokens=6))[0]
    assert len(samples) == 3 and all(1 <= len(s.completion_ids) == len(s.logprobs) <= 6 for s in samples)
    for kind in ("hf", "kv", "vllm"):
        with pytest.raises(OmnigymError, match=f"--engine {kind} cannot run a recurrent"):
            make_engine(model, tokenizer, kind)


@pytest.mark.parametrize("argv, message", [
    (["train", "text_reinforce", "--model", "lstm", "--lstm-hidden", "0"], "--lstm-hidden must be positive, got 0"),
    (["train", "text_reinforce", "--model", "lstm", "--lstm-hidden", "100000000"],
     "--lstm-hidden 100000000 is more than 4096"),
    (["train", "text_reinforce", "--lstm-hidden", "64"], "--lstm-hidden sizes the LSTM of --model lstm; --model tiny"),
    # an algorithm that puts a scalar head on --model, or an engine that cannot run an LSTM
    (["train", "rm", "--model", "lstm"], "--model lstm is an LSTM policy, and this run needs a transformer under the "
                                         "reward model's scalar head"),
    (["train", "prm", "--model", "lstm"], "under the process reward model's scalar head"),
    (["train", "rlhf", "--model", "lstm"], "under the value model's scalar head"),
    (["train", "grpo", "--model", "lstm", "--engine", "kv"], "--engine kv cannot run a recurrent (LSTM) policy"),
    # peft finds no attention or MLP layer in an LSTM: before, NoMatchingPeftModuleError's traceback
    (["train", "sft", "--model", "lstm", "--lora-r", "4"], "--lora-r adapts a transformer's attention and MLP"),
])
def test_bad_lstm_input_gets_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("omnigym: error: ") and message in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_text_reinforce_with_an_lstm_policy_learns_a_keyword(tmp_path):
    """The guide's first project: an untrained LSTM LM rewarded for a "z" in its 16 characters.
    Measured (seed 0, one thread): mean reward 0.22 over steps 1-5, 1.00 at step 30, about 11 s of
    CPU; the same command's first 30 steps are in docs/text_env.md."""
    from omnigym.algos import text_reinforce

    result = text_reinforce.train(text_reinforce.TextReinforceConfig(
        run_dir=str(tmp_path), model="lstm", keywords="z", steps=40, seed=0, progress=False, plot=False,
        tensorboard=False))
    rewards = [json.loads(line)["reward/mean"] for line in open(tmp_path / "metrics.jsonl")]
    assert sum(rewards[:5]) / 5 < 0.4  # an untrained LSTM rarely writes a "z" in 16 characters
    assert sum(rewards[-5:]) / 5 > 0.9 and result["final_reward"] > 0.9


@pytest.mark.slow
def test_an_lstm_sft_run_resumes_and_its_model_folder_is_the_next_policy(tmp_path, monkeypatch):
    """``omnigym train sft --model lstm`` stopped after 2 steps goes on to 4 from its checkpoint,
    and its ``model/`` is an LSTM LM that text_reinforce takes as ``--model RUN_DIR``
    (measured: about 15 s of CPU for the three runs)."""
    monkeypatch.chdir(tmp_path)
    run = str(tmp_path / "sft")
    common = ["--model", "lstm", "--eval-size", "20", "--no-progress", "--no-plot"]
    assert main(["train", "sft", "--steps", "2", "--run-dir", run, *common]) == 0
    assert main(["train", "sft", "--steps", "4", "--resume", run, *common]) == 0
    steps = [json.loads(line).get("global_step") for line in open(tmp_path / "sft" / "metrics.jsonl")]
    assert steps[-1] == 4 and steps.count(1) == steps.count(3) == 1  # on from step 2, not from 0
    loaded, _ = load_policy_and_tokenizer(run)
    assert type(loaded).__name__ == "LstmForCausalLM"
    assert main(["train", "text_reinforce", "--model", run, "--steps", "2", "--run-dir", str(tmp_path / "tr"),
                 "--no-progress", "--no-plot"]) == 0


def test_lora_on_a_saved_lstm_folder_is_one_line_and_writes_no_run(lstm, tmp_path, monkeypatch, capsys):
    # before, peft's NoMatchingPeftModuleError traceback
    from omnigym.track.model_folder import save_model_folder

    model, tokenizer = lstm
    save_model_folder(model, tokenizer, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "sft", "--model", "model", "--lora-r", "4", "--steps", "1", "--run-dir", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lora-r adapts a transformer's attention and MLP layers, which the LSTM policy model" \
        in err[0], err
    assert not (tmp_path / "run").exists()
