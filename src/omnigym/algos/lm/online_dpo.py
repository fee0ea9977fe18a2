"""Online DPO (Guo et al., 2024; the asynchronous RLHF of Noukhovitch et al., 2025): DPO on pairs
the current policy samples, ranked by a judge.

Each step:

1. sample ``--samples-per-prompt`` k replies to each of ``prompts_per_step`` prompts (with
   ``--runtime ray`` on generator actors, up to ``--max-staleness`` policy versions old);
2. the judge (``--rewards``: a reward model ``rm:RUN_DIR`` or ``rm:URL``, a verifiable reward,
   any weighted sum of the registry) scores every reply, less ``--missing-eos-penalty`` where
   the reply never ended;
3. each prompt's best and worst reply become a (chosen, rejected) pair; a prompt whose replies
   all score the same gives none;
4. one AdamW step on the preference loss (``--loss``: DPO's sigmoid, IPO, hinge; the shared
   ``preference_loss``) of the pairs' sequence log-probs against the frozen reference.

DPO needs no importance ratio: a pair is a pair whichever policy sampled it, which is why the
Asynchronous RLHF paper finds it the loss that degrades least when samples are stale.
``omnigym train online_dpo`` with no flags runs on the offline RLHF demo's world (as
``train rlhf`` does): its SFT policy, its reward model as the judge, and the hidden gold rule
scored on held-out prompts (never trained on) beside the KL to the reference.
"""

from __future__ import annotations

import functools
import os
import sys

from contextlib import closing
from dataclasses import dataclass

import torch

from omnigym.algos import get_algorithm
from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_fraction, require_non_negative, require_positive
from omnigym.errors import require
from omnigym.evaluation.text import finish_sampled_run, heldout_rewards
from omnigym.generators.base import Trajectories
from omnigym.generators.prompts import PromptGenerator, remote_prompt_generator
from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.lm import LoraSettings, check_context, load_policy_and_tokenizer
from omnigym.models.reference import FrozenReference
from omnigym.models.tokens import completion_logprobs, make_completion_batch
from omnigym.optim import adamw
from omnigym.pipelines.rlhf_demo import DemoModels, demo_models, given_gold_reward
from omnigym.process import scoped_run
from omnigym.rewards import parse_weights, scored_with_notes
from omnigym.rewards.judge import judge_metrics
from omnigym.rl.hacking import SCORED_KEYS, HackingMonitor
from omnigym.rl.losses import PREFERENCE_LOSSES, check_finite, preference_loss
from omnigym.runtime import RolloutRuntimeConfig, make_rollouts
from omnigym.tasks.preference_data import read_prompts
from omnigym.tasks.prompt_set import PromptSetConfig, prompts_for_step, split_prompts
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.resume import reward_places
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import start_run


@dataclass
class OnlineDPOConfig(PromptSetConfig, RolloutRuntimeConfig, LanguageModelConfig):
    rewards: str | None = None
    """the judge, name:weight,... of the reward registry: rm:RUN_DIR (omnigym train rm), rm:URL
    (omnigym serve-rm), a verifiable reward, your own module:name; none (with --model tiny):
    the offline demo's reward model"""
    pairwise_judge: str | None = None
    """instead of --rewards: a judge model shown two replies, MODEL_FOLDER or http://HOST:PORT/v1 (an
    OpenAI-compatible endpoint): each prompt's pair is the replies it prefers most and least, each
    comparison asked in both orders (docs/judges.md); held-out replies get its judge:... score; --missing-eos-penalty
    is not applied (the judge reads the reply as it was cut)"""
    gold_reward: str | None = None
    """rewards scored on held-out samples at each evaluation, never trained on; the demo uses
    its hidden rule, gold_vowels:1.0"""
    samples_per_prompt: int = 2
    """k replies sampled per prompt; the best and the worst make its pair"""
    loss: str = "sigmoid"
    """sigmoid (DPO), ipo, hinge or simpo"""
    beta: float = 0.1
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    steps: int = 100
    prompts_per_step: int = 16
    learning_rate: float = 2e-4
    missing_eos_penalty: float = 1.0
    """subtracted from the judge's score of a reply that never emitted the end-of-sequence token"""
    max_new_tokens: int = 40
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    eval_every: int = 25
    checkpoint_every: int = 50
    hacking_warnings: bool = True
    """say a warning line when the reward-hacking monitor finds a known hack (the judge's score rising
    while the held-out gold reward, --gold-reward, falls; the score following reply length; the
    question echoed); the hacking/... metrics are logged either way (docs/hacking.md)"""

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("rewards", "pairwise_judge", "data", "split", "max_prompt_length",
                                                       "eval_prompts", "samples_per_prompt", "loss", "runtime",
                                                       "max_staleness", "num_generators")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        self.check_runtime(self.prompts_per_step, training_backend=self.training_backend)
        require_positive(self, "steps", "prompts_per_step", "learning_rate", "beta", "max_new_tokens", "temperature",
                         "max_grad_norm", "eval_prompts", "eval_every", "max_prompt_length")
        require_non_negative(self, "missing_eos_penalty", "checkpoint_every", "simpo_gamma")
        require_fraction(self, "label_smoothing")
        from omnigym.pipelines.rlhf_demo import check_demo_in_one_process

        check_demo_in_one_process(self, demo=self.rewards is None and self.pairwise_judge is None)
        require(self.label_smoothing < 0.5, f"--label-smoothing must be below 0.5, got {self.label_smoothing}")
        require(self.samples_per_prompt >= 2,
                f"--samples-per-prompt must be at least 2 (a pair is two replies), got {self.samples_per_prompt}")
        require(self.loss in PREFERENCE_LOSSES, f"unknown --loss {self.loss!r}; choose one of "
                                                f"{', '.join(PREFERENCE_LOSSES)}")
        require(self.behaviour_cap is None, "--behaviour-cap weighs a policy-gradient loss by pi_old / pi_behaviour; "
                                            "online DPO's loss has no such ratio (a stale pair is still a pair)")
        require(not (self.rewards and self.pairwise_judge), "give --rewards or --pairwise-judge, not both: "
                "each is the judge that makes the pairs")
        require(self.rewards is not None or self.pairwise_judge is not None or self.model == "tiny",
                "give --rewards, the judge (rm:RUN_DIR of a finished `omnigym train rm`, rm:URL of `omnigym serve-rm`, "
                "or any reward); only the built-in demo (--model tiny) trains its own")


CONFIG = OnlineDPOConfig


@scoped_run
def train(cfg: OnlineDPOConfig) -> dict:
    # a misspelt reward: one line before any run
    judge = parse_weights(cfg.rewards, places=reward_places(cfg)) if cfg.rewards else None
    pairwise = None
    if cfg.pairwise_judge:  # its pointwise score is the held-out judge_score
        from omnigym.rewards.judge import PairwiseJudge

        pairwise = PairwiseJudge(cfg.pairwise_judge, max_new_tokens=256, device=cfg.device)
        judge = parse_weights(f"judge:{cfg.pairwise_judge}:1.0")
    rows = read_prompts(cfg.data, cfg.split, cfg.seed)
    gold = given_gold_reward(cfg)  # a bad one: one line before the demo's stages run
    run = start_run(cfg, "online_dpo", cfg.model)
    if judge is None:  # the demo: its SFT policy, its reward model as the judge, its gold rule
        models = demo_models(cfg, run, get_algorithm("sft"), get_algorithm("rm"))  # its stages' trainers, by name
        judge = parse_weights(f"rm:{models.reward_model}:1.0")
    else:
        models = DemoModels(cfg.model, cfg.rewards or f"judge:{cfg.pairwise_judge}:1.0", cfg.gold_reward)
    judge = judge.to(cfg.device)
    gold = (gold or parse_weights(models.gold_reward)).to(cfg.device) if models.gold_reward else None
    policy, tokenizer = load_policy_and_tokenizer(models.policy, cfg.seed, cfg.chat_template,
                                                  LoraSettings(r=cfg.lora_r), cfg.device, need_chat_template=False)
    check_context(policy, cfg.max_new_tokens)
    heldout, training, left_out = split_prompts(cfg, rows, tokenizer)

    reference = FrozenReference(policy)  # the policy as it starts; rebuilt from it on resume
    engine = make_engine(policy, tokenizer)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.learning_rate), cfg.max_grad_norm)
    components = {"trainer": trainer}
    rollouts = make_rollouts(cfg, PromptGenerator(engine, params, tokenizer.eos_token_id),
                             functools.partial(remote_prompt_generator, cfg, models.policy, os.getcwd()),
                             functools.partial(prompts_for_step, cfg, training), cfg.samples_per_prompt, cfg.steps,
                             cfg.seed)
    if cfg.runtime == "ray":  # the finished rollouts in flight, for an exact resume
        components["rollouts"] = rollouts
    judges = {"judge_score": judge, **({"gold_reward": gold} if gold is not None else {})}
    loss_fn = functools.partial(pair_loss, cfg=cfg, pad_id=tokenizer.pad_token_id)
    with closing(rollouts):  # Ray's actors end with the run, however it ends
        step = run.begin(components).get("step", 0)
        # the judge's score against the gold it stands for, as in PPO-RLHF
        monitor = HackingMonitor.for_run(run, step, cfg.hacking_warnings, SCORED_KEYS)
        if step == 0:
            evaluated = heldout_rewards(cfg, run, policy, reference, engine, tokenizer, heldout, judges, params, 0)
            run.log(0, {**evaluated, "data/prompts_left_out": left_out, "data/train_prompts": len(training)})
            monitor.evaluated(0, evaluated)
        progress = ProgressBar(cfg.steps, "online_dpo", start=step, enabled=cfg.progress)
        clock = Clock(step)
        rollouts.update_weights(policy.named_parameters(), version=step)  # the generators start from this policy
        steps_here, trained_here = step, 0
        while step < cfg.steps:
            # 1. k replies a prompt (ray: sampled up to --max-staleness versions ago).
            items = rollouts.trajectories(step).items
            # 2. The judge scores every reply; 3. each prompt's best and worst make its pair.
            if pairwise is not None:
                pairs, scores = preferred_pairs(pairwise, items, tokenizer)
            else:
                scores = judged_scores(cfg, judge, items, tokenizer)
                pairs = best_and_worst(items, scores)
            # 4. One step on the preference loss of the pairs, against the reference's log-probs.
            stats = {}
            if pairs:
                rows, share = trainer.local_part(range(len(pairs)))
                mine = [pairs[i] for i in rows]
                ref = reference.run(functools.partial(sequence_logps, cfg=cfg, pad_id=tokenizer.pad_token_id), mine) \
                    if cfg.loss != "simpo" else None
                stats = trainer.forward_backward((mine, ref, step), loss_fn, share)
                trainer.optim_step()
                trained_here += 1
            rollouts.update_weights(policy.named_parameters() if pairs else (), version=step + 1)

            step += 1
            metrics = {**step_metrics(items, scores, pairs, stats), "perf/steps_per_second": clock.sps(step),
                       **rollouts.metrics(), **judge_metrics(Trajectories(items))}
            if step % cfg.eval_every == 0 or step == cfg.steps:
                evaluated = heldout_rewards(cfg, run, policy, reference, engine, tokenizer, heldout, judges, params, step)
                metrics.update(evaluated)
                monitor.evaluated(step, evaluated)  # before the step's check, so the last one is checked too
            decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
            metrics.update(monitor.step(step, Trajectories(items), decode, paid=scores.tolist(), logged=metrics))
            run.log(step, metrics)
            progress.update(step, score=metrics["reward/score"], pairs=metrics["pairs/kept_fraction"])
            if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
                run.save(components, step=step)
        progress.close()
        if step > steps_here and not trained_here:  # it ran and exited 0 with an unchanged policy, unsaid
            print(f"omnigym: note: none of the {step - steps_here} steps had a pair to train on (each prompt's replies "
                  f"{'had no reply preferred in both orders' if pairwise is not None else 'all scored alike'}), so the "
                  "policy did not change; see pairs/kept_fraction (docs/online_dpo.md)", file=sys.stderr, flush=True)
        return finish_sampled_run(run, cfg, trainer.full_model(), tokenizer, gold is not None, "judge_score",
                                  "judge's score")


@torch.no_grad()
def judged_scores(cfg: OnlineDPOConfig, judge, items: list, tokenizer) -> torch.Tensor:
    """The judge's score of each reply, less --missing-eos-penalty where it never ended; what the
    judge noted of a reply (a verdict it could not read) goes to the reply's info."""
    texts = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in items]
    scores, _, notes = scored_with_notes(judge, texts, [t.example for t in items])
    scores = scores.double().cpu()
    for name, column in notes.items():
        for t, value in zip(items, column):
            t.info[name] = value
    unfinished = torch.tensor([not t.info["finished"] for t in items], dtype=torch.float64)
    return scores - cfg.missing_eos_penalty * unfinished


def best_and_worst(items: list, scores: torch.Tensor) -> list[tuple]:
    """(chosen, rejected) per prompt: its highest- and lowest-scored replies (the first of equal
    ones); none where all its replies score the same."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(items):
        groups.setdefault(t.group_id, []).append(i)
    pairs = []
    for members in groups.values():
        best = max(members, key=lambda i: scores[i].item())
        worst = min(members, key=lambda i: scores[i].item())
        if scores[best] > scores[worst]:
            pairs.append((items[best], items[worst]))
    return pairs


@torch.no_grad()
def preferred_pairs(judge, items: list, tokenizer) -> tuple[list[tuple], torch.Tensor]:
    """(chosen, rejected) per prompt by a pairwise judge: the reply that beat or tied every one
    it met and the one that lost or tied every one, each reply after the first meeting the best
    and the worst so far (2(k-1) comparisons a prompt, all prompts' in one batch a round); none
    where no comparison was decided. Scores: 1 for the chosen, 0 for the rest (for the metrics; a
    prompt with no pair has no chosen reply)."""
    texts = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in items]
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(items):
        groups.setdefault(t.group_id, []).append(i)
    best = {g: members[0] for g, members in groups.items()}
    worst = dict(best)
    for round_ in range(1, max(len(m) for m in groups.values())):
        meet = [(g, members[round_]) for g, members in groups.items() if round_ < len(members)]
        firsts = [texts[best[g]] for g, _ in meet] + [texts[worst[g]] for g, _ in meet]
        seconds = [texts[c] for _, c in meet] * 2
        examples = [items[c].example for _, c in meet] * 2
        verdicts = judge.prefer(examples, firsts, seconds)
        for (g, c), over_best, over_worst in zip(meet, verdicts[:len(meet)], verdicts[len(meet):]):
            if over_best == 1:
                best[g] = c
            if over_worst == 0:
                worst[g] = c
    pairs = [(items[best[g]], items[worst[g]]) for g in groups if best[g] != worst[g]]
    scores = torch.zeros(len(items), dtype=torch.float64)
    scores[[best[g] for g in groups if best[g] != worst[g]]] = 1.0
    return pairs, scores


def sequence_logps(model, pairs: list[tuple], cfg: OnlineDPOConfig, pad_id: int) -> torch.Tensor:
    """``[2P]``: every pair's chosen reply, then every pair's rejected reply, as the sum of its
    tokens' log-probs (IPO and SimPO: their mean)."""
    replies = [chosen for chosen, _ in pairs] + [rejected for _, rejected in pairs]
    tokens = make_completion_batch([t.prompt_ids for t in replies], [t.response_ids for t in replies], pad_id,
                                   device=cfg.device)
    mask = tokens.loss_mask
    total = (completion_logprobs(model, tokens) * mask).sum(1)
    return total / mask.sum(1).clamp(min=1) if cfg.loss in ("ipo", "simpo") else total


def pair_loss(model, batch, cfg: OnlineDPOConfig, pad_id: int):
    pairs, ref, step = batch
    logps, n = sequence_logps(model, pairs, cfg, pad_id), len(pairs)
    loss, stats = preference_loss(logps[:n], logps[n:], *((ref[:n], ref[n:]) if ref is not None else (None, None)),
                                  cfg.loss, cfg.beta, cfg.label_smoothing, cfg.simpo_gamma)
    check_finite(loss, step)
    return loss, stats


def step_metrics(items: list, scores: torch.Tensor, pairs: list, stats: dict) -> dict:
    prompts = len({t.group_id for t in items})
    metrics = {"reward/score": scores.mean().item(), "pairs/kept_fraction": len(pairs) / max(prompts, 1),
               "completion/length": sum(len(t.response_ids) for t in items) / len(items),
               "completion/eos_fraction": sum(bool(t.info["finished"]) for t in items) / len(items)}
    if pairs:
        index = {id(t): i for i, t in enumerate(items)}
        metrics.update({"reward/chosen_score": sum(scores[index[id(c)]].item() for c, _ in pairs) / len(pairs),
                        "reward/rejected_score": sum(scores[index[id(r)]].item() for _, r in pairs) / len(pairs),
                        "completion/chosen_length": sum(len(c.response_ids) for c, _ in pairs) / len(pairs)})
    if stats:
        metrics["losses/loss"] = stats["loss"].item()
        metrics.update({k: v.item() for k, v in stats.items() if k.startswith("rewards/")})
    return metrics
