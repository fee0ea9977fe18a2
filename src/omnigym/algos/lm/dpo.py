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
from omnigym.track.run import start_run


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
        require(not (self.precompute_ref and self.loss == "simpo"), "--precompute-ref: simpo has no reference")
        require(self.max_length >= 2, f"--max-length must be at least 2 tokens, got {self.max_length}")


CONFIG = DPOConfig


@scoped_run
def train(cfg: DPOConfig) -> dict:
    from omnigym.models.lm import LoraSettings, load_policy_and_tokenizer

    run = start_run(cfg, "dpo", cfg.model)
    data, start, gold_reward = cfg.data, cfg.model, cfg.gold_reward
    if cfg.data == "gold":  # the offline demo: its SFT model and gold-labelled pairs (a resumed run reuses them)
        from omnigym.pipelines.rlhf_demo import use_demo_pairs

        demo = use_demo_pairs(cfg, run)
        data, start, gold_reward = demo.pairs, demo.model, gold_reward or demo.gold_reward
    gold = parse_weights(gold_reward).to(cfg.device) if gold_reward else None
    policy, tokenizer = load_policy_and_tokenizer(start, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device, need_chat_template=False)
    rows, heldout, training, _ = read_pairs(data, cfg.split, cfg.seed, cfg.eval_size, tokenizer, cfg.max_length)
    check_language_batch(f"--batch-size {cfg.batch_size}", 2 * min(cfg.batch_size, max(len(training.pairs), 1)),
                         longest_pair(training.pairs), policy.config)  # a pair's chosen and rejected replies
    reference = FrozenReference(policy)
    engine = make_engine(policy, tokenizer)
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.learning_rate), cfg.max_grad_norm)
    components = {"trainer": trainer}  # the reference is rebuilt from --model on resume, unchanged
    step = run.begin(components).get("step", 0)
    averaged = cfg.loss in ("ipo", "simpo")  # IPO and SimPO compare length-averaged log-probs

    def sequence_logps(model, pairs) -> torch.Tensor:
        """[2B]: every pair's chosen reply, then every pair's rejected reply. The two replies of
        a pair share its prompt, which runs once for both (``make_trained_batch``)."""
        batch = make_trained_batch(pair_sequences(pairs), tokenizer.pad_token_id, cfg.device)
        logps, mask = batch_logprobs(model, batch), batch.loss_mask
        total = (logps * mask).sum(1)
        return total / mask.sum(1).clamp(min=1) if averaged else total

    def reference_logps(pairs) -> torch.Tensor | None:
        return None if cfg.loss == "simpo" else reference.run(sequence_logps, pairs)

    precomputed = None
    if cfg.precompute_ref:
        precomputed = [reference_logps(training.pairs[i:i + cfg.batch_size])
                       for i in range(0, len(training.pairs), cfg.batch_size)]

    def loss_fn(model, batch):
        indices, ref = batch
        pairs = [training.pairs[i] for i in indices]
        logps = sequence_logps(model, pairs)
        n = len(pairs)
        loss, stats = preference_loss(logps[:n], logps[n:], *((ref[:n], ref[n:]) if ref is not None else (None, None)),
                                      cfg.loss, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma)
        check_finite(loss, step)
        return loss, stats

    eval_examples = [{"prompt": p.source_prompt} for p in heldout.pairs[:cfg.eval_prompts]]
    eval_prompt_ids = [p.prompt for p in heldout.pairs[:cfg.eval_prompts]]
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=1.0)

    @torch.no_grad()
    def evaluate(at: int) -> dict:
        policy.eval()
        totals: dict[str, list] = {}
        for start in range(0, len(heldout.pairs), cfg.batch_size):
            pairs = heldout.pairs[start:start + cfg.batch_size]
            logps, ref = sequence_logps(policy, pairs), reference_logps(pairs)
            n = len(pairs)
            _, stats = preference_loss(logps[:n], logps[n:], *((ref[:n], ref[n:]) if ref is not None else (None, None)),
                                       cfg.loss, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma)
            for k, v in stats.items():
                totals.setdefault(k, []).append(v.item() * n)
        policy.train()
        metrics = {f"eval/{k.split('/')[-1]}": sum(v) / len(heldout.pairs) for k, v in totals.items()}
        if gold is not None:
            samples: list = []
            with torch.random.fork_rng():  # the sampled eval leaves training's random stream alone
                torch.manual_seed(cfg.seed + at)
                metrics.update(sampled_rewards(policy, reference, engine, tokenizer, eval_examples, eval_prompt_ids,
                                               {"gold_reward": gold}, params, samples))
            run.log_samples(at, samples)
        return metrics

    first = evaluate(0) if step == 0 else None
    if step == 0:
        run.log(0, {**first, "data/truncated": training.truncated + heldout.truncated,
                    "data/dropped": training.dropped + heldout.dropped, "data/train_pairs": len(training.pairs)})
    progress = ProgressBar(cfg.steps, "dpo", start=step, enabled=cfg.progress)
    clock = Clock(step)
    order = list(range(len(training.pairs)))
    while step < cfg.steps:
        if precomputed is not None:  # whole precomputed batches, in a seeded order
            chunk = random.Random(cfg.seed * 1_000_003 + step).randrange(len(precomputed))
            indices = list(range(chunk * cfg.batch_size, min((chunk + 1) * cfg.batch_size, len(training.pairs))))
            ref = precomputed[chunk]
        else:
            indices = random.Random(cfg.seed * 1_000_003 + step).sample(order, min(cfg.batch_size, len(order)))
            ref = reference_logps([training.pairs[i] for i in indices])
        rows, share = trainer.local_part(range(len(indices)))  # this process's pairs (all of them in one)
        if ref is not None and len(rows) < len(indices):  # ref holds every chosen, then every rejected
            ref = torch.cat([ref[:len(indices)][rows], ref[len(indices):][rows]])
        stats = trainer.forward_backward(([indices[i] for i in rows], ref), loss_fn, share)
        trainer.optim_step()
        step += 1
        metrics = {"train/loss": stats["loss"].item(), **{k: v.item() for k, v in stats.items() if "/" in k},
                   "perf/steps_per_second": clock.sps(step)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            metrics.update(evaluate(step))
        run.log(step, metrics)
        progress.update(step, loss=metrics["train/loss"], acc=metrics.get("eval/accuracy", float("nan")))
        if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
            run.save(components, step=step)
    progress.close()
    from omnigym.track.files import read_metrics

    evaluated = [r for r in read_metrics(run.dir) if "eval/accuracy" in r]
    run.export_model(trainer.full_model(), tokenizer)
    metric = "eval/gold_reward" if gold is not None else "eval/accuracy"
    plot_path = run.close(plot=cfg.plot, metric=metric)
    start, end = evaluated[0], evaluated[-1]
    lines = [f"run: {run.dir}  (the model: {run.dir / 'model'})",
             f"held-out preference accuracy: {start['eval/accuracy']:.3f} -> {end['eval/accuracy']:.3f}  "
             f"(implicit reward margin {end['eval/margin']:.3f})"]
    if gold is not None:
        lines.append(f"gold reward of sampled replies: {start['eval/gold_reward']:.3f} -> {end['eval/gold_reward']:.3f}  "
                     f"at KL {end['eval/kl']:.2f} nats to the reference")
    run.say(*lines)
    return {"run_dir": str(run.dir), "accuracy_before": start["eval/accuracy"], "accuracy_after": end["eval/accuracy"],
            "gold_before": start.get("eval/gold_reward"), "gold_after": end.get("eval/gold_reward"),
            "kl": end.get("eval/kl"), "plot": str(plot_path) if plot_path else None}
