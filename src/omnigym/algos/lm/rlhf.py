"""PPO-RLHF (Ziegler et al., 2019; Ouyang et al., 2022): a policy trained with PPO against a
learned reward model, with a per-token KL penalty to a frozen reference.

Four roles: the policy (trained), the reference (the policy as it started, frozen: with
LoRA the base with adapters off), the reward model (``omnigym train rm``, frozen) and the
value model (its own network with a scalar head, trained; initialised from the reward model
or from the policy, ``--value-init``). Each step:

1. sample one reply per prompt for ``prompts_per_step`` prompts;
2. score them: the policy's and the reference's log-probs of every reply token, the value
   model's V at every token, the reward model's score of the whole reply;
3. per-token reward ``-beta * (log pi - log ref)`` at every token, plus the score (less
   ``--missing-eos-penalty`` when the reply never ended) at the last;
4. GAE over the tokens (the shared ``gae``), advantages whitened;
5. ``ppo_epochs`` passes over ``minibatches`` shuffled minibatches: the PPO-clip loss for the
   policy, the clipped value loss for the value model, each with its own optimizer;
6. with ``--target-kl``, beta adapts toward it (Ziegler et al.'s proportional controller).

``docs/rlhf.md`` goes through "The N Implementation Details of RLHF with PPO" one by one.
``omnigym train rlhf`` with no flags is the offline demo: SFT -> reward model -> PPO in the
synthetic preference world (``omnigym.tasks.gold_world``), with the gold reward of the
policy's samples reported before and after beside their KL to the reference.
"""

from __future__ import annotations

import functools
import os
import random
from contextlib import closing
from dataclasses import dataclass

import torch

from omnigym.algos import get_algorithm
from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_fraction, require_non_negative, require_positive
from omnigym.errors import OmnigymError, require
from omnigym.evaluation.text import finish_sampled_run, heldout_rewards
from omnigym.generators.base import Trajectories
from omnigym.generators.prompts import PromptGenerator, remote_prompt_generator
from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.lm import LoraSettings, check_context, load_policy_and_tokenizer, load_tokenizer, model_folder
from omnigym.models.reference import FrozenReference
from omnigym.models.scalar_head import completion_values, load_scalar_model, reward_model_folder
from omnigym.models.tokens import completion_logprobs, make_completion_batch, padded
from omnigym.optim import adamw
from omnigym.pipelines.rlhf_demo import DemoModels, demo_models, given_gold_reward
from omnigym.process import scoped_run
from omnigym.rewards import parse_weights
from omnigym.rewards.reward_model import RewardModelScorer
from omnigym.rl.advantages import AdvantageConfig, gae, normalize
from omnigym.rl.hacking import SCORED_KEYS, HackingMonitor
from omnigym.rl.losses import PolicyLossConfig, check_finite, masked_mean, ppo_clip, value_loss
from omnigym.runtime import RolloutRuntimeConfig, make_rollouts
from omnigym.tasks.preference_data import read_prompts
from omnigym.tasks.prompt_set import PromptSetConfig, prompts_for_step, split_prompts
from omnigym.track.progress import Clock, Laps, ProgressBar
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class RLHFConfig(PromptSetConfig, RolloutRuntimeConfig, LanguageModelConfig):
    SCALAR_HEAD = "the value model's scalar head"
    reward_model: str | None = None
    """the run directory of `omnigym train rm`; none (with --model tiny): the offline demo trains one first"""
    value_init: str = "reward"
    """initialise the value model from the reward model or from the policy"""
    steps: int = 20
    prompts_per_step: int = 64
    """replies sampled per step (one per prompt): the rollout batch"""
    minibatches: int = 4
    ppo_epochs: int = 4
    learning_rate: float = 1e-4
    value_learning_rate: float = 1e-4
    beta: float = 0.05
    """KL penalty coefficient (the starting value with --target-kl)"""
    target_kl: float | None = None
    """adapt beta so that the per-reply KL approaches this (nats); off: beta stays fixed"""
    kl_horizon: int = 10_000
    """the adaptive controller's horizon, in replies"""
    gamma: float = 1.0
    lam: float = 0.95
    clip: float = 0.2
    value_clip: float = 0.2
    whiten_rewards: bool = False
    """standardise the per-token rewards of each batch (scale only) before GAE"""
    missing_eos_penalty: float = 1.0
    """subtracted from the score of a reply that never emitted the end-of-sequence token"""
    max_new_tokens: int = 40
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    gold_reward: str | None = None
    """rewards (name:weight,...) scored on held-out samples at each evaluation, never trained on;
    the demo uses its hidden rule, gold_vowels:1.0"""
    eval_every: int = 5
    checkpoint_every: int = 10
    hacking_warnings: bool = True
    """a warning line when a step shows a known reward hack: the reward model's score follows reply length, or
    rises while the held-out gold reward (--gold-reward) falls; the hacking/... metrics are logged either way
    (docs/hacking.md)"""

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("reward_model", "value_init", "data", "split",
                                                       "max_prompt_length", "eval_prompts", "runtime", "max_staleness",
                                                       "num_generators")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        self.check_runtime(self.prompts_per_step, training_backend=self.training_backend)
        require_positive(self, "steps", "prompts_per_step", "minibatches", "ppo_epochs", "learning_rate",
                         "value_learning_rate", "kl_horizon", "clip", "value_clip", "max_new_tokens", "temperature",
                         "max_grad_norm", "eval_prompts", "eval_every", "max_prompt_length")
        require_non_negative(self, "beta", "missing_eos_penalty", "checkpoint_every")
        require_fraction(self, "gamma", "lam")
        from omnigym.pipelines.rlhf_demo import check_demo_in_one_process

        check_demo_in_one_process(self, demo=self.reward_model is None)
        require(self.value_init in ("reward", "policy"), f"--value-init must be reward or policy, got {self.value_init!r}")
        require(self.target_kl is None or self.target_kl > 0, f"--target-kl must be positive, got {self.target_kl}")
        require(self.minibatches <= self.prompts_per_step,
                f"--minibatches {self.minibatches} is more than the {self.prompts_per_step} replies of a step")
        require(self.reward_model is not None or self.model == "tiny",
                "give --reward-model RUN_DIR (a finished `omnigym train rm`); only the built-in demo (--model tiny) "
                "trains its own")


CONFIG = RLHFConfig


@scoped_run
def train(cfg: RLHFConfig) -> dict:
    if cfg.reward_model is not None:
        reward_model_folder(cfg.reward_model)  # not a reward model: one line before anything is written
    rows = read_prompts(cfg.data, cfg.split, cfg.seed)  # bad data: one line before the demo's stages run
    gold = given_gold_reward(cfg)  # likewise a bad --gold-reward
    run = start_run(cfg, "rlhf", cfg.model)
    # the demo's stages are trained by sft and rm, found by name (the pipeline sits below the registry)
    models = demo_models(cfg, run, get_algorithm("sft"), get_algorithm("rm")) if cfg.reward_model is None \
        else DemoModels(cfg.model, cfg.reward_model, cfg.gold_reward)
    scorer = RewardModelScorer(models.reward_model, cfg.device)
    gold = (gold or parse_weights(models.gold_reward)).to(cfg.device) if models.gold_reward else None
    policy, tokenizer = load_policy_and_tokenizer(models.policy, cfg.seed, cfg.chat_template,
                                                  LoraSettings(r=cfg.lora_r), cfg.device, need_chat_template=False)
    check_context(policy, cfg.max_new_tokens)
    value_model = load_value_model(cfg, models, scorer, tokenizer)
    heldout, training, left_out = split_prompts(cfg, rows, tokenizer)

    reference = FrozenReference(policy)
    engine = make_engine(policy, tokenizer)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.learning_rate), cfg.max_grad_norm)
    value_trainer = make_backend(cfg, value_model, lambda m: adamw(m, cfg.value_learning_rate), cfg.max_grad_norm)
    components = {"trainer": trainer, "value_trainer": value_trainer}
    # sync: the engine above samples in this process; ray: generator actors, up to K steps ahead
    rollouts = make_rollouts(cfg, PromptGenerator(engine, params, tokenizer.eos_token_id),
                             functools.partial(remote_prompt_generator, cfg, models.policy, os.getcwd()),
                             functools.partial(prompts_for_step, cfg, training), 1, cfg.steps, cfg.seed)
    if cfg.runtime == "ray":  # the finished rollouts in flight, for an exact resume
        components["rollouts"] = rollouts
    judges = {"rm_score": scorer, **({"gold_reward": gold} if gold is not None else {})}
    losses = Losses(cfg, PolicyLossConfig(cfg.clip, cfg.clip, "token-mean", behaviour_cap=cfg.behaviour_cap_in_effect()))
    with closing(rollouts):  # Ray's actors end with the run, however it ends
        counters = run.begin(components)
        step, beta = counters.get("step", 0), counters.get("beta", cfg.beta)
        # the proxy against the gold: the reward model's score, and the gold reward as the held-out measure
        monitor = HackingMonitor.for_run(run, step, cfg.hacking_warnings, SCORED_KEYS)
        if step == 0:
            evaluated = heldout_rewards(cfg, run, policy, reference, engine, tokenizer, heldout, judges, params, 0)
            run.log(0, {**evaluated, "data/prompts_left_out": left_out, "data/train_prompts": len(training)})
            monitor.evaluated(0, evaluated)
        progress = ProgressBar(cfg.steps, "rlhf", start=step, enabled=cfg.progress)
        clock = Clock(step)
        rollouts.update_weights(policy.named_parameters(), version=step)  # the generators start from this policy
        while step < cfg.steps:
            laps = Laps()
            # 1. One reply a prompt (ray: sampled up to K versions ago; pi_old below is this
            # policy's, and the sampler's log-probs weigh the loss with --behaviour-cap).
            items = rollouts.trajectories(step).items
            laps.lap("generate")
            # 2. Score: log-probs of the policy and the reference, the reward model's score, V.
            batch = score(cfg, items, policy, reference, value_model, scorer, tokenizer, laps)
            # 3. Per-token rewards (-beta x KL, the score at the last token), GAE, whitened advantages.
            advantages, returns = token_advantages(cfg, batch, beta)
            # 4. PPO epochs over shuffled minibatches: the policy's and the value model's steps.
            policy_stats, value_stats = ppo_updates(cfg, trainer, value_trainer, batch, advantages, returns, losses, step)
            rollouts.update_weights(policy.named_parameters(), version=step + 1)
            laps.lap("update")

            # 5. Log what this step applied, then adapt beta; show, evaluate, checkpoint.
            step += 1
            metrics = {**step_metrics(batch, beta, policy_stats, value_stats), **laps.times,
                       "perf/steps_per_second": clock.sps(step), **rollouts.metrics()}
            beta = adapted_beta(cfg, beta, batch.kl.sum(1).mean().item(), len(items))
            if step % cfg.eval_every == 0 or step == cfg.steps:
                evaluated = heldout_rewards(cfg, run, policy, reference, engine, tokenizer, heldout, judges, params, step)
                metrics.update(evaluated)
                monitor.evaluated(step, evaluated)  # before the step's check, so the last one is checked too
            decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
            metrics.update(monitor.step(step, Trajectories(items), decode, paid=batch.scores.tolist(), logged=metrics))
            run.log(step, metrics)
            progress.update(step, score=metrics["reward/score"], kl=metrics["kl/mean"])
            if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
                run.save(components, step=step, beta=beta)
        progress.close()
        return finish_sampled_run(run, cfg, trainer.full_model(), tokenizer, gold is not None, "rm_score",
                                  "reward-model score")


def load_value_model(cfg: RLHFConfig, models: Models, scorer, tokenizer):
    """The critic: the reward model with its head, or the policy with a new zero head."""
    source = str(scorer.folder) if cfg.value_init == "reward" else models.policy
    with model_folder(source, cfg.seed, score_head=True) as folder:
        if cfg.value_init == "reward" and load_tokenizer(folder, need_chat_template=False).get_vocab() != tokenizer.get_vocab():
            raise OmnigymError("the reward model's tokenizer is not the policy's, so the value model cannot start from "
                               "it; use --value-init policy")
        # A new head on the policy starts at V = 0 (zero weights, as lm-human-preferences does).
        return load_scalar_model(folder, tokenizer.pad_token_id, cfg.lora_r, cfg.device,
                                 zero_head=cfg.value_init == "policy")


@dataclass
class ScoredBatch:
    """One step's replies and what the frozen passes said of them (``[replies, tokens]``)."""
    prompt_ids: list[list[int]]
    completions: list[list[int]]
    pad_id: int
    tokens: object                      # CompletionBatch
    finished: torch.Tensor              # the reply ended with the end-of-sequence token
    old_logprobs: torch.Tensor          # pi_old: this policy, before the step
    behaviour_logprobs: torch.Tensor | None  # the sampler's (--behaviour-cap)
    kl: torch.Tensor                    # log pi_old - log ref, per token
    scores: torch.Tensor                # the reward model's score of each reply
    penalised: torch.Tensor             # less --missing-eos-penalty where the reply never ended
    old_values: torch.Tensor


@torch.no_grad()
def score(cfg: RLHFConfig, items: list, policy, reference, value_model, scorer, tokenizer, laps) -> ScoredBatch:
    prompt_ids, completions = [t.prompt_ids for t in items], [t.response_ids for t in items]
    tokens = make_completion_batch(prompt_ids, completions, tokenizer.pad_token_id, device=cfg.device)
    mask = tokens.loss_mask
    behaviour = padded([t.logprobs for t in items], mask.shape[1]).to(cfg.device) \
        if cfg.behaviour_cap_in_effect() is not None else None
    policy.eval()
    old_logprobs = completion_logprobs(policy, tokens, cfg.temperature)
    policy.train()
    laps.lap("policy_logprobs")
    ref_logprobs = reference.run(functools.partial(completion_logprobs, temperature=cfg.temperature), tokens)
    laps.lap("reference")
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]
    scores = scorer(texts, [t.example for t in items]).float().to(cfg.device)
    laps.lap("reward")
    old_values = completion_values(value_model, tokens) * mask
    laps.lap("value")
    finished = torch.tensor([t.info["finished"] for t in items], dtype=torch.bool)
    penalised = scores - cfg.missing_eos_penalty * (~finished).float().to(cfg.device)
    return ScoredBatch(prompt_ids, completions, tokenizer.pad_token_id, tokens, finished, old_logprobs, behaviour,
                       (old_logprobs - ref_logprobs) * mask, scores, penalised, old_values)


@torch.no_grad()
def token_advantages(cfg: RLHFConfig, batch: ScoredBatch, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = batch.tokens.loss_mask
    rewards = -beta * batch.kl
    last = mask.sum(1).long() - 1
    rewards[torch.arange(len(batch.completions)), last] += batch.penalised
    if cfg.whiten_rewards:
        rewards = rewards / (masked_mean(rewards ** 2, mask) - masked_mean(rewards, mask) ** 2).clamp(min=1e-8).sqrt() * mask
    advantages, returns = gae(rewards, mask, values=batch.old_values, cfg=AdvantageConfig(gamma=cfg.gamma, lam=cfg.lam))
    return normalize(advantages, mask) * mask, returns


class Losses:
    """The policy's PPO-clip loss and the value model's clipped loss on one minibatch."""

    def __init__(self, cfg: RLHFConfig, loss_cfg: PolicyLossConfig):
        self.cfg, self.loss_cfg = cfg, loss_cfg

    def policy(self, model, mb: dict, step: int):
        new = completion_logprobs(model, mb["tokens"], self.cfg.temperature)
        loss, stats = ppo_clip(new, mb["old_logprobs"], mb["advantages"], mb["tokens"].loss_mask, self.loss_cfg,
                               mb["behaviour_logprobs"])
        check_finite(loss, step)
        return loss, stats

    def value(self, model, mb: dict, step: int):
        new = completion_values(model, mb["tokens"])
        loss = value_loss(new, mb["old_values"], mb["returns"], mb["tokens"].loss_mask, self.cfg.value_clip)
        check_finite(loss, step)
        clipped = ((new - mb["old_values"]).abs() > self.cfg.value_clip).float()
        return loss, {"value_clip_fraction": masked_mean(clipped, mb["tokens"].loss_mask)}


def ppo_updates(cfg: RLHFConfig, trainer, value_trainer, batch: ScoredBatch, advantages, returns, losses: Losses,
                step: int) -> tuple[dict, dict]:
    """``ppo_epochs`` passes over ``minibatches`` shuffled minibatches; returns the last stats.
    Each process of a data-parallel run trains its rows of a minibatch, weighed by their tokens."""
    order = list(range(len(batch.completions)))
    shuffle = random.Random(cfg.seed * 31 + step)
    size = -(-len(order) // cfg.minibatches)
    mask = batch.tokens.loss_mask
    for _ in range(cfg.ppo_epochs):
        shuffle.shuffle(order)
        for begin in range(0, len(order), size):
            chosen = order[begin:begin + size]
            chosen, share = trainer.local_part(chosen, weights=mask[chosen].sum(1).tolist())
            tokens = make_completion_batch([batch.prompt_ids[i] for i in chosen], [batch.completions[i] for i in chosen],
                                           batch.pad_id, device=cfg.device)
            width = tokens.loss_mask.shape[1]
            mb = {"tokens": tokens, "old_logprobs": batch.old_logprobs[chosen, :width],
                  "advantages": advantages[chosen, :width], "old_values": batch.old_values[chosen, :width],
                  "returns": returns[chosen, :width],
                  "behaviour_logprobs": None if batch.behaviour_logprobs is None else
                  batch.behaviour_logprobs[chosen, :width]}
            policy_stats = trainer.forward_backward(mb, functools.partial(losses.policy, step=step), share)
            trainer.optim_step()
            value_stats = value_trainer.forward_backward(mb, functools.partial(losses.value, step=step), share)
            value_trainer.optim_step()
    return policy_stats, value_stats


def adapted_beta(cfg: RLHFConfig, beta: float, kl_per_reply: float, replies: int) -> float:
    """With --target-kl, Ziegler et al.'s proportional controller on log(KL / target); else beta."""
    if cfg.target_kl is None:
        return beta
    error = max(-0.2, min(0.2, kl_per_reply / cfg.target_kl - 1))
    return beta * (1 + error * replies / cfg.kl_horizon)


def step_metrics(batch: ScoredBatch, beta: float, policy_stats: dict, value_stats: dict) -> dict:
    """What the step trained on, with the ``beta`` it applied."""
    kl_per_reply, mask = batch.kl.sum(1), batch.tokens.loss_mask
    return {"reward/score": batch.scores.mean().item(), "reward/penalised_score": batch.penalised.mean().item(),
            "reward/kl_penalty": (-beta * kl_per_reply).mean().item(),
            "reward/total": (batch.penalised - beta * kl_per_reply).mean().item(), "kl/mean": kl_per_reply.mean().item(),
            "kl/beta": beta, "completion/length": mask.sum(1).mean().item(),
            "completion/eos_fraction": batch.finished.float().mean().item(),
            "losses/policy_loss": policy_stats["loss"].item(), "losses/value_loss": value_stats["loss"].item(),
            "losses/clip_fraction": policy_stats["clip_fraction"].item(),
            "losses/clipped_objective_fraction": policy_stats["clipped_objective_fraction"].item(),
            "losses/approx_kl": policy_stats["approx_kl"].item(),
            "losses/value_clip_fraction": value_stats["value_clip_fraction"].item()}
