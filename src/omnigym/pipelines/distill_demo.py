"""The offline distillation demo's stages: what ``omnigym train distill`` runs first when it is
given no ``--teacher``.

1. ``stages/teacher``: the teacher, omnigym's GRPO demo (below).
2. ``stages/warmup``: the student's supervised warm-up, GRPO's own (``pipelines/grpo_warmup.py``,
   ``STUDENT_WARMUP``: to validation accuracy 0.3 on the training split, at most 1000 steps). An
   untrained student samples characters at random, which the teacher grades all alike (measured:
   80 steps of distillation from an untrained "tiny-small" left every reply a run of one letter),
   so the student first learns the answer format from demonstrations, as GRPO's demo model does;
   the recipe, too, distills into a student that was fine-tuned first. GRPO from the same warm-up
   is the comparison in docs/distillation.md.

The teacher is omnigym's own GRPO demo (``omnigym train grpo``: the built-in "tiny" model, its
supervised warm-up, then GRPO from rewards) run as a stage of the distillation run, with
``TEACHER_FLAGS``: 50 GRPO steps where the GRPO demo's default is 150, which keeps the demo
affordable on a CPU and already lifts held-out accuracy (docs/distillation.md). It trains on the distillation run's own
task (the task flags, the seed), so the two runs hold out the same problems.

The stage is a finished GRPO run that a later start with the same settings reuses (a resumed or
``--overwrite``-n distillation trains its teacher once). GRPO trains it in a run scope of its own,
which gives the caller's random state back as it was, so a reused teacher leaves the student's
run to sample what it sampled when the teacher was made. The algorithm that trains the stage
(``grpo``: a module with a ``CONFIG`` and a ``train``) is passed in by the trainer, which finds it
in the algorithm registry by name (the registry sits above this package).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType, ModuleType

from omnigym.generators.text_tasks import TextTaskConfig
from omnigym.pipelines.grpo_warmup import warm_up
from omnigym.pipelines.stages import run_again, undo_stages
from omnigym.track.files import DiskFault, load_config_dict, read_metrics
from omnigym.track.run import MODEL_FOLDER, STAGES_FOLDER, Run

STAGE = "teacher"
STUDENT_WARMUP = MappingProxyType({})
"""the student's warm-up flags (``train grpo``'s --sft-* flags) beyond GRPO's defaults; the tests make it smaller"""
TEACHER_FLAGS = MappingProxyType({"steps": 50})
"""the demo teacher's GRPO flags beyond the task's: 50 GRPO steps after the warm-up (the GRPO demo's
default is 150); the tests make it smaller"""


def settings(cfg) -> dict:
    """What the teacher depends on: the task flags and the seed (a finished stage with other ones is
    trained again)."""
    return {"seed": cfg.seed, **TEACHER_FLAGS, **task_flags(cfg)}


def task_flags(cfg) -> dict:
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(TextTaskConfig)}


def finished(stage: Path, cfg) -> bool:
    if not (stage / MODEL_FOLDER / "config.json").is_file():
        return False
    try:
        made_with = load_config_dict(stage)
    except Exception:  # an unreadable config: the stage runs again
        return False
    return all(made_with.get(k) == v for k, v in settings(cfg).items())


def teacher_stage(cfg, run: Run, grpo: ModuleType) -> Path:
    """The demo teacher's run directory for ``run``: trained now by ``grpo``, or reused. ``cfg``
    gives the task, the seed, threads, device and output."""
    stage = run.dir / STAGES_FOLDER / STAGE
    made = not stage.parent.exists()
    if finished(stage, cfg):
        run.say(f"demo teacher: reusing {stage}")
        run.finished_stages.append(STAGE)
        return stage
    run.say(f"demo teacher: omnigym's GRPO demo (the tiny model, its warm-up, then {TEACHER_FLAGS['steps']} GRPO "
            f"steps) -> {stage}")
    run.set_aside_stage(stage)  # another seed's or task's teacher: kept until the run has a checkpoint
    try:
        grpo.train(grpo.CONFIG(**task_flags(cfg), **TEACHER_FLAGS, model="tiny", seed=cfg.seed, run_dir=str(stage),
                               torch_threads=cfg.torch_threads, device=cfg.device,
                               progress=cfg.progress, tensorboard=cfg.tensorboard, plot=False))
    except DiskFault as fault:
        undo_stages(run, made)
        raise fault.then(run_again(run)) from None
    except BaseException:
        undo_stages(run, made)
        raise
    run.finished_stages.append(STAGE)
    return stage


def student_warm_up(cfg, run: Run, grpo: ModuleType, env, correct, train_set: list[dict]) -> Path:
    """The warmed-up student's model folder for ``run`` (``stages/warmup``, made or reused): GRPO's
    warm-up of ``cfg.model`` on the run's task, with GRPO's --sft-* defaults and ``STUDENT_WARMUP``."""
    settings_of = grpo.CONFIG(**task_flags(cfg), **STUDENT_WARMUP, model=cfg.model, seed=cfg.seed,
                              chat_template=cfg.chat_template, lora_r=cfg.lora_r, torch_threads=cfg.torch_threads,
                              device=cfg.device, progress=cfg.progress, tensorboard=cfg.tensorboard)
    return warm_up(settings_of, run, env, correct, train_set)


def teacher_accuracy(stage: Path) -> tuple[float, float]:
    """The teacher's held-out accuracy before and after its GRPO steps (its metrics.jsonl)."""
    acc = [row["eval/accuracy"] for row in read_metrics(stage) if "eval/accuracy" in row]
    return (acc[0], acc[-1]) if acc else (float("nan"), float("nan"))
