"""A process reward model: a scalar head on a causal LM, read at the end of every step of a
reply and trained with binary cross-entropy on each step's label (right or wrong).

The step labels are made procedurally, Math-Shepherd style: each step draws ``batch_size``
problems of a task whose steps can be checked (``--task chain``, ``omnigym.tasks.steps``),
and for each the right written solution and ``--wrong-per-problem`` copies with one step
perturbed (an arithmetic slip, a wrong operand or operator, a wrong answer), carried on from
the wrong value; the task's checker labels every step, so a step after a mistake is labelled
wrong too ("can it still reach the answer?"). The head is read on the token that ends each
step (``rewards.process.step_logits``), after the prompt and the reply up to there, and the
loss is the mean over steps of ``BCE(sigmoid(logit), label)``.

Every ``eval_every`` steps the held-out problems' labelled replies (fixed, never trained on)
give ``eval/step_accuracy`` (a step called right when its probability is above 0.5),
``eval/base_rate`` (the share of the commoner label: what always guessing it scores),
``eval/reply_accuracy`` (a reply called right when its weakest step is: the whole-reply score
of ``prm:``) and ``eval/loss``. The finished model is ``RUN_DIR/model``, a reward model
folder marked ``kind: process``: ``--rewards prm:RUN_DIR:1.0`` scores a reply by its weakest
step, ``omnigym train grpo --step-rewards prm:RUN_DIR:1.0`` rewards each step (docs/prm.md).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_non_negative, require_positive
from omnigym.errors import OmnigymError, require
from omnigym.evaluation.text import SAMPLES_SHOWN
from omnigym.optim import adamw
from omnigym.process import scoped_run
from omnigym.rewards.process import KIND, fit, step_logits, tokenized_reply
from omnigym.rl.losses import check_finite
from omnigym.envs.task_spec import load_task
from omnigym.tasks.steps import labelled_replies
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.stopping import checkpoint_due
from omnigym.track.run import Run, start_run


@dataclass
class PRMConfig(LanguageModelConfig):
    SCALAR_HEAD = "the process reward model's scalar head"
    task: str = "chain"
    """a task whose steps can be checked: chain (tasks/steps.py)"""
    digits: int = 1
    terms: int = 4
    """numbers in each chain: the start and one per operation (4: three steps and the answer line)"""
    operations: str = "+-*"
    wrong_per_problem: int = 3
    """perturbed solutions per problem beside the right one"""
    eval_size: int = 200
    """held-out problems (never trained on), each with its right and perturbed solutions"""
    max_length: int = 256
    """tokens of prompt + reply (longer is cut; a step past the cut is read at the last token)"""
    steps: int = 300
    batch_size: int = 16
    """problems per step (each with 1 + --wrong-per-problem replies)"""
    learning_rate: float = 5e-4
    max_grad_norm: float = 1.0
    eval_every: int = 50
    checkpoint_every: int = 100

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("task", "digits", "terms", "operations", "wrong_per_problem",
                                                       "eval_size", "max_length")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        require_positive(self, "steps", "batch_size", "learning_rate", "max_grad_norm", "eval_size", "max_length",
                         "eval_every")
        require_non_negative(self, "checkpoint_every")
        # with none, every step is labelled right: nothing to tell apart, and a ranking metric of 1.0
        require(self.wrong_per_problem >= 1, "--wrong-per-problem must be at least 1 (with none every step is right, "
                f"and there is nothing to learn to tell apart), got {self.wrong_per_problem}")
        require(self.max_length >= 2, f"--max-length must be at least 2 tokens, got {self.max_length}")


CONFIG = PRMConfig


@dataclass
class LabelledReply:
    prompt: list[int]
    reply: list[int]
    ends: list[int]
    """reply tokens through each step's last character"""
    labels: list[bool]
    text: str


def labelled(examples: list[dict], rng: random.Random, wrong: int, tokenizer, max_length: int) -> list[LabelledReply]:
    """Each example's right and perturbed solutions, tokenized, with their step labels."""
    from omnigym.tasks.sft_data import prompt_tokens

    out = []
    for example in examples:
        prompt = prompt_tokens("chain", [{"role": "user", "content": example["question"]}], tokenizer)
        for text, labels in labelled_replies(example, rng, wrong):
            reply, ends = tokenized_reply(tokenizer, text)
            out.append(LabelledReply(*fit(prompt, reply, ends, max_length), labels, text))
    return out


def verification(scored: list[tuple[list[bool], torch.Tensor]], group: int) -> dict:
    """How well a PRM checks, apart from the priors of position (early steps mostly right, late ones
    mostly wrong). ``scored``: each reply's step labels and step logits, in groups of ``group`` per
    problem, the right solution first (``labelled``'s order). ``first_mistake_accuracy``: a wrong
    reply's first wrong step called wrong; ``right_ranked_first``: the right solution's weakest step
    scored strictly above every other reply's of its problem (chance 1/group; strictly, so that a
    PRM scoring every reply alike gets 0, not 1)."""
    first_mistakes = [bool(logits[labels.index(False)] < 0) for labels, logits in scored if not all(labels)]
    weakest = [logits.min().item() for _, logits in scored]
    right_first = [all(weakest[at] > weakest[at + i] for i in range(1, group)) for at in range(0, len(weakest), group)]
    return {"eval/first_mistake_accuracy": sum(first_mistakes) / max(len(first_mistakes), 1),
            "eval/right_ranked_first": sum(right_first) / max(len(right_first), 1)}


def step_examples(cfg: PRMConfig) -> tuple[list[dict], list[dict]]:
    """The task's training and held-out problems; a task without checkable steps is one line."""
    task = load_task(cfg.task, cfg.seed, cfg.eval_size, cfg.digits, cfg.terms, cfg.operations)
    if "steps" not in task.train[0]:
        raise OmnigymError(f"--task {cfg.task} has no steps to label (its examples have no 'steps'); "
                           "train prm needs a task whose steps can be checked: --task chain")
    return task.train, task.heldout


@scoped_run
def train(cfg: PRMConfig) -> dict:
    from omnigym.models.lm import check_max_length, check_vocabulary, load_tokenizer, model_folder
    from omnigym.models.scalar_head import finish_reward_model, load_scalar_model

    train_set, heldout_set = step_examples(cfg)
    run = start_run(cfg, "prm", cfg.model)
    with model_folder(cfg.model, cfg.seed, score_head=True) as folder:
        tokenizer = load_tokenizer(folder, cfg.chat_template)
        model = load_scalar_model(folder, tokenizer.pad_token_id, cfg.lora_r, cfg.device)
    check_max_length(model, cfg.max_length)
    check_vocabulary(model, tokenizer, cfg.model)
    heldout = labelled(heldout_set, random.Random(cfg.seed + 10_000), cfg.wrong_per_problem, tokenizer,
                       cfg.max_length)
    trainer = make_backend(cfg, model, lambda m: adamw(m, cfg.learning_rate, weight_decay=0.01), cfg.max_grad_norm)
    components = {"trainer": trainer}
    step = run.begin(components).get("step", 0)
    model.train()  # as a new run's first evaluation leaves it: a resume loaded it in eval mode (no dropout)
    evaluate = functools.partial(evaluation, cfg, run, model, tokenizer.pad_token_id, heldout)
    first = final = None  # the first and the last evaluation's figures
    if step == 0:
        first = evaluate(0)
        run.log(0, {**first, "data/heldout_steps": sum(len(r.labels) for r in heldout)})
    progress = ProgressBar(cfg.steps, "prm", start=step, enabled=cfg.progress)
    clock = Clock(step)
    while step < cfg.steps:
        # 1. The step's problems, each with its right and perturbed solutions, labelled step by step.
        rows = step_rows(cfg, train_set, tokenizer, step)
        # 2. One AdamW step on the mean over steps of the per-step cross-entropy.
        local, share = trainer.local_part(rows, weights=[len(r.labels) for r in rows])  # a mean over steps
        stats = trainer.forward_backward(local, functools.partial(prm_loss, cfg=cfg, pad_id=tokenizer.pad_token_id,
                                                                  step=step), share)
        trainer.optim_step()
        step += 1
        # 3. Log (the held-out figures every --eval-every, and at the last step: they are the run's), checkpoint.
        metrics = {"train/loss": stats["loss"].item(), "train/step_accuracy": stats["step_accuracy"].item(),
                   "perf/steps_per_second": clock.sps(step)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            final = evaluate(step)
            metrics.update(final)
        run.log(step, metrics)
        progress.update(step, loss=metrics["train/loss"], acc=metrics.get("eval/step_accuracy", float("nan")))
        if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
            run.save(components, step=step)
    progress.close()
    final, plot_path = finish_reward_model(run, trainer, tokenizer,
                                           {"kind": KIND, "base_model": cfg.model, "conversational": True,
                                            "task": cfg.task, "max_length": cfg.max_length, "whole_reply": "min"},
                                           "eval/step_accuracy", final, cfg.plot)
    return report(run, cfg, first, final, plot_path)


def report(run: Run, cfg: PRMConfig, first: dict | None, final: dict, plot_path) -> dict:
    """Says what the run did, from its first and last evaluations, and returns it."""
    before = f"{first['eval/step_accuracy']:.3f} -> " if first else ""
    run.say(f"run: {run.dir}",
            f"held-out step accuracy: {before}{final['eval/step_accuracy']:.3f}  (always guessing the commoner label: "
            f"{final['eval/base_rate']:.3f}; reply accuracy {final['eval/reply_accuracy']:.3f})",
            f"use it: --rewards prm:{run.dir}:1.0  or  omnigym train grpo --task {cfg.task} --step-rewards "
            f"prm:{run.dir}:1.0 --advantage process")
    return {"run_dir": str(run.dir), "step_accuracy": final["eval/step_accuracy"], "base_rate": final["eval/base_rate"],
            "reply_accuracy": final["eval/reply_accuracy"],
            "initial_step_accuracy": first["eval/step_accuracy"] if first else None,
            "plot": str(plot_path) if plot_path else None}


def step_rows(cfg: PRMConfig, train_set: list[dict], tokenizer, step: int) -> list[LabelledReply]:
    """Step ``step``'s labelled replies: a seeded draw, the same whether the run was resumed or not."""
    rng = random.Random(cfg.seed * 1_000_003 + step)
    return labelled(rng.sample(train_set, cfg.batch_size), rng, cfg.wrong_per_problem, tokenizer, cfg.max_length)


def reply_logits(model, rows: list[LabelledReply], pad_id: int, device: str) -> list[torch.Tensor]:
    """Each reply's step logits: the head read on the token that ends each of its steps."""
    return step_logits(model, [r.prompt for r in rows], [r.reply for r in rows], [r.ends for r in rows], pad_id,
                       device)


def prm_loss(model, rows: list[LabelledReply], cfg: PRMConfig, pad_id: int, step: int):
    logits = torch.cat(reply_logits(model, rows, pad_id, cfg.device))
    labels = torch.tensor([float(x) for r in rows for x in r.labels], device=cfg.device)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    check_finite(loss, step)
    return loss, {"loss": loss.detach(), "step_accuracy": ((logits > 0).float() == labels).float().mean()}


@torch.no_grad()
def evaluation(cfg: PRMConfig, run: Run, model, pad_id: int, heldout: list[LabelledReply], at: int) -> dict:
    """Step and reply accuracy on the held-out replies; a few go to samples.jsonl with their step scores."""
    model.eval()
    logits, labels, replies_right, scored = [], [], [], []
    for start in range(0, len(heldout), 64):
        rows = heldout[start:start + 64]
        per_reply = reply_logits(model, rows, pad_id, cfg.device)
        for row, reply in zip(rows, per_reply):
            logits.append(reply)
            labels += row.labels
            replies_right.append(bool(reply.min() > 0) == all(row.labels))
            scored.append((row.labels, reply))
        if start == 0:
            run.log_samples(at, [{"reply": r.text, "labels": r.labels,
                                  "scores": [round(p, 4) for p in torch.sigmoid(x).tolist()]}
                                 for r, x in zip(rows[:SAMPLES_SHOWN], per_reply)])
    model.train()
    logits, labels = torch.cat(logits), torch.tensor(labels, dtype=torch.float32, device=cfg.device)
    positive = labels.mean().item()
    return {"eval/step_accuracy": ((logits > 0).float() == labels).float().mean().item(),
            "eval/base_rate": max(positive, 1 - positive),
            "eval/reply_accuracy": sum(replies_right) / len(replies_right),
            **verification(scored, 1 + cfg.wrong_per_problem),
            "eval/loss": torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).item()}
