"""On-policy distillation (Thinking Machines, "On-Policy Distillation", 2025; Agarwal et al.'s GKD,
2024, in its on-policy, sampled-token form): the student learns from a teacher on its own samples.

Each step:

1. the student samples ``--samples-per-prompt`` replies to each of ``--prompts-per-step`` prompts
   of the task (the same task, env, engine and rollouts as ``train grpo``);
2. the teacher scores every sampled token: one forward pass of the teacher on prompt + reply
   gives its log-prob of each token the student wrote;
3. each generated token's advantage is ``log p_teacher(token) - log p_student(token)``, the
   negative of the per-token reverse-KL estimate (discount 0: a token answers for itself only,
   no baseline), plus, with ``--reward-weight w``, ``w x (reward - the batch's mean reward)``
   of the task's verifiable reward on every token of the reply;
4. ``--ppo-epochs`` policy steps on the importance-weighted objective ``-ratio x advantage``
   against the log-probs the student had when it sampled: ``--loss is`` (the recipe's plain
   importance sampling, no clip) or ``--loss ppo_clip`` (PPO's clip at ``--clip``).

The teacher is a model folder or an omnigym run directory (its ``model/``); it must share the
student's tokenizer, since it reads the student's token ids. With no ``--teacher`` the run is an
offline demo: the teacher is omnigym's GRPO demo, trained first as a stage of the run
(``pipelines/distill_demo.py``), and the student by default "tiny-small", a quarter of its size
with the same character tokenizer; the run prints both models' held-out accuracy. The demo's
student, and any built-in untrained one ("tiny", "tiny-small"), first gets GRPO's supervised
warm-up (``stages/warmup``). Held-out
accuracy (greedy, the task's correctness reward) is logged as GRPO logs it. docs/distillation.md says
where this differs from TRL's GKDTrainer.
"""

from __future__ import annotations

import functools
import os
import random
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import torch

from omnigym.algos import get_algorithm
from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_non_negative, require_positive
from omnigym.distributed import gathered
from omnigym.errors import OmnigymError, require
from omnigym.evaluation.text import accuracy, judged_env
from omnigym.generators.text_tasks import ECOSYSTEM, GAMES, TextTaskConfig, make_generator, remote_generator, \
    task_env, text_task
from omnigym.inference import check_engine_available, make_engine
from omnigym.models.lm import LoadFailed, LoraSettings, check_context, load_model, load_policy_and_tokenizer, \
    TINY_MODELS, load_tokenizer, model_folder, resolve_model
from omnigym.models.precision import compute_in, store_frozen
from omnigym.models.tokens import completion_logprobs, make_completion_batch, padded
from omnigym.optim import adamw
from omnigym.pipelines.distill_demo import student_warm_up, teacher_accuracy, teacher_stage
from omnigym.process import scoped_run
from omnigym.generators.base import Trajectories
from omnigym.rewards.judge import judge_metrics
from omnigym.rl.hacking import DISTILL_KEYS, HackingMonitor
from omnigym.rl.losses import PolicyLossConfig, check_finite, masked_mean, ppo_clip
from omnigym.runtime import RolloutRuntimeConfig, make_rollouts
from omnigym.runtime.episodes import EpisodeScheduleConfig
from omnigym.track.files import read_metrics
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import Run, start_run

LOSSES = ("is", "ppo_clip")


@dataclass
class DistillConfig(TextTaskConfig, EpisodeScheduleConfig, RolloutRuntimeConfig, LanguageModelConfig):
    model: str = "tiny-small"
    """the student: hub id or local path of a causal LM; "tiny-small" (0.27M parameters) and "tiny" (1.06M)
    are built offline"""
    teacher: str | None = None
    """the teacher: a model folder (save_pretrained) or the directory of a finished omnigym run (its model/);
    it must use the student's tokenizer. None: the offline demo's teacher, omnigym's GRPO demo trained first in
    RUN_DIR/stages/teacher"""
    steps: int = 200
    prompts_per_step: int = 16
    samples_per_prompt: int = 4
    learning_rate: float = 1e-4
    loss: str = "is"
    """is (plain importance sampling, -ratio x advantage, as the recipe) or ppo_clip (clipped at --clip)"""
    clip: float = 0.2
    ppo_epochs: int = 1
    """policy steps per batch, against the log-probs the student sampled with (1: the ratio is 1)"""
    reward_weight: float = 0.0
    """weight of the task's reward (less the batch's mean) added to every token's advantage; 0: the
    teacher alone"""
    max_grad_norm: float = 1.0
    eval_every: int = 50
    checkpoint_every: int = 50
    hacking_warnings: bool = True
    """say a warning line when the reward-hacking monitor finds a known hack (the student matching the
    teacher better while held-out accuracy falls: teacher hacking; the question echoed); the hacking/...
    metrics are logged either way (docs/hacking.md)"""

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("teacher", "task", "env", "env_args", "eval_size", "digits",
                                                       "terms", "operations", "runtime", "max_staleness",
                                                       "num_generators", "rollouts")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        self.check_runtime(self.prompts_per_step, training_backend=self.training_backend)
        self.check_episodes(self.prompts_per_step, multi_turn=self.env != "single-turn")
        self.check_task()
        require_positive(self, "steps", "prompts_per_step", "samples_per_prompt", "learning_rate", "max_grad_norm",
                         "ppo_epochs", "eval_every")
        require_non_negative(self, "clip", "reward_weight", "checkpoint_every")
        require(self.loss in LOSSES, f"unknown --loss {self.loss!r}; choose one of {', '.join(LOSSES)}")
        require(self.env not in GAMES and not self.env.startswith(ECOSYSTEM),
                f"--env {self.env}: distillation scores the student's own replies to a task's prompts; use "
                "single-turn, tools, python, search or guess")


CONFIG = DistillConfig


@scoped_run
def train(cfg: DistillConfig) -> dict:
    task, _ = text_task(cfg)
    if len(task.train) < cfg.prompts_per_step:
        raise OmnigymError(f"--task {cfg.task} leaves {len(task.train)} training examples after the {cfg.eval_size} "
                           f"held out; that is fewer than --prompts-per-step {cfg.prompts_per_step} asks: give a smaller "
                           "one, a smaller --eval-size, or more examples")
    env, correct = task_env(cfg, task)
    teacher_dir = teacher_folder(cfg) if cfg.teacher is not None else None
    # both models load before the run directory is made: a teacher that cannot teach this student writes nothing
    policy, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device)
    check_context(policy, cfg.max_new_tokens)
    if teacher_dir is None:  # before the demo's teacher trains: a student it cannot teach waits for nothing
        check_demo_student(cfg, tokenizer, policy)
    teacher = load_teacher(cfg, teacher_dir, tokenizer, policy) if teacher_dir else None
    check_engine_available(cfg.engine, cfg.lora_r)  # the extra it needs: before a warm-up of minutes
    run = start_run(cfg, "distill", cfg.model)
    grpo = get_algorithm("grpo")
    demo = teacher_stage(cfg, run, grpo) if teacher is None else None  # the demo's (pipelines/distill_demo.py)
    if demo is not None or cfg.model in TINY_MODELS:
        # an untrained student does not learn the answer format from the teacher's grades: GRPO's warm-up first
        student = student_warm_up(cfg, run, grpo, env, correct, task.train)
        policy, tokenizer = load_policy_and_tokenizer(str(student), cfg.seed, cfg.chat_template,
                                                      LoraSettings(r=cfg.lora_r), cfg.device)
    if demo is not None:
        teacher = load_teacher(cfg, str(demo / "model"), tokenizer, policy)
    engine = make_engine(policy, tokenizer, cfg.engine)
    sampler = make_generator(cfg, env, engine, tokenizer)
    judge = make_generator(cfg, judged_env(env, correct), engine, tokenizer, greedy=True)  # held-out accuracy
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.learning_rate), cfg.max_grad_norm)
    components = {"trainer": trainer}
    rollouts = make_rollouts(cfg, sampler, functools.partial(remote_generator, cfg, os.getcwd()),
                             functools.partial(examples_for, cfg, task.train), cfg.samples_per_prompt, cfg.steps,
                             cfg.seed)
    if cfg.runtime == "ray" or cfg.rollouts == "async":  # their rollouts in flight, for an exact resume
        components["rollouts"] = rollouts
    bound = float("inf") if cfg.loss == "is" else cfg.clip  # plain importance sampling: a clip that never bites
    loss_cfg = PolicyLossConfig(bound, bound, "token-mean", behaviour_cap=cfg.behaviour_cap_in_effect())
    loss_fn = functools.partial(distill_loss, cfg=cfg, loss_cfg=loss_cfg)
    with closing(rollouts):
        step = run.begin(components).get("step", 0)
        progress = ProgressBar(cfg.steps, "distill", start=step, enabled=cfg.progress)
        clock = Clock(step)
        rollouts.update_weights(policy.named_parameters(), version=step)
        monitor = HackingMonitor.for_run(run, step, cfg.hacking_warnings, DISTILL_KEYS)
        decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
        for step in range(step, cfg.steps):
            metrics = {}
            if step % cfg.eval_every == 0:
                metrics["eval/accuracy"] = evaluate(run, judge, policy, tokenizer, task.heldout, step, step + 1)
                monitor.heldout(step, metrics["eval/accuracy"])
            items = [t for t in rollouts.trajectories(step).items if not t.info.get("error")]
            stats = distill_step(cfg, trainer, teacher, items, tokenizer.pad_token_id, loss_fn, step) if items else {}
            rollouts.update_weights(policy.named_parameters() if items else (), version=step + 1)
            metrics.update({**step_metrics(cfg, items, stats), "perf/steps_per_second": clock.sps(step + 1),
                            **rollouts.metrics()})
            if items:  # the step's replies, each with what it was paid
                metrics.update(monitor.step(step + 1, Trajectories(items), decode, paid=stats["paid"], logged=metrics))
            if step == cfg.steps - 1:
                if step == 0:  # --steps 1: the accuracy before gets a row of its own
                    run.log(0, {"eval/accuracy": metrics.pop("eval/accuracy")})
                metrics["eval/accuracy"] = evaluate(run, judge, policy, tokenizer, task.heldout, step + 1, step + 1)
            run.log(step + 1, metrics)
            progress.update(step + 1, kl=metrics.get("distill/reverse_kl", float("nan")))
            if step == cfg.steps - 1 or checkpoint_due(step + 1, step, cfg.checkpoint_every):
                run.save(components, step=step + 1)
        progress.close()
    return finish(run, cfg, trainer.full_model(), tokenizer, demo)


def teacher_folder(cfg: DistillConfig) -> str:
    """--teacher's model folder (a run directory's model/), refused in one line when it is missing,
    not a model, "tiny" (an untrained model teaches nothing) or the student itself."""
    require(cfg.teacher not in TINY_MODELS,
            f"--teacher {cfg.teacher} is an untrained model and teaches nothing; give a trained model folder or the "
            "directory of a finished omnigym run (or no --teacher: the demo trains one)")
    folder = resolve_model(cfg.teacher, f"--teacher {cfg.teacher}")
    student = None
    if cfg.model not in TINY_MODELS:
        try:
            student = resolve_model(cfg.model)
        except OmnigymError:
            student = None  # said when the student loads
    same = cfg.teacher == cfg.model or (student is not None and Path(student).exists() and Path(folder).exists()
                                        and Path(student).resolve() == Path(folder).resolve())
    require(not same, f"--teacher {cfg.teacher} is the student (--model {cfg.model}) itself: its reverse KL to "
                      "itself is 0 and there is nothing to learn; give another model as the teacher")
    return folder


def check_demo_student(cfg: DistillConfig, tokenizer, student) -> None:
    """With no --teacher the teacher is the built-in tiny model trained by GRPO: a student that
    does not read its character tokenizer is refused in one line, before the teacher trains."""
    with model_folder("tiny", cfg.seed) as folder:
        theirs = load_tokenizer(folder, need_chat_template=False).get_vocab()
    mine, width = tokenizer.get_vocab(), student.get_output_embeddings().weight.shape[0]
    require(mine == theirs and width == len(theirs),
            f"--model {cfg.model} does not share the demo teacher's tokenizer (the built-in tiny model's "
            f"{len(theirs)} characters; the student's: {len(mine)} tokens, output width {width}): with no --teacher "
            "the teacher is omnigym's GRPO demo model; give --teacher MODEL_OR_RUN with this student's tokenizer, "
            "or a student built with omnigym.models.lm.build_tiny_model")


def load_teacher(cfg: DistillConfig, folder: str, tokenizer, student):
    """The frozen teacher, on the student's device, after checking that it reads the student's
    token ids as the student does (the same vocabulary, the same output width)."""
    try:
        teacher_tokenizer = load_tokenizer(folder, need_chat_template=False)
        teacher = load_model(folder, device=cfg.device)
    except LoadFailed as exc:
        raise OmnigymError(f"--teacher {cfg.teacher or folder}: {exc}") from None
    mine, theirs = tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    widths = (student.get_output_embeddings().weight.shape[0], teacher.get_output_embeddings().weight.shape[0])
    # the same tokens; the output widths may differ where a model pads its table past the tokenizer (Qwen2.5-7B's
    # 152,064 rows and 0.5B's 151,936 share one tokenizer): a token's log-prob is read at its id either way
    if mine != theirs or widths[1] < len(mine):
        raise OmnigymError(f"--teacher {cfg.teacher or folder} does not share the student's tokenizer "
                           f"({len(theirs)} tokens, output width {widths[1]}; the student's: {len(mine)}, "
                           f"{widths[0]}): the teacher scores the student's token ids, so both need the same tokenizer")
    teacher.eval()
    teacher.requires_grad_(False)
    return store_frozen(compute_in(teacher, cfg.precision))  # scored in the student's precision


def examples_for(cfg: DistillConfig, train_set: list[dict], step: int) -> list[dict]:
    """Step ``step``'s prompts: a seeded draw, the same whether the run was resumed or not."""
    return random.Random(cfg.seed * 7_919 + step).sample(train_set, cfg.prompts_per_step)


def token_advantages(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor,
                     rewards: torch.Tensor | None = None, reward_weight: float = 0.0) -> torch.Tensor:
    """``[B, C]``: each generated token's ``log p_teacher - log p_student`` (minus the per-token
    reverse-KL estimate, discount 0), plus ``reward_weight x (reward - mean reward)`` of its
    reply; 0 on the tokens the model did not write (mask 0)."""
    advantages = teacher_logprobs - student_logprobs
    if rewards is not None and reward_weight:
        advantages = advantages + reward_weight * (rewards - rewards.mean()).to(advantages)[:, None]
    return advantages.masked_fill(mask <= 0, 0.0)


@dataclass
class DistillBatch:
    tokens: object                      # CompletionBatch
    advantages: torch.Tensor            # [B, C]
    old_logprobs: torch.Tensor          # the student as it sampled
    behaviour_logprobs: torch.Tensor | None


def distill_step(cfg: DistillConfig, trainer, teacher, items: list, pad_id: int, loss_fn, step: int) -> dict:
    """Teacher-scored advantages for this process's replies, then ``--ppo-epochs`` policy steps."""
    tokens_per_row = [sum(t.loss_mask) for t in items]
    rows, share = trainer.local_part(range(len(items)), weights=tokens_per_row)
    mine = [items[i] for i in rows]
    tokens = make_completion_batch([t.prompt_ids for t in mine], [t.response_ids for t in mine], pad_id,
                                   [t.loss_mask for t in mine], cfg.device)
    mask = tokens.loss_mask
    with torch.no_grad():
        # the student at the temperature it sampled at; the teacher's own distribution
        student = completion_logprobs(trainer.model, tokens, cfg.temperature)
        teacher_logprobs = completion_logprobs(teacher, tokens)
    rewards = torch.tensor([t.reward for t in mine], dtype=torch.float32)
    advantages = token_advantages(student, teacher_logprobs, mask, rewards, cfg.reward_weight)
    behaviour = padded([t.logprobs for t in mine], mask.shape[1]).to(cfg.device) \
        if cfg.behaviour_cap_in_effect() is not None else None
    batch = DistillBatch(tokens, advantages, student, behaviour)
    for _ in range(cfg.ppo_epochs):
        stats = trainer.forward_backward((batch, step), loss_fn, share)
        trainer.optim_step()
    per_reply = (student - teacher_logprobs).masked_fill(mask <= 0, 0.0).sum(1).cpu()
    tokens = mask.sum(1).cpu()
    # the whole batch's figures, whichever share of it this process trained on: each process's
    # replies (their reverse KL summed over tokens, token counts, rewards) gathered in row order
    shares = gathered((rows, per_reply.tolist(), tokens.tolist(), rewards.tolist()))
    order = [row for share_rows, *_ in shares for row in share_rows]
    kl_sums, counts, all_rewards = ([value for share in shares for value in share[i]] for i in (1, 2, 3))
    # what each reply is paid, for the hacking monitor: its tokens' mean advantage before the batch's
    # baseline (minus its per-token reverse KL, plus the weighted task reward)
    paid = {row: -kl / max(n, 1) + cfg.reward_weight * r for row, kl, n, r in zip(order, kl_sums, counts, all_rewards)}
    return {**{k: v.item() for k, v in stats.items()}, "reverse_kl": sum(kl_sums) / max(sum(counts), 1),
            "reverse_kl_per_reply": sum(kl_sums) / len(kl_sums), "reward": sum(all_rewards) / len(all_rewards),
            "paid": [paid[i] for i in range(len(items))]}


def distill_loss(model, batch, cfg: DistillConfig, loss_cfg: PolicyLossConfig):
    """``-ratio x advantage`` on the generated tokens (mask 0 elsewhere, their log-probs zeroed
    before any ratio: an inf there times a 0 mask would poison the gradient)."""
    batch, step = batch
    mask = batch.tokens.loss_mask
    valid = mask > 0
    new = completion_logprobs(model, batch.tokens, cfg.temperature).masked_fill(~valid, 0.0)
    behaviour = None if batch.behaviour_logprobs is None else batch.behaviour_logprobs.masked_fill(~valid, 0.0)
    loss, stats = ppo_clip(new, batch.old_logprobs.masked_fill(~valid, 0.0), batch.advantages, mask, loss_cfg,
                           behaviour)
    check_finite(loss, step)
    return loss, {**stats, "entropy": masked_mean(-new.detach(), mask)}


def step_metrics(cfg: DistillConfig, items: list, stats: dict) -> dict:
    if not items:
        return {"steps/no_usable_episode": 1.0}
    metrics = {"reward/mean": stats["reward"], "distill/reverse_kl": stats["reverse_kl"],
               # what the student is paid, on the scale of one token: rising as it writes what the teacher would
               "distill/signal": -stats["reverse_kl"] + cfg.reward_weight * stats["reward"],
               "distill/reverse_kl_per_reply": stats["reverse_kl_per_reply"],
               "losses/policy_loss": stats["loss"], "policy/entropy": stats["entropy"],
               "completion/length": sum(sum(t.loss_mask) for t in items) / len(items),
               "completion/cut_off_fraction": sum(bool(t.info.get("cut_off")) for t in items) / len(items)}
    if "clip_fraction" in stats:
        metrics["losses/clip_fraction"] = stats["clip_fraction"]
    return {**metrics, **judge_metrics(Trajectories(items))}


def evaluate(run: Run, judge, policy, tokenizer, examples: list[dict], version: int, log_step: int) -> float:
    """Greedy held-out accuracy of the student; a few episodes go to samples.jsonl."""
    samples: list = []
    judge.update_weights(policy.named_parameters(), version)
    value = accuracy(judge, tokenizer, examples, samples)
    run.log_samples(log_step, samples)
    return value


def finish(run: Run, cfg: DistillConfig, policy, tokenizer, demo: Path | None = None) -> dict:
    if not run.writer:  # the first process of a data-parallel run reports
        run.close(plot=False)
        return {"run_dir": str(run.dir)}
    run.export_model(policy, tokenizer)
    logged = read_metrics(run.dir)
    acc = [r["eval/accuracy"] for r in logged if "eval/accuracy" in r]
    kl = [r["distill/reverse_kl"] for r in logged if "distill/reverse_kl" in r]
    plot_path = run.close(plot=cfg.plot and bool(acc), metric=("eval/accuracy", "distill/reverse_kl"))
    nan = float("nan")
    before, after = (acc[0], acc[-1]) if acc else (nan, nan)
    teacher = teacher_accuracy(demo) if demo else None
    if teacher:  # the demo: the teacher's own GRPO run first, on the same held-out problems
        run.say(f"teacher ({demo}, the GRPO demo): held-out accuracy before GRPO: {teacher[0]:.3f}  "
                f"after: {teacher[1]:.3f}")
    run.say(f"run: {run.dir}  (the student: {run.dir / 'model'})",
            f"held-out accuracy before distillation: {before:.3f}  after: {after:.3f}  "
            f"({100 * (after - before):+.1f} points)",
            f"reverse KL to the teacher per token, first step: {kl[0] if kl else nan:.4f}  "
            f"last: {kl[-1] if kl else nan:.4f}")
    if plot_path:
        run.say(f"curve: {plot_path}")
    return {"run_dir": str(run.dir), "accuracy_before": before, "accuracy_after": after,
            "reverse_kl_first": kl[0] if kl else nan, "reverse_kl_last": kl[-1] if kl else nan,
            "plot": str(plot_path) if plot_path else None,
            **({"teacher_accuracy_before": teacher[0], "teacher_accuracy_after": teacher[1]} if teacher else {})}
