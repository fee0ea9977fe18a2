"""Direct Preference Optimization (Rafailov et al., 2023) and its relatives, on preference pairs.

Each step draws ``batch_size`` pairs and takes an AdamW step on the preference loss of the
policy's sequence log-probabilities of the chosen and rejected replies against the frozen
reference's (``omnigym.rl.losses.preference_loss``): ``--loss sigmoid`` (DPO; with
``--label-smoothing`` the conservative cDPO), ``ipo``, ``hinge`` (SLiC) or ``simpo``
(reference-free, length-averaged). The reference log-probs are computed with each batch, or
once for the whole set with ``--precompute-ref``; with LoRA the reference is the base model
with the adapters off. Logged: TRL's rewards/chosen, rewards/rejected, rewards/accuracy and
rewards/margin, the same on held-out pairs (eval/...), and, with ``--gold-reward``, the
reward and KL to the reference of replies sampled on held-out prompts.

``omnigym train dpo`` with no flags runs the offline demo: SFT on random-word replies, pairs
of its replies labelled by a hidden gold rule, then DPO on the pairs, reporting the gold
reward of its samples before and after.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_fraction, require_non_negative, require_positive
from omnigym.errors import require
from omnigym.evaluation.text import sampled_rewards
from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.reference import FrozenReference
from omnigym.models.tokens import batch_logprobs, make_trained_batch
from omnigym.optim import adamw
from omnigym.process import scoped_run
from omnigym.rewards import parse_weights
from omnigym.rl.losses import PREFERENCE_LOSSES, check_finite, preference_loss
from omnigym.tasks.preference_data import longest_pair, pair_sequences, read_pairs
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.stopping import checkpoint_due
from omnigym.resources import check_language_batch
from omnigym.track.files import read_metrics
from omnigym.track.run import Run, start_run


@dataclass
class DPOConfig(LanguageModelConfig):
    data: str = "gold"
    """preference pairs: a .jsonl/.json file, a dataset folder or offline hub id, or "gold" (the
    offline demo's pairs, made first in RUN_DIR/stages)"""
    split: str = "train"
    eval_size: int = 200
    """pairs held out for the eval/ metrics (never trained on)"""
    max_length: int = 256
    loss: str = "sigmoid"
    """sigmoid (DPO), ipo, hinge or simpo"""
    beta: float = 0.1
    label_smoothing: float = 0.0
    """conservative DPO: the probability that a label is flipped (sigmoid and simpo)"""
    simpo_gamma: float = 0.5
    """SimPO's target margin"""
    precompute_ref: bool = False
    """compute the reference log-probs of every pair once, before training"""
    steps: int = 100
    batch_size: int = 16
    """pairs per step"""
    learning_rate: float = 2e-4
    max_grad_norm: float = 1.0
    gold_reward: str | None = None
    """rewards (name:weight,...) to score replies sampled on held-out prompts at each evaluation,
    never trained on; the demo uses its hidden rule, gold_vowels:1.0"""
    eval_prompts: int = 128
    max_new_tokens: int = 40
    eval_every: int = 25
    checkpoint_every: int = 50

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("data", "split", "eval_size", "max_length", "loss",
                                                       "precompute_ref")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        require_positive(self, "steps", "batch_size", "learning_rate", "max_grad_norm", "eval_size", "max_length",
                         "beta", "eval_prompts", "max_new_tokens", "eval_every")
        require_non_negative(self, "checkpoint_every", "simpo_gamma")
        require_fraction(self, "label_smoothing")
        require(self.label_smoothing < 0.5, f"--label-smoothing must be below 0.5, got {self.label_smoothing}")
        require(self.loss in PREFERENCE_LOSSES, f"unknown --loss {self.loss!r}; choose one of "
                                                f"{', '.join(PREFERENCE_LOSSES)}")
        from omnigym.pipelines.rlhf_demo import check_demo_in_one_process

        check_demo_in_one_process(self, demo=self.data == "gold")
        require(not (self.precompute_ref and self.loss == "simpo"), "--precompute-ref: simpo has no reference")
        require(self.max_length >= 2, f"--max-length must be at least 2 tokens, got {self.max_length}")


CONFIG = DPOConfig


@scoped_run
def train(cfg: DPOConfig) -> dict:
    from omnigym.models.lm import LoraSettings, check_max_length, load_policy_and_tokenizer
    from omnigym.pipelines.rlhf_demo import given_gold_reward, use_demo_pairs

    gold = given_gold_reward(cfg)  # a bad one: one line before the demo's stage runs
    run = start_run(cfg, "dpo", cfg.model)
    data, start, gold_reward = cfg.data, cfg.model, cfg.gold_reward
    if cfg.data == "gold":  # the offline demo: its SFT model and gold-labelled pairs (a resumed run reuses them)
        from omnigym.algos import get_algorithm

        demo = use_demo_pairs(cfg, run, get_algorithm("sft"))  # the SFT stage's trainer, by name
        data, start, gold_reward = demo.pairs, demo.model, gold_reward or demo.gold_reward
    gold = (gold or parse_weights(gold_reward)).to(cfg.device) if gold_reward else None
    policy, tokenizer = load_policy_and_tokenizer(start, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device, need_chat_template=False)
    check_max_length(policy, cfg.max_length)
    _, heldout, training, _ = read_pairs(data, cfg.split, cfg.seed, cfg.eval_size, tokenizer, cfg.max_length)
    check_language_batch(f"--batch-size {cfg.batch_size}", 2 * min(cfg.batch_size, max(len(training.pairs), 1)),
                         longest_pair(training.pairs), policy.config)  # a pair's chosen and rejected replies
    reference = FrozenReference(policy)
    engine = make_engine(policy, tokenizer)
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.learning_rate), cfg.max_grad_norm)
    components = {"trainer": trainer}  # the reference is rebuilt from --model on resume, unchanged
    step = run.begin(components).get("step", 0)
    policy.train()  # as a new run's first evaluation leaves it: a resume loaded it in eval mode (no dropout)
    logps = functools.partial(sequence_logps, cfg=cfg, pad_id=tokenizer.pad_token_id)
    precomputed = precomputed_reference(cfg, reference, logps, training.pairs) if cfg.precompute_ref else None
    evaluate = functools.partial(evaluation, cfg, run, policy, reference, engine, tokenizer, heldout.pairs, gold, logps)
    if step == 0:
        run.log(0, {**evaluate(0), "data/truncated": training.truncated + heldout.truncated,
                    "data/dropped": training.dropped + heldout.dropped, "data/train_pairs": len(training.pairs)})
    progress = ProgressBar(cfg.steps, "dpo", start=step, enabled=cfg.progress)
    clock = Clock(step)
    while step < cfg.steps:
        # 1. A seeded draw of the step's pairs, with their reference log-probs (precomputed, or now).
        pairs, ref = step_pairs(cfg, training.pairs, precomputed, reference, logps, step)
        # 2. One AdamW step on the preference loss of this process's pairs.
        rows, share = trainer.local_part(range(len(pairs)))  # this process's pairs (all of them in one)
        if ref is not None and len(rows) < len(pairs):  # ref holds every chosen, then every rejected
            ref = torch.cat([ref[:len(pairs)][rows], ref[len(pairs):][rows]])
        stats = trainer.forward_backward(([pairs[i] for i in rows], ref, step),
                                         functools.partial(dpo_loss, cfg=cfg, logps=logps), share)
        trainer.optim_step()
        step += 1
        # 3. Log (the held-out figures every --eval-every), checkpoint.
        metrics = {"train/loss": stats["loss"].item(), **{k: v.item() for k, v in stats.items() if "/" in k},
                   "perf/steps_per_second": clock.sps(step)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics.update(evaluate(step))
        run.log(step, metrics)
        progress.update(step, loss=metrics["train/loss"], acc=metrics.get("eval/accuracy", float("nan")))
        if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
            run.save(components, step=step)
    progress.close()
    return finish(run, cfg, trainer.full_model(), tokenizer, gold is not None)


def sequence_logps(model, pairs, cfg: DPOConfig, pad_id: int) -> torch.Tensor:
    """[2B]: every pair's chosen reply, then every pair's rejected reply, as the sum of its
    tokens' log-probs (IPO and SimPO: their mean). The two replies of a pair share its prompt,
    which runs once for both (``make_trained_batch``)."""
    batch = make_trained_batch(pair_sequences(pairs), pad_id, cfg.device)
    logps, mask = batch_logprobs(model, batch), batch.loss_mask
    total = (logps * mask).sum(1)
    return total / mask.sum(1).clamp(min=1) if cfg.loss in ("ipo", "simpo") else total


def reference_logps(cfg: DPOConfig, reference: FrozenReference, logps, pairs) -> torch.Tensor | None:
    """``logps`` of ``pairs`` under the reference; SimPO has none."""
    return None if cfg.loss == "simpo" else reference.run(logps, pairs)


def precomputed_reference(cfg: DPOConfig, reference: FrozenReference, logps, pairs: list) -> list:
    """--precompute-ref: the reference log-probs of every batch of --batch-size pairs, in order."""
    return [reference_logps(cfg, reference, logps, pairs[i:i + cfg.batch_size])
            for i in range(0, len(pairs), cfg.batch_size)]


def step_pairs(cfg: DPOConfig, pairs: list, precomputed: list | None, reference: FrozenReference, logps,
               step: int) -> tuple[list, torch.Tensor | None]:
    """Step ``step``'s pairs and their reference log-probs: a seeded draw, the same whether the
    run was resumed or not; with --precompute-ref a whole precomputed batch."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    if precomputed is not None:
        chunk = rng.randrange(len(precomputed))
        return pairs[chunk * cfg.batch_size:(chunk + 1) * cfg.batch_size], precomputed[chunk]
    drawn = [pairs[i] for i in rng.sample(range(len(pairs)), min(cfg.batch_size, len(pairs)))]
    return drawn, reference_logps(cfg, reference, logps, drawn)


def pair_loss(logps: torch.Tensor, ref: torch.Tensor | None, cfg: DPOConfig):
    """The preference loss of ``logps`` (every chosen, then every rejected) against ``ref``."""
    n = len(logps) // 2
    return preference_loss(logps[:n], logps[n:], *((ref[:n], ref[n:]) if ref is not None else (None, None)),
                           cfg.loss, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma)


def dpo_loss(model, batch, cfg: DPOConfig, logps):
    pairs, ref, step = batch
    loss, stats = pair_loss(logps(model, pairs), ref, cfg)
    check_finite(loss, step)
    return loss, stats


@torch.no_grad()
def evaluation(cfg: DPOConfig, run: Run, policy, reference: FrozenReference, engine, tokenizer, heldout: list,
               gold, logps, at: int) -> dict:
    """The preference metrics on the held-out pairs (eval/...), and with a gold reward the
    reward and KL of replies sampled on held-out prompts (a few go to samples.jsonl)."""
    policy.eval()
    totals: dict[str, list] = {}
    for start in range(0, len(heldout), cfg.batch_size):
        pairs = heldout[start:start + cfg.batch_size]
        _, stats = pair_loss(logps(policy, pairs), reference_logps(cfg, reference, logps, pairs), cfg)
        for k, v in stats.items():
            totals.setdefault(k, []).append(v.item() * len(pairs))
    policy.train()
    metrics = {f"eval/{k.split('/')[-1]}": sum(v) / len(heldout) for k, v in totals.items()}
    if gold is not None:
        samples: list = []
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=1.0)
        with torch.random.fork_rng():  # the sampled eval leaves training's random stream alone
            torch.manual_seed(cfg.seed + at)
            metrics.update(sampled_rewards(policy, reference, engine, tokenizer,
                                           [{"prompt": p.source_prompt} for p in heldout[:cfg.eval_prompts]],
                                           [p.prompt for p in heldout[:cfg.eval_prompts]], {"gold_reward": gold},
                                           params, samples))
        run.log_samples(at, samples)
    return metrics


def finish(run: Run, cfg: DPOConfig, model, tokenizer, gold: bool) -> dict:
    """Writes RUN_DIR/model (``model``: the whole trained model) and says what the run did,
    from its first and last evaluations."""
    evaluated = [r for r in read_metrics(run.dir) if "eval/accuracy" in r]
    run.export_model(model, tokenizer)
    plot_path = run.close(plot=cfg.plot, metric="eval/gold_reward" if gold else "eval/accuracy")
    start, end = evaluated[0], evaluated[-1]
    lines = [f"run: {run.dir}  (the model: {run.dir / 'model'})",
             f"held-out preference accuracy: {start['eval/accuracy']:.3f} -> {end['eval/accuracy']:.3f}  "
             f"(implicit reward margin {end['eval/margin']:.3f})"]
    if gold:
        lines.append(f"gold reward of sampled replies: {start['eval/gold_reward']:.3f} -> {end['eval/gold_reward']:.3f}  "
                     f"at KL {end['eval/kl']:.2f} nats to the reference")
    run.say(*lines)
    return {"run_dir": str(run.dir), "accuracy_before": start["eval/accuracy"], "accuracy_after": end["eval/accuracy"],
            "gold_before": start.get("eval/gold_reward"), "gold_after": end.get("eval/gold_reward"),
            "kl": end.get("eval/kl"), "plot": str(plot_path) if plot_path else None}
