"""Supervised fine-tuning of a causal LM on demonstrations: the first stage of RLHF.

Each step draws ``batch_size`` examples (or packed blocks) and takes an AdamW step on the
mean negative log-likelihood of their trained tokens: the completion of a prompt/completion
row, the assistant turns of a conversation, every token of plain text
(``omnigym.tasks.sft_data`` reads the formats). Every ``eval_every`` steps the same loss on
the held-out examples is logged. ``omnigym train sft`` with no flags fine-tunes the built-in
tiny model on the arithmetic demonstrations that GRPO's demo warms up on.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_non_negative, require_positive
from omnigym.errors import OmnigymError
from omnigym.evaluation.text import SAMPLES_SHOWN
from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.tokens import batch_logprobs, local_batch, make_trained_batch
from omnigym.optim import adamw
from omnigym.process import scoped_run
from omnigym.rl.losses import check_finite, nll_loss
from omnigym.tasks.datasets import check_held_out, first_refusal
from omnigym.tasks.sft_data import pack, read_sft_rows, to_sequence, tokenize_rows
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.stopping import checkpoint_due
from omnigym.resources import check_language_batch
from omnigym.track.run import Run, start_run


@dataclass
class SFTConfig(LanguageModelConfig):
    data: str = "arithmetic"
    """a .jsonl file, a dataset folder or hub id that loads offline, or "arithmetic" (built in)"""
    split: str = "train"
    """the split to read from a dataset"""
    eval_size: int = 200
    """examples held out for eval/loss (never trained on)"""
    max_length: int = 256
    """tokens per example (longer ones are cut, and counted)"""
    completion_only: bool = True
    """loss on completions and assistant turns only (off: on every token)"""
    packing: bool = False
    """concatenate examples into blocks of max_length tokens (no padding)"""
    steps: int = 300
    batch_size: int = 16
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    eval_every: int = 50
    checkpoint_every: int = 100

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("data", "split", "eval_size", "max_length",
                                             "completion_only", "packing")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        require_positive(self, "steps", "batch_size", "learning_rate", "max_grad_norm", "eval_size", "max_length",
                         "eval_every")
        require_non_negative(self, "checkpoint_every")
        if self.max_length < 2:
            raise OmnigymError(f"--max-length must be at least 2 tokens, got {self.max_length}")


CONFIG = SFTConfig


@scoped_run
def train(cfg: SFTConfig) -> dict:
    from omnigym.models.lm import LoraSettings, check_max_length, load_policy_and_tokenizer

    rows = shuffled_rows(cfg)
    run = start_run(cfg, "sft", cfg.model)
    model, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                 cfg.device, need_chat_template=False)
    check_max_length(model, cfg.max_length)
    heldout, training, examples = tokenized_examples(cfg, rows, tokenizer)
    check_language_batch(f"--batch-size {cfg.batch_size}", min(cfg.batch_size, max(len(examples), 1)),
                         max((len(ids) for ids, _ in examples), default=1), model.config)
    trainer = make_backend(cfg, model, lambda m: adamw(m, cfg.learning_rate, weight_decay=0.01), cfg.max_grad_norm)
    components = {"trainer": trainer}
    step = run.begin(components).get("step", 0)
    model.train()  # as a new run's first evaluation leaves it: a resume loaded it in eval mode (no dropout)
    shown = shown_pairs(heldout.sequences)
    engine = make_engine(model, tokenizer) if shown else None
    evaluate = functools.partial(heldout_loss, cfg, model, heldout.sequences, tokenizer.pad_token_id)
    first_loss = evaluate() if step == 0 else None
    if step == 0:
        log_samples(run, engine, tokenizer, shown, 0)
        run.log(0, {"eval/loss": first_loss, "data/truncated": training.truncated + heldout.truncated,
                    "data/dropped": training.dropped + heldout.dropped, "data/train_examples": len(examples)})
    progress = ProgressBar(cfg.steps, "sft", start=step, enabled=cfg.progress)
    clock = Clock(step)
    while step < cfg.steps:
        # 1. A seeded draw of the step's examples, the same whether the run was resumed or not.
        batch, share = local_batch(trainer, step_examples(cfg, examples, step), tokenizer.pad_token_id, cfg.device)
        # 2. One AdamW step on the mean negative log-likelihood of their trained tokens.
        loss = trainer.forward_backward(batch, functools.partial(sft_loss, step=step), share)["loss"]
        trainer.optim_step()
        step += 1
        # 3. Log (the held-out loss and a few greedy replies every --eval-every), checkpoint.
        metrics = {"train/loss": loss.item(), "perf/steps_per_second": clock.sps(step)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics["eval/loss"] = evaluate()
            log_samples(run, engine, tokenizer, shown, step)
        run.log(step, metrics)
        progress.update(step, loss=loss.item())
        if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
            run.save(components, step=step)
    progress.close()
    final = evaluate()
    return finish(run, cfg, trainer.full_model(), tokenizer, first_loss, final,
                  training.truncated + heldout.truncated, training.dropped + heldout.dropped, len(rows))


def shuffled_rows(cfg: SFTConfig) -> list[dict]:
    """--data's rows in a seeded order; too few to hold --eval-size out is one line."""
    rows = read_sft_rows(cfg.data, cfg.split, cfg.seed)
    if not rows:  # it read "use --eval-size below 0"
        raise OmnigymError(f"--data {cfg.data} has no examples")
    check_held_out(f"--data {cfg.data}", len(rows), "examples", cfg.eval_size)
    random.Random(cfg.seed).shuffle(rows)
    return rows


def tokenized_examples(cfg: SFTConfig, rows: list[dict], tokenizer):
    """The held-out and the training examples tokenized, and what a step draws from: the
    training examples, or with --packing their blocks of --max-length tokens."""
    try:
        heldout = tokenize_rows(rows[:cfg.eval_size], tokenizer, cfg.max_length, cfg.completion_only, "held-out ")
        # Packing cuts the stream of whole examples into blocks; cutting each example first would lose its tail.
        training = tokenize_rows(rows[cfg.eval_size:], tokenizer, None if cfg.packing else cfg.max_length,
                                 cfg.completion_only, "training ")
    except OmnigymError as refused:
        raise first_refusal(rows, lambda where, row: to_sequence(where, row, tokenizer, cfg.completion_only),
                            refused) from None
    examples = pack(training.sequences, cfg.max_length) if cfg.packing else training.sequences
    return heldout, training, examples


def step_examples(cfg: SFTConfig, examples: list, step: int) -> list:
    return random.Random(cfg.seed * 1_000_003 + step).sample(examples, min(cfg.batch_size, len(examples)))


def sft_loss(model, batch, step: int):
    loss = nll_loss(batch_logprobs(model, batch), batch.loss_mask)
    check_finite(loss, step)
    return loss, {}


@torch.no_grad()
def heldout_loss(cfg: SFTConfig, model, sequences: list, pad_id: int) -> float:
    """The mean negative log-likelihood per trained token of the held-out examples."""
    model.eval()
    total, tokens = 0.0, 0.0
    for start in range(0, len(sequences), cfg.batch_size):
        batch = make_trained_batch(sequences[start:start + cfg.batch_size], pad_id, cfg.device)
        total += -(batch_logprobs(model, batch) * batch.loss_mask).sum().item()
        tokens += batch.loss_mask.sum().item()
    model.train()
    return total / max(tokens, 1.0)


def shown_pairs(sequences: list) -> list[tuple[list[int], list[int]]]:
    """A few held-out prompts with their reference replies (plain text has no prompt: none)."""
    return [(ids[:trained.index(1)], ids[trained.index(1):]) for ids, trained in sequences[:SAMPLES_SHOWN]
            if 0 < trained.index(1)]


def log_samples(run: Run, engine, tokenizer, shown: list, at: int) -> None:
    """The model's greedy replies to the ``shown`` prompts, beside the data's, in samples.jsonl."""
    if not shown:
        return
    params = SamplingParams(max_new_tokens=max(len(reply) for _, reply in shown) + 8, greedy=True)
    replies = engine.generate([prompt for prompt, _ in shown], 1, params)
    run.log_samples(at, [{"prompt": tokenizer.decode(prompt, skip_special_tokens=True),
                          "completion": tokenizer.decode(group[0].completion_ids, skip_special_tokens=True),
                          "reference": tokenizer.decode(reply, skip_special_tokens=True)}
                         for (prompt, reply), group in zip(shown, replies)])


def finish(run: Run, cfg: SFTConfig, model, tokenizer, first_loss: float | None, final: float, cut: int,
           dropped: int, rows: int) -> dict:
    """Writes RUN_DIR/model (``model``: the whole trained model) and says what the run did."""
    run.export_model(model, tokenizer)
    plot_path = run.close(plot=cfg.plot, metric="eval/loss")
    run.say(f"run: {run.dir}  (the model: {run.dir / 'model'}; start the next stage with --model {run.dir})",
            f"held-out loss: {first_loss:.3f} -> {final:.3f}" if first_loss is not None else f"held-out loss: {final:.3f}",
            f"examples cut at --max-length {cfg.max_length}: {cut} of {rows}"
            + (f"; {dropped} dropped (nothing left to learn)" if dropped else ""))
    return {"run_dir": str(run.dir), "heldout_loss": final, "initial_heldout_loss": first_loss, "truncated": cut,
            "plot": str(plot_path) if plot_path else None}
