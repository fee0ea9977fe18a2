"""REINFORCE on text: the classic first exercise of RL on a language model.

Sample completions of one prompt, reward those that contain the keywords, and step on
``-(reward - mean reward) * log p(completion)``, the score-function gradient with the
batch mean as baseline. Same engine, batches, log-probs and tracking as GRPO; no clipping,
no reference model.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from omnigym.algos.common import Clock, RunConfig, start
from omnigym.algos.lm_common import adamw, completion_logprobs, completion_texts, make_completion_batch, prompt_ids
from omnigym.errors import OmnigymError
from omnigym.rewards import get_reward
from omnigym.rl.losses import aggregate, check_finite
from omnigym.systems.generation import SamplingParams, make_engine


@dataclass
class TextReinforceConfig(RunConfig):
    model: str = "tiny"
    """hub id or local path; "tiny" builds a ~1M-parameter untrained model offline"""
    prompt: str = "Say something."
    keywords: str = "a"
    """comma-separated keywords the completion should contain"""
    steps: int = 40
    batch_size: int = 32
    learning_rate: float = 1e-3
    max_new_tokens: int = 16
    temperature: float = 1.0


def train(cfg: TextReinforceConfig) -> dict:
    from omnigym.models.lm import build_tiny_model, load_model, load_tokenizer

    keywords = [k for k in cfg.keywords.split(",") if k]
    if not keywords:
        raise OmnigymError("--keywords needs at least one keyword")
    if cfg.resume:
        raise OmnigymError("text_reinforce runs are short and keep no checkpoint; start a new run instead of --resume")
    run = start(cfg, "text_reinforce", label=cfg.model)
    model_path = str(build_tiny_model(run.dir / "tiny-model", seed=cfg.seed)) if cfg.model == "tiny" else cfg.model
    tokenizer = load_tokenizer(model_path)
    policy = load_model(model_path, device=cfg.device)
    engine = make_engine(policy, tokenizer)
    optimizer = adamw(policy, cfg.learning_rate)
    reward_fn, example = get_reward("keyword"), {"keywords": keywords}
    prompt = prompt_ids(tokenizer, cfg.prompt)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    clock = Clock(0)
    for step in range(cfg.steps):
        groups = engine.generate([prompt], cfg.batch_size, params)
        rewards = torch.tensor([reward_fn(t, example) for t in completion_texts(tokenizer, groups)])
        batch = make_completion_batch(groups[0], tokenizer.pad_token_id, cfg.device)
        advantages = (rewards - rewards.mean()).to(cfg.device).unsqueeze(1)
        loss = -aggregate(advantages * completion_logprobs(policy, batch), batch.loss_mask, "seq-mean-token-sum-norm",
                          normalizer=cfg.max_new_tokens)
        check_finite(loss, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log(step + 1, {"reward/mean": rewards.mean().item(), "losses/policy_loss": loss.item(),
                           "perf/steps_per_second": clock.sps(step + 1)})
    plot_path = run.close(plot=cfg.plot, metric="reward/mean")
    print(f"run: {run.dir}\nfinal mean reward: {rewards.mean().item():.3f}", file=sys.stderr)
    return {"run_dir": str(run.dir), "final_reward": rewards.mean().item(), "plot": str(plot_path) if plot_path else None}
