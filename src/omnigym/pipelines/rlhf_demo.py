"""The offline RLHF demo's first stages, in ``RUN_DIR/stages/``: what ``omnigym train rlhf``,
``train rm`` and ``train dpo`` run first when they are given no model and no data.

1. ``stages/sft``: ``omnigym train sft --data words`` on the built-in tiny model (a run of its
   own: its ``model/`` is the SFT policy and the frozen reference).
2. ``stages/pairs.jsonl``: two replies per prompt sampled from the SFT model, labelled by the
   hidden gold rule (``omnigym.tasks.gold_world``): the only thing the next stages learn from.
3. ``stages/rm`` (PPO-RLHF only): ``omnigym train rm`` on those pairs.

Each stage is a finished run or file that a later start with the same seed reuses (so
``--overwrite`` retrains only the last stage). A failure before the caller's run has a
checkpoint removes the stages this process made, unless one of them finished, and puts back
the ones it made again (``Run.set_aside_stage``). The algorithms that train the stages (``sft``
and ``rm``: modules with a ``CONFIG`` and a ``train``) are passed in by the trainer that runs the
demo, which finds them in the algorithm registry by name: the registry sits above this package
(the trainers call the pipeline), so the pipeline names no algorithm module and imports none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from omnigym.errors import OmnigymError
from omnigym.pipelines.stages import go_on_from_random_state, keep_random_state, run_again, undo_stages
from omnigym.track.files import DiskFault, load_config_dict, write_atomically
from omnigym.track.run import MODEL_FOLDER, STAGES_FOLDER, Run

SFT_STEPS = 120
RM_STEPS = 100
PAIR_PROMPTS = 2000
REPLY_TOKENS = 40
GOLD_REWARD = "gold_vowels"
PAIRS_RANDOM_STATE = "pairs_random_state.pt"
"""the random state sampling the pairs left (pipelines/stages.py): reusing them goes on from it"""


@dataclass
class Stages:
    sft: Path
    pairs: Path
    reward_model: Path | None


def finished(run_dir: Path, seed: int) -> bool:
    """A finished run of this seed: its model folder is written last."""
    if not (run_dir / MODEL_FOLDER / "config.json").is_file():
        return False
    try:
        return load_config_dict(run_dir).get("seed") == seed
    except Exception:  # an unreadable config: the stage runs again
        return False


def prepare(cfg, run: Run, sft: ModuleType, rm: ModuleType | None = None) -> Stages:
    """Run (or reuse) the stages for ``run``; ``cfg`` gives the seed, threads, device and output.
    ``sft`` trains stage 1; ``rm``, when given, trains stage 3 (the reward model)."""
    reward_model = rm is not None
    root = run.dir / STAGES_FOLDER
    made = not root.exists()
    common = dict(seed=cfg.seed, torch_threads=cfg.torch_threads, device=cfg.device, progress=cfg.progress,
                  tensorboard=cfg.tensorboard, plot=False)
    stages = Stages(root / "sft", root / "pairs.jsonl", root / "rm" if reward_model else None)
    try:
        # a stage made again (another seed) waits aside until the run has a checkpoint, and
        # the pairs sampled from the old SFT model go with it
        sft_made_again = not finished(stages.sft, cfg.seed)
        if sft_made_again:
            run.say(f"demo stage 1: supervised fine-tuning on random-word replies -> {stages.sft}")
            run.set_aside_stage(stages.sft)
            sft.train(sft.CONFIG(data="words", steps=SFT_STEPS, run_dir=str(stages.sft), **common))
        run.finished_stages.append(stages.sft.name)
        if sft_made_again or not stages.pairs.is_file():
            run.set_aside_stage(stages.pairs)
            run.set_aside_stage(root / PAIRS_RANDOM_STATE)
            run.say(f"demo stage 2: {PAIR_PROMPTS} pairs of SFT replies, labelled by the hidden gold rule -> "
                    f"{stages.pairs}")
            write_gold_pairs(stages.sft, stages.pairs, cfg.seed, cfg.device)
        else:  # the SFT and RM stages run in scopes of their own; sampling the pairs moved the random state
            go_on_from_random_state(root / PAIRS_RANDOM_STATE)
        run.finished_stages.append(stages.pairs.name)
        if reward_model and not finished(stages.reward_model, cfg.seed):
            run.say(f"demo stage 3: a reward model on those pairs -> {stages.reward_model}")
            run.set_aside_stage(stages.reward_model)
            rm.train(rm.CONFIG(data=str(stages.pairs), model=str(stages.sft), run_dir=str(stages.reward_model), steps=RM_STEPS,
                               **common))
        if reward_model:
            run.finished_stages.append(stages.reward_model.name)
    except DiskFault as fault:
        undo_stages(run, made)
        raise fault.then(run_again(run)) from None
    except BaseException:
        undo_stages(run, made)
        raise
    return stages


@dataclass
class DemoModels:
    """Where an RL-on-prompts run's models come from: the user's flags, or the demo's stages."""
    policy: str
    reward_model: str
    gold_reward: str | None


def given_gold_reward(cfg):
    """``--gold-reward`` as a reward (None when not given), read before the run writes anything:
    a misspelt one was found only after the demo's stages had trained (tens of seconds, ``runs/``
    written). A resumed run finds its reward models where it recorded them (``reward_places``)."""
    from omnigym.rewards import parse_weights
    from omnigym.track.resume import reward_places

    if not cfg.gold_reward:
        return None
    return parse_weights(cfg.gold_reward, places=reward_places(cfg, "gold_reward"), flag="--gold-reward")


def check_demo_in_one_process(cfg, demo: bool) -> None:
    """The demo's stages (an SFT model, its sampled pairs, a reward model) are made in one process:
    under torchrun the SFT stage met the launcher with the local backend, and the line said
    "--training-backend is local" to a user who had given fsdp2."""
    if demo and cfg.data_parallel():
        raise OmnigymError(f"the demo's stages (no data of your own given) are made in one process, not under "
                           f"--training-backend {cfg.training_backend}: give your own data (--data PAIRS.jsonl; "
                           "rlhf and online_dpo: --reward-model or --rewards), or run the demo without torchrun")


def demo_models(cfg, run: Run, sft: ModuleType, rm: ModuleType) -> DemoModels:
    """The offline demo (no reward model given): its SFT policy and reward model, made or reused
    as stages of this run (trained by the ``sft`` and ``rm`` algorithms), and the hidden gold
    rule as the gold reward."""
    stages = prepare(cfg, run, sft, rm)
    return DemoModels(str(stages.sft), str(stages.reward_model), cfg.gold_reward or f"{GOLD_REWARD}:1.0")


@dataclass
class DemoPairs:
    pairs: str
    model: str
    gold_reward: str


def use_demo_pairs(cfg, run: Run, sft: ModuleType) -> DemoPairs:
    """``--data gold`` of ``train rm`` and ``train dpo``: the demo's gold-labelled pairs, the model
    to train (``--model``, or the demo's SFT model for ``tiny``) and the hidden rule as a gold
    reward, made or reused (a resumed run finds its finished stages). A ``--model`` of the
    user's own is checked first: a misspelt folder is one line, not a minute of demo stages
    and then the same line. ``sft``: the algorithm that trains the SFT stage."""
    if cfg.model != "tiny":
        from omnigym.models.lm import resolve_model

        resolve_model(cfg.model)
    stages = prepare(cfg, run, sft)
    return DemoPairs(str(stages.pairs), str(stages.sft) if cfg.model == "tiny" else cfg.model, f"{GOLD_REWARD}:1.0")


def write_gold_pairs(sft_dir: Path, out: Path, seed: int, device: str) -> None:
    """Sample two replies per prompt from the SFT model and keep the gold-labelled pairs."""
    import torch

    from omnigym.generators.text_env import render
    from omnigym.inference import make_engine
    from omnigym.inference.engine import SamplingParams
    from omnigym.models.lm import load_policy_and_tokenizer
    from omnigym.tasks.gold_world import label_pairs, prompts

    model, tokenizer = load_policy_and_tokenizer(str(sft_dir), seed, device=device)
    engine = make_engine(model, tokenizer)
    rows = prompts(PAIR_PROMPTS, seed)
    torch.manual_seed(seed)
    samples = engine.generate([render(tokenizer, row["prompt"]) for row in rows], 2,
                              SamplingParams(max_new_tokens=REPLY_TOKENS, temperature=1.0))
    replies = [tuple(tokenizer.decode(s.completion_ids, skip_special_tokens=True) for s in group) for group in samples]
    pairs = label_pairs(rows, replies)
    out.parent.mkdir(parents=True, exist_ok=True)
    keep_random_state(out.parent / PAIRS_RANDOM_STATE)  # before the pairs: reused pairs always have it
    # whole or absent: a reused pairs file is never half-written
    write_atomically(out, "".join(json.dumps(pair) + "\n" for pair in pairs).encode())
