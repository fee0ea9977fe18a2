"""Group Relative Policy Optimization (Shao et al., 2024) and its variants, on any causal LM.

Each step: draw ``prompts_per_step`` prompts, sample ``group_size`` completions of each,
score them with the rewards, turn each group's rewards into advantages (``--advantage``:
grpo, dr_grpo, rloo, reinforce_pp), drop groups whose rewards are all equal (no signal),
then take ``ppo_epochs`` clipped policy steps on the completion tokens against the stored
old log-probs, with a KL penalty to the reference model (``--beta 0`` drops it).

``omnigym train grpo`` with no flags is an offline demo: it builds a ~1M-parameter model,
warms it up with a short supervised phase on 2-digit addition, then trains it with GRPO
from rewards alone (correctness + 0.1 x format) and reports held-out accuracy before and
after. With ``--model`` a hub id or a local path, the same loop trains a real model.
"""

from __future__ import annotations

import copy
import random
import sys
from dataclasses import dataclass

import torch

from omnigym.algos.common import Clock, RunConfig, due, restore_rng, start
from omnigym.algos.lm_common import (accuracy, adamw, completion_logprobs, completion_texts, make_batch,
                                     make_completion_batch, prompt_ids, sft_loss)
from omnigym.errors import OmnigymError
from omnigym.rewards import combine, get_reward
from omnigym.rl.advantages import get_advantage
from omnigym.rl.losses import aggregate, check_finite, kl_estimate, ppo_policy_loss
from omnigym.systems.generation import SamplingParams, make_engine
from omnigym.track.checkpoint import rng_state
from omnigym.track.progress import ProgressBar
from omnigym.track.run import Run


@dataclass
class GRPOConfig(RunConfig):
    model: str = "tiny"
    """hub id or local path of a causal LM; "tiny" builds a ~1M-parameter model offline"""
    chat_template: str | None = None
    """Jinja chat template (string or file) for models that have none"""
    lora_r: int = 0
    """LoRA rank (0 trains all weights)"""
    engine: str = "auto"
    """sampler: auto (the lean KV-cache loop of kv_decode for Llama-family models, else HF generate), kv or hf"""
    task: str = "arithmetic"
    """"arithmetic", "reasoning_gym:<task>" (use --rewards reasoning_gym:1.0,...), "gsm8k:<file.jsonl>",
    or a jsonl file / HF dataset with question and answer fields"""
    digits: int = 2
    terms: int = 2
    operations: str = "+"
    system_prompt: str | None = None
    rewards: str = "math:1.0,format:0.1"
    """weighted rewards, name:weight,..."""
    steps: int = 400
    prompts_per_step: int = 16
    group_size: int = 8
    learning_rate: float = 1e-4
    beta: float = 0.04
    """KL penalty to the reference model; 0 drops the reference model"""
    kl_estimator: str = "k3"
    advantage: str = "grpo"
    """grpo, dr_grpo, rloo or reinforce_pp"""
    loss_aggregation: str = "seq-mean-token-mean"
    """token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO)"""
    clip_low: float = 0.2
    clip_high: float = 0.2
    """above clip_low is DAPO's clip-higher (e.g. 0.28)"""
    ppo_epochs: int = 1
    """policy steps per batch, against the stored old log-probs"""
    skip_equal_groups: bool = True
    max_new_tokens: int = 24
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    sft_steps: int = 1000
    """at most this many supervised warm-up steps before GRPO (0 for a model that can already answer)"""
    sft_target_accuracy: float = 0.3
    """the warm-up stops once validation accuracy (train-split problems) reaches this"""
    sft_eval_every: int = 25
    sft_batch_size: int = 64
    sft_learning_rate: float = 1e-3
    eval_size: int = 500
    """held-out problems for eval/accuracy"""
    eval_every: int = 50
    checkpoint_every: int = 50
    """GRPO steps between checkpoints (one is always written at the end)"""


def load_examples(cfg: GRPOConfig) -> tuple[list[dict], list[dict]]:
    if cfg.task == "arithmetic":
        from omnigym.tasks.arithmetic import ArithmeticTask

        task = ArithmeticTask(cfg.digits, cfg.terms, cfg.operations)
        return task.sample(20_000, cfg.seed), task.sample(cfg.eval_size, 10_000 + cfg.seed, split="heldout")
    if cfg.task.startswith("reasoning_gym:"):
        from omnigym.tasks.reasoning_gym import load_reasoning_gym

        rows = load_reasoning_gym(cfg.task.split(":", 1)[1], size=20_000 + cfg.eval_size, seed=cfg.seed)
    elif cfg.task.startswith("gsm8k:"):
        from omnigym.tasks.datasets import load_gsm8k

        rows = load_gsm8k(cfg.task.split(":", 1)[1])
    else:
        from omnigym.tasks.datasets import load_prompt_answer

        rows = load_prompt_answer(cfg.task, "question", "answer")
    random.Random(cfg.seed).shuffle(rows)
    return rows[cfg.eval_size:], rows[:cfg.eval_size]


def parse_rewards(spec: str) -> dict[str, float]:
    try:
        weights = {name.strip(): float(weight) for name, weight in (part.split(":") for part in spec.split(","))}
    except ValueError:
        raise OmnigymError(f"--rewards must look like 'math:1.0,format:0.1', got {spec!r}") from None
    for name in weights:
        get_reward(name)
    return weights


def train(cfg: GRPOConfig) -> dict:
    from omnigym.models.lm import LoraSettings, build_tiny_model, load_model, load_tokenizer

    if cfg.prompts_per_step <= 0 or cfg.group_size < 2:
        raise OmnigymError("GRPO needs prompts_per_step >= 1 and group_size >= 2")
    weights = parse_rewards(cfg.rewards)
    score, correct = combine(weights), get_reward("math")
    run = start(cfg, "grpo", label=cfg.model)
    model_path = str(run.dir / "tiny-model") if cfg.model == "tiny" else cfg.model
    if cfg.model == "tiny" and not (run.dir / "tiny-model" / "config.json").exists():
        build_tiny_model(model_path, seed=cfg.seed)
    tokenizer = load_tokenizer(model_path, cfg.chat_template)
    policy = load_model(model_path, LoraSettings(r=cfg.lora_r), device=cfg.device)
    engine = make_engine(policy, tokenizer, cfg.engine)
    train_set, heldout = load_examples(cfg)
    sft_optimizer = adamw(policy, cfg.sft_learning_rate, weight_decay=0.01)
    optimizer = adamw(policy, cfg.learning_rate)
    reference, sft_step, step, sft_done = None, 0, 0, cfg.sft_steps == 0

    def make_reference():
        if cfg.beta == 0:
            return None
        ref = copy.deepcopy(policy).eval()
        ref.requires_grad_(False)
        return ref

    if run.checkpoint is not None:
        ckpt = run.checkpoint
        policy.load_state_dict(ckpt["model"])
        sft_optimizer.load_state_dict(ckpt["sft_optimizer"])
        optimizer.load_state_dict(ckpt["optimizer"])
        sft_step, step, sft_done = ckpt["sft_step"], ckpt["step"], ckpt["sft_done"]
        if ckpt.get("reference") is not None:
            reference = make_reference()
            reference.load_state_dict(ckpt["reference"])
        restore_rng(run)

    def save(next_step: int):
        run.save({"model": policy.state_dict(), "optimizer": optimizer.state_dict(),
                  "sft_optimizer": sft_optimizer.state_dict(), "rng": rng_state(), "sft_step": sft_step,
                  "sft_done": sft_done, "step": next_step,
                  "reference": reference.state_dict() if reference is not None else None})

    def evaluate() -> float:
        return accuracy(engine, tokenizer, heldout, correct, cfg.system_prompt, cfg.max_new_tokens)

    progress = ProgressBar(cfg.sft_steps + cfg.steps, "grpo", start=sft_step + step, enabled=cfg.progress)

    # 1. Supervised warm-up (the demo's): answers in <answer> tags until accuracy on a
    # validation set drawn from the training split reaches sft_target_accuracy, so that GRPO
    # starts with some reward to learn from. The held-out set is never looked at here.
    validation = random.Random(cfg.seed + 99).sample(train_set, 100)
    while not sft_done and sft_step < cfg.sft_steps:
        rng = random.Random(cfg.seed * 1_000_003 + sft_step)
        examples = rng.sample(train_set, cfg.sft_batch_size)
        pairs = [(prompt_ids(tokenizer, e["question"], cfg.system_prompt),
                  tokenizer(f"<answer>{e['answer']}</answer>", add_special_tokens=False)["input_ids"]
                  + [tokenizer.eos_token_id]) for e in examples]
        loss = sft_loss(policy, make_batch(pairs, tokenizer.pad_token_id, cfg.device))
        check_finite(loss, sft_step)
        sft_optimizer.zero_grad()
        loss.backward()
        sft_optimizer.step()
        sft_step += 1
        metrics = {"sft/loss": loss.item()}
        if sft_step % cfg.sft_eval_every == 0 or sft_step == cfg.sft_steps:
            metrics["sft/val_accuracy"] = accuracy(engine, tokenizer, validation, correct, cfg.system_prompt,
                                                   cfg.max_new_tokens)
            sft_done = metrics["sft/val_accuracy"] >= cfg.sft_target_accuracy or sft_step == cfg.sft_steps
        run.log(sft_step, metrics)
        progress.update(sft_step, sft_loss=loss.item())
        if sft_done:
            reference = make_reference()
        if sft_done or sft_step % cfg.checkpoint_every == 0:
            save(0)
    if reference is None:
        reference = make_reference()

    # 2. GRPO.
    offset = sft_step
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    estimator = get_advantage(cfg.advantage)
    clock = Clock(step)
    for step in range(step, cfg.steps):
        metrics = {}
        if step == 0 or step % cfg.eval_every == 0:
            metrics["eval/accuracy"] = evaluate()
        rng = random.Random(cfg.seed * 7_919 + step)
        examples = rng.sample(train_set, cfg.prompts_per_step)
        prompts = [prompt_ids(tokenizer, e["question"], cfg.system_prompt) for e in examples]
        groups = engine.generate(prompts, cfg.group_size, params)
        texts = completion_texts(tokenizer, groups)
        scored = [score(text, examples[i // cfg.group_size]) for i, text in enumerate(texts)]
        rewards = torch.tensor([total for total, _ in scored])
        advantages = estimator(rewards, cfg.group_size)
        keep = torch.ones(len(rewards), dtype=torch.bool)
        if cfg.skip_equal_groups:
            spread = rewards.reshape(-1, cfg.group_size).std(1) > 0
            keep = spread.repeat_interleave(cfg.group_size)
        samples = [s for group in groups for s in group]
        kept = [i for i in range(len(samples)) if keep[i]]

        stats = {}
        if kept:
            batch = make_completion_batch([samples[i] for i in kept], tokenizer.pad_token_id, cfg.device)
            adv = advantages[kept].to(cfg.device).unsqueeze(1)
            with torch.no_grad():
                ref_logprobs = completion_logprobs(reference, batch) if reference is not None else None
                old_logprobs = completion_logprobs(policy, batch) if cfg.ppo_epochs > 1 else None
            for _ in range(cfg.ppo_epochs):
                new_logprobs = completion_logprobs(policy, batch)
                old = old_logprobs if old_logprobs is not None else new_logprobs.detach()
                loss, stats = ppo_policy_loss(new_logprobs, old, adv, batch.loss_mask, cfg.clip_low, cfg.clip_high,
                                              cfg.loss_aggregation, normalizer=cfg.max_new_tokens)
                if ref_logprobs is not None:
                    kl = kl_estimate(new_logprobs, ref_logprobs, cfg.kl_estimator)
                    kl_term = aggregate(kl, batch.loss_mask, cfg.loss_aggregation, cfg.max_new_tokens)
                    loss = loss + cfg.beta * kl_term
                    stats["kl"] = kl_term.detach()
                check_finite(loss, offset + step)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                optimizer.step()
            stats["loss"] = loss.detach()
        parts = {name: sum(p[name] for _, p in scored) / len(scored) for name in weights}
        metrics.update({
            "reward/mean": rewards.mean().item(), **{f"reward/{k}": v for k, v in parts.items()},
            "reward/std": rewards.std().item(), "groups/kept_fraction": keep.float().mean().item(),
            "completion/length": sum(len(s.completion_ids) for s in samples) / len(samples),
            "perf/steps_per_second": clock.sps(step + 1),
        })
        if kept:
            metrics.update({"losses/policy_loss": stats["loss"].item(), "losses/clip_fraction":
                            stats["clip_fraction"].item(), "losses/approx_kl": stats["approx_kl"].item()})
            if "kl" in stats:
                metrics["kl/mean"] = stats["kl"].item()
        if step == cfg.steps - 1:
            metrics["eval/accuracy"] = evaluate()
        run.log(offset + step + 1, metrics)
        progress.update(offset + step + 1, reward=metrics["reward/mean"], acc=metrics.get("eval/accuracy", float("nan")))
        if step == cfg.steps - 1 or due(step + 1, step, cfg.checkpoint_every):
            save(step + 1)
    progress.close()
    return finish_lm(run, cfg)


def finish_lm(run: Run, cfg) -> dict:
    from omnigym.track.run import read_metrics

    rows = [r for r in read_metrics(run.dir) if "eval/accuracy" in r]
    plot_path = run.close(plot=cfg.plot and bool(rows), metric="eval/accuracy")
    before, after = (rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]) if rows else (float("nan"),) * 2
    print(f"run: {run.dir}", file=sys.stderr)
    print(f"held-out accuracy before GRPO: {before:.3f}  after: {after:.3f}  ({100 * (after - before):+.1f} points)",
          file=sys.stderr)
    if plot_path:
        print(f"curve: {plot_path}", file=sys.stderr)
    return {"run_dir": str(run.dir), "accuracy_before": before, "accuracy_after": after,
            "plot": str(plot_path) if plot_path else None}
