"""``omnigym sample``: best-of-N and rejection sampling from a language model.

Samples ``--n`` replies to each of ``--prompts`` prompts of a task (``--task`` as ``train grpo``
reads it: its prompts, its env, its system prompt), scores every reply with ``--rewards`` (the
reward registry: a verifier, a reward model ``rm:RUN``, a reward of your own), and then either

- writes a dataset (the default): per prompt the best reply (the highest score among the replies
  that finished and are not blank; a tie goes to the earlier sample) as a conversational
  prompt/completion row that ``omnigym train sft --data`` reads, with the scores, reward parts,
  correctness and text of all ``n`` replies under ``best_of_n`` (a key SFT does not read).
  ``--min-reward`` drops prompts whose best reply scores below it: rejection-sampling
  fine-tuning (RAFT, ReST) trains on what is left. Training-split prompts, never held-out ones;
- or, with ``--curve``, measures best-of-N on held-out prompts: for N = 1, 2, 4, ... ``--n`` the
  accuracy of the reply the reward ranks first beside the oracle pass@N, both from the one set of
  ``n`` replies per prompt (``evaluation/best_of_n.py``: the exact expectation over subsets), and
  greedy accuracy for reference. Correct: ``--accuracy-reward``, default the first of ``--rewards``,
  scores >= 1, as GRPO's ``eval/accuracy`` counts it.

The task, its env and the generator are chosen from the same flags by the module GRPO chooses
them with (``generators/text_tasks.py``), so a reply is sampled and scored here exactly as GRPO
samples and scores it. Everything is checked and loaded before the first sample, and the output
is written at the end, whole (``write_atomically``): a refused or interrupted command leaves no
file, and an existing one is replaced only with ``--overwrite``.
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from omnigym.config import LanguageModelConfig
from omnigym.errors import OmnigymError, path_name, require
from omnigym.generators.text_tasks import DEFAULT_REWARDS, TextTaskConfig
from omnigym.runtime.episodes import EpisodeScheduleConfig

PROMPTS_PER_CALL, REPLIES_PER_CALL = 64, 1024
"""prompts sampled per engine call, fewer where their replies would pass ``REPLIES_PER_CALL``
(above --n 16): the progress line moves between calls, and one call's memory is bounded"""
MAX_N = 1024
"""the most replies a prompt: one call holds at least one prompt's (``--n 100000000`` sampled
until killed)"""


@dataclass
class SampleConfig(TextTaskConfig, EpisodeScheduleConfig, LanguageModelConfig):
    """The flags ``sample`` shares with ``train grpo``, with GRPO's defaults (one reply per
    episode, no episode budget beyond --max-new-tokens)."""

    def check(self) -> None:
        super().check()
        self.check_task()


def add_flags(parser) -> None:
    """``omnigym sample``'s flags on ``parser`` (``cli.py`` makes it); the task's and the sampler's
    defaults are ``train grpo``'s."""
    defaults = SampleConfig()
    add = parser.add_argument
    add("model", type=path_name,
        help="a finished run's directory (sft, dpo, rlhf: its model/), a GRPO run's stages/warmup, a model "
             "folder, a hub id available offline, or tiny")
    add("--n", type=int, default=8, help=f"replies sampled per prompt (default 8, at most {MAX_N})")
    add("--rewards", help=f"the reranker, weighted rewards name:weight,... as train grpo reads them (default: the "
                          f"task env's own reward, else {DEFAULT_REWARDS})")
    add("--accuracy-reward", help="the reward that decides correctness (a reply is correct when it scores >= 1); "
                                  "default: the first of --rewards")
    add("--curve", action="store_true", help="measure best-of-N and pass@N for N = 1, 2, 4, ... --n on held-out "
                                             "prompts instead of writing a dataset")
    add("--prompts", type=int, default=256, help="prompts to sample (default 256): training-split ones drawn with "
                                                 "--seed, or with --curve the first held-out ones")
    add("--out", type=path_name,
        help="the dataset to write (default best_of_N.jsonl); with --curve, a JSON of the curve (default: "
             "printed only)")
    add("--overwrite", action="store_true", help="replace --out if it exists")
    add("--min-reward", type=float, help="drop prompts whose best reply scores below this (rejection sampling)")
    add("--task", default=defaults.task, help="the prompts, as train grpo --task reads them (default arithmetic)")
    add("--digits", type=int, default=defaults.digits, help="arithmetic: digits per operand")
    add("--terms", type=int, default=defaults.terms, help="arithmetic: operands per problem")
    add("--operations", default=defaults.operations, help="arithmetic: operators to draw from, e.g. +-*")
    add("--eval-size", type=int, default=defaults.eval_size, help="problems held out, as train grpo holds them out "
                                                                  f"(default {defaults.eval_size})")
    add("--system-prompt", help="the system message; default as train grpo: none for the tiny model and models "
                                "trained from it, else one that states the answer format")
    add("--chat-template", help="Jinja chat template (string or file) for a model that has none")
    add("--temperature", type=float, default=defaults.temperature, help=f"default {defaults.temperature}")
    add("--max-new-tokens", type=int, default=defaults.max_new_tokens, help=f"default {defaults.max_new_tokens}")
    add("--seed", type=int, default=defaults.seed, help="seeds the samples and the prompts drawn: same seed, same file")
    add("--engine", default=defaults.engine, help="auto, kv, hf or vllm, as train grpo --engine")
    add("--device", default=defaults.device, help="torch device (cpu, cuda, ...)")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar or lines")


def sample_command(args) -> dict:
    """Runs ``omnigym sample`` on its parsed flags; returns what it measured or wrote."""
    from omnigym.evaluation.text import accuracy, judged_env
    from omnigym.generators.text_tasks import make_generator, shown_as_trained, task_env, text_task
    from omnigym.inference import make_engine
    from omnigym.models.lm import LoraSettings, check_context, load_policy_and_tokenizer
    from omnigym.models.precision import compute_in
    from omnigym.process import run_scope
    from omnigym.rewards import as_reward

    cfg = sampling_config(args)
    out = Path(args.out) if args.out else (None if args.curve else Path(f"best_of_{args.n}.jsonl"))
    if out is not None:  # sample --out runs/sft/config.json --overwrite replaced the run's config
        from omnigym.track.run_dir import refuse_run_files

        refuse_run_files(out, "--out", "sample", own_runs=[args.model])
    require(out is None or args.overwrite or not out.exists(),
            f"{out} already exists; give another --out, or --overwrite to replace it")
    require(out is None or not out.is_dir(), f"--out {out} is a folder; give a file name")
    task, _ = text_task(cfg)
    pool = task.heldout if args.curve else task.train
    require(args.prompts <= len(pool), f"--prompts {args.prompts} is more than the {len(pool)} "
            + ("held-out problems (raise --eval-size)" if args.curve else "training-split problems of the task"))
    examples = pool[:args.prompts] if args.curve else random.Random(cfg.seed).sample(pool, args.prompts)
    with run_scope(cfg.seed, cfg.torch_threads):
        policy, tokenizer = load_policy_and_tokenizer(cfg.model, cfg.seed, cfg.chat_template, LoraSettings(),
                                                      cfg.device)
        check_context(policy, cfg.max_new_tokens)
        compute_in(policy, getattr(cfg, "precision", "fp32"))  # as the run sampled it
        shown_as_trained(cfg, task, tokenizer.chat_template)
        env, correct = task_env(cfg, task)
        require(not hasattr(env, "max_turns"), f"--task {cfg.task} is a multi-turn env; sample writes one-reply "
                                               "rows: give a single-turn task")
        as_reward(env.reward, "of the env").to(cfg.device)  # a reward model scores on the policy's device
        engine = make_engine(policy, tokenizer, cfg.engine)
        groups = sample_groups(make_generator(cfg, env, engine, tokenizer), tokenizer, correct, examples, args.n,
                               args.progress)
        if not args.curve:
            return write_dataset(groups, env, out, args, cfg)
        judge = make_generator(cfg, judged_env(env, correct), engine, tokenizer, greedy=True)
        return report_curve(groups, accuracy(judge, tokenizer, examples), out, args, cfg, env.reward, correct)


def sampling_config(args) -> SampleConfig:
    """The config of the flags ``sample`` shares with ``train grpo``, checked as GRPO checks
    them; the rewards are looked up now, before anything loads."""
    from omnigym.rewards import get_reward, parse_weights

    require(1 <= args.n <= MAX_N, f"--n must be 1 to {MAX_N:,} replies a prompt, got {args.n}")
    require(args.prompts >= 1, f"--prompts must be at least 1, got {args.prompts}")
    require(args.min_reward is None or math.isfinite(args.min_reward),  # nan kept nothing and said "0 below nan"
            f"--min-reward must be a finite number, got {args.min_reward}")
    require(not (args.curve and args.min_reward is not None),
            "--min-reward drops dataset rows; --curve scores every held-out prompt: give one of them")
    cfg = SampleConfig(model=args.model, task=args.task, digits=args.digits, terms=args.terms,
                     operations=args.operations, eval_size=args.eval_size, system_prompt=args.system_prompt,
                     chat_template=args.chat_template, rewards=args.rewards, accuracy_reward=args.accuracy_reward,
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                     engine=args.engine, device=args.device, progress=args.progress)
    cfg.check()
    parse_weights(cfg.rewards or DEFAULT_REWARDS)
    if cfg.accuracy_reward:
        get_reward(cfg.accuracy_reward)
    return cfg


def sample_groups(generator, tokenizer, correct, examples: list[dict], n: int, progress: bool) -> list[dict]:
    """Per example: its ``n`` replies (text), their scores and reward parts, whether each is correct
    and whether it finished (ended before ``--max-new-tokens``)."""
    from omnigym.rewards import scored_with_parts
    from omnigym.track.progress import ProgressBar

    bar = ProgressBar(len(examples), "sample", enabled=progress)
    groups = []
    prompts_per_call = min(PROMPTS_PER_CALL, max(1, REPLIES_PER_CALL // n))
    for begin in range(0, len(examples), prompts_per_call):
        batch = examples[begin:begin + prompts_per_call]
        items = generator.generate(batch, n).items
        texts = [tokenizer.decode(t.response_ids, skip_special_tokens=True) for t in items]
        right, _ = scored_with_parts(correct, texts, [t.example for t in items])  # checked: one float per reply
        right = right.tolist()
        for g, example in enumerate(batch):
            mine = range(g * n, (g + 1) * n)
            names = dict.fromkeys(name for i in mine for name in items[i].info["reward_parts"])
            parts = {name: [items[i].info["reward_parts"].get(name, 0.0) for i in mine] for name in names}
            groups.append({"example": example, "replies": [texts[i] for i in mine],
                           "scores": [items[i].reward for i in mine], "parts": parts,
                           "correct": [right[i] >= 1.0 for i in mine],
                           "finished": [not items[i].info["cut_off"] for i in mine]})
        bar.update(len(groups))
    bar.close()
    return groups


def chosen_reply(group: dict) -> int | None:
    """The best reply's index: the highest score among the replies that finished and are not
    blank (SFT trains the end-of-sequence after a reply, and refuses an empty one), a tie to the
    earlier sample; None when no reply qualifies."""
    from omnigym.evaluation.best_of_n import ranking

    return next((i for i in ranking(group["scores"]) if group["finished"][i] and group["replies"][i].strip()), None)


def write_dataset(groups: list[dict], env, out: Path, args, cfg) -> dict:
    rows, unfinished, below = [], 0, 0
    for group in groups:
        best = chosen_reply(group)
        if best is None:
            unfinished += 1
        elif args.min_reward is not None and group["scores"][best] < args.min_reward:
            below += 1
        else:
            rows.append(dataset_row(env, group, best))
    dropped = (f"; {below} below --min-reward {args.min_reward}" if args.min_reward is not None else "") + \
              (f"; {unfinished} with no finished, non-blank reply" if unfinished else "")
    if not rows:
        raise OmnigymError(f"no prompt kept a reply{dropped}; nothing written")
    write_output(out, "".join(json.dumps(row) + "\n" for row in rows))
    replies = [s for g in groups for s in g["scores"]]
    kept = [row["best_of_n"] for row in rows]
    summary = {"out": str(out), "prompts": len(groups), "rows": len(rows), "below_min_reward": below,
               "unfinished": unfinished, "mean_score": sum(replies) / len(replies),
               "mean_chosen_score": sum(k["score"] for k in kept) / len(kept),
               "correct_reply_fraction": sum(c for g in groups for c in g["correct"]) / len(replies),
               "chosen_correct_fraction": sum(k["correct"][k["chosen"]] for k in kept) / len(kept)}
    print(f"sampled {args.n} replies to each of {len(groups)} training-split prompts from {cfg.model} "
          f"(temperature {cfg.temperature}), scored by {describe(env.reward)}")
    print(f"wrote {out}: {len(rows)} rows, the best reply of each prompt{dropped.replace(';', ',', 1)}")
    print(f"mean score {summary['mean_score']:.3f} over all replies, {summary['mean_chosen_score']:.3f} over the "
          f"chosen; correct {summary['correct_reply_fraction']:.3f} of all replies, "
          f"{summary['chosen_correct_fraction']:.3f} of the chosen")
    print(f"next: omnigym train sft --model {cfg.model} --data {out}")
    return summary


def dataset_row(env, group: dict, best: int) -> dict:
    """A conversational prompt/completion row (the prompt as the env shows it: its system prompt
    and the question), and under ``best_of_n`` what was sampled and how it scored."""
    messages, _ = copy.copy(env).reset(options={"example": group["example"]})
    example = {k: v for k, v in group["example"].items() if isinstance(v, (str, int, float, bool))}
    return {"prompt": messages, "completion": [{"role": "assistant", "content": group["replies"][best]}],
            "best_of_n": {"chosen": best, "score": group["scores"][best], "scores": group["scores"],
                          "parts": group["parts"], "correct": group["correct"], "finished": group["finished"],
                          "replies": group["replies"], "example": example}}


def report_curve(groups: list[dict], greedy: float, out: Path | None, args, cfg, reward, correct) -> dict:
    from omnigym.evaluation.best_of_n import accuracy_curve, curve_points

    rows = accuracy_curve([(g["scores"], g["correct"]) for g in groups], curve_points(args.n))
    reranker, judge = describe(reward), describe(correct)
    result = {"model": cfg.model, "prompts": len(groups), "samples_per_prompt": args.n,
              "temperature": cfg.temperature, "reranker": reranker, "correct": f"{judge} >= 1",
              "estimator": "exact expectation over all N-subsets of the samples", "curve": rows,
              "greedy_accuracy": greedy, "groups": [{"scores": g["scores"], "correct": g["correct"]} for g in groups]}
    if out is not None:
        write_output(out, json.dumps(result, indent=1) + "\n")
    print(f"best-of-N on {len(groups)} held-out prompts, {args.n} replies each (temperature {cfg.temperature}) "
          f"from {cfg.model}")
    print(f"reranked by {reranker}; correct: {judge} >= 1; pass@N: some reply of the N is correct (the oracle)")
    print(f"{'N':>4}  {'best-of-N':>9}  {'pass@N':>7}")
    for row in rows:
        print(f"{row['n']:>4}  {row['best_of_n']:>9.3f}  {row['pass_at_n']:>7.3f}")
    print(f"greedy: {greedy:.3f}  (each N: the expectation over all N-subsets of the {args.n} replies)"
          + (f"\nwrote {out}" if out is not None else ""))
    return result


def describe(reward) -> str:
    """A reward as the flags name it: ``math:1.0,format:0.1``, a lone part by its name (``math``)."""
    weights = getattr(reward, "weights", None)
    if weights and len(weights) == 1 and next(iter(weights.values())) == 1.0:
        return next(iter(weights))
    return getattr(reward, "label", type(reward).__name__)


def write_output(out: Path, text: str) -> None:
    from omnigym.track.files import write_atomically

    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, text.encode())
