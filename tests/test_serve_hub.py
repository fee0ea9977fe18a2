"""serve/hub.py in process on the tiny model: adapters per run, the Tinker losses against hand
computations and omnigym's own losses, gradient accumulation, Adam per call, checkpoints and
exact resume, sampling through the KV engine, and refused requests that change nothing."""

import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from omnigym.models.lm import build_tiny_model, load_model  # noqa: E402
from omnigym.models.tokens import token_budget_batches  # noqa: E402
from omnigym.rl.losses import PolicyLossConfig, nll_loss, ppo_clip  # noqa: E402
from omnigym.serve.contract import (AdamStep, DatumIn, RequestError, SampleParams,  # noqa: E402
                                    SamplerSource)
from omnigym.serve.hub import LORA_ALPHA, ModelHub  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture
def hub(tiny, tmp_path):
    return ModelHub(tiny, tmp_path / "store")


def sl_datum(tokens, weights=None):
    targets = tokens[1:] + [2]
    w = torch.ones(len(tokens)) if weights is None else torch.tensor(weights, dtype=torch.float32)
    return DatumIn(list(tokens), {"target_tokens": torch.tensor(targets), "weights": w})


def rl_datum(tokens, sampling_logprobs, advantages):
    return DatumIn(list(tokens), {"target_tokens": torch.tensor(tokens[1:] + [2]),
                                  "logprobs": torch.as_tensor(sampling_logprobs, dtype=torch.float32),
                                  "advantages": torch.as_tensor(advantages, dtype=torch.float32)})


def batch(seed=0, sizes=(12, 7, 20)):
    g = torch.Generator().manual_seed(seed)
    return [sl_datum(torch.randint(7, 100, (n,), generator=g).tolist()) for n in sizes]


def snapshot(hub, model_id):
    return [p.detach().clone() for p in hub._runs[model_id].params]


def train(hub, model_id, steps, seed=0, lr=1e-2):
    for s in range(steps):
        hub.forward_backward(model_id, batch(seed + s), "cross_entropy")
        hub.optim_step(model_id, AdamStep(learning_rate=lr))


def hand_logprobs(model, datum):
    """log_softmax + gather on one unpadded sequence: the reference every loss is checked against."""
    with torch.no_grad():
        logits = model(torch.tensor([datum.tokens])).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, datum.inputs["target_tokens"].view(-1, 1))[:, 0]


def merged_by_hand(tiny, hub, model_id):
    """A plain transformers model with ``W + alpha / r * B @ A`` written into it from the run's
    adapter tensors: an independent check of the LoRA arithmetic and scaling."""
    model = load_model(tiny)
    run = hub._runs[model_id]
    tensors = dict(zip(run.names, run.params))
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untie
    with torch.no_grad():
        for name, a in tensors.items():
            if name.endswith(".lora_A"):
                path = name[:-len(".lora_A")]
                b = tensors[path + ".lora_B"]
                model.get_submodule(path).weight += LORA_ALPHA / run.rank * (b @ a)
    return model.eval()


def test_same_seed_same_initial_adapter_and_alpha_32(hub):
    hub.create_model("a", 4, seed=7)
    hub.create_model("b", 4, seed=7)
    hub.create_model("c", 4, seed=8)
    a, b, c = snapshot(hub, "a"), snapshot(hub, "b"), snapshot(hub, "c")
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert hub._runs["a"].backend.model.peft_config[hub._runs["a"].adapter].lora_alpha == 32


def test_layers_trained_follow_the_flags_and_bad_ranks_are_refused(hub):
    hub.create_model("attn", 2, train_mlp=False, train_unembed=False)
    names = hub._runs["attn"].names
    assert names and all("self_attn" in n for n in names)
    hub.create_model("mlp", 2, train_attn=False, train_unembed=False)
    assert all(".mlp." in n for n in hub._runs["mlp"].names)
    hub.create_model("head", 2, train_attn=False, train_mlp=False)
    assert {n.rsplit(".", 1)[0] for n in hub._runs["head"].names} == {"lm_head"}
    with pytest.raises(RequestError, match="nothing to train"):
        hub.create_model("none", 2, train_attn=False, train_mlp=False, train_unembed=False)
    with pytest.raises(RequestError, match="rank"):
        hub.create_model("zero", 0)
    with pytest.raises(RequestError, match="valid name"):
        hub.create_model("../escape", 2)
    with pytest.raises(RequestError, match="valid name"):
        hub.create_model(".hidden", 2)
    hub.create_model("sess-1:train:0", 2)  # the HTTP layer's ids
    with pytest.raises(RequestError, match="exists already"):
        hub.create_model("attn", 2)
    assert set(hub._runs) == {"attn", "mlp", "head", "sess-1:train:0"}


def test_training_one_adapter_leaves_another_bit_identical(hub):
    hub.create_model("a", 4, seed=1)
    hub.create_model("b", 4, seed=2)
    train(hub, "b", 1)  # b's adapter is non-zero, so its outputs depend on it
    b_params = snapshot(hub, "b")
    probe = batch(9)
    b_out = hub.forward_backward("b", probe, "cross_entropy", forward_only=True)
    a_before = snapshot(hub, "a")
    train(hub, "a", 3)
    assert not all(torch.equal(x, y) for x, y in zip(a_before, snapshot(hub, "a")))
    assert all(torch.equal(x, y) for x, y in zip(b_params, snapshot(hub, "b")))
    again = hub.forward_backward("b", probe, "cross_entropy", forward_only=True)
    assert all(torch.equal(x["logprobs"], y["logprobs"]) for x, y in zip(b_out.outputs, again.outputs))
    assert again.metrics["loss:sum"] == b_out.metrics["loss:sum"]


def test_cross_entropy_equals_hand_computation_and_omnigym_nll(tiny, hub):
    hub.create_model("a", 4, seed=3)
    train(hub, "a", 2)  # a non-zero adapter: the check covers LoRA's arithmetic too
    data = batch(5, sizes=(9, 16, 4))
    data[1] = sl_datum(data[1].tokens, [0.0] * 6 + [1.0] * 10)  # a prompt that does not count
    result = hub.forward_backward("a", data, "cross_entropy")
    reference = merged_by_hand(tiny, hub, "a")
    total = 0.0
    for datum, out in zip(data, result.outputs):
        expected = hand_logprobs(reference, datum)
        assert out["logprobs"].dtype == torch.float32 and out["logprobs"].shape == expected.shape
        torch.testing.assert_close(out["logprobs"], expected, atol=1e-5, rtol=1e-5)
        weights = datum.inputs["weights"]
        total += float(nll_loss(expected, weights) * weights.sum())  # omnigym's mean NLL, as a sum
        torch.testing.assert_close(out["elementwise_loss"], -weights * expected, atol=1e-5, rtol=1e-5)
    assert math.isclose(result.metrics["loss:sum"], total, rel_tol=1e-5, abs_tol=1e-5)


def test_cross_entropy_gradient_equals_autograd_on_the_plain_loss(hub):
    hub.create_model("a", 4, seed=3)
    train(hub, "a", 1)
    data = batch(6)
    hub.forward_backward("a", data, "cross_entropy")
    hub_grads = [p.grad.clone() for p in hub._runs["a"].params]
    for p in hub._runs["a"].params:
        p.grad = None
    model = hub._runs["a"].backend.model  # the same model, one unpadded sequence at a time
    for datum in data:
        logits = model(input_ids=torch.tensor([datum.tokens])).logits[0].float()
        logp = torch.log_softmax(logits, -1).gather(-1, datum.inputs["target_tokens"].view(-1, 1))[:, 0]
        (-(datum.inputs["weights"] * logp).sum()).backward()
    for mine, theirs in zip(hub_grads, [p.grad for p in hub._runs["a"].params]):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def rl_batch(hub, model_id, seed=0):
    """RL data whose sampler log-probs are near the model's own, so ratios fall both inside and
    outside PPO's clip range."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for datum in batch(seed):
        n = len(datum.tokens)
        out = hub.forward_backward(model_id, [datum], "cross_entropy", forward_only=True).outputs[0]["logprobs"]
        q = out + 0.4 * torch.randn(n, generator=g)
        adv = torch.randn(n, generator=g)
        adv[:3] = 0.0  # prompt positions
        q[:3] = 0.0
        data.append(rl_datum(datum.tokens, q, adv))
    return data


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo"])
def test_rl_losses_equal_hand_computation_and_omnigym_ppo_clip(tiny, hub, loss):
    hub.create_model("a", 4, seed=4)
    train(hub, "a", 1)
    data = rl_batch(hub, "a")
    result = hub.forward_backward("a", data, loss)
    reference = merged_by_hand(tiny, hub, "a")
    hand_total, omnigym_total = 0.0, 0.0
    clipped = 0
    for datum, out in zip(data, result.outputs):
        logp = hand_logprobs(reference, datum)
        torch.testing.assert_close(out["logprobs"], logp, atol=1e-5, rtol=1e-5)
        q, adv = datum.inputs["logprobs"], datum.inputs["advantages"]
        ratio = (logp - q).exp()
        if loss == "ppo":
            hand = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
            clipped += int(((ratio < 0.8) | (ratio > 1.2)).sum())
            cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.2)
        else:
            hand = -ratio * adv
            cfg = PolicyLossConfig(clip_low=1e9, clip_high=1e9)  # a clip that never bites: plain IS
        hand_total += float(hand.sum())
        mean, _ = ppo_clip(logp, q, adv, None, cfg)  # omnigym's token mean, times the tokens = the sum
        omnigym_total += float(mean) * len(logp)
        torch.testing.assert_close(out["elementwise_loss"], hand, atol=1e-5, rtol=1e-5)
    assert math.isclose(result.metrics["loss:sum"], hand_total, rel_tol=1e-5, abs_tol=1e-5)
    assert math.isclose(result.metrics["loss:sum"], omnigym_total, rel_tol=1e-5, abs_tol=1e-5)
    if loss == "ppo":
        assert clipped > 0  # the data reach the clip, so the check covers it


def test_ppo_thresholds_come_from_loss_fn_config(hub):
    hub.create_model("a", 4)
    data = rl_batch(hub, "a")
    wide = hub.forward_backward("a", data, "ppo", {"clip_low_threshold": 0.0, "clip_high_threshold": 1e9},
                                forward_only=True)
    plain = hub.forward_backward("a", data, "importance_sampling", forward_only=True)
    narrow = hub.forward_backward("a", data, "ppo", forward_only=True)
    assert math.isclose(wide.metrics["loss:sum"], plain.metrics["loss:sum"], rel_tol=1e-6)
    assert not math.isclose(narrow.metrics["loss:sum"], plain.metrics["loss:sum"], rel_tol=1e-3)


def test_cispo_dro_gspo_follow_their_definitions(hub):
    hub.create_model("a", 4, seed=2)
    train(hub, "a", 1)
    data = rl_batch(hub, "a", seed=1)
    for loss, config in (("cispo", {}), ("dro", {"beta": 0.3}), ("gspo", {})):
        result = hub.forward_backward("a", data, loss, config, forward_only=True)
        total = 0.0
        for datum, out in zip(data, result.outputs):
            logp, q, adv = out["logprobs"], datum.inputs["logprobs"], datum.inputs["advantages"]
            if loss == "cispo":
                hand = -(logp - q).exp().clamp(0.8, 1.2) * logp * adv
            elif loss == "dro":
                hand = -(logp * adv - 0.15 * (logp - q) ** 2)
            else:
                in_ratio = adv != 0
                s = ((logp - q)[in_ratio].mean()).exp()
                hand = -torch.minimum(s * adv, s.clamp(0.8, 1.2) * adv)
            total += float(hand.sum())
        assert math.isclose(result.metrics["loss:sum"], total, rel_tol=1e-5, abs_tol=1e-5), loss


def test_gradients_accumulate_over_calls_and_forward_only_makes_none(hub):
    hub.create_model("a", 4, seed=1)
    train(hub, "a", 1)
    first, second = batch(1), batch(2)
    hub.forward_backward("a", first + second, "cross_entropy", forward_only=True)
    assert all(p.grad is None for p in hub._runs["a"].params)
    hub.forward_backward("a", first + second, "cross_entropy")
    together = [p.grad.clone() for p in hub._runs["a"].params]
    for p in hub._runs["a"].params:
        p.grad = None
    hub.forward_backward("a", first, "cross_entropy")
    hub.forward_backward("a", second, "cross_entropy")
    for x, p in zip(together, hub._runs["a"].params):
        torch.testing.assert_close(p.grad, x, atol=1e-5, rtol=1e-5)


def test_micro_batches_give_the_same_numbers_as_one_batch(tiny, tmp_path):
    small = ModelHub(tiny, tmp_path / "s", max_batch_tokens=16)
    large = ModelHub(tiny, tmp_path / "l")
    assert len(token_budget_batches([12, 7, 20], small.max_batch_tokens)) == 3
    assert len(token_budget_batches([12, 7, 20], large.max_batch_tokens)) == 1
    outs = []
    for h in (small, large):
        h.create_model("a", 4, seed=1)
        outs.append(h.forward_backward("a", batch(3), "cross_entropy"))
    for x, y in zip(*[o.outputs for o in outs]):
        torch.testing.assert_close(x["logprobs"], y["logprobs"], atol=1e-5, rtol=1e-5)
    for p, q in zip(small._runs["a"].params, large._runs["a"].params):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)


def test_recomputed_activations_give_the_same_numbers(tiny, tmp_path):
    """A micro-batch over the activation budget is trained with gradient checkpointing (a long
    multi-turn datum on SmolLM2 held 15.7 GB without it): the same log-probs and gradients."""
    recomputing = ModelHub(tiny, tmp_path / "r", activation_budget=0)
    keeping = ModelHub(tiny, tmp_path / "k")
    outs, kept = [], []
    for h in (recomputing, keeping):
        h.create_model("a", 4, seed=1)
        saved = []  # what autograd keeps for the backward pass outside checkpointed layers

        def pack(t):
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            outs.append(h.forward_backward("a", batch(3), "cross_entropy"))
        kept.append(sum(saved))
    assert kept[0] < kept[1] / 2, kept
    assert recomputing._adapters.activation_bytes(3, 20) > 0 == recomputing._adapters.activation_budget
    assert keeping._adapters.activation_bytes(3, 20) < keeping._adapters.activation_budget
    for x, y in zip(*[o.outputs for o in outs]):
        torch.testing.assert_close(x["logprobs"], y["logprobs"], atol=1e-5, rtol=1e-5)
    assert sum(float(p.grad.abs().sum()) for p in recomputing._runs["a"].params) > 0  # (A's is 0 while B is)
    for p, q in zip(recomputing._runs["a"].params, keeping._runs["a"].params):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    assert not recomputing._runs["a"].backend.model.training  # back in eval mode for the next forward


def test_adam_settings_apply_per_call(hub):
    hub.create_model("a", 4, seed=1)
    hub.forward_backward("a", batch(1), "cross_entropy")
    before = snapshot(hub, "a")
    metrics = hub.optim_step("a", AdamStep(learning_rate=0.0))
    assert metrics["grad_norm:mean"] > 0
    assert all(torch.equal(x, y) for x, y in zip(before, snapshot(hub, "a")))
    assert all(p.grad is None for p in hub._runs["a"].params)  # the step used them up

    def update(model_id, clip):
        hub.create_model(model_id, 4, seed=1)  # fresh Adam moments for each
        h_before = snapshot(hub, model_id)
        hub.forward_backward(model_id, batch(2), "cross_entropy")
        hub.optim_step(model_id, AdamStep(learning_rate=1e-2, eps=1.0, grad_clip_norm=clip))
        return sum(float((x - y).norm()) for x, y in zip(snapshot(hub, model_id), h_before))

    # eps=1 makes Adam's step grow with the gradient, so clipping it to 1e-4 must shrink the step
    assert update("clipped", 1e-4) < 0.01 * update("free", 0.0)
    assert hub._runs["clipped"].optimizer.param_groups[0]["eps"] == 1.0


def test_refused_requests_say_why_and_change_nothing(hub):
    hub.create_model("a", 4, seed=1)
    good = batch(1)
    before = snapshot(hub, "a")
    vocab = hub.vocab_size
    short_targets = DatumIn(good[0].tokens, {"target_tokens": torch.tensor(good[0].tokens[:-2]),
                                            "weights": torch.ones(len(good[0].tokens) - 2)})
    cases = [
        (lambda: hub.forward_backward("nobody", good, "cross_entropy"), "unknown model id"),
        (lambda: hub.forward_backward("a", good, "hinge"), "unknown loss 'hinge'.*cross_entropy.*ppo"),
        (lambda: hub.forward_backward("a", good, "stable_reinforce"), "not supported"),
        (lambda: hub.forward_backward("a", good + [short_targets], "cross_entropy"), "datum 3: target_tokens"),
        (lambda: hub.forward_backward("a", [DatumIn(good[0].tokens, {"target_tokens": good[0].inputs[
            "target_tokens"], "logprobs": torch.zeros(12)})], "ppo"), "lacks advantages"),
        (lambda: hub.forward_backward("a", good + [sl_datum([5, vocab, 6])], "cross_entropy"),
         f"token id {vocab} is outside"),
        (lambda: hub.forward_backward("a", [sl_datum([5, 6, 7], [1.0, float("nan"), 1.0])], "cross_entropy"), "NaN"),
        (lambda: hub.forward_backward("a", [sl_datum(list(range(7, 7 + 300)))], "cross_entropy"), "longer than"),
        (lambda: hub.forward_backward("a", good, "ppo", {"clip": 0.3}), "unknown key"),
        (lambda: hub.forward_backward("a", [], "cross_entropy"), "no data"),
        (lambda: hub.optim_step("a", AdamStep(learning_rate=float("nan"))), "finite"),
        (lambda: hub.optim_step("a", AdamStep(beta1=1.5)), "beta1"),
        (lambda: hub.load("a", "a", "nothing", True), "no saved state"),
        (lambda: hub.save("a", "../../etc", "state"), "valid name"),
        (lambda: hub.sample(SamplerSource("a", "nothing"), [5, 6], 1, SampleParams()), "no sampler weights"),
        (lambda: hub.sample(SamplerSource(), [5, vocab + 3], 1, SampleParams()), "outside the vocabulary"),
        (lambda: hub.sample(SamplerSource(), [5, 6], 1, SampleParams(max_tokens=1000)), "exceeds"),
    ]
    for call, message in cases:
        with pytest.raises(RequestError, match=message) as caught:
            call()
        assert caught.value.status in (400, 404, 413)
        assert all(p.grad is None for p in hub._runs["a"].params), message
    assert all(torch.equal(x, y) for x, y in zip(before, snapshot(hub, "a")))
    assert not list((hub.root / "models").glob("a/state/*"))
    # and the hub still works
    assert hub.forward_backward("a", good, "cross_entropy").metrics["loss:sum"] > 0


def test_inputs_that_overflow_and_steps_that_overflow_leave_the_run_as_it_was(hub):
    """Finite inputs passed the NaN check: weights of 1e38 made the loss inf and its NaN gradients went into the
    next optim_step, whose metrics the SDK could not parse (JSON NaN), and every later sample came from NaN
    weights. A learning rate of 1e39 overflowed the weights in one step."""
    hub.create_model("a", 4, seed=1)
    good = batch(1)
    hub.forward_backward("a", good, "cross_entropy")
    gathered = [p.grad.clone() for p in hub._runs["a"].params]
    weights = snapshot(hub, "a")
    tokens = good[0].tokens
    n = len(tokens)
    overflowing = [  # each after a datum that is fine
        ([*good, sl_datum(tokens, [1e38] * n)], "cross_entropy"),
        ([rl_datum(tokens, [-1.0] * n, [1.0] * n), rl_datum(tokens, [-1e30] * n, [1.0] * n)], "importance_sampling"),
    ]
    for data, loss in overflowing:
        for forward_only in (False, True):
            with pytest.raises(RequestError, match="the loss or its gradients are not finite"):
                hub.forward_backward("a", data, loss, forward_only=forward_only)
            assert all(torch.equal(p.grad, g) for p, g in zip(hub._runs["a"].params, gathered))  # as before the call
    with pytest.raises(RequestError, match="learning_rate 1e[+]?39 made the weights overflow float32: the step was undone"):
        hub.optim_step("a", AdamStep(learning_rate=1e39))
    assert all(torch.equal(x, y) for x, y in zip(weights, snapshot(hub, "a"))) and hub._runs["a"].steps == 0
    # what was kept trains on: finite metrics, and the same step as a run that never met the bad requests
    hub.forward_backward("a", good, "cross_entropy")
    metrics = hub.optim_step("a", AdamStep(learning_rate=1e-2))
    assert all(math.isfinite(v) for v in metrics.values()) and metrics["step:max"] == 1
    hub.create_model("b", 4, seed=1)
    hub.forward_backward("b", good, "cross_entropy")
    hub.optim_step("b", AdamStep(learning_rate=1e-2))
    assert all(torch.equal(x, y) for x, y in zip(snapshot(hub, "a"), snapshot(hub, "b")))


def test_save_state_and_load_resume_exactly(hub):
    hub.create_model("a", 4, seed=1)
    train(hub, "a", 2)
    hub.save("a", "ckpt", "state")
    folder = hub.root / "models" / "a" / "state" / "ckpt"
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.json", "adapter.safetensors", "optimizer.pt"]
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporaries left
    train(hub, "a", 3, seed=10)
    continued = snapshot(hub, "a")

    hub.load("a", "a", "ckpt", with_optimizer=True)
    assert hub._runs["a"].steps == 2
    train(hub, "a", 3, seed=10)
    assert all(torch.equal(x, y) for x, y in zip(continued, snapshot(hub, "a")))

    hub.load("b", "a", "ckpt", with_optimizer=True)  # a new run from the checkpoint
    train(hub, "b", 3, seed=10)
    assert all(torch.equal(x, y) for x, y in zip(continued, snapshot(hub, "b")))

    hub.load("c", "a", "ckpt", with_optimizer=False)  # same weights, a fresh optimizer
    assert hub._runs["c"].steps == 0 and not hub._runs["c"].optimizer.state
    train(hub, "c", 3, seed=10)
    assert not all(torch.equal(x, y) for x, y in zip(continued, snapshot(hub, "c")))

    hub.save("a", "ckpt", "state")  # overwriting a checkpoint replaces it whole
    assert (folder / "optimizer.pt").is_file()
    hub.create_model("r8", 8)
    with pytest.raises(RequestError, match="rank 4"):
        hub.load("r8", "a", "ckpt", True)


def test_sampling_base_and_saved_weights_match_the_model_they_name(tiny, hub):
    hub.create_model("a", 4, seed=1)
    train(hub, "a", 3, lr=3e-2)
    hub.save("a", "w1", "sampler")
    assert sorted(p.name for p in (hub.root / "models/a/sampler/w1").iterdir()) == ["adapter.json",
                                                                                    "adapter.safetensors"]
    prompt = [10, 20, 30, 40]
    params = SampleParams(max_tokens=12, seed=5, prompt_logprobs=True)
    tuned = hub.sample(SamplerSource("a", "w1"), prompt, 3, params)
    base = hub.sample(SamplerSource(), prompt, 3, params)
    assert len(tuned.sequences) == 3
    for result, reference in ((tuned, merged_by_hand(tiny, hub, "a")), (base, load_model(tiny).eval())):
        for seq in result.sequences:
            assert 1 <= len(seq.tokens) <= 12 and len(seq.logprobs) == len(seq.tokens)
            assert seq.stop_reason == ("length" if len(seq.tokens) == 12 else "stop")
            datum = DatumIn(prompt + seq.tokens[:-1], {"target_tokens": torch.tensor(prompt[1:] + seq.tokens)})
            expected = hand_logprobs(reference, datum)
            torch.testing.assert_close(torch.tensor(seq.logprobs), expected[len(prompt) - 1:], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(torch.tensor(result.prompt_logprobs[1:]), expected[:len(prompt) - 1],
                                       atol=1e-4, rtol=1e-4)
        assert result.prompt_logprobs[0] is None
    again = hub.sample(SamplerSource("a", "w1"), prompt, 3, params)
    assert [s.tokens for s in again.sequences] == [s.tokens for s in tuned.sequences]
    other = hub.sample(SamplerSource("a", "w1"), prompt, 3, SampleParams(max_tokens=12, seed=6))
    assert [s.tokens for s in other.sequences] != [s.tokens for s in tuned.sequences]
    unseeded = [[s.tokens for s in hub.sample(SamplerSource("a", "w1"), prompt, 3,
                                              SampleParams(max_tokens=12)).sequences] for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # no seed: a fresh draw each call, not a replay of the last
    # training on after saving does not change what the saved weights sample
    train(hub, "a", 1)
    assert [s.tokens for s in hub.sample(SamplerSource("a", "w1"), prompt, 3, params).sequences] == \
        [s.tokens for s in tuned.sequences]


def test_stop_tokens_strings_and_length(hub):
    prompt = [10, 20, 30]
    greedy = hub.sample(SamplerSource(), prompt, 1, SampleParams(max_tokens=8, temperature=0.0)).sequences[0]
    assert greedy.stop_reason in ("length", "stop") and len(greedy.tokens) <= 8
    full = greedy.tokens
    if len(full) < 4:
        pytest.skip("the tiny model's greedy answer ended early")
    by_token = hub.sample(SamplerSource(), prompt, 1, SampleParams(max_tokens=8, temperature=0.0,
                                                                   stop_tokens=[full[2]])).sequences[0]
    cut = full.index(full[2]) + 1
    assert by_token.tokens == full[:cut] and by_token.stop_reason == "stop"
    text = hub.tokenizer.decode(full[2:4])  # a stop string in the middle of the answer
    by_string = hub.sample(SamplerSource(), prompt, 1, SampleParams(max_tokens=8, temperature=0.0,
                                                                    stop_strings=["never there", text])).sequences[0]
    first = next(i for i in range(1, len(full) + 1) if text in hub.tokenizer.decode(full[:i]))
    assert by_string.tokens == full[:first] and by_string.stop_reason == "stop"
    assert hub.tokenizer.decode(by_string.tokens).endswith(text)
    one = hub.sample(SamplerSource(), prompt, 2, SampleParams(max_tokens=1)).sequences
    assert len(one) == 2 and all(len(s.tokens) == 1 for s in one)


def test_drop_frees_the_adapter_and_keeps_the_others(hub):
    hub.create_model("a", 4, seed=1)
    hub.create_model("b", 4, seed=2)
    adapter, kept = hub._runs["a"].adapter, hub._runs["b"].backend.model
    hub.drop("a")
    assert adapter not in hub._adapters.adapters and list(hub._adapters.adapters) == [hub._runs["b"].adapter]
    assert not any(f".{adapter}." in n for n, _ in kept.named_parameters())
    with pytest.raises(RequestError, match="unknown model id") as caught:
        hub.optim_step("a", AdamStep())
    assert caught.value.status == 404
    train(hub, "b", 1)
    hub.drop("b")
    hub.create_model("a", 4, seed=1)  # the id can be used again, from a clean adapter
    train(hub, "a", 1)


def test_two_runs_interleaved_end_as_each_trained_alone(tiny, tmp_path):
    """Many users on one base model: two runs whose calls alternate end bit for bit where each
    ends when trained alone in a hub of its own (same seeds, same data)."""
    runs = (("a", 1, 4), ("b", 2, 8))

    def step(h, model_id, seed, k):
        h.forward_backward(model_id, batch(seed + k), "cross_entropy")
        h.optim_step(model_id, AdamStep(learning_rate=1e-2))

    alone = {}
    for model_id, seed, rank in runs:
        h = ModelHub(tiny, tmp_path / f"alone-{model_id}")
        h.create_model(model_id, rank, seed=seed)
        start = snapshot(h, model_id)
        for k in range(3):
            step(h, model_id, seed, k)
        alone[model_id] = snapshot(h, model_id)
        assert not all(torch.equal(x, y) for x, y in zip(start, alone[model_id]))  # it did train
    shared = ModelHub(tiny, tmp_path / "shared")
    for model_id, seed, rank in runs:
        shared.create_model(model_id, rank, seed=seed)
    for k in range(3):
        for model_id, seed, _ in runs:
            step(shared, model_id, seed, k)
    for model_id, _, _ in runs:
        assert all(torch.equal(x, y) for x, y in zip(alone[model_id], snapshot(shared, model_id))), model_id


def test_top_k_targets_give_one_logprob_per_target(tiny, hub):
    """cross_entropy with (n, k) targets and weights (the cookbook's top-k distillation): an
    (n, k) log-prob per datum and the loss -sum(weights * logp) over all of them."""
    hub.create_model("a", 4, seed=1)
    tokens = [10, 11, 12, 13, 14]
    targets = torch.tensor([[11, 30, 40], [12, 31, 41], [13, 32, 42], [14, 33, 43], [2, 34, 44]])
    weights = torch.tensor([[0.7, 0.2, 0.1]] * 5)
    result = hub.forward_backward("a", [DatumIn(tokens, {"target_tokens": targets, "weights": weights})],
                                  "cross_entropy")
    with torch.no_grad():
        logits = load_model(tiny)(torch.tensor([tokens])).logits[0]
    expected = torch.log_softmax(logits, -1).gather(-1, targets)
    assert result.outputs[0]["logprobs"].shape == (5, 3)
    torch.testing.assert_close(result.outputs[0]["logprobs"], expected, atol=1e-5, rtol=1e-5)
    assert math.isclose(result.metrics["loss:sum"], float(-(weights * expected).sum()), rel_tol=1e-5)
    with pytest.raises(RequestError, match="one value per target"):
        hub.forward_backward("a", [DatumIn(tokens, {"target_tokens": targets, "weights": torch.ones(5)})],
                             "cross_entropy")


def test_a_save_that_fails_leaves_the_old_checkpoint_whole(hub, monkeypatch):
    hub.create_model("a", 4, seed=1)
    train(hub, "a", 1)
    hub.save("a", "ckpt", "state")
    folder = hub.root / "models" / "a" / "state" / "ckpt"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    train(hub, "a", 1)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)  # the optimizer file, written after the adapter
    with pytest.raises(OSError):
        hub.save("a", "ckpt", "state")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in folder.parent.iterdir()) == ["ckpt"]  # no temporary folder left
