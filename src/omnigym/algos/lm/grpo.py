"""Group Relative Policy Optimization (Shao et al., 2024) and its variants, on any causal LM.

Each step: draw ``prompts_per_step`` prompts, play ``group_size`` episodes of each in the
text env (``--env single-turn``: one scored reply; ``--env tools``: replies may call a
Python sandbox or a calculator first; ``--env python``, ``search``, ``guess``: the built-in tool
envs of ``envs/``, docs/text_env.md; ``--env tictactoe``: a game against ``--opponent``, or itself,
docs/text_games.md), turn each group's rewards into advantages
(``--advantage``: grpo, dr_grpo, rloo, reinforce_pp), drop groups whose rewards are all
equal (no signal), then take ``ppo_epochs`` clipped policy steps on the tokens the model
generated against the stored old log-probs, with a KL penalty to the reference model
(``--beta 0`` drops it).

``omnigym train grpo`` with no flags is an offline demo: it builds a ~1M-parameter model,
warms it up with a short supervised stage on 2-digit addition (``pipelines/grpo_warmup.py``,
``--sft-steps``), then trains it with GRPO from rewards alone (correctness + 0.1 x format)
and reports held-out accuracy before and after. With ``--model`` a hub id or a local path, the same loop trains a real model.

The task, its env, its rewards and the generator that plays it are chosen from the flags by
``generators/text_tasks.py`` (which ``omnigym sample`` shares); this file is the algorithm.
"""

from __future__ import annotations

import copy
import functools
import os
import random
from contextlib import closing
from dataclasses import dataclass

import torch

from omnigym.agents.config import AgentConfig
from omnigym.agents.episodes import agent_generators, agent_metrics, load_agent
from omnigym.backends import make_backend
from omnigym.backends.base import micro_batches
from omnigym.config import LanguageModelConfig, require_fraction, require_non_negative, require_positive
from omnigym.distributed import world_size
from omnigym.errors import OmnigymError, require
from omnigym.evaluation.text import accuracy, judged_env
from omnigym.generators.text_tasks import GAMES, TextTaskConfig, make_generator, remote_generator, task_env, text_task
from omnigym.generators.two_seat_episodes import Snapshot
from omnigym.inference import check_engine_available, make_engine
from omnigym.models.lm import LoraSettings, check_context, load_policy_and_tokenizer
from omnigym.models.tokens import completion_logprobs, make_completion_batch, padded
from omnigym.optim import adamw
from omnigym.pipelines.grpo_warmup import warm_up
from omnigym.process import scoped_run
from omnigym.rl.advantages import AdvantageConfig, get_advantage, outcome_rewards, turn_spans
from omnigym.rewards.judge import judge_metrics
from omnigym.rl.hacking import HackingMonitor
from omnigym.rl.losses import (AGGREGATIONS, PolicyLossConfig, aggregate, check_finite, kl_estimate, masked_mean,
                               ppo_clip)
from omnigym.rl.step_rewards import place_step_rewards, step_reward_tensor, step_scorer
from omnigym.runtime import RolloutRuntimeConfig, make_rollouts
from omnigym.runtime.episodes import EpisodeScheduleConfig
from omnigym.track.files import read_metrics
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.resume import reward_places
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import Run, start_run


FAILED_STEPS_TO_STOP = 3
"""steps in a row whose every episode failed before a run stops: one such step is skipped (counted
in steps/no_usable_episode), three say the agent or its env is broken, not unlucky"""


@dataclass
class GRPOConfig(TextTaskConfig, AgentConfig, EpisodeScheduleConfig, RolloutRuntimeConfig, LanguageModelConfig):
    step_rewards: str | None = None
    """rewards on the steps inside a reply, name:weight (prm:RUN_DIR:1.0, a model of omnigym train prm): each
    step's score on the token that ends it, beside --rewards' outcome; read apart by --advantage process
    (docs/prm.md)"""
    steps: int = 150
    prompts_per_step: int = 16
    group_size: int = 8
    learning_rate: float = 1e-4
    beta: float = 0.04
    """KL penalty to the reference model; 0 drops the reference model"""
    kl_estimator: str = "k3"
    advantage: str = "grpo"
    """grpo, dr_grpo, rloo, reinforce_pp (group estimators: every token of an episode gets its
    episode's advantage), gae (per turn: GAE over the episode's turns with --gamma and --lam,
    the baseline the group's mean return at each turn index; docs/agents.md), returns (no
    baseline: every token gets the episode's reward), or process (GRPO's advantage of the outcome plus each
    --step-rewards step's centred reward to go; docs/prm.md)"""
    gamma: float = 1.0
    """--advantage gae: the discount from one turn to the next"""
    lam: float = 1.0
    """--advantage gae: GAE's lambda over turns (1: each turn's return minus its baseline; 0: one-turn TD)"""
    loss_aggregation: str = "seq-mean-token-mean"
    """token-mean (DAPO), seq-mean-token-mean (GRPO), seq-mean-token-sum-norm (Dr. GRPO)"""
    clip_low: float = 0.2
    clip_high: float = 0.2
    """above clip_low is DAPO's clip-higher (e.g. 0.28)"""
    ppo_epochs: int = 1
    """policy steps per batch, against the stored old log-probs"""
    micro_batch_size: int = 0
    """rows per forward and backward pass in each process (gradient accumulation: the step is the
    same, its memory a micro-batch's); 0: the whole batch in one pass"""
    skip_equal_groups: bool = True
    max_grad_norm: float = 1.0
    sft_steps: int = 1000
    """at most this many supervised warm-up steps before GRPO, a stage of its own in RUN_DIR/stages/warmup
    (0 for a model that can already answer)"""
    sft_target_accuracy: float = 0.3
    """the warm-up stops once validation accuracy (train-split problems) reaches this"""
    sft_eval_every: int = 25
    sft_batch_size: int = 64
    sft_learning_rate: float = 1e-3
    eval_every: int = 50
    checkpoint_every: int = 50
    """GRPO steps between checkpoints (one is always written at the end)"""
    hacking_warnings: bool = True
    """a warning line when a step shows a known reward hack (the question echoed, format-only reward,
    length gaming, reward up and held-out accuracy down, code the sandbox blocked); the hacking/...
    metrics are logged either way (docs/hacking.md)"""

    # --rewards too: a resume with another reward swapped what the run optimizes and what its held-out accuracy
    # counts as correct ("0.000 -> 1.000" for a length reward), in silence
    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("task", "env", "env_args", "eval_size", "digits", "terms",
                                                       "operations", "runtime", "max_staleness", "num_generators",
                                                       "rollouts", "agent", "opponent", "snapshot_every", "rewards")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        # before the backend's own checks, so it is said even where the launcher or DeepSpeed is missing
        require(self.engine != "vllm" or not shards_weights(self),
                f"--engine vllm is sent the trainer's whole weights after each step, and --training-backend "
                f"{self.training_backend} ({'ZeRO-3' if self.training_backend == 'deepspeed' else 'FSDP2'}) keeps "
                "a shard of them in each process; use --engine auto (it samples with the trainer's own model, which "
                "gathers the shards), or --training-backend ddp or ZeRO stage 0-2")
        require_non_negative(self, "micro_batch_size")
        require(not self.micro_batch_size or self.training_backend != "deepspeed",
                "--micro-batch-size with --training-backend deepspeed: DeepSpeed accumulates by its config's "
                "gradient_accumulation_steps; leave --micro-batch-size out")
        super().check()
        # first: --prompts-per-step 0 was said to be fewer prompts than --num-generators
        require_positive(self, "steps", "prompts_per_step", "learning_rate", "max_grad_norm", "ppo_epochs",
                         "sft_eval_every", "sft_batch_size", "sft_learning_rate", "eval_every")
        self.check_runtime(self.prompts_per_step, training_backend=self.training_backend)
        self.check_episodes(self.prompts_per_step, multi_turn=self.env != "single-turn")
        self.check_task()
        require_non_negative(self, "beta", "clip_low", "clip_high", "sft_steps", "checkpoint_every")
        require_fraction(self, "gamma", "lam")
        require(self.group_size >= 2, f"--group-size must be at least 2 (advantages compare a group), got {self.group_size}")
        require(not self.env.startswith("vf:") or (self.runtime == "sync" and self.training_backend == "local"),
                f"--env {self.env} plays its episodes in this process, through this run's endpoint: use --runtime "
                "sync and --training-backend local")
        require(not self.agent or self.sft_steps == 0,
                f"--agent {self.agent}: the warm-up (--sft-steps {self.sft_steps}) imitates the task env's scripted "
                "answers, not your agent's episodes; give --sft-steps 0 (a model that can already act, or one "
                "warmed up with omnigym train sft)")
        require(not self.env.startswith("vf:") or self.sft_steps == 0,
                f"--env {self.env}: the warm-up (--sft-steps {self.sft_steps}) cannot script a verifiers env's "
                "episodes; give --sft-steps 0 (a model that can already answer)")
        require(self.loss_aggregation in AGGREGATIONS, f"unknown --loss-aggregation {self.loss_aggregation!r}; "
                                                       f"choose one of {', '.join(AGGREGATIONS)}")
        require(self.kl_estimator in ("k1", "k2", "k3"), f"unknown --kl-estimator {self.kl_estimator!r}; "
                                                          "choose k1, k2 or k3")
        self.check_agent()
        require(not self.step_rewards or (self.env == "single-turn" and not self.agent),
                "--step-rewards reads the steps of one reply: use it with --env single-turn and no --agent")
        require(self.opponent not in ("self", "snapshot") or (self.runtime == "sync" and self.rollouts == "sync"),
                f"--opponent {self.opponent} plays both seats of each game in one batch-synchronous generator: use "
                "--runtime sync and --rollouts sync")
        require(not self.agent or (self.rewards is None and self.env == "single-turn"),
                f"--agent {self.agent} plays its own episodes and returns their reward: leave out --rewards and --env")


CONFIG = GRPOConfig


@scoped_run
def train(cfg: GRPOConfig) -> dict:
    estimator = get_advantage(cfg.advantage)  # a misspelt name: one line before anything is written
    agent = load_agent(cfg.agent) if cfg.agent else None  # checked (async, (client, example)) before the run starts
    task, env_agent = text_task(cfg)
    agent = agent or env_agent  # --env vf:MODULE: the verifiers env's rollout, played as an agent
    needed = {"--prompts-per-step": cfg.prompts_per_step, "--sft-batch-size": cfg.sft_batch_size if cfg.sft_steps else 0}
    if len(task.train) < max(needed.values()):  # it named both flags, neither with its value
        short = ", ".join(f"{flag} {value}" for flag, value in needed.items() if value > len(task.train))
        raise OmnigymError(f"--task {cfg.task} leaves {len(task.train)} training examples after the {cfg.eval_size} "
                           f"held out; that is fewer than {short} asks: give smaller values, a smaller --eval-size, "
                           "or more examples")
    env, correct = task_env(cfg, task)
    if cfg.sft_steps and not hasattr(env, "demonstration") and not all(str(e.get("answer", "")).strip()
                                                                        for e in task.train):
        # a task scored by rules on the reply (--task ifeval) has no answer to put in <answer> tags:
        # the warm-up would teach the model to write an empty one
        raise OmnigymError(f"--task {cfg.task} has examples without a reference answer, which the warm-up "
                           f"(--sft-steps {cfg.sft_steps}) demonstrates: give --sft-steps 0")
    # not a PRM: one line, no run
    step_reward = step_scorer(cfg.step_rewards, reward_places(cfg, "step_rewards")) if cfg.step_rewards else None
    check_engine_available(cfg.engine, cfg.lora_r)  # the extra it needs: before a warm-up of minutes
    run = start_run(cfg, "grpo", cfg.model)
    # The demo's model first learns the answer format from demonstrations: a stage of its own
    # (pipelines/grpo_warmup.py), whose model is GRPO's starting policy and reference.
    start = warm_up(cfg, run, env, correct, task.train) if cfg.sft_steps else cfg.model
    policy, tokenizer = load_policy_and_tokenizer(str(start), cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device)
    check_context(policy, cfg.max_new_tokens)
    engine = make_engine(policy, tokenizer, cfg.engine)
    snapshot = frozen_snapshot(cfg, policy, tokenizer) if cfg.opponent == "snapshot" else None
    if agent:  # your agent's episodes, its requests served by this engine; accuracy: held-out reward >= 1, greedy
        sampler, judge = agent_generators(cfg, agent, engine, tokenizer, policy)
    else:
        sampler = make_generator(cfg, env, engine, tokenizer,  # the episodes GRPO trains on
                                 opponent=snapshot.engine if snapshot else None)
        judge = make_generator(cfg, judged_env(env, correct), engine, tokenizer, greedy=True)  # held-out accuracy
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.learning_rate), cfg.max_grad_norm)
    reference = trainer.frozen_copy() if cfg.beta > 0 else None  # the policy as GRPO starts (--beta 0: none)
    components = {"trainer": trainer, **({"snapshot": snapshot} if snapshot else {})}
    rollouts = make_rollouts(cfg, sampler, functools.partial(remote_generator, cfg, os.getcwd()),
                             functools.partial(examples_for, cfg, task.train), cfg.group_size, cfg.steps, cfg.seed)
    if cfg.runtime == "ray" or cfg.rollouts == "async":  # ray: the finished rollouts in flight, for an exact
        components["rollouts"] = rollouts                   # resume; async: where the prompt stream goes on
    loss_cfg = PolicyLossConfig(cfg.clip_low, cfg.clip_high, cfg.loss_aggregation, normalizer=cfg.max_new_tokens,
                                behaviour_cap=cfg.behaviour_cap_in_effect())
    with closing(rollouts):  # Ray's actors end with the run, however it ends
        step = run.begin(components).get("step", 0)  # restores the checkpoint when resuming
        progress = ProgressBar(cfg.steps, "grpo", start=step, enabled=cfg.progress)
        clock = Clock(step)
        rollouts.update_weights(policy.named_parameters(), version=step)  # the generators start from this policy
        failed_in_a_row = 0
        monitor = HackingMonitor.for_run(run, step, cfg.hacking_warnings)
        for step in range(step, cfg.steps):
            metrics = {}
            if step % cfg.eval_every == 0:
                before = evaluate(run, judge, policy, tokenizer, task.heldout, step, step + 1)
                monitor.heldout(step, before)
                if step == 0 == cfg.steps - 1:  # --steps 1: the only step's row gets the accuracy after it, so the
                    run.log(step, eval_metrics(cfg, before))  # accuracy before GRPO gets a row of its own
                else:
                    metrics.update(eval_metrics(cfg, before))

            # 1. Sample group_size episodes of each prompt, each scored by the env's reward (ray:
            # sampled up to --max-staleness versions ago; the sampler's log-probs come along).
            trajectories = rollouts.trajectories(step)
            # a step whose every episode failed (an --agent that raised or timed out) trains nothing
            failed_in_a_row = failed_in_a_row + 1 if all(t.info.get("error") for t in trajectories.items) else 0
            if step_reward is not None:  # --step-rewards: each step's score, on the token that ends it
                metrics.update(place_step_rewards(step_reward, trajectories, tokenizer))
            # 2. Advantages within each group; a group whose rewards are all equal carries no signal.
            advantages, informative = group_advantages(cfg, estimator, trajectories)
            trained = torch.nonzero(informative).squeeze(1).tolist()
            # 3. Clipped policy steps on the tokens the model generated in the informative groups.
            stats = policy_steps(cfg, trainer, reference, trajectories.select(trained), advantages[trained],
                                 tokenizer.pad_token_id, functools.partial(grpo_loss, cfg=cfg, loss_cfg=loss_cfg,
                                                                           step=step)) if trained else {}
            rollouts.update_weights(policy.named_parameters() if trained else (), version=step + 1)
            if snapshot and cfg.snapshot_every and (step + 1) % cfg.snapshot_every == 0:
                snapshot.refresh(policy.named_parameters(), version=step + 1)  # the opponent from now on

            # 4. Log, show, checkpoint.
            metrics.update({**step_metrics(cfg, trajectories, informative, stats),
                            "steps/no_usable_episode": float(failed_in_a_row > 0),
                            **({"game/snapshot_version": float(snapshot.version)} if snapshot else {}),
                            "perf/steps_per_second": clock.sps(step + 1), **rollouts.metrics(),
                            **monitor.step(step + 1, trajectories,
                                           functools.partial(tokenizer.decode, skip_special_tokens=True))})
            if step == cfg.steps - 1:
                metrics.update(eval_metrics(cfg, evaluate(run, judge, policy, tokenizer, task.heldout, step + 1,
                                                          step + 1)))
            run.log(step + 1, metrics)
            progress.update(step + 1, reward=metrics["reward/mean"], acc=metrics.get("eval/accuracy", float("nan")))
            if step == cfg.steps - 1 or checkpoint_due(step + 1, step, cfg.checkpoint_every) or \
                    failed_in_a_row == FAILED_STEPS_TO_STOP:
                run.save(components, step=step + 1)
            if failed_in_a_row == FAILED_STEPS_TO_STOP:
                raise OmnigymError(f"every episode failed in {FAILED_STEPS_TO_STOP} steps in a row (steps "
                                   f"{step + 2 - FAILED_STEPS_TO_STOP}-{step + 1}; agent/errors counts them, the first "
                                   f"error is said above): the run stops, checkpointed at step {step + 1}; fix what "
                                   f"fails, then go on with omnigym train grpo --resume {run.dir}")
        progress.close()
    return finish_lm(run, cfg, trainer.full_model(), tokenizer)


def frozen_snapshot(cfg: GRPOConfig, policy, tokenizer) -> Snapshot:
    """--opponent snapshot: a copy of the policy as it starts, never trained, sampled by an engine
    of its own (an in-process one where --engine vllm: a second vLLM would hold the GPU twice)."""
    frozen = copy.deepcopy(policy).requires_grad_(False)
    return Snapshot(frozen, make_engine(frozen, tokenizer, "auto" if cfg.engine == "vllm" else cfg.engine))


def shards_weights(cfg: GRPOConfig) -> bool:
    """Whether the training backend keeps only a shard of the weights in each process."""
    if cfg.training_backend == "deepspeed" and cfg.deepspeed_config:
        from omnigym.backends.deepspeed import read_config

        return read_config(cfg.deepspeed_config).get("zero_optimization", {}).get("stage", 0) == 3
    return cfg.training_backend == "fsdp2"


def examples_for(cfg: GRPOConfig, train_set: list[dict], step: int) -> list[dict]:
    """Step ``step``'s prompts: a seeded draw, the same whether the run was resumed or not."""
    return random.Random(cfg.seed * 7_919 + step).sample(train_set, cfg.prompts_per_step)


def evaluate(run: Run, judge, policy, tokenizer, examples: list[dict], version: int,
             log_step: int) -> float:
    """Greedy held-out accuracy of policy ``version``; a few episodes go to samples.jsonl at
    ``log_step``. An engine outside this process (vLLM) gets the policy's weights first."""
    samples: list = []
    judge.update_weights(policy.named_parameters(), version)
    value = accuracy(judge, tokenizer, examples, samples)
    run.log_samples(log_step, samples)
    return value


def eval_metrics(cfg: GRPOConfig, accuracy_: float) -> dict:
    """Held-out accuracy; in a game (--env tictactoe) the judge plays the random opponent and wins
    score 1, so it is also the win rate under issue 42's name for it."""
    return {"eval/accuracy": accuracy_, **({"eval/vs_random/win_rate": accuracy_} if cfg.env in GAMES else {})}


def group_advantages(cfg: GRPOConfig, estimator, trajectories) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages ``[episodes, tokens]`` from each group's rewards, and which episodes
    carry signal (all, or with --skip-equal-groups those of groups whose rewards differ). An
    episode that failed (``info["error"]``: an --agent that raised or timed out) carries none and
    is left out of its group's baseline: the group is the episodes that finished. Groups are read
    by group id, not by position: an agent's episode may hand over several sequences."""
    group_ids = trajectories.group_ids()
    masks = padded([t.loss_mask for t in trajectories.items])
    rewards = token_rewards(trajectories, masks)
    valid = torch.tensor([not t.info.get("error") for t in trajectories.items], dtype=torch.bool)
    advantages = torch.zeros(masks.shape)
    if valid.any():
        advantages[valid], _ = estimator(rewards[valid], masks[valid], group_ids[valid],
                                         cfg=AdvantageConfig(cfg.gamma, cfg.lam),
                                         steps=step_reward_tensor(trajectories, masks)[valid])
    informative = valid.clone()
    if cfg.skip_equal_groups:  # an episode's score: its reward and its turns' step rewards
        scores = rewards.sum(1)
        for group in group_ids[valid].unique().tolist():
            members = valid & (group_ids == group)
            informative[members] = bool(scores[members].std() > 0) if members.sum() > 1 else False
    return advantages, informative


def token_rewards(trajectories, masks: torch.Tensor) -> torch.Tensor:
    """``[episodes, tokens]``: each episode's reward on its last generated token, plus, where an
    episode source gave them, its env's step rewards (``info["turn_rewards"]``, one per model
    turn) on the last token of their turns, and its --step-rewards on the tokens that end its
    steps. Only the per-turn estimator (--advantage gae) tells the turns apart, and only
    --advantage process the steps; the group estimators sum a row."""
    rewards = outcome_rewards(trajectories.rewards(), masks)
    for b, t in enumerate(trajectories.items):
        spans = turn_spans(masks[b])
        for k, r in enumerate(t.info.get("turn_rewards") or ()):
            if spans and r:  # a turn the mask does not separate (nothing inserted) joins the last one
                rewards[b, spans[min(k, len(spans) - 1)][1] - 1] += float(r)
    return rewards + step_reward_tensor(trajectories, masks).nan_to_num(nan=0.0)


@dataclass
class PolicyBatch:
    tokens: object                      # CompletionBatch
    advantages: torch.Tensor            # [B, C]
    old_logprobs: torch.Tensor | None   # the policy before this batch's steps (None: one step, ratio 1)
    ref_logprobs: torch.Tensor | None
    behaviour_logprobs: torch.Tensor | None


def policy_steps(cfg: GRPOConfig, trainer, reference, trajectories, advantages: torch.Tensor, pad_id: int,
                 loss_fn) -> dict:
    """``ppo_epochs`` clipped steps on ``trajectories``; returns the last step's stats. The batch
    is taken ``--micro-batch-size`` rows a pass, and each process of a data-parallel run trains
    its rows of each micro-batch; every part is weighed by its share of the batch (its
    sequences, or its generated tokens for a token-mean loss), so a step is one over the whole
    batch however it is cut."""
    token_mean = cfg.loss_aggregation == "token-mean"
    weights = [sum(t.loss_mask) for t in trajectories.items] if token_mean else [1] * len(trajectories)
    parts = []
    for rows, fraction in micro_batches(weights, cfg.micro_batch_size, world_size()):
        rows, share = trainer.local_part(rows, weights=[weights[i] for i in rows] if token_mean else None)
        parts.append((policy_batch(cfg, trainer, reference, [trajectories.items[i] for i in rows],
                                   advantages[rows], pad_id), share * fraction))
    for _ in range(cfg.ppo_epochs):
        passes = [trainer.forward_backward(batch, loss_fn, share) for batch, share in parts]
        trainer.optim_step()
    return {k: sum(p[k] for p in passes) if torch.is_tensor(v) and v.numel() == 1 else v
            for k, v in passes[0].items()}


def policy_batch(cfg: GRPOConfig, trainer, reference, items, advantages: torch.Tensor, pad_id: int) -> PolicyBatch:
    """The tensors a policy step reads for ``items``, with their reference and old log-probs."""
    tokens = make_completion_batch([t.prompt_ids for t in items], [t.response_ids for t in items], pad_id,
                                   [t.loss_mask for t in items], cfg.device)
    width = tokens.loss_mask.shape[1]
    behaviour = padded([t.logprobs for t in items], width).to(cfg.device) \
        if cfg.behaviour_cap_in_effect() is not None else None
    with torch.no_grad():
        # at the sampling temperature, as the engine recorded mu and as TRL and verl recompute them
        ref_logprobs = completion_logprobs(reference, tokens, cfg.temperature) if reference is not None else None
        old_logprobs = completion_logprobs(trainer.model, tokens, cfg.temperature) if cfg.ppo_epochs > 1 else None
    return PolicyBatch(tokens, advantages[:, :width].to(cfg.device), old_logprobs, ref_logprobs, behaviour)


def grpo_loss(model, batch: PolicyBatch, cfg: GRPOConfig, loss_cfg: PolicyLossConfig, step: int):
    """The clipped surrogate on the generated tokens, plus beta x KL to the reference. Tokens
    the env or the template inserted (loss mask 0) take no part: their log-probs, whatever they
    are, are replaced by 0 before any ratio or KL is taken, so they add nothing to the loss, the
    KL, the entropy estimate or the gradient (an inf or a NaN there times a 0 mask would)."""
    mask = batch.tokens.loss_mask
    valid = mask > 0

    def generated(logprobs):
        return None if logprobs is None else logprobs.masked_fill(~valid, 0.0)

    new_logprobs = generated(completion_logprobs(model, batch.tokens, cfg.temperature))
    old = generated(batch.old_logprobs) if batch.old_logprobs is not None else new_logprobs.detach()
    loss, stats = ppo_clip(new_logprobs, old, batch.advantages.masked_fill(~valid, 0.0), mask, loss_cfg,
                           generated(batch.behaviour_logprobs))
    # the sampled tokens' mean surprise: the policy's entropy, estimated on the tokens it generated
    stats["entropy"] = masked_mean(-new_logprobs.detach(), mask)
    if batch.ref_logprobs is not None:
        kl = kl_estimate(new_logprobs, generated(batch.ref_logprobs), cfg.kl_estimator)
        kl_term = aggregate(kl, mask, cfg.loss_aggregation, cfg.max_new_tokens)
        loss = loss + cfg.beta * kl_term
        stats["kl"] = kl_term.detach()
    check_finite(loss, step)
    return loss, stats


def step_metrics(cfg: GRPOConfig, trajectories, informative: torch.Tensor, stats: dict) -> dict:
    rewards, items = trajectories.rewards(), trajectories.items
    # the parts first: the trainer's own reward/ metrics are written over any part of the same name
    metrics = {**{f"reward/{k}": v for k, v in trajectories.reward_parts().items()}, "reward/mean": rewards.mean().item(),
               "reward/std": rewards.std().item(), "groups/kept_fraction": informative.float().mean().item(),
               # the model's own tokens: a tool's output between turns is not the model's length
               "completion/length": sum(sum(t.loss_mask) for t in items) / len(items),
               "completion/cut_off_fraction": sum(t.info["cut_off"] for t in items) / len(items)}
    if stats:
        metrics.update({"losses/policy_loss": stats["loss"].item(), "losses/clip_fraction": stats["clip_fraction"].item(),
                        "losses/clipped_objective_fraction": stats["clipped_objective_fraction"].item(),
                        "losses/approx_kl": stats["approx_kl"].item(), "policy/entropy": stats["entropy"].item()})
        if "kl" in stats:
            metrics["kl/mean"] = stats["kl"].item()
    if cfg.env != "single-turn":
        metrics["episode/turns"] = sum(t.info["turns"] for t in items) / len(items)
    if cfg.env in GAMES:  # a reply that is not one legal move lost its game
        metrics["game/invalid_move_fraction"] = sum(bool(t.example.get("invalid") or t.info.get("invalid_move"))
                                                    for t in items) / len(items)
        if cfg.opponent == "snapshot":  # the snapshot's invalid moves, replaced by random legal ones
            moves = sum(t.info["opponent_moves"] for t in items)
            metrics["game/opponent_replaced_fraction"] = sum(t.info["opponent_moves_replaced"] for t in items) / \
                max(moves, 1)
    if cfg.agent or cfg.env.startswith("vf:"):
        metrics.update(agent_metrics(items))
    return {**metrics, **judge_metrics(trajectories)}


def cut_off_lines(cfg, logged: list[dict], percent: float) -> list[str]:
    """An agent's cut-off replies by the limit they ran into: its requests' own max_tokens
    (raising --max-new-tokens would change nothing), --max-new-tokens, or the model's context."""
    share = {}
    for name in ("max_tokens", "max_new_tokens", "context"):
        values = [r[f"completion/cut_by_{name}_fraction"] for r in logged if f"completion/cut_by_{name}_fraction" in r]
        share[name] = 100 * sum(values) / max(len(values), 1)
    advice = {"max_tokens": (f"by the agent's own max_tokens: {share['max_tokens']:.1f}% (raise max_tokens in its "
                             f"requests if this is high; --max-new-tokens {cfg.max_new_tokens} is the most a request gets)"),
              "max_new_tokens": (f"by --max-new-tokens {cfg.max_new_tokens}: {share['max_new_tokens']:.1f}% "
                                 "(raise --max-new-tokens if this is high)"),
              "context": (f"by the model's context: {share['context']:.1f}% (the conversation left too little of it; "
                          "shorten the conversation if this is high)")}
    return [f"completions cut off: {percent:.1f}% (an answer cut off scores as wrong)",
            *(f"  {advice[name]}" for name in advice if share[name])]


def finish_lm(run: Run, cfg, policy, tokenizer) -> dict:
    """``policy``: the whole trained model (None in the other processes of a data-parallel run),
    written to RUN_DIR/model for the next stage (omnigym sample, train sft, --model)."""
    if not run.writer:  # the first process of a data-parallel run reports
        run.close(plot=False)
        return {"run_dir": str(run.dir)}
    run.export_model(policy, tokenizer)
    logged = read_metrics(run.dir)
    rows = [r for r in logged if "eval/accuracy" in r]
    # accuracy, and the reward GRPO learns from below it (curve.png; the warm-up drawn first)
    plot_path = run.close(plot=cfg.plot and bool(rows), metric=("eval/accuracy", "reward/mean"))
    before, after = (rows[0]["eval/accuracy"], rows[-1]["eval/accuracy"]) if rows else (float("nan"),) * 2
    # in a game the judge plays the random opponent (eval_metrics): the figure is a win rate
    measured = "win rate against the random opponent" if cfg.env in GAMES else "held-out accuracy"
    run.say(f"run: {run.dir}  (the policy: {run.dir / 'model'})",
            f"{measured} before GRPO: {before:.3f}  after: {after:.3f}  ({100 * (after - before):+.1f} points)")
    cut = [r["completion/cut_off_fraction"] for r in logged if "completion/cut_off_fraction" in r]
    if cut and any("completion/cut_by_max_tokens_fraction" in r for r in logged):  # an agent: its own limit too
        run.say(*cut_off_lines(cfg, logged, 100 * sum(cut) / len(cut)))
    elif cut:
        run.say(f"completions cut off by --max-new-tokens {cfg.max_new_tokens}: {100 * sum(cut) / len(cut):.1f}% "
                "(an answer cut off scores as wrong; raise --max-new-tokens if this is high)")
    if plot_path:
        run.say(f"curve: {plot_path}")
    return {"run_dir": str(run.dir), "accuracy_before": before, "accuracy_after": after,
            "cut_off_fraction": sum(cut) / len(cut) if cut else float("nan"),
            "plot": str(plot_path) if plot_path else None}
