"""Which directory a run may use: a new or empty one, a run it may replace (``--overwrite``),
or a run it may continue (``--resume``), checked before anything is written.

What crosses this module: the config's own flags (``run_dir``, ``resume``, ``overwrite``,
``seed`` and the class's ``RESUME_FIXED`` and ``BUDGET``), the algorithm's name, and a
directory already decided for this call when the user named none; out come the directory
and the loaded checkpoint, or one ``OmnigymError`` line. It reads the disk and writes nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omnigym.errors import OmnigymError, a_run, show_flag, shown_value, without_dots
from omnigym.track.checkpoint import CHECKPOINT_NAME, Checkpointer
from omnigym.track.files import CONFIG_NAME, METRICS_NAME, describe, load_config_dict, read_metrics
from omnigym.track.model_folder import complete_model, weights_fingerprint
from omnigym.track.progress import whole_rollouts
from omnigym.track.lock import LOCK_NAME
from omnigym.track.run_dir import (MODEL_FOLDER, REPLACED_RUN, STAGES_FOLDER, check_name_lengths, check_writable,
                                   default_run_dir, is_run_dir, left_set_aside)


def checked_run_dir(cfg, algo: str, label, decided: str | None = None) -> tuple[Path, dict | None]:
    """The directory the run may use, and its checkpoint when resuming; refuses in one line.
    ``decided``: the directory this call chose already when the user gave none (``--capture-video``
    names its folder before the run starts); else a new name is made from ``label``."""
    for flag, given in (("--resume", cfg.resume), ("--run-dir", cfg.run_dir)):
        check_name_lengths(flag, given)
    if cfg.resume:
        run_dir = Path(cfg.resume)
        if cfg.run_dir and Path(cfg.run_dir).resolve() != run_dir.resolve():
            raise OmnigymError("give either --resume RUN_DIR or --run-dir, not two different directories")
        refuse_what_a_killed_start_set_aside(run_dir)
        check_resumable(cfg, algo, load_config_dict(run_dir))
        if restarts(run_dir):
            refuse_a_lost_checkpoint(run_dir, load_config_dict(run_dir))
            return run_dir, None
        saved = Checkpointer(run_dir).load()
        check_saved_state(cfg, run_dir, saved, algo)
    else:
        run_dir, saved = without_dots(cfg.run_dir or decided or default_run_dir(algo, label, cfg.seed)), None
        if run_dir.exists() and not run_dir.is_dir():
            raise OmnigymError(f"--run-dir {run_dir} is a file; choose a directory")
        refuse_what_a_killed_start_set_aside(run_dir)
        refuse_a_run_inside_another(run_dir)
        if run_dir.is_dir() and is_run_dir(run_dir) and not cfg.overwrite:
            # without its config.json, --resume cannot read it ("not a run directory"): not a way on to offer
            resumable = cfg.RESUMABLE and (run_dir / CONFIG_NAME).is_file()
            keep = f"continue it with --resume {run_dir}, or " if resumable else "choose a new --run-dir, or "
            what = "a run" if (run_dir / CONFIG_NAME).is_file() or not cfg.RESUMABLE else \
                "a run's files without its config.json, so it cannot be resumed"
            raise OmnigymError(f"{run_dir} already holds {what}; {keep}replace it with --overwrite")
        # a demo's start that stopped before its first checkpoint leaves its finished stages: a new
        # start there reuses them (the pipelines remake an unfinished one)
        if run_dir.is_dir() and not is_run_dir(run_dir) and any(
                p.name != LOCK_NAME and not (p.name == STAGES_FOLDER and p.is_dir()) for p in run_dir.iterdir()):
            raise OmnigymError(f"{run_dir} is not empty and holds no omnigym run; choose a new or empty --run-dir")
        check_writable(run_dir)
    return run_dir, saved


def refuse_a_run_inside_another(run_dir: Path) -> None:
    """A new run is not made inside another run's directory (``--run-dir runs/walk/inner``): its
    files would sit among that run's as if they were its own. A pipeline's stages are the
    exception: ``RUN/stages/NAME`` are the finished runs of ``RUN``'s demo."""
    folder = run_dir.absolute()
    owner = next((p for p in folder.parents if is_run_dir(p)), None)
    if owner is not None and folder.relative_to(owner).parts[0] != STAGES_FOLDER:
        raise OmnigymError(f"--run-dir {run_dir} is inside the run {owner}; choose a --run-dir outside it")


def refuse_what_a_killed_start_set_aside(run_dir: Path) -> None:
    """A start killed (SIGKILL, the OOM killer) left the run it replaced, or stages it made
    again, set aside: which to keep is the user's choice, and a new start would mix them."""
    left = left_set_aside(run_dir)
    if not left:
        return
    names = ", ".join(str(p.relative_to(run_dir)) for p in left)
    restage = (f"for each {STAGES_FOLDER}/.replaced-NAME, remove {STAGES_FOLDER}/NAME and rename it to that name"
               if any(p.parent.name == STAGES_FOLDER for p in left) else "")
    if (run_dir / CHECKPOINT_NAME).is_file() and (run_dir / CONFIG_NAME).is_file():
        # before its first checkpoint a start has none in place (the old one is aside): this
        # one's commit was deleting what it replaced when the kill came
        how = ("the run in place has a checkpoint, so they are what it replaced, half deleted when it was killed; "
               "delete them, then run the command again")
    elif (run_dir / REPLACED_RUN).exists():
        back = (f"delete the run files in place, move {REPLACED_RUN}/* into {run_dir} and remove the empty "
                f"{REPLACED_RUN}")
        how = ("the run an --overwrite was replacing, killed before its first checkpoint. To keep the new start's "
               f"files, delete them; to get the old run back, {back}{f', and {restage}' if restage else ''}; then "
               "run the command again")
    else:
        how = ("the stages of the run in place, which a start killed before it began was making again. To keep "
               f"them, {restage}; to keep the new ones, delete them; then run the command again")
    raise OmnigymError(f"{run_dir} holds what a killed start had set aside ({names}): {how}")


def restarts(run_dir: Path) -> bool:
    """A run whose process was killed (SIGKILL, the OOM killer, a power cut) before its first
    checkpoint: its config.json and first metrics are there, no checkpoint and no model. Nothing
    can be resumed from it, and it cannot have been undone as a run stopped by a signal is:
    ``--resume`` starts it again from step 0, with its own config (its files are set aside
    until the new start's first checkpoint, as ``--overwrite`` does)."""
    return not Checkpointer(run_dir).exists() and not (run_dir / MODEL_FOLDER).exists()


def refuse_a_lost_checkpoint(run_dir: Path, config: dict) -> None:
    """A run without a checkpoint that nonetheless shows one was written: it finished (its
    curve.png is drawn at the end, after the last checkpoint) or logged two rows past ``--checkpoint-every``.
    Its checkpoint was deleted or lost, not never written, and starting it again from step 0 (as a
    killed start is, ``restarts``) replaced a finished run's log with a new one."""
    why = None
    if (run_dir / "curve.png").exists():
        why = "finished (its curve.png is drawn at the end)"
    else:
        every = config.get("checkpoint_every")
        try:
            steps = [row["global_step"] for row in read_metrics(run_dir)]
        except OmnigymError:  # no log, or a damaged one: nothing shows a checkpoint was written
            steps = []
        # The update that first passes --checkpoint-every logs its row and then writes the checkpoint: a start
        # killed during that write has one row past it. A second row comes only after the checkpoint was written.
        if isinstance(every, int) and not isinstance(every, bool) and every > 0 and \
                sum(step > every for step in steps) >= 2:
            why = (f"logged step {max(steps):g}, two rows past --checkpoint-every {every}, after its first "
                   "checkpoint was written")
    if why:
        raise OmnigymError(f"{run_dir} has no {CHECKPOINT_NAME}, yet it {why}: the checkpoint was deleted or lost, "
                           f"so the run cannot be resumed; put {CHECKPOINT_NAME} back, or start a new run in its place "
                           f"with --run-dir {run_dir} --overwrite")


def check_saved_state(cfg, run_dir: Path, saved: dict, algo: str) -> None:
    """The run has steps left, and its log still reaches the checkpoint (it is cut back to it). A
    config whose budget cannot grow says what to do instead (``spent_budget(run_dir, algo)``)."""
    if cfg.BUDGET:
        flag_name = cfg.BUDGET[0]
        counter, done, goal = budget_reached(cfg, saved["counters"])
        # a model left unsaved is saved again only where the run ended exactly there: a run stopped at step 55 of
        # 200 and resumed with --steps 5 went on to write its model and "steps: 5"
        # a stop during the last evaluation saved the run at its goal with that evaluation still owed (its row
        # "unlogged"): the resume plays it, logs the row and ends; refused, the run could never finish
        owed = saved["counters"].get("unlogged") is not None
        if done > goal or (done == goal and not unsaved_model(cfg, run_dir) and not owed):
            fixed = getattr(cfg, "spent_budget", lambda *_: None)(run_dir, algo)
            if fixed:
                raise OmnigymError(fixed)
            flag = f"--{flag_name.replace('_', '-')}"
            if counter == "update":  # whole rollouts: the env steps they take, autoresets counted, are what to pass
                rollout = cfg.num_envs * cfg.num_steps
                raise OmnigymError(f"{run_dir} is already at update {done} ({done * rollout} env steps of {rollout} a "
                                   f"rollout), and {flag} {getattr(cfg, flag_name)} makes {goal} rollouts; give {flag} "
                                   f"{(done + 1) * rollout} or more to continue it")
            raise OmnigymError(f"{run_dir} is already at {counter} {done} of {flag} {goal}; give a larger {flag} to "
                               "continue it")
    log, offset = run_dir / METRICS_NAME, saved["components"]["metrics"]["offset"]
    if not log.is_file() or log.stat().st_size < offset:
        raise OmnigymError(f"{log} is missing or shorter than when the checkpoint was written; put it back "
                           "(a resumed run's log continues it), or start a new run")


def budget_reached(cfg, counters: dict) -> tuple[str, int, int]:
    """``(counter, done, goal)``: how far a checkpoint (its ``counters``) is along ``cfg.BUDGET``.
    On-policy runs count whole rollouts: autoreset steps are not counted, so a finished run stands
    below its --total-timesteps (its resume re-closed it and rewrote its files)."""
    flag_name, counter = cfg.BUDGET
    if "update" in counters and hasattr(cfg, "num_steps"):
        return "update", counters["update"], whole_rollouts(getattr(cfg, flag_name), cfg.num_envs, cfg.num_steps)
    return counter, counters.get(counter, 0), getattr(cfg, flag_name)


def unsaved_model(cfg, run_dir: Path) -> bool:
    """The run trained all its steps but its final ``model/`` was never written whole (the disk
    filled, or it was stopped, while saving it): resuming it saves the model again."""
    return cfg.FINAL_MODEL and not complete_model(run_dir / MODEL_FOLDER)


def check_resumable(cfg, algo: str, saved_config: dict) -> None:
    """A run continues with the algorithm and the settings its checkpoint was made with;
    ``cfg.RESUME_FIXED`` names the settings that cannot change (shapes, envs, data)."""
    made_by = saved_config.get("algo")
    if made_by != algo:
        raise OmnigymError(f"{cfg.resume} is {a_run(made_by)}; continue it with: "
                           f"omnigym train {made_by} --resume {cfg.resume}")
    check_data(cfg, saved_config)
    check_fixed_settings(cfg, saved_config)
    check_weights(cfg, saved_config)


def check_fixed_settings(cfg, saved_config: dict) -> None:
    """The settings of ``cfg.RESUME_FIXED`` other than data files, as the run was made with them. A
    config may first say what a change means for it (``resume_refusal()``: a line, or None)."""
    refusal = getattr(cfg, "resume_refusal", lambda: None)()
    if refusal:
        raise OmnigymError(refusal)
    for name in cfg.RESUME_FIXED:
        if name in data_flags(cfg):
            continue  # compared by content (check_data), not by how the path is spelled
        if name not in saved_config:  # a config from before the setting existed
            continue
        now, then = getattr(cfg, name, None), saved_config[name]
        now = json.loads(json.dumps(now, default=describe))
        # a setting left out when the run was made (None) is fixed too: --rewards given to a run made without it
        # swapped its reward in silence
        if now != then and not same_path(name, now, then, saved_config):
            place = recorded_place(saved_config, name, then)
            where = f" ({place})" if place else ""
            flag_name = f"--{name.replace('_', '-')}"
            # a list flag left empty reads "made with --env-kwargs , not N=4" as a value
            made = f"without {flag_name}" if then in ([], None) else f"with {flag_name} {shown_value(then)}{where}"
            given = (f"{flag_name} {shown_value(now)}" if then in ([], None) else "none" if now in ([], None)
                     else shown_value(now))
            if isinstance(then, bool) and isinstance(now, bool):  # "made with --her, not --no-her"
                made, given = f"with {show_flag(name, then)}", show_flag(name, now)
            raise OmnigymError(f"{cfg.resume} was made {made}, not {given}; its checkpoint only fits its own setting "
                               "(leave the flag out to keep it)")


DATA_FILES_KEY = "data_files"
"""config.json's record of the data files a language run trains on: {flag: {size, sha256}}"""
DATA_SUFFIXES = (".jsonl", ".json", ".gz")


def data_flags(cfg) -> tuple[str, ...]:
    """The flags of ``cfg`` that may name a data file (``--data``; GRPO's ``--task``)."""
    return tuple(name for name in ("data", "task") if isinstance(getattr(cfg, name, None), str))


def data_file(value: str) -> Path | None:
    """The file a data flag names, when it names one (not a built-in set or a hub id)."""
    path = Path(value).expanduser()
    return path if value.endswith(DATA_SUFFIXES) and path.is_file() else None


def fingerprint(path: Path) -> dict:
    """What identifies a data file wherever it lies: its size and SHA-256."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def recorded_data(cfg) -> dict:
    """What config.json records of a run's data files, beside the flags as typed: for each, its
    absolute path (so a resume from another folder finds it) and fingerprint (so the same data
    is recognised under any path, after it moved)."""
    recorded = {}
    for name in data_flags(cfg):
        path = data_file(getattr(cfg, name))
        if path is not None:
            recorded[name] = {"path": str(path.resolve()), **fingerprint(path)}
    return recorded


def resolve_data(cfg, saved_config: dict) -> dict:
    """Where a resumed language run's data is now: {flag: path} for each data flag whose value,
    as given or as saved, does not name the run's own file from here but its recorded absolute
    path does (a run started with a relative path, resumed from another folder). The same file
    under any spelling, or a copy of it elsewhere (same size and SHA-256), is the run's data; a
    file that is gone, or other data, is refused in one line."""
    recorded = saved_config.get(DATA_FILES_KEY) if isinstance(saved_config.get(DATA_FILES_KEY), dict) else {}
    found = {}
    for name in data_flags(cfg):
        now, then, known = getattr(cfg, name), saved_config.get(name), recorded.get(name)
        if then is None:
            continue
        shown = f"--{name}"
        path = data_file(now)
        if isinstance(known, dict) and {"path", "size", "sha256"} <= set(known):
            same = {k: known[k] for k in ("size", "sha256")}
            if path is not None and fingerprint(path) == same:
                continue
            if now == then:  # the saved value: where the run's file was recorded is the place to look
                there = data_file(known["path"])
                if there is not None and fingerprint(there) == same:
                    found[name] = str(there)
                    continue
                raise OmnigymError(f"{cfg.resume} was made with {shown} {then} ({known['path']}), which is not there "
                                   f"any more; give {shown} PATH where the same file is now (it is recognised by its "
                                   "content)")
            raise OmnigymError(f"{cfg.resume} was made with other data: {shown} {then} ({known['size']} bytes, sha256 "
                               f"{known['sha256'][:12]}), not {now}; its checkpoint only fits its own data")
        if now == then or (path is not None and data_file(str(then)) is not None and path.samefile(then)):
            continue  # a run from before fingerprints: the same value, or the same file under another spelling
        raise OmnigymError(f"{cfg.resume} was made with {shown} {then}, not {now}; its checkpoint only fits its own "
                           "data (leave the flag out to keep it)")
    return found


WEIGHTS_KEY = "model_weights"
"""config.json's record of the weights each model folder a run reads (``WEIGHT_FLAGS``) held when
it started (``weights_fingerprint``): a teacher retrained in place since, or a base model folder
replaced, would go on under the run's numbers as if nothing had changed"""
WEIGHT_FLAGS = ("model", "teacher", "reward_model")


def recorded_weights(cfg) -> dict:
    """{flag: fingerprint} for each of ``WEIGHT_FLAGS`` that names a folder holding weights."""
    built_in = getattr(cfg, "BUILT_IN_MODELS", ())
    found = {}
    for name in WEIGHT_FLAGS:
        value = getattr(cfg, name, None)
        if not isinstance(value, str) or not value.strip() or value in built_in:
            continue
        try:
            folder = Path(value).expanduser()
            weights = weights_fingerprint(folder) if folder.is_dir() else None
        except OSError:  # unreadable or gone: the model's loader says so in its own line
            continue
        if weights is not None:
            found[name] = weights
    return found


def check_weights(cfg, saved_config: dict) -> None:
    """A resumed run reads the weights it started with (runs from before the record are not checked)."""
    recorded = saved_config.get(WEIGHTS_KEY)
    if not isinstance(recorded, dict):
        return
    now = recorded_weights(cfg)
    for name, then in recorded.items():
        if name in now and now[name] != then:
            flag = f"--{name.replace('_', '-')}"
            raise OmnigymError(f"{flag} {getattr(cfg, name)} holds other weights than when {cfg.resume} started "
                               "(retrained or replaced since), so the run cannot go on where it stopped; put back "
                               "the model it started with, or start a new run")


PATHS_KEY = "paths"
"""config.json's record of where the folders and files that ``PATH_FLAGS`` named relatively were,
as absolute paths: a run resumed from another folder finds its model, template or teacher there"""
PATH_FLAGS = ("model", "chat_template", "teacher", "reward_model", "pairwise_judge", "judge_rubric")
REWARD_FOLDERS = ("rm:", "prm:", "judge:")
"""reward names that hold a folder (``rm:RUN_DIR``, ``prm:RUN_DIR``, ``judge:MODEL``), or a URL"""
REWARD_FLAGS = ("rewards", "gold_reward", "step_rewards", "accuracy_reward")
"""the flags that name rewards: weighted specs (``rm:runs/rm:1.0,format:0.1``), and
``--accuracy-reward``, one name without a weight"""


def relative_path(value) -> Path | None:
    """The file or folder ``value`` names relative to the working directory, when it names one
    ("" names none: it is not the working directory)."""
    if not isinstance(value, str) or not value.strip() or "\n" in value or value.startswith(("/", "~")):
        return None
    try:
        return Path(value) if Path(value).exists() else None
    except OSError:  # longer than a file name can be: not a path here
        return None


def recorded_paths(cfg) -> dict:
    """{flag: absolute path} for each of ``PATH_FLAGS`` that names a file or folder relatively, and
    {"FLAG PART": absolute path} for each reward part that does (``"rewards rm:runs/rm"``); a
    resumed run keeps the record of a part it found through it (``reward_places``)."""
    built_in = getattr(cfg, "BUILT_IN_MODELS", ())  # --model tiny is the built-in, not a folder named tiny here
    found = {name: os.path.abspath(path) for name in PATH_FLAGS
             if getattr(cfg, name, None) not in built_in and (path := relative_path(getattr(cfg, name, None))) is not None}
    for flag in REWARD_FLAGS:
        moved = reward_places(cfg, flag)
        for part, path in reward_folders(cfg, flag).items():
            if part in moved:
                found[f"{flag} {part}"] = moved[part].split(":", 1)[1]
            elif relative_path(path) is not None:
                found[f"{flag} {part}"] = os.path.abspath(path)
    return found


def named_folders(flag: str, spec) -> list[tuple[str, str, str]]:
    """(part, prefix, what follows it) for each part of reward flag ``flag``'s ``spec`` whose name
    holds a folder or a URL (``rm:runs/rm:1.0`` -> ``("rm:runs/rm", "rm:", "runs/rm")``)."""
    if not isinstance(spec, str):
        return []
    names = [spec.strip()] if flag == "accuracy_reward" else [p.strip().rpartition(":")[0] for p in spec.split(",")]
    found = []
    for name in names:
        prefix = next((p for p in REWARD_FOLDERS if name.startswith(p)), None)
        if prefix is not None:
            found.append((name, prefix, name[len(prefix):]))
    return found


def reward_folders(cfg, flag: str) -> dict:
    """{part: its folder as written} for the parts of reward flag ``flag`` that name one by a
    relative path (``rm:runs/rm`` -> ``runs/rm``); URLs, absolute paths, the built-in models
    (``judge:tiny``) and other rewards are left out."""
    built_in = getattr(cfg, "BUILT_IN_MODELS", ())
    return {part: path for part, _, path in named_folders(flag, getattr(cfg, flag, None))
            if path.strip() and "://" not in path and not path.startswith(("/", "~")) and path not in built_in}


def reward_places(cfg, flag: str = "rewards") -> dict:
    """For a resumed run whose reward flag ``flag`` is as saved: {part: the part with its recorded
    absolute folder} where the relative folder it names is not, from here, the one the run was
    made with (resumed from another working directory). The parts keep their names (and so their
    metrics' names); only where each loads from changes. A recorded folder that is gone, with
    nothing of that name here, is one line."""
    resume = getattr(cfg, "resume", None)
    parts = reward_folders(cfg, flag)
    if not resume or not parts:
        return {}
    try:
        saved = load_config_dict(resume)
    except OmnigymError:
        return {}
    if saved.get(flag) != getattr(cfg, flag):
        return {}
    record, places = recorded_in(saved), {}
    for part, path in parts.items():
        there = record.get(f"{flag} {part}")
        if there is None or not recorded_for(path, there):
            continue
        here = relative_path(path)
        if not Path(there).exists():
            if here is None:
                option = f"--{flag.replace('_', '-')}"
                raise OmnigymError(f"{resume} was made with {option} {part} ({there}), which is not there any more; "
                                   f"put it back there, or give {option} with {part.split(':', 1)[0]}:PATH where it "
                                   "is now (that part's metrics then take the new name)")
            continue
        if here is None or not os.path.samefile(here, there):
            places[part] = part[:len(part) - len(path)] + there
    return places


def moved_paths(cfg, saved_config: dict) -> dict:
    """{flag: recorded absolute path} for each path flag left as the run saved it (a relative
    value, not a built-in model name) whose recorded place is where that value pointed: the run's
    own folder, used from any working directory, and even where the same relative name here is
    another folder (a relative --model, resumed from another folder, was read as a hub id:
    'cannot connect to huggingface.co'). A recorded place that is gone is one line saying so. A
    record that cannot be where the value pointed (not absolute, another name: a hand-edited or
    foreign config.json) is ignored."""
    recorded = recorded_in(saved_config)
    built_in = getattr(cfg, "BUILT_IN_MODELS", ())
    found = {}
    for name, there in recorded.items():
        now = getattr(cfg, name, None)
        if name not in PATH_FLAGS or not isinstance(now, str) or now != saved_config.get(name) or now in built_in \
                or now.startswith(("/", "~")) or not recorded_for(now, there):
            continue
        here = relative_path(now)
        if not Path(there).exists():
            if here is not None:
                continue  # the run's folder is gone, and the name names one here: the resume's own choice
            flag = f"--{name.replace('_', '-')}"
            raise OmnigymError(f"{cfg.resume} was made with {flag} {now} ({there}), which is not there any more; "
                               f"give {flag} PATH where it is now")
        if here is None or not os.path.samefile(here, there):
            found[name] = there
    return found


def found_elsewhere(saved_config: dict) -> dict:
    """{flag: recorded place} for each relative path flag of a saved config that names nothing
    from the working directory and whose recorded place is there."""
    found = {}
    for name in PATH_FLAGS:
        value = saved_config.get(name)
        there = recorded_place(saved_config, name, value)
        if there is not None and relative_path(value) is None and Path(there).exists():
            found[name] = there
    return found


def recorded_in(saved_config: dict) -> dict:
    """config.json's ``paths`` record, its string entries only."""
    record = saved_config.get(PATHS_KEY)
    return {k: v for k, v in record.items() if isinstance(v, str)} if isinstance(record, dict) else {}


def recorded_place(saved_config: dict, name: str, value) -> str | None:
    """Where config.json recorded the saved relative ``value`` of flag ``name`` to be, if it could be."""
    there = recorded_in(saved_config).get(name)
    return there if isinstance(value, str) and there is not None and recorded_for(value, there) else None


def recorded_for(value: str, there: str) -> bool:
    """``there`` could be where the relative ``value`` pointed: absolute, and ending in its names
    (``.``, ``..``, ``../..`` have none: any absolute folder could be theirs)."""
    try:
        names = [part for part in Path(os.path.normpath(value)).parts if part != ".."]
        parts = Path(there).parts
        return Path(there).is_absolute() and "\0" not in there and list(parts[len(parts) - len(names):]) == names
    except (OSError, ValueError):
        return False


def same_path(name: str, now, then, saved_config: dict) -> bool:
    """``now`` and ``then``, values of a path flag, name the same file or folder under two spellings
    (relative from another folder, absolute, or where ``moved_paths`` found it), or the run's
    recorded folder is gone and ``now`` names one (a moved model folder, given where it is now:
    the checkpoint's shapes are still checked when it loads)."""
    known = recorded_place(saved_config, name, then)
    there = known or then
    try:
        if name not in (*PATH_FLAGS, "dataset") or not isinstance(now, str) or not isinstance(there, str) or \
                not Path(now).expanduser().exists():
            return False
        if not Path(there).expanduser().exists():
            return known is not None  # a recorded folder that is gone; a hub id is never a folder's other spelling
        return os.path.samefile(Path(now).expanduser(), Path(there).expanduser())
    except (OSError, ValueError):
        return False


def check_data(cfg, saved_config: dict) -> None:
    """``resolve_data`` for a config that cannot be changed any more (a run from Python)."""
    elsewhere = resolve_data(cfg, saved_config)
    if elsewhere:
        name, path = next(iter(elsewhere.items()))
        raise OmnigymError(f"{cfg.resume} was made with --{name} {saved_config.get(name)}, which is {path} (not the "
                           f"{getattr(cfg, name)} seen from here); give {name}={path!r}")
