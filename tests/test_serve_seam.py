"""The pieces ``omnigym serve`` now trains through, shared with ``omnigym train``: the Tinker
losses as ``rl/losses.py``'s per-token objectives with Tinker's conventions (against hand
computations, values and gradients), ``models.tokens.target_logprobs`` and its micro-batches,
``optim.adamw`` over a list of parameters, and the several-adapters backend
(``backends/lora.py``)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from omnigym.backends.lora import LoRAAdapters, linear_layers  # noqa: E402
from omnigym.models.lm import build_tiny_model, load_model  # noqa: E402
from omnigym.models.tokens import make_sequence_batch, target_logprobs, token_budget_batches  # noqa: E402
from omnigym.optim import adamw  # noqa: E402
from omnigym.rl.losses import PolicyLossConfig, aggregate, clipped_surrogate, ppo_clip  # noqa: E402
from omnigym.serve.contract import RequestError  # noqa: E402
from omnigym.serve.losses import LOSSES, loss_spec  # noqa: E402


def rl_inputs(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = -torch.rand(n, generator=g) * 3
    logp = (q + 0.5 * torch.randn(n, generator=g)).clamp(max=-1e-3).requires_grad_()
    adv = torch.randn(n, generator=g)
    adv[:4] = 0.0  # prompt positions
    return logp, {"logprobs": q, "advantages": adv}


def hand(name, logp, q, adv, low=0.8, high=1.2, beta=0.05):
    """Tinker's documented definitions, written out term by term."""
    r = torch.exp(logp - q)
    if name == "importance_sampling":
        return -(r * adv)
    if name == "ppo":
        return -torch.min(r * adv, torch.clamp(r, low, high) * adv)
    if name == "cispo":
        return -(torch.clamp(r, low, high).detach() * logp * adv)
    if name == "dro":
        return -(logp * adv - beta / 2 * (logp - q) ** 2)
    keep = adv != 0  # gspo: the sequence ratio over the positions with an advantage
    s = torch.exp((logp.detach() - q)[keep].sum() / keep.sum()) * torch.exp(logp - logp.detach())
    return -torch.min(s * adv, torch.clamp(s, low, high) * adv)


@pytest.mark.parametrize("name,config", [("importance_sampling", {}), ("ppo", {}),
                                         ("ppo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}),
                                         ("cispo", {"clip_low_threshold": 0.9}), ("dro", {"beta": 0.3}),
                                         ("gspo", {})])
def test_tinker_losses_are_the_hand_computation_summed_values_and_gradients(name, config):
    spec, cfg = loss_spec(name, config)
    logp, inputs = rl_inputs()
    loss, elementwise, _ = spec.fn(logp, inputs, cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    expected = hand(name, logp, inputs["logprobs"], inputs["advantages"], cfg.get("clip_low_threshold", 0.8),
                    cfg.get("clip_high_threshold", 1.2), cfg.get("beta", 0.05))
    (expected_grad,) = torch.autograd.grad(expected.sum(), logp)
    torch.testing.assert_close(elementwise, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss, expected.sum(), atol=1e-5, rtol=1e-6)  # a sum over tokens, not a mean
    torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-6)


def test_ppo_bounds_clip_and_report_the_clipped_fraction():
    logp, inputs = rl_inputs(seed=1)
    spec, cfg = loss_spec("ppo", {})
    _, _, metrics = spec.fn(logp, inputs, cfg)
    r, adv = torch.exp(logp - inputs["logprobs"]).detach(), inputs["advantages"]
    took = ((r > 1.2) & (adv > 0)) | ((r < 0.8) & (adv < 0))  # the clipped term is the smaller one
    assert 0 < int(took.sum()) < len(r)
    assert metrics["clip_fraction:mean"] == pytest.approx(float(took.float().mean()))
    loss, _, _ = spec.fn(logp, inputs, cfg)
    (grad,) = torch.autograd.grad(loss, logp)
    assert bool((grad[took] == 0).all()) and bool((grad[~took & (adv != 0)] != 0).all())


def test_the_trainers_ppo_clip_is_the_same_objective_with_epsilons():
    """omnigym train's ppo_clip (epsilon 0.2, token mean) and Tinker's ppo (bounds 0.8/1.2, token
    sum) are one per-token objective under two reductions."""
    logp, inputs = rl_inputs(seed=2)
    q, adv = inputs["logprobs"], inputs["advantages"]
    tinker, elementwise, _ = LOSSES["ppo"].fn(logp, inputs, dict(loss_spec("ppo", {})[1]))
    mean, stats = ppo_clip(logp, q, adv, None, PolicyLossConfig(clip_low=0.2))
    torch.testing.assert_close(mean * len(logp), tinker, atol=1e-5, rtol=1e-6)
    per_token, took = clipped_surrogate((logp - q).exp(), adv, 0.8, 1.2)
    assert torch.equal(per_token, elementwise)
    assert float(stats["clipped_objective_fraction"]) == pytest.approx(float(took.float().mean()))
    mask = (adv != 0).float()
    summed = aggregate(per_token.detach(), mask, "token-sum")
    assert float(summed) == pytest.approx(float(per_token.detach()[mask.bool()].sum()))


def test_tinker_loss_config_is_checked():
    with pytest.raises(RequestError, match="bounds of the probability ratio"):
        LOSSES["ppo"].fn(*rl_inputs(), loss_spec("ppo", {"clip_low_threshold": 1.1})[1])
    with pytest.raises(RequestError, match="unknown key"):
        loss_spec("dro", {"clip_low_threshold": 0.5})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0))


def test_target_logprobs_of_a_padded_batch_equal_each_sequence_alone(tiny):
    model = load_model(tiny).eval()
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(7, 100, (n,), generator=g) for n in (9, 3, 14)]
    targets = [torch.randint(7, 100, (9,), generator=g), torch.randint(7, 100, (3, 4), generator=g),
               torch.randint(7, 100, (14,), generator=g)]
    batch = make_sequence_batch([(r.tolist(), [0] * len(r)) for r in rows], 0)
    with torch.no_grad():
        got = target_logprobs(model, batch, targets)
        for ids, wanted, out in zip(rows, targets, got):
            logits = model(input_ids=ids[None]).logits[0].float()
            expected = torch.log_softmax(logits, -1).gather(-1, wanted.view(len(ids), -1)).view(wanted.shape)
            assert out.shape == wanted.shape
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_token_budget_batches_keep_order_and_the_budget():
    assert token_budget_batches([12, 7, 20], 2048) == [[0, 1, 2]]
    assert token_budget_batches([12, 7, 20], 16) == [[0], [1], [2]]
    assert token_budget_batches([4, 4, 4, 9], 12) == [[0, 1, 2], [3]]  # 3 x 4 fits; 9 widens to 4 x 9
    assert token_budget_batches([], 8) == []


def test_adamw_over_a_parameter_list_takes_it_as_given_and_matches_torchs():
    """Given parameters, not a module: kept whether or not they require grad now (peft turns it on
    for the active adapter only); the fused kernel agrees with torch's loop to float rounding."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(8, 4, generator=g), torch.randn(4, generator=g)]
    ours = [torch.nn.Parameter(w.clone(), requires_grad=False) for w in weights]
    theirs = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = adamw(ours, 1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-12)
    ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-12, foreach=False)
    assert len(opt.param_groups[0]["params"]) == 2 and opt.param_groups[0]["eps"] == 1e-12
    for step in range(5):
        grads = [torch.randn(w.shape, generator=g) for w in weights]
        for p, q, grad in zip(ours, theirs, grads):
            p.grad, q.grad = grad.clone(), grad.clone()
        opt.step()
        ref.step()
    for p, q, w in zip(ours, theirs, weights):
        assert not torch.equal(p, w)
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


def make_adapters(tiny):
    adapters = LoRAAdapters(load_model(tiny))
    layers = linear_layers(adapters.base)
    targets = sorted(layers["attn"] | layers["mlp"])
    a = adapters.add("a", 4, 32, targets, seed=1, make_optimizer=lambda ps: adamw(ps, 1e-3))
    b = adapters.add("b", 2, 32, sorted(layers["mlp"]), seed=2, make_optimizer=lambda ps: adamw(ps, 1e-2))
    return adapters, a, b


def nll(model, batch):
    logp = target_logprobs(model, batch, [batch.input_ids[0, 1:]])[0]
    return -logp.sum(), {}


def test_each_adapter_trains_its_own_parameters_alone(tiny):
    adapters, a, b = make_adapters(tiny)
    lora = {id(p) for p in a.params + b.params}
    for model in (a.model, b.model):  # base frozen
        assert not any(p.requires_grad for p in model.parameters() if id(p) not in lora)
    # each adapter's own modules over the one copy of the base weights
    assert {p.data_ptr() for p in a.model.get_base_model().parameters() if id(p) not in lora} == \
        {p.data_ptr() for p in adapters.base.parameters()}
    batch = make_sequence_batch([([5, 9, 13, 17, 21, 25], [0] * 6)], 0)
    b_before = [p.detach().clone() for p in b.params]
    first, _ = a.forward(batch, nll)
    for _ in range(3):
        a.forward_backward(batch, nll)
        assert all(p.grad is None for p in b.params)
        grads = [p.grad.clone() for p in a.params if p.grad is not None]
        norm = a.optim_step()["grad_norm"]
        torch.testing.assert_close(norm, torch.linalg.vector_norm(torch.cat([x.flatten() for x in grads])), rtol=1e-5,
                                   atol=0)
    assert all(torch.equal(x, y) for x, y in zip(b_before, b.params))
    after, _ = a.forward(batch, nll)
    assert float(after) < float(first) - 1  # it learned the sequence
    b_loss, _ = b.forward(batch, nll)  # b's passes leave a's adapter out
    assert float(b_loss) != float(after)
    a.max_grad_norm = 1e-3
    a.forward_backward(batch, nll)
    before = [p.grad.clone() for p in a.params if p.grad is not None]
    raw = a.optim_step()["grad_norm"]
    assert float(raw) > 1e-3 and float(torch.linalg.vector_norm(torch.cat([x.flatten() for x in before]))) == \
        pytest.approx(float(raw), rel=1e-5)


def test_adapter_state_round_trips_and_frozen_copy_is_the_adapter_merged(tiny):
    adapters, a, b = make_adapters(tiny)
    batch = make_sequence_batch([([5, 9, 13, 17, 21, 25], [0] * 6)], 0)
    a.forward_backward(batch, nll)
    a.optim_step()
    state = a.state_dict()
    assert sorted(state["model"]) == sorted(a.names) and state["optimizer"]["state"]
    a.forward_backward(batch, nll)
    a.optim_step()
    a.load_state_dict({"model": state["model"], "optimizer": None})  # weights back, a fresh optimizer
    assert not a.optimizer.state and all(torch.equal(p, state["model"][n]) for n, p in zip(a.names, a.params))
    a.load_state_dict(state)
    assert len(a.optimizer.state) == len(state["optimizer"]["state"])
    merged = a.frozen_copy()
    with torch.no_grad():
        own, _ = a.forward(batch, nll)
        plain, _ = nll(merged, batch)
    assert isinstance(merged, type(adapters.base)) and not hasattr(merged, "peft_config")
    torch.testing.assert_close(plain, own, atol=1e-4, rtol=1e-5)
    adapters.remove("a")
    assert list(adapters.adapters) == ["b"]
