"""A Bradley-Terry reward model: a scalar head on a causal LM, trained on preference pairs.

Each step draws ``batch_size`` pairs, scores prompt + chosen and prompt + rejected (the head
read at the last real token) and takes an AdamW step on ``-log sigmoid(r_chosen - r_rejected
- margin)`` (``--use-margin`` reads a ``margin`` field of each row, as in Llama 2), plus
``--center-coef`` times the mean squared sum of the two scores, which keeps them near 0.
Every ``eval_every`` steps the held-out pairwise accuracy and mean margin are logged. The
finished model is ``RUN_DIR/model``: ``--rewards rm:RUN_DIR`` scores completions with it in
GRPO and text REINFORCE, and ``omnigym train rlhf --reward-model RUN_DIR`` trains against it.

``omnigym train rm`` with no flags runs the offline demo's first stages (an SFT model on
random-word replies, pairs of its replies labelled by a hidden gold rule; see
``omnigym.tasks.gold_world``) and learns the gold preferences from the pairs alone.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from omnigym.backends import make_backend
from omnigym.config import LanguageModelConfig, require_non_negative, require_positive
from omnigym.errors import require
from omnigym.evaluation.text import SAMPLES_SHOWN
from omnigym.optim import adamw
from omnigym.process import scoped_run
from omnigym.rl.losses import bradley_terry, check_finite
from omnigym.tasks.preference_data import longest_pair, read_pairs
from omnigym.track.progress import Clock, ProgressBar
from omnigym.track.stopping import checkpoint_due
from omnigym.resources import check_language_batch
from omnigym.track.run import Run, start_run


@dataclass
class RMConfig(LanguageModelConfig):
    SCALAR_HEAD = "the reward model's scalar head"
    data: str = "gold"
    """preference pairs: a .jsonl/.json file, a dataset folder or offline hub id, or "gold" (the
    offline demo: pairs of SFT replies labelled by a hidden rule)"""
    split: str = "train"
    eval_size: int = 200
    """pairs held out for eval/accuracy (never trained on)"""
    max_length: int = 256
    """tokens of prompt + reply (a longer reply is cut, and counted)"""
    use_margin: bool = False
    """subtract each row's ``margin`` field inside the sigmoid"""
    center_coef: float = 0.0
    """weight of the reward-centering loss (e.g. 0.01)"""
    steps: int = 300
    batch_size: int = 32
    """pairs per step"""
    learning_rate: float = 5e-4
    max_grad_norm: float = 1.0
    eval_every: int = 50
    checkpoint_every: int = 100

    RESUME_FIXED = LanguageModelConfig.RESUME_FIXED + ("data", "split", "eval_size", "max_length", "use_margin")
    BUDGET = ("steps", "step")
    FINAL_MODEL = True

    def check(self) -> None:
        super().check()
        require_positive(self, "steps", "batch_size", "learning_rate", "max_grad_norm", "eval_size", "max_length",
                         "eval_every")
        require_non_negative(self, "center_coef", "checkpoint_every")
        require(self.max_length >= 2, f"--max-length must be at least 2 tokens, got {self.max_length}")
        from omnigym.pipelines.rlhf_demo import check_demo_in_one_process

        check_demo_in_one_process(self, demo=self.data == "gold")


CONFIG = RMConfig


@scoped_run
def train(cfg: RMConfig) -> dict:
    from omnigym.models.lm import check_max_length, check_vocabulary, load_tokenizer, model_folder
    from omnigym.models.scalar_head import finish_reward_model, load_scalar_model

    run = start_run(cfg, "rm", cfg.model)
    data, base_model = cfg.data, cfg.model
    if cfg.data == "gold":  # the offline demo: its SFT model and gold-labelled pairs (a resumed run reuses them)
        from omnigym.algos import get_algorithm
        from omnigym.pipelines.rlhf_demo import use_demo_pairs

        demo = use_demo_pairs(cfg, run, get_algorithm("sft"))  # the SFT stage's trainer, by name
        data, base_model = demo.pairs, demo.model
    with model_folder(base_model, cfg.seed, score_head=True) as folder:
        tokenizer = load_tokenizer(folder, cfg.chat_template, need_chat_template=False)
        rows, heldout, training, conversational = read_pairs(data, cfg.split, cfg.seed, cfg.eval_size, tokenizer,
                                                             cfg.max_length)
        model = load_scalar_model(folder, tokenizer.pad_token_id, cfg.lora_r, cfg.device)
    check_max_length(model, cfg.max_length)
    check_vocabulary(model, tokenizer, cfg.model)
    check_language_batch(f"--batch-size {cfg.batch_size}", 2 * min(cfg.batch_size, max(len(training.pairs), 1)),
                         longest_pair(training.pairs), model.config,  # a pair's chosen and rejected replies
                         logits=False)
    trainer = make_backend(cfg, model, lambda m: adamw(m, cfg.learning_rate, weight_decay=0.01), cfg.max_grad_norm)
    components = {"trainer": trainer}
    step = run.begin(components).get("step", 0)
    model.train()  # as a new run's first evaluation leaves it: a resume loaded it in eval mode (no dropout)
    evaluate = functools.partial(evaluation, cfg, run, model, tokenizer, heldout.pairs)
    first = final = None  # the first and the last evaluation's figures
    if step == 0:
        first = evaluate(0)
        run.log(0, {**first, "data/truncated": training.truncated + heldout.truncated,
                    "data/dropped": training.dropped + heldout.dropped, "data/train_pairs": len(training.pairs)})
    progress = ProgressBar(cfg.steps, "rm", start=step, enabled=cfg.progress)
    clock = Clock(step)
    while step < cfg.steps:
        # 1. A seeded draw of the step's pairs, the same whether the run was resumed or not.
        pairs = random.Random(cfg.seed * 1_000_003 + step).sample(training.pairs, min(cfg.batch_size, len(training.pairs)))
        # 2. One AdamW step on the Bradley-Terry loss of this process's pairs.
        local, share = trainer.local_part(pairs)  # this process's pairs (all of them in one)
        stats = trainer.forward_backward(local, functools.partial(rm_loss, cfg=cfg, pad_id=tokenizer.pad_token_id,
                                                                  step=step), share)
        trainer.optim_step()
        step += 1
        # 3. Log (the held-out figures every --eval-every, and at the last step: they are the run's), checkpoint.
        metrics = {"train/loss": stats["loss"].item(), "train/accuracy": stats["accuracy"].item(),
                   "train/margin": stats["margin"].item(), "perf/steps_per_second": clock.sps(step)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            final = evaluate(step)
            metrics.update(final)
        run.log(step, metrics)
        progress.update(step, loss=metrics["train/loss"], acc=metrics.get("eval/accuracy", float("nan")))
        if step == cfg.steps or checkpoint_due(step, step - 1, cfg.checkpoint_every):
            run.save(components, step=step)
    progress.close()
    final, plot_path = finish_reward_model(run, trainer, tokenizer, {"base_model": base_model,
                                                                      "conversational": conversational,
                                                                      "max_length": cfg.max_length},
                                           "eval/accuracy", final, cfg.plot)
    cut, dropped = training.truncated + heldout.truncated, training.dropped + heldout.dropped
    return report(run, cfg, first, final, plot_path, len(heldout.pairs), cut, dropped, len(rows))


def scores(model, pairs, pad_id: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen, rejected) scores; a pair's prompt runs once for both replies."""
    from omnigym.models.scalar_head import pair_scores

    both = pair_scores(model, [p.prompt for p in pairs] * 2, [p.chosen for p in pairs] + [p.rejected for p in pairs],
                       pad_id, device)
    return both[:len(pairs)], both[len(pairs):]


def rm_loss(model, pairs, cfg: RMConfig, pad_id: int, step: int):
    chosen, rejected = scores(model, pairs, pad_id, cfg.device)  # the backend's model: data-parallel, its wrapper
    margin = torch.tensor([p.margin for p in pairs], device=chosen.device) if cfg.use_margin else None
    loss, stats = bradley_terry(chosen, rejected, margin, cfg.center_coef)
    check_finite(loss, step)
    return loss, stats


def report(run: Run, cfg: RMConfig, first: dict | None, final: dict, plot_path, heldout: int, cut: int, dropped: int,
           rows: int) -> dict:
    """Says what the run did, from its first and last evaluations, and returns it."""
    before = f"{first['eval/accuracy']:.3f} -> " if first else ""
    run.say(f"run: {run.dir}",
            f"held-out pairwise accuracy: {before}{final['eval/accuracy']:.3f}  (mean margin {final['eval/margin']:.3f}, "
            f"{heldout} pairs)",
            f"pairs cut at --max-length {cfg.max_length}: {cut} of {rows}" + (f"; {dropped} dropped" if dropped else ""),
            f"use it: --rewards rm:{run.dir}:1.0  or  omnigym train rlhf --reward-model {run.dir}")
    return {"run_dir": str(run.dir), "accuracy": final["eval/accuracy"], "margin": final["eval/margin"],
            "initial_accuracy": first["eval/accuracy"] if first else None, "plot": str(plot_path) if plot_path else None}


@torch.no_grad()
def evaluation(cfg: RMConfig, run: Run, model, tokenizer, heldout: list, at: int) -> dict:
    """Held-out accuracy, margin and loss; a few pairs with their scores go to samples.jsonl."""
    model.eval()
    margins = []
    for start in range(0, len(heldout), cfg.batch_size):
        chosen, rejected = scores(model, heldout[start:start + cfg.batch_size], tokenizer.pad_token_id, cfg.device)
        margins.append(chosen - rejected)
        if start == 0:  # a few held-out pairs with their scores, to read (samples.jsonl)
            run.log_samples(at, [{"prompt": tokenizer.decode(p.prompt, skip_special_tokens=True),
                                  "chosen": tokenizer.decode(p.chosen, skip_special_tokens=True),
                                  "rejected": tokenizer.decode(p.rejected, skip_special_tokens=True),
                                  "score_chosen": round(c.item(), 4), "score_rejected": round(r.item(), 4)}
                                 for p, c, r in zip(heldout[:SAMPLES_SHOWN], chosen, rejected)])
    model.train()
    margin = torch.cat(margins)
    return {"eval/accuracy": (margin > 0).float().mean().item(), "eval/margin": margin.mean().item(),
            "eval/loss": -torch.nn.functional.logsigmoid(margin).mean().item()}
