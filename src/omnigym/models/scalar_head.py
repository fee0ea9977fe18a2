"""A causal LM backbone with a scalar head: the reward model and the value model of RLHF.

Both are ``AutoModelForSequenceClassification`` with one label (``score``, a linear layer
on the last hidden state), as in TRL and OpenRLHF, so they save and load like any Hugging
Face model. omnigym reads the head itself rather than through the class's own pooling:

- ``token_values``: the head at every position, ``[B, L]`` (the value model's V(s_t));
- ``sequence_scores``: the head at each row's last real token, found from the attention
  mask (the reward model's r(x, y)). The class's pooling looks for the last token that is
  not the pad id, which is wrong when the pad token is the end-of-sequence token, as it is
  for most chat models.

A trained reward model is a folder (``save_reward_model``): the model, its tokenizer and
``omnigym_reward.json`` (how its inputs are rendered). ``rewards/reward_model.py`` scores
completions with it (``--rewards rm:RUN_DIR``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnigym.errors import OmnigymError, missing_extra
from omnigym.models.lm import LOAD_ERRORS, REWARD_MODEL_MARKER, check_model_folder, first_line
from omnigym.models.tokens import make_completion_batch, make_sequence_batch, shared_prefix_forward

MARKER = REWARD_MODEL_MARKER


def load_scalar_model(name_or_path: str, pad_token_id: int, lora_r: int = 0, device: str = "cpu",
                      zero_head: bool = False):
    """A one-label sequence-classification model on the backbone in ``name_or_path``; a folder
    saved from a causal LM gets a new head (initialised from the seeded torch RNG, or to zero
    with ``zero_head``)."""
    import transformers

    try:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(name_or_path, num_labels=1,
                                                                                dtype=torch.float32)
    except LOAD_ERRORS as exc:
        raise OmnigymError(f"cannot load {name_or_path!r} with a scalar head: {first_line(exc)}") from None
    model.config.pad_token_id = pad_token_id
    score = head(model)  # refuses a model class without a ``score`` layer now, not at the first batch
    if zero_head:
        torch.nn.init.zeros_(score.weight)
    model.to(device)
    if lora_r > 0:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise missing_extra("peft", "llm") from None
        # SEQ_CLS keeps the new head fully trainable (peft's modules_to_save) beside the adapters.
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=32, target_modules="all-linear",
                                                 task_type="SEQ_CLS"))
    return model


def _unwrapped(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def head(model):
    inner = _unwrapped(model)
    if not hasattr(inner, "score"):
        raise OmnigymError(f"{type(inner).__name__} has no 'score' head; reward and value models need a "
                           "decoder-only backbone (Llama, Qwen2, Mistral, GPT-2, ...)")
    return inner.score


def token_values(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids=None) -> torch.Tensor:
    """The scalar head at every position, ``[B, L]`` (float32)."""
    backbone = _unwrapped(model).base_model
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).last_hidden_state
    return head(model)(hidden).squeeze(-1).float()


def completion_values(model, batch) -> torch.Tensor:
    """The scalar head at every position of a ``CompletionBatch``'s reply part, ``[B, C]``:
    column t reads the prompt and the reply's first t tokens (V(s_t) before reply token t).
    Each distinct prompt runs once, its KV cache shared by its replies, as in
    ``models.tokens.completion_logprobs``."""
    return shared_prefix_forward(_unwrapped(model).base_model, batch,
                                 lambda output, _: head(model)(output.last_hidden_state).squeeze(-1).float())


def pair_scores(model, prompts: list[list[int]], replies: list[list[int]], pad_id: int, device) -> torch.Tensor:
    """The score of each prompt + reply at the reply's last token, ``[B]``, with each distinct
    prompt run once (the chosen and rejected replies of a pair share it). Prompts of fewer
    than 2 tokens take the plain right-padded path."""
    if min(map(len, prompts)) < 2:
        batch = make_sequence_batch([(p + r, [0] * len(p) + [1] * len(r)) for p, r in zip(prompts, replies)],
                                    pad_id, device)
        return sequence_scores(model, batch.input_ids, batch.attention_mask)
    # One placeholder token after each reply makes the reply's last token an input of the reply part.
    batch = make_completion_batch(prompts, [r + [pad_id] for r in replies], pad_id, device=device)
    values = completion_values(model, batch)
    return values[torch.arange(len(replies), device=values.device), torch.tensor([len(r) for r in replies],
                                                                                  device=values.device)]


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The scalar head at the last real token of each right-padded row, ``[B]``."""
    values = token_values(model, input_ids, attention_mask)
    last = attention_mask.sum(1) - 1
    return values[torch.arange(len(values), device=values.device), last]


def save_reward_model(folder: Path, model, tokenizer, info: dict) -> None:
    """The reward model as a plain Hugging Face folder (LoRA merged in) with its marker file."""
    from omnigym.track.model_folder import save_model_folder

    plain = _unwrapped(model.merge_and_unload()) if hasattr(model, "merge_and_unload") else model
    save_model_folder(plain, tokenizer, folder, {MARKER: json.dumps(info, indent=2)})  # whole or absent


def finish_reward_model(run, trainer, tokenizer, info: dict, metric: str, final: dict | None,
                        plot: bool) -> tuple[dict, Path | None]:
    """The end of a run that trained a reward model (``train rm``, ``train prm``): writes
    RUN_DIR/model with ``info`` and the final held-out ``metric`` in its marker, and closes the
    run. ``final``: the last evaluation's figures, None when a resumed run had no step left
    (it was resumed only to write model/ after a failed save): they are read back from
    metrics.jsonl. Returns them and the curve's path."""
    if final is None:
        from omnigym.track.files import read_metrics

        final = [row for row in read_metrics(run.dir) if metric in row][-1]
    whole = trainer.full_model()  # None in the other processes of a data-parallel run
    if whole is not None:
        with run.disk_faults():
            save_reward_model(run.dir / "model", whole, tokenizer,
                              {**info, f"heldout_{metric.split('/')[-1]}": final[metric]})
    return final, run.close(plot=plot, metric=metric)


def reward_model_folder(given: str, prefix: str = "rm:") -> Path:
    """The folder of a trained reward model: a ``train rm`` (``train prm`` for ``prefix``
    "prm:") run directory or its ``model/`` folder. Anything else is refused in one line,
    before any weights are read."""
    path, algo = Path(given).expanduser(), prefix.rstrip(":")
    if not given.strip():  # "" is Path("."): the reward model run the command stood in scored
        raise OmnigymError(f"{prefix} names no folder; give the run directory of `omnigym train {algo}`")
    for candidate in (path / "model", path):
        if (candidate / MARKER).is_file() and (candidate / "config.json").is_file():
            check_model_folder(f"{prefix}{given}", candidate)
            return candidate
    if not path.exists():
        raise OmnigymError(f"{prefix}{given}: no such folder; give the run directory of `omnigym train {algo}`")
    raise OmnigymError(f"{prefix}{given} is not a reward model (no model/{MARKER}); give the run directory of a "
                       f"finished `omnigym train {algo}`")


def read_reward_info(folder: Path) -> dict:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise OmnigymError(f"{folder / MARKER} cannot be read ({type(exc).__name__}); train the reward model again") from None
    if not isinstance(info, dict):
        raise OmnigymError(f"{folder / MARKER} is not a JSON object; train the reward model again")
    return info
