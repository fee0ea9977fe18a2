"""--precision bf16 (models/precision.py): every forward of the model in bfloat16 autocast, the
weights in float32; the samplers run the products as the trainer's forward does."""

import copy

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from omnigym.inference import make_engine  # noqa: E402
from omnigym.inference.engine import SamplingParams  # noqa: E402
from omnigym.models.lm import build_tiny_model, load_model, load_tokenizer  # noqa: E402
from omnigym.models.precision import autocast_for, compute_in, precision_of  # noqa: E402
from omnigym.models.tokens import completion_logprobs, make_completion_batch  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def test_every_forward_runs_in_bf16_and_autocast_ends_with_it(folder):
    model = load_model(folder)
    ids = torch.randint(5, 100, (2, 12))
    exact = model(input_ids=ids).logits
    assert compute_in(model, "fp32") is model and precision_of(model) == "fp32"
    compute_in(model, "bf16")
    out = model(input_ids=ids).logits
    assert out.dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu")
    assert torch.allclose(out.float(), exact, atol=0.05) and not torch.equal(out.float(), exact)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    with pytest.raises(IndexError):  # a forward that raises still leaves autocast off after it
        model(input_ids=torch.tensor([[10 ** 9]]))
    assert not torch.is_autocast_enabled("cpu")
    twin = copy.deepcopy(model)  # a reference made by frozen_copy scores in the policy's precision
    assert precision_of(twin) == "bf16" and torch.equal(twin(input_ids=ids).logits, out)
    compute_in(model, "bf16")  # twice is once: one autocast region a forward
    assert torch.equal(model(input_ids=ids).logits, out)
    from omnigym.errors import OmnigymError

    with pytest.raises(OmnigymError, match="unknown precision 'fp16'"):
        compute_in(load_model(folder), "fp16")


@pytest.mark.parametrize("engine", ["kv", "hf"])
def test_the_samplers_record_what_the_bf16_forward_computes(folder, engine):
    """Each engine's recorded log-probs are those of the trainer's bf16 forward on the same tokens,
    within bf16's rounding (float32: exactly, tests/test_sampled_logprobs.py), and a bf16 sample
    is not a float32 one: the products did change."""
    tokenizer = load_tokenizer(folder)
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    drawn = {}
    for precision in ("fp32", "bf16"):
        model = compute_in(load_model(folder), precision)
        torch.manual_seed(0)
        samples = make_engine(model, tokenizer, engine).generate([[5, 6, 7, 8], [9, 10]], 3, params)
        rows = [s for group in samples for s in group]
        batch = make_completion_batch([s.prompt_ids for s in rows], [s.completion_ids for s in rows],
                                      tokenizer.pad_token_id)
        with torch.no_grad():
            recomputed = completion_logprobs(model, batch)
        gap = max((recomputed[i, :len(s.logprobs)] - torch.tensor(s.logprobs)).abs().max().item()
                  for i, s in enumerate(rows))
        assert gap < (1e-4 if precision == "fp32" else 0.05), (precision, gap)
        drawn[precision] = [s.logprobs for s in rows]
        assert not torch.is_autocast_enabled("cpu")
    assert drawn["fp32"] != drawn["bf16"]


def test_autocast_for_is_a_region_only_for_a_bf16_model(folder):
    model = load_model(folder)
    with autocast_for(model):
        assert not torch.is_autocast_enabled("cpu")
    with autocast_for(compute_in(model, "bf16")):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_a_frozen_reference_stores_its_weights_in_bf16_and_scores_as_the_policy(folder):
    """A reference (frozen_copy) is not in autocast's weight cache: its linear weights are cast
    to bf16 once. Autocast rounds the policy's the same way, so the two score alike, to the bit;
    a head tied to the input embedding stays float32 for the lookup."""
    from omnigym.backends.local import frozen

    policy = compute_in(load_model(folder), "bf16")
    reference = frozen(copy.deepcopy(policy))
    tied = reference.get_input_embeddings().weight
    linear = [m for m in reference.modules() if isinstance(m, torch.nn.Linear)]
    assert linear and all(m.weight.dtype == (torch.float32 if m.weight is tied else torch.bfloat16) for m in linear)
    ids = torch.randint(5, 100, (3, 9))
    with torch.no_grad():
        assert torch.equal(reference(input_ids=ids).logits, policy(input_ids=ids).logits)
    plain = frozen(copy.deepcopy(load_model(folder)))  # float32 runs keep float32 references
    assert all(p.dtype == torch.float32 for p in plain.parameters())
