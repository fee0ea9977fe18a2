"""GRPO's supervised warm-up, a stage of its own in ``RUN_DIR/stages/warmup``.

GRPO learns only from a reward, and a model that never answers in the graded format gets
none. The demo's tiny model therefore first imitates demonstrations (``--sft-steps``): the
answer in ``<answer>`` tags after the env's prompt (and, in the tools env, the calculator
call before it), built with ``omnigym train sft``'s data code. It stops once greedy
accuracy on a validation set drawn from the *training* split reaches
``--sft-target-accuracy`` (the held-out set is never looked at here), or after
``--sft-steps``.

The stage has its own model, optimizer (AdamW, ``--sft-learning-rate``) and backend, so it
runs under every ``--training-backend`` and GRPO's backend wraps a model once. It writes
``metrics.jsonl`` (``sft/loss``, ``sft/val_accuracy``), ``config.json`` (its settings) and,
last, ``model/``: the folder GRPO then loads as its policy and reference. A finished stage
with the same settings is reused (a resumed or ``--overwrite``-n run does not warm up twice);
an unfinished one runs again from the start.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from omnigym.backends import make_backend
from omnigym.distributed import barrier, is_main_process
from omnigym.evaluation.text import accuracy, judged_env
from omnigym.generators.text_env import TextEnvGenerator
from omnigym.inference import make_engine
from omnigym.inference.engine import SamplingParams
from omnigym.models.lm import LoraSettings, check_context, load_policy_and_tokenizer
from omnigym.models.tokens import batch_logprobs, local_batch
from omnigym.optim import adamw
from omnigym.pipelines.stages import (RANDOM_STATE, export_model_folder, finished_stage, go_on_from_random_state,
                                      keep_random_state, undo_stages)
from omnigym.rl.losses import check_finite, nll_loss
from omnigym.tasks.sft_data import to_sequence
from omnigym.track.progress import ProgressBar
from omnigym.track.metrics import MetricsLog
from omnigym.track.files import write_atomically
from omnigym.track.run import STAGES_FOLDER

STAGE = "warmup"
VALIDATION_SIZE = 100


def settings(cfg) -> dict:
    """What the warm-up's result depends on: a finished stage is reused only when all are equal."""
    return {"seed": cfg.seed, "model": cfg.model, "task": cfg.task, "env": cfg.env, "digits": cfg.digits,
            "terms": cfg.terms, "operations": cfg.operations, "eval_size": cfg.eval_size,
            "system_prompt": cfg.system_prompt, "chat_template": cfg.chat_template, "lora_r": cfg.lora_r,
            "max_turns": cfg.max_turns, "max_new_tokens": cfg.max_new_tokens, "sft_steps": cfg.sft_steps,
            "sft_target_accuracy": cfg.sft_target_accuracy, "sft_eval_every": cfg.sft_eval_every,
            "sft_batch_size": cfg.sft_batch_size, "sft_learning_rate": cfg.sft_learning_rate,
            # a stage made before --precision existed was float32, and is reused as one
            **({"precision": cfg.precision} if getattr(cfg, "precision", "fp32") != "fp32" else {})}


def warm_up(cfg, run, env, correct, train_set: list[dict]) -> Path:
    """The warmed-up model's folder for ``run``: made now, or reused."""
    stage = run.dir / STAGES_FOLDER / STAGE
    if finished_stage(stage, settings(cfg)):
        run.say(f"warm-up: reusing {stage}")
        go_on_from_random_state(stage / RANDOM_STATE)  # GRPO then samples what it sampled after making it
        run.finished_stages.append(STAGE)
        return stage / "model"
    # a misspelt --model, a broken template or an impossible --max-new-tokens: one line, nothing written
    policy, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, cfg.chat_template, LoraSettings(r=cfg.lora_r),
                                                  cfg.device)
    check_context(policy, cfg.max_new_tokens)
    made = not stage.parent.exists()
    run.say(f"warm-up: supervised steps on demonstrations until validation accuracy {cfg.sft_target_accuracy} "
            f"(at most {cfg.sft_steps}) -> {stage}")
    try:
        if is_main_process():
            run.set_aside_stage(stage)  # one made with other settings: kept until the run has a checkpoint
            stage.mkdir(parents=True)  # unfinished until its config.json is written, last
        barrier()
        step, reached = train_warm_up(cfg, stage, env, correct, train_set, policy, tokenizer)
    except BaseException:  # an error or Ctrl-C in the stage: what this process made goes, but finished stages
        undo_stages(run, made)
        raise
    run.finished_stages.append(STAGE)
    if step < cfg.sft_steps:  # said only in --help otherwise: a --sft-steps 150 that ran 50 looks like a bug
        run.say(f"warm-up: stopped at step {step} of --sft-steps {cfg.sft_steps}: validation accuracy {reached:.3f} "
                f"reached --sft-target-accuracy {cfg.sft_target_accuracy} (a higher target, or one above 1, runs "
                "more steps)")
    return stage / "model"


def train_warm_up(cfg, stage: Path, env, correct, train_set: list[dict], policy, tokenizer) -> tuple[int, float]:
    """Trains the stage; returns the steps it ran and its last validation accuracy."""
    # vLLM would hold a second copy of the model on the GPU beside GRPO's: the warm-up's few
    # greedy evaluations run on the in-process sampler instead.
    engine = make_engine(policy, tokenizer, "auto" if cfg.engine == "vllm" else cfg.engine)
    judge = TextEnvGenerator(judged_env(env, correct), engine, tokenizer,
                             SamplingParams(max_new_tokens=cfg.max_new_tokens, greedy=True), cfg.max_turns)
    trainer = make_backend(cfg, policy, lambda m: adamw(m, cfg.sft_learning_rate, weight_decay=0.01))
    validation = random.Random(cfg.seed + 99).sample(train_set, min(VALIDATION_SIZE, len(train_set)))
    log = MetricsLog(stage, settings(cfg), append=False, tensorboard=cfg.tensorboard) if is_main_process() else None
    progress = ProgressBar(cfg.sft_steps, "warm-up", enabled=cfg.progress and is_main_process())
    step, done = 0, False
    # an example's demonstration is the same each time it is drawn: rendered and tokenized once, by
    # its place in train_set (the demo's 550 steps draw 35,200 examples, 16,570 of them distinct)
    demonstrations: dict[int, list] = {}
    while not done:
        # indices drawn as the examples themselves were (random.sample picks positions either way)
        drawn = random.Random(cfg.seed * 1_000_003 + step).sample(range(len(train_set)), cfg.sft_batch_size)
        for i in drawn:
            if i not in demonstrations:
                demonstrations[i] = demonstration(env, tokenizer, train_set[i])
        sequences = [sequence for i in drawn for sequence in demonstrations[i]]
        batch, share = local_batch(trainer, sequences, tokenizer.pad_token_id, cfg.device)
        loss = trainer.forward_backward(batch, functools.partial(warm_up_loss, step=step), share)["loss"]
        trainer.optim_step()
        step += 1
        metrics = {"sft/loss": loss.item()}
        if step % cfg.sft_eval_every == 0 or step == cfg.sft_steps:
            metrics["sft/val_accuracy"] = accuracy(judge, tokenizer, validation)  # its sampler reads the policy itself
            done = metrics["sft/val_accuracy"] >= cfg.sft_target_accuracy or step == cfg.sft_steps
            if metrics["sft/val_accuracy"] >= cfg.sft_target_accuracy:
                metrics["sft/target_reached"] = 1  # why the stage ended: a program reads it here
        if log is not None:
            log.log(step, metrics)
        progress.update(step, sft_loss=metrics["sft/loss"])
    progress.close()
    if log is not None:
        log.close()
    whole = trainer.full_model()  # every process takes part (FSDP2 gathers); the first gets it
    if whole is not None:
        export_model_folder(whole, tokenizer, stage / "model")
        keep_random_state(stage / RANDOM_STATE)
        write_atomically(stage / "config.json", json.dumps(settings(cfg), indent=1).encode())  # last: finished
    barrier()  # the other processes load the folder the first one wrote
    return step, metrics["sft/val_accuracy"]


def warm_up_loss(model, batch, step: int):
    loss = nll_loss(batch_logprobs(model, batch), batch.loss_mask)
    check_finite(loss, step)
    return loss, {}


def demonstration(env, tokenizer, example: dict) -> list[tuple[list[int], list[int]]]:
    """The warm-up's demonstrations for one example, as SFT sequences (``omnigym train sft``'s
    data code, conversational prompt/completion): the answer in <answer> tags after the env's
    prompt; in the tools env, when the example has an expression, first the calculator call,
    then, after the env's real reply to it, the answer (one sequence per model turn, then `folded`)."""
    messages, _ = env.reset(options={"example": example})
    turns = []
    # a tool env of envs/ scripts its own episode (the calls and the env's replies, not run)
    scripted = env.demonstration(example) if hasattr(env, "demonstration") else None
    if scripted:
        for i, message in enumerate(scripted):
            if message["role"] == "assistant":
                turns.append((messages + scripted[:i], message["content"]))
    else:
        if "calculator" in env.tools and "expression" in example:
            call = f'<tool name="calculator">{example["expression"]}</tool>'
            turns.append((messages, call))
            messages, *_ = env.respond(call)
        turns.append((messages, f"<answer>{example['answer']}</answer>"))
    return folded([to_sequence("warm-up", {"prompt": prompt, "completion": [{"role": "assistant", "content": reply}]},
                               tokenizer, completion_only=True) for prompt, reply in turns])


def folded(sequences: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """One episode's per-turn sequences with each one that is a prefix of the next folded into
    it, its trained tokens trained there: under causal attention a token in the longer row has
    the same context as in the shorter one, so the batch trains the same tokens on the same
    contexts (the same token-mean loss, up to float rounding) and computes the earlier turns
    once instead of once per later turn (a two-turn tool episode: 145 tokens -> 87). A turn
    that the next one's prompt renders differently (a template that rewrites earlier turns)
    stays a row of its own."""
    out: list[tuple[list[int], list[int]]] = []
    for ids, trained in sequences:
        if out and ids[:len(out[-1][0])] == out[-1][0]:
            before, before_trained = out.pop()
            trained = [max(a, b) for a, b in zip(before_trained + [0] * (len(ids) - len(before)), trained)]
        out.append((ids, trained))
    return out
