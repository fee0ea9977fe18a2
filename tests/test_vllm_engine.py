"""The vLLM engine (``omnigym.inference.vllm``).

Without vLLM (every machine): the pure mapping (omnigym's sampling parameters to vLLM's,
vLLM's outputs to ``Sample``, trainer weight names to checkpoint names), the engine's own
bookkeeping against a stand-in ``LLM`` (when it wakes, sleeps, resets the prefix cache,
which weights reach the worker), and the one-line error without the extra.

With vLLM and a CUDA GPU (skipped otherwise): greedy samples' log-probs against the Hugging
Face model's, and ``update_weights`` changing what is sampled.
"""

import importlib.util
import json
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import omnigym.inference.vllm as vllm_engine  # noqa: E402
from omnigym.errors import OmnigymError  # noqa: E402
from omnigym.inference import ENGINES, make_engine  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.inference.vllm import (  # noqa: E402
    MISSING, VLLMEngine, model_source, samples_from_outputs, sampling_kwargs, vllm_weight_name)
from omnigym.models.lm import LoraSettings, build_tiny_model, load_model, load_tokenizer  # noqa: E402

EOS = 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def completion(index, tokens, finish_reason, logprobs=None):
    """A stand-in for vLLM's ``CompletionOutput``: one {token: Logprob} per position, holding
    the sampled token (what ``logprobs=0`` returns), plus a decoy entry."""
    logprobs = logprobs or [-0.5 - i for i in range(len(tokens))]
    positions = [{t: SimpleNamespace(logprob=lp, rank=1), t + 1000: SimpleNamespace(logprob=-99.0, rank=2)}
                 for t, lp in zip(tokens, logprobs)]
    return SimpleNamespace(index=index, token_ids=tuple(tokens), logprobs=positions, finish_reason=finish_reason,
                           text="")


# --- sampling parameters ---


def test_greedy_is_temperature_zero_with_the_sampled_logprob_and_only_our_eos_stops():
    kwargs = sampling_kwargs(SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.5, top_k=3, greedy=True),
                             n=3, eos_id=EOS)
    assert kwargs == dict(n=3, max_tokens=12, logprobs=0, detokenize=False, ignore_eos=True, stop_token_ids=[EOS],
                          temperature=0.0, top_p=1.0, top_k=0)


def test_sampling_passes_temperature_top_p_top_k_and_no_per_request_seed():
    kwargs = sampling_kwargs(SamplingParams(max_new_tokens=5, temperature=0.8, top_p=0.9, top_k=40), n=8, eos_id=EOS)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"], kwargs["n"]) == (0.8, 0.9, 40, 8)
    assert "seed" not in kwargs  # a per-request seed would repeat a prompt's samples at every call
    assert sampling_kwargs(SamplingParams(), n=1, eos_id=EOS)["top_k"] == 0  # omnigym's "off" is vLLM's "off"
    assert sampling_kwargs(SamplingParams(), n=1, eos_id=None)["stop_token_ids"] == []
    assert sampling_kwargs(SamplingParams(stop_ids=(7, 9)), n=1, eos_id=EOS)["stop_token_ids"] == [EOS, 7, 9]


@pytest.mark.parametrize("params, n, message", [
    (SamplingParams(max_new_tokens=0), 1, "max_new_tokens must be at least 1"),
    (SamplingParams(), 0, "n must be at least 1"),
])
def test_bad_sampling_parameters_are_refused_in_one_line(params, n, message):
    with pytest.raises(OmnigymError, match=message):
        sampling_kwargs(params, n, EOS)


# --- outputs to samples ---


def test_outputs_become_n_samples_per_prompt_cut_after_eos():
    prompts = [[5, 6], [7]]
    outputs = [
        SimpleNamespace(outputs=[completion(1, [9, 10, 11], "length"),  # out of order: sorted by index
                                 completion(0, [8, EOS], "stop", [-0.1, -0.2])]),
        SimpleNamespace(outputs=[completion(0, [12, EOS, 13], "stop", [-1.0, -2.0, -3.0]),
                                 completion(1, [14], "abort")]),
    ]
    groups = samples_from_outputs(prompts, outputs, n=2, eos_id=EOS)
    assert [[s.completion_ids for s in g] for g in groups] == [[[8, EOS], [9, 10, 11]], [[12, EOS], [14]]]
    assert [[s.finished for s in g] for g in groups] == [[True, False], [True, False]]
    assert groups[0][0].logprobs == [-0.1, -0.2]  # the sampled token's entry, not the decoy's
    assert groups[0][1].logprobs == [-0.5, -1.5, -2.5]
    assert groups[1][0].logprobs == [-1.0, -2.0]  # cut with the tokens
    assert groups[1][0].prompt_ids == [7] and groups[0][1].prompt_ids == [5, 6]


def test_a_stop_without_the_eos_token_still_finishes():
    # a stop that vLLM reports without our EOS among the tokens (e.g. a stop token of its own)
    [[sample]] = samples_from_outputs([[1]], [SimpleNamespace(outputs=[completion(0, [4, 5], "stop")])], 1, EOS)
    assert sample.finished and sample.completion_ids == [4, 5]


def test_repeated_prompts_with_one_completion_each_are_regrouped():
    # greedy n=2: each prompt sent twice with n=1 (vLLM takes only n=1 at temperature 0)
    outputs = [SimpleNamespace(outputs=[completion(0, [t, EOS], "stop")]) for t in (10, 11, 20, 21)]
    groups = samples_from_outputs([[1], [2]], outputs, n=2, eos_id=EOS)
    assert [[s.completion_ids[0] for s in g] for g in groups] == [[10, 11], [20, 21]]
    assert [s.prompt_ids for g in groups for s in g] == [[1], [1], [2], [2]]


def test_outputs_that_do_not_match_the_request_are_an_error():
    with pytest.raises(RuntimeError, match="3 outputs for 2 prompts"):
        samples_from_outputs([[1], [2]], [SimpleNamespace(outputs=[])] * 3, 1, EOS)
    with pytest.raises(RuntimeError, match="not n=2"):
        samples_from_outputs([[1]], [SimpleNamespace(outputs=[completion(0, [3], "length")])], 2, EOS)
    missing = SimpleNamespace(index=0, token_ids=(3,), logprobs=None, finish_reason="length")
    with pytest.raises(RuntimeError, match="no log-probs"):
        samples_from_outputs([[1]], [SimpleNamespace(outputs=[missing])], 1, EOS)


# --- weight names ---


def test_weight_names_pass_through_and_lose_the_peft_wrapping():
    assert vllm_weight_name("model.layers.0.self_attn.q_proj.weight") == "model.layers.0.self_attn.q_proj.weight"
    assert vllm_weight_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert vllm_weight_name("base_model.model.lm_head.weight") == "lm_head.weight"


@pytest.mark.parametrize("name", ["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
                                  "base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight",
                                  "base_model.model.model.embed_tokens.lora_embedding_A.default"])
def test_lora_adapter_tensors_are_refused_in_one_line(name):
    with pytest.raises(OmnigymError, match="is a LoRA adapter tensor") as info:
        vllm_weight_name(name)
    assert "\n" not in str(info.value)


def test_the_peft_names_of_a_real_lora_model_map_to_the_plain_models(tiny):
    plain = {name for name, _ in load_model(tiny).named_parameters()}
    lora = load_model(tiny, LoraSettings(r=4))
    base = [name for name, _ in lora.named_parameters() if ".lora_" not in name]
    assert {vllm_weight_name(name) for name in base} == plain


# --- where vLLM loads the model from ---


def test_the_model_is_loaded_from_its_folder_or_saved_when_the_folder_is_gone(tiny, tmp_path):
    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    keep = []
    assert model_source(model, tokenizer, keep) == tiny and keep == []
    model.config._name_or_path = str(tmp_path / "gone")  # as --model tiny leaves it: a deleted temporary folder
    saved = model_source(model, tokenizer, keep)
    assert len(keep) == 1 and saved == keep[0].name
    reloaded = load_model(saved)
    assert torch.equal(reloaded.model.embed_tokens.weight, model.model.embed_tokens.weight)
    model.config._name_or_path = "Qwen/Qwen2.5-0.5B"  # a hub id is vLLM's to fetch
    assert model_source(model, tokenizer, keep) == "Qwen/Qwen2.5-0.5B"


# --- without the extra ---


def test_vllm_is_an_engine_choice():
    assert "vllm" in ENGINES
    with pytest.raises(OmnigymError, match="choose auto, hf, kv or vllm"):
        make_engine(None, None, "vllm2")


def test_without_vllm_the_engine_names_the_extra_in_one_line(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails as if it were not installed
    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    with pytest.raises(OmnigymError) as info:
        make_engine(model, tokenizer, "vllm")
    assert str(info.value) == MISSING
    assert "pip install 'omnigym[vllm]'" in MISSING and "\n" not in MISSING


def test_a_vllm_that_does_not_import_says_so_in_one_line(tmp_path, monkeypatch):
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("import _vllm_missing_native_library\n")
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(OmnigymError, match="vllm is installed but does not import") as info:
        vllm_engine.import_vllm()
    assert "\n" not in str(info.value)
    monkeypatch.delitem(sys.modules, "vllm", raising=False)


# --- the engine's bookkeeping, against a stand-in LLM ---


class FakeLLM:
    """Records what the engine asks of vLLM's ``LLM``; samples [prompt[-1] + 1, EOS]. Its
    worker's model runner has no ``reload_weights`` (0.10-era vLLM): weights go through
    the model's ``load_weights``."""

    def __init__(self, model, **kwargs):
        self.in_process = vllm_engine.os.environ.get(vllm_engine.IN_PROCESS)  # what vLLM would read now
        self.model, self.kwargs, self.calls, self.loaded, self.requests = model, kwargs, [], [], []

    def generate(self, requests, sampling, use_tqdm=True):
        self.calls.append("generate")
        self.requests.append((requests, sampling))
        assert use_tqdm is False
        return [SimpleNamespace(outputs=[completion(i, [r["prompt_token_ids"][-1] + 1, EOS], "stop")
                                         for i in range(sampling["n"])]) for r in requests]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append("rpc")
        model = SimpleNamespace(load_weights=lambda weights: self.loaded.extend(weights))
        worker = SimpleNamespace(model_runner=SimpleNamespace(model=model), get_model=lambda: model)
        return [method(worker, *args)]

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def sleep(self, level=1):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags=None):
        self.calls.append("wake_up" if tags is None else f"wake_up{tags}")


@pytest.fixture
def fake_vllm(monkeypatch):
    fake = SimpleNamespace(LLM=FakeLLM, SamplingParams=dict, TokensPrompt=dict, __version__="0.33.0")
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: fake)
    monkeypatch.setattr(vllm_engine, "_require_cuda", lambda: None)
    monkeypatch.delenv(vllm_engine.IN_PROCESS, raising=False)
    return fake


def test_the_engine_builds_vllm_in_process_from_the_models_folder(tiny, fake_vllm):
    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    engine = make_engine(model, tokenizer, "vllm")
    assert isinstance(engine, VLLMEngine) and engine.version == 0
    assert engine.llm.model == tiny
    assert engine.llm.kwargs["logprobs_mode"] == "processed_logprobs"
    assert engine.llm.kwargs["skip_tokenizer_init"] and engine.llm.kwargs["seed"] == 0
    assert engine.llm.kwargs["gpu_memory_utilization"] == 0.5 and not engine.llm.kwargs["enable_sleep_mode"]
    assert engine.llm.in_process == "0"  # set while vLLM builds its engine, and only then
    assert vllm_engine.IN_PROCESS not in vllm_engine.os.environ
    groups = engine.generate([[5, 6], [7]], 3, SamplingParams(max_new_tokens=4))
    assert [[s.completion_ids for s in g] for g in groups] == [[[7, EOS]] * 3, [[8, EOS]] * 3]
    assert engine.llm.calls == ["generate"]  # one call for all prompts; no sleeping without sleep mode
    assert engine.generate([], 3, SamplingParams()) == []
    with pytest.raises(OmnigymError, match="enable_sleep_mode=True"):
        engine.sleep()


def test_greedy_with_n_above_one_repeats_the_prompt(tiny, fake_vllm):
    engine = VLLMEngine(tiny, load_tokenizer(tiny))
    groups = engine.generate([[5], [6]], 3, SamplingParams(max_new_tokens=4, greedy=True))
    [(requests, sampling)] = engine.llm.requests
    assert [r["prompt_token_ids"] for r in requests] == [[5]] * 3 + [[6]] * 3
    assert sampling["n"] == 1 and sampling["temperature"] == 0.0
    assert [[s.completion_ids for s in g] for g in groups] == [[[6, EOS]] * 3, [[7, EOS]] * 3]


def test_update_weights_hands_every_named_tensor_over_then_drops_the_prefix_cache(tiny, fake_vllm):
    tokenizer, model = load_tokenizer(tiny), load_model(tiny)
    engine = make_engine(model, tokenizer, "vllm")
    params = list(model.named_parameters())
    engine.update_weights(model.named_parameters(), version=3)
    assert engine.version == 3
    assert [name for name, _ in engine.llm.loaded] == [name for name, _ in params]
    assert all(not t.requires_grad and t.data_ptr() == p.data_ptr()
               for (_, t), (_, p) in zip(engine.llm.loaded, params))
    assert engine.llm.calls == ["rpc", "reset_prefix_cache"]  # one call: a list of references, no copies
    engine.update_weights((), version=4)  # a step that changed nothing: the version moves, the cache stays
    assert engine.version == 4 and engine.llm.calls == ["rpc", "reset_prefix_cache"]


def test_a_lora_name_is_refused_before_anything_is_loaded(tiny, fake_vllm):
    engine = VLLMEngine(tiny, load_tokenizer(tiny))
    weights = [("model.norm.weight", torch.ones(128)),
               ("model.layers.0.mlp.up_proj.lora_A.default.weight", torch.ones(1))]
    with pytest.raises(OmnigymError, match="LoRA adapter tensor"):
        engine.update_weights(weights, version=1)
    assert engine.llm.calls == [] and engine.version == 0


def test_the_worker_uses_vllms_in_place_reload_where_it_has_one():
    class Runner:  # the signature of vllm 0.33.0's GPUModelRunner.reload_weights
        def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
            raise AssertionError("called through the worker, which sets vLLM's config around it")

    reloaded = []
    worker = SimpleNamespace(model_runner=Runner(), reload_weights=lambda **kwargs: reloaded.append(kwargs),
                             get_model=lambda: pytest.fail("load_weights is the fallback"))
    weights = [("lm_head.weight", torch.zeros(2))]
    vllm_engine._load_weights_on_worker(worker, weights)
    assert reloaded == [{"weights_iterator": weights, "is_checkpoint_format": True}]


def test_sleep_mode_sleeps_between_generates_and_wakes_before_work(tiny, fake_vllm):
    tokenizer = load_tokenizer(tiny)
    engine = VLLMEngine(tiny, tokenizer, enable_sleep_mode=True, gpu_memory_utilization=0.3, max_model_len=128)
    assert engine.llm.kwargs["max_model_len"] == 128 and engine.llm.kwargs["enable_sleep_mode"]
    assert engine.llm.calls == ["sleep1"]  # the trainer has the GPU until the first generate
    engine.generate([[1]], 1, SamplingParams(greedy=True))
    assert engine.llm.calls == ["sleep1", "wake_up", "generate", "sleep1"]
    engine.update_weights([("model.norm.weight", torch.ones(128))], version=1)
    assert engine.llm.calls[4:] == ["wake_up", "rpc", "reset_prefix_cache"]
    engine.generate([[1]], 1, SamplingParams(greedy=True))
    assert engine.llm.calls[7:] == ["generate", "sleep1"]  # already awake
    engine.wake_up()
    engine.wake_up()
    engine.sleep()
    engine.sleep()
    assert engine.llm.calls[9:] == ["wake_up", "sleep1"]  # each once


def test_lora_models_and_out_of_process_engines_are_refused(tiny, fake_vllm, monkeypatch):
    tokenizer = load_tokenizer(tiny)
    with pytest.raises(OmnigymError, match="not a LoRA adapter"):
        make_engine(load_model(tiny, LoraSettings(r=4)), tokenizer, "vllm")
    monkeypatch.setenv(vllm_engine.IN_PROCESS, "1")
    with pytest.raises(OmnigymError, match="update_weights cannot reach its model"):
        VLLMEngine(tiny, tokenizer)
    with pytest.raises(OmnigymError, match="gpu_memory_utilization"):
        VLLMEngine(tiny, tokenizer, gpu_memory_utilization=1.5)


@pytest.mark.parametrize("version, refused", [("0.10.1.1", True), ("0.10.0", True), ("0.10.2", False),
                                              ("0.10.2rc1", False), ("0.33.0", False), ("0.34.0.dev12+gabc", False)])
def test_vllm_older_than_0_10_2_is_refused(tiny, fake_vllm, monkeypatch, version, refused):
    monkeypatch.setattr(fake_vllm, "__version__", version)
    if refused:
        with pytest.raises(OmnigymError, match=f"vllm {version} is too old.*pip install 'vllm>=0.10.2'"):
            VLLMEngine(tiny, load_tokenizer(tiny))
    else:
        VLLMEngine(tiny, load_tokenizer(tiny))


class OwnCopyEngine:
    """Stands in for ``VLLMEngine.for_model`` in GRPO: samples (with the ``hf`` engine) from its own
    copy of the policy, which only ``update_weights`` changes, as vLLM's does; and counts each
    ``generate`` that found its copy behind the trainer's policy."""

    def __init__(self, policy, tokenizer):
        import copy

        from omnigym.inference.hf import HFEngine

        self.policy, self.copy = policy, copy.deepcopy(policy)
        self.engine, self.version, self.calls, self.stale_calls = HFEngine(self.copy, tokenizer), 0, 0, 0

    def generate(self, prompts, n, params):
        trainer = dict(self.policy.named_parameters())
        self.calls += 1
        self.stale_calls += any(not torch.equal(p, trainer[name]) for name, p in self.copy.named_parameters())
        return self.engine.generate(prompts, n, params)

    def update_weights(self, named_tensors, version):
        mine = dict(self.copy.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                mine[name].copy_(tensor)
        self.version = version


def test_grpo_hands_an_engine_with_its_own_weights_the_policy_before_every_sampling(tmp_path, monkeypatch):
    """vLLM samples from its own copy of the weights. GRPO's held-out accuracy and its rollouts
    must each come from the policy as it is then (docs/vllm.md). The warm-up stage samples with
    the in-process engine (a second vLLM copy of the model would not fit beside GRPO's): one
    vLLM engine is built."""
    from omnigym.cli import main

    engines = []
    monkeypatch.setattr(VLLMEngine, "for_model",
                        classmethod(lambda cls, model, tokenizer: engines.append(OwnCopyEngine(model, tokenizer))
                                    or engines[-1]))
    monkeypatch.setattr(vllm_engine, "import_vllm", lambda: None)  # the extra is asked for before the run
    assert main(["train", "grpo", "--engine", "vllm", "--sft-steps", "4", "--sft-eval-every", "2",
                 "--sft-batch-size", "8", "--sft-target-accuracy", "1.1", "--steps", "2", "--prompts-per-step", "2",
                 "--group-size", "4", "--eval-size", "8", "--eval-every", "1", "--rewards", "length:1.0,format:1.0",
                 "--no-skip-equal-groups", "--run-dir", str(tmp_path / "run"), "--no-progress", "--no-plot",
                 "--no-tensorboard"]) == 0
    (engine,) = engines
    read = lambda path: [json.loads(line) for line in path.read_text().splitlines()]  # noqa: E731
    rows, warm_up = read(tmp_path / "run" / "metrics.jsonl"), read(tmp_path / "run" / "stages" / "warmup" / "metrics.jsonl")
    assert sum("sft/val_accuracy" in r for r in warm_up) == 2 and sum("eval/accuracy" in r for r in rows) >= 2
    assert engine.calls >= 2 + 2 and engine.stale_calls == 0


# --- the real vLLM (a CUDA GPU and the [vllm] extra) ---


@pytest.fixture(scope="module")
def real_engine(tiny):
    pytest.importorskip("vllm", reason="vllm is not installed (GPU-only extra [vllm])")
    if not torch.cuda.is_available():
        pytest.skip("vllm needs a CUDA GPU")
    tokenizer = load_tokenizer(tiny)
    engine = VLLMEngine(tiny, tokenizer, gpu_memory_utilization=0.3, enable_sleep_mode=True, dtype="bfloat16",
                        max_model_len=256, enforce_eager=True)
    return engine, tokenizer


PROMPTS = ["What is 2 + 3?", "Say hi", "1, 2, 3,", "The quick brown fox"]


def hf_logprobs(model, sample) -> torch.Tensor:
    """The HF model's log-prob of each completion token, by one forward over prompt + completion."""
    ids = torch.tensor([sample.prompt_ids + sample.completion_ids], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(sample.prompt_ids):, None]).squeeze(-1).cpu()


def greedy(engine, tokenizer):
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    return [g[0] for g in engine.generate(prompts, 1, SamplingParams(max_new_tokens=24, greedy=True))]


def test_real_greedy_logprobs_match_the_hf_model(real_engine, tiny):
    engine, tokenizer = real_engine
    model = load_model(tiny, device="cuda").eval()
    for sample in greedy(engine, tokenizer):
        assert 1 <= len(sample.completion_ids) <= 24 and len(sample.logprobs) == len(sample.completion_ids)
        # vLLM runs in bfloat16 here, the HF model in float32
        assert torch.allclose(torch.tensor(sample.logprobs), hf_logprobs(model, sample), atol=0.05)


def test_real_n_samples_per_prompt(real_engine):
    engine, tokenizer = real_engine
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS[:2]]
    groups = engine.generate(prompts, 4, SamplingParams(max_new_tokens=16, temperature=1.0))
    assert [len(g) for g in groups] == [4, 4]
    for prompt, group in zip(prompts, groups):
        for s in group:
            assert s.prompt_ids == prompt and 1 <= len(s.completion_ids) <= 16
            assert all(lp <= 0 for lp in s.logprobs) and s.finished == (tokenizer.eos_token_id in s.completion_ids)
            assert tokenizer.eos_token_id not in s.completion_ids[:-1]


def test_real_update_weights_changes_the_samples(real_engine, tiny, tmp_path):
    engine, tokenizer = real_engine
    before = greedy(engine, tokenizer)
    other = load_model(str(build_tiny_model(tmp_path / "other", seed=1)), device="cuda").eval()
    engine.update_weights(other.named_parameters(), version=1)
    after = greedy(engine, tokenizer)
    assert engine.version == 1
    assert [s.completion_ids for s in after] != [s.completion_ids for s in before]
    for sample in after:  # the new weights, not a mix
        assert torch.allclose(torch.tensor(sample.logprobs), hf_logprobs(other, sample), atol=0.05)
    engine.update_weights(load_model(tiny).named_parameters(), version=2)  # back, from CPU tensors
    assert [s.completion_ids for s in greedy(engine, tokenizer)] == [s.completion_ids for s in before]


def test_real_sleep_gives_memory_back(real_engine):
    engine, tokenizer = real_engine
    engine.wake_up()
    awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    assert torch.cuda.mem_get_info()[0] > awake  # free memory grew
    greedy(engine, tokenizer)  # wakes by itself


def test_grpo_without_the_vllm_extra_is_refused_before_its_warm_up(tmp_path, capsys):
    """The missing extra was said when the engine was built: after the warm-up had run (1000 steps, minutes), with
    its stage left in the run directory."""
    from omnigym.cli import main

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here: nothing to refuse")
    run = tmp_path / "run"
    assert main(["train", "grpo", "--engine", "vllm", "--steps", "1", "--run-dir", str(run), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == f"omnigym: error: {vllm_engine.MISSING}"
    assert not run.exists()
    assert main(["train", "distill", "--engine", "vllm", "--run-dir", str(run), "--no-progress"]) == 2
    assert not run.exists()
