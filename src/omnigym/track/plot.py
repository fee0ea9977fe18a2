"""Learning-curve PNGs: one run, or several seeds of several configurations overlaid.

Only logged points are drawn: a curve starts at its first logged step (a PPO return at the
first finished episode, an accuracy at the first evaluation) and never runs past its last.
One run's stages (``RUN/stages/NAME``, e.g. GRPO's supervised warm-up) are drawn before the
run's own steps, as phases of their own, where they logged the panel's metric.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import MappingProxyType

import numpy as np

from omnigym.errors import OmnigymError
from omnigym.track.files import METRICS_NAME, as_disk_fault, load_config_dict, read_metrics
from omnigym.track.run_dir import STAGES_FOLDER, check_out_of_other_runs, is_run_dir, refuse_run_files

# Each algorithm's headline metric: what its own curve.png draws (the first of these it logged).
# The algorithms sit above track/, so they are named here, not imported (tests/test_plot_groups.py
# fails on an algorithm missing from it).
CONTROL_RETURN = ("charts/episodic_return",)
OFFLINE_SCORE = ("eval/normalized_score", "eval/episodic_return")  # normalized where the dataset has references
HEADLINES = MappingProxyType({
    **dict.fromkeys(("ppo", "reinforce", "dqn", "sac", "td3", "drq", "ppo_lstm", "mappo"), CONTROL_RETURN),
    **dict.fromkeys(("bc", "td3_bc", "iql", "cql"), OFFLINE_SCORE),
    "alphazero": ("eval/vs_mcts/score", "eval/vs_random/win_rate"),
    "grpo": ("eval/accuracy",), "text_reinforce": ("reward/mean",), "sft": ("eval/loss",),
    "dpo": ("eval/gold_reward", "eval/accuracy"), "rm": ("eval/accuracy",), "prm": ("eval/step_accuracy",),
    "rlhf": ("eval/gold_reward", "eval/rm_score"), "online_dpo": ("eval/gold_reward", "eval/judge_score"),
    "distill": ("eval/accuracy", "distill/reverse_kl"),
})
# A run of an algorithm not in the table (a newer version's): the first of these it logged.
MAIN_METRICS = ("charts/episodic_return", "eval/normalized_score", "eval/episodic_return", "eval/gold_reward",
                "eval/accuracy", "eval/step_accuracy", "eval/rm_score", "eval/judge_score", "eval/loss", "reward/mean")
# Drawn under the main metric when the run logged them: a language run's reward beside its
# accuracy, a goal env's success rate under its return.
COMPANIONS = ("reward/mean", "charts/success_rate")
# What a stage logged in place of a panel's metric: the warm-up's accuracy is measured on
# problems from the training split (its label says so), the run's on held-out ones.
STAGE_METRICS = (("eval/accuracy", "sft/val_accuracy"),)
# Below this many points a curve shows its points as markers: sparse evaluations read as
# measurements, not as a line.
MARKERS_UP_TO = 60


# config.json keys that do not make runs different experiments: the seed (runs that differ in it
# alone are seeds of one curve), where a run is and what it printed or saved along the way.
NOT_SETTINGS = frozenset({"seed", "run_dir", "resume", "overwrite", "data_files", "paths", "progress", "plot", "tensorboard",
                          "wandb", "print_episodes", "capture_video", "checkpoint_every", "torch_threads"})
LEGEND_SETTINGS = 4
"""at most this many differing settings are named in one legend entry (then "+N more")"""


def _label(run_dir: Path) -> str:
    cfg = load_config_dict(run_dir)
    return _name(cfg)


def _name(cfg: dict) -> str:
    return f"{cfg.get('algo', '?')} {cfg.get('env_id', cfg.get('task', ''))}".strip()


def settings(cfg: dict) -> dict:
    """What makes a run the experiment it is: its config.json less the seed, paths and timestamps."""
    return {k: v for k, v in cfg.items() if k not in NOT_SETTINGS
            and not k.endswith(("_dir", "_path", "_at", "_time")) and "timestamp" not in k}


def _show(value) -> str:
    text = " ".join(map(str, value)) if isinstance(value, (list, tuple)) else json.dumps(value) \
        if isinstance(value, dict) else str(value)
    return text if len(text) <= 30 else text[:29] + "…"


def group_runs(configs: dict[Path, dict]) -> dict[Path, str]:
    """Each run's curve label: runs whose settings (``settings``) are equal are seeds of one curve;
    the label is the algorithm and env or task, then every setting that differs between the
    curves of that algorithm and env (``hidden=64 64``), so no two configurations share a name
    or a mean."""
    keyed = {run: json.dumps(settings(cfg), sort_keys=True, default=str) for run, cfg in configs.items()}
    groups = {key: settings(configs[run]) for run, key in keyed.items()}
    labels = {}
    for name in dict.fromkeys(map(_name, groups.values())):  # curves another name tells apart need no more
        same = {key: values for key, values in groups.items() if _name(values) == name}
        shown_by_name = {"algo", "env_id"} if any("env_id" in values for values in same.values()) else {"algo", "task"}
        keys = sorted({k for values in same.values() for k in values} - shown_by_name)
        differing = [k for k in keys if len({json.dumps(values.get(k), sort_keys=True, default=str)
                                             for values in same.values()}) > 1]
        for key, values in same.items():
            shown = [f"{k}={_show(values[k]) if k in values else '(unset)'}" for k in differing]
            more = f", +{len(shown) - LEGEND_SETTINGS} more settings" if len(shown) > LEGEND_SETTINGS else ""
            labels[key] = ", ".join([name, *shown[:LEGEND_SETTINGS]]) + more
    if len(set(labels.values())) < len(labels):  # settings past the legend's four tell them apart: number them
        labels = {key: f"{label} [#{i + 1}]" for i, (key, label) in enumerate(labels.items())}
    return {run: labels[key] for run, key in keyed.items()}


def _series(rows: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    points = [(r["global_step"], r[metric]) for r in rows if isinstance(r.get(metric), (int, float))]
    if not points:
        return None
    steps, values = np.array(points, dtype=float).T
    return steps, values


def logged_metrics(runs: dict[Path, list[dict]]) -> list[str]:
    """Every numeric metric any of ``runs`` logged, sorted."""
    return sorted({k for rows in runs.values() for r in rows for k, v in r.items()
                   if k != "global_step" and isinstance(v, (int, float))})


def headline(cfg: dict, rows: list[dict]) -> str | None:
    """The run's headline metric, the one its own curve.png draws (``HEADLINES``), or None when
    it logged none of them (a short run that ended no episode)."""
    have = {k for r in rows for k, v in r.items() if isinstance(v, (int, float))}
    return next((m for m in HEADLINES.get(cfg.get("algo"), MAIN_METRICS) if m in have), None)


def default_metrics(runs: dict[Path, list[dict]], configs: dict[Path, dict] | None = None) -> tuple[str, ...]:
    """Each run's headline metric (one panel per different one, in the runs' order) and, below
    them, a reward or success rate that any run logged."""
    configs = configs or {run: load_config_dict(run) for run in runs}
    mains = [headline(configs[run], rows) for run, rows in runs.items()]
    if not any(mains):
        wanted = sorted({m for run in runs for m in HEADLINES.get(configs[run].get("algo"), MAIN_METRICS)})
        raise OmnigymError(f"no run among {', '.join(map(str, runs))} logged a metric to plot by default "
                           f"({', '.join(wanted)}); name one with --metric: {', '.join(logged_metrics(runs)) or 'none'}")
    panels = tuple(dict.fromkeys(m for m in mains if m))
    have = set(logged_metrics(runs))
    return (*panels, *(m for m in COMPANIONS if m in have and m not in panels))


def stages_of(run_dir: Path) -> list[tuple[str, list[dict]]]:
    """The run's stages with a metrics log, in the order they ran (their logs' ages). A log
    that cannot be read is left out: the run's own curve is still drawn."""
    folder = run_dir / STAGES_FOLDER
    logs = sorted(folder.glob(f"*/{METRICS_NAME}"), key=lambda p: p.stat().st_mtime_ns) if folder.is_dir() else []
    stages = []
    for log in logs:
        try:
            stages.append((log.parent.name, read_metrics(log.parent)))
        except OmnigymError:
            continue
    return stages


def _draw(ax, steps: np.ndarray, values: np.ndarray, **style) -> None:
    ax.plot(steps, values, marker="o" if len(steps) <= MARKERS_UP_TO else None, markersize=3, **style)


def _draw_group(ax, label: str, curves: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Seeds of one configuration: their mean and min-max band on the steps they logged, where
    all of them have data (no curve is extended before its first or past its last point)."""
    name = f"{label} ({len(curves)} run{'s' if len(curves) > 1 else ''})"
    if len(curves) == 1:
        _draw(ax, *curves[0], label=name)
        return
    start, end = max(s[0] for s, _ in curves), min(s[-1] for s, _ in curves)
    grid = np.unique(np.concatenate([s[(s >= start) & (s <= end)] for s, _ in curves]))
    if grid.size == 0:  # the runs' logged steps do not overlap: each is drawn as it is
        for i, curve in enumerate(curves):
            _draw(ax, *curve, label=name if i == 0 else None, alpha=0.7)
        return
    ys = np.stack([np.interp(grid, *_increasing(steps, values)) for steps, values in curves])
    line = ax.plot(grid, ys.mean(0), marker="o" if grid.size <= MARKERS_UP_TO else None, markersize=3, label=name)[0]
    ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.25, color=line.get_color())


def _increasing(steps: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One value per step (several episodes can end at one step: their mean), for np.interp."""
    unique, inverse = np.unique(steps, return_inverse=True)
    return unique, np.bincount(inverse, weights=values) / np.bincount(inverse)


def _stage_metric(rows: list[dict], metric: str) -> str | None:
    """What a stage logged for ``metric``: the metric itself, or its stage equivalent."""
    if _series(rows, metric) is not None:
        return metric
    other = dict(STAGE_METRICS).get(metric)
    return other if other and _series(rows, other) is not None else None


def phases_of(stages, metrics) -> list[tuple[str, float, list[dict]]]:
    """The stages that logged one of ``metrics``, each with the step it starts at on the
    plot's x axis (stages back to back from 0; the run's own steps after the last)."""
    phases, offset = [], 0.0
    for name, rows in stages:
        length = max((r["global_step"] for r in rows), default=0)
        if length and any(_stage_metric(rows, m) for m in metrics):
            phases.append((name, offset, rows))
            offset += length
    return phases


def _draw_single_run(ax, run_dir: Path, rows: list[dict], metric: str, phases) -> None:
    """One run and, before its steps, its stages (``phases_of``), each a shaded phase."""
    for i, (name, start, stage_rows) in enumerate(phases):
        end = start + max(r["global_step"] for r in stage_rows)
        ax.axvspan(start, end, color="tab:gray", alpha=0.15 if i % 2 == 0 else 0.07, lw=0)
        stage_metric = _stage_metric(stage_rows, metric)
        if stage_metric:
            note = "" if stage_metric == metric else f": {stage_metric}, on training-split problems"
            steps, values = _series(stage_rows, stage_metric)
            _draw(ax, steps + start, values, color="tab:gray", label=f"{name}{note}")
    offset = phases[-1][1] + max(r["global_step"] for r in phases[-1][2]) if phases else 0.0
    if phases:
        ax.axvline(offset, color="tab:gray", lw=0.8, ls="--")
    series = _series(rows, metric)
    if series is not None:
        _draw(ax, series[0] + offset, series[1], color="tab:blue", label=_label(run_dir))


IMAGE_STARTS = MappingProxyType({".png": (b"\x89PNG",), ".pdf": (b"%PDF",), ".svg": (b"<?xml", b"<svg"),
                                 ".jpg": (b"\xff\xd8",), ".jpeg": (b"\xff\xd8",), ".eps": (b"%!PS",),
                                 ".ps": (b"%!PS",)})
"""How an image file of each suffix begins: ``plot --out`` replaces an image, never another file"""


def refuse_replacing_a_non_image(out: Path) -> None:
    """``plot --out notes.pdf`` replaced a text file that happened to have an image's suffix."""
    if not out.is_file():
        return
    with open(out, "rb") as file:
        start = file.read(8)
    if not start.startswith(IMAGE_STARTS.get(out.suffix.lower(), ())):
        raise OmnigymError(f"--out {out} exists and is not a {out.suffix} image; plot replaces only its own kind of "
                           "file: name another --out, or move that file")


def plot_runs(run_dirs, out, metric: str | tuple[str, ...] | list[str] | None = None, say=None) -> Path:
    """``figure(run_dirs, metric, say)`` written to ``out``, an image file."""
    out = Path(out)
    if not str(out) or out.is_dir() or not out.suffix:
        raise OmnigymError(f"--out {str(out)!r} must name an image file, e.g. runs/plot.png")
    check_out_of_other_runs(out, run_dirs, "--out", "which this plot does not draw", "the plot", "runs/plot.png")
    # a run's own curve.png may be drawn again (troubleshooting.md's line for a full disk at the end)
    refuse_run_files(out, "--out", "plot", own_runs=run_dirs, allowed=("curve.png",))
    refuse_replacing_a_non_image(out)
    fig = figure(run_dirs, metric, say)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except (OSError, ValueError) as exc:  # an unwritable place, or a suffix matplotlib cannot write
        if as_disk_fault(exc, out) is not None:  # a full disk: the caller says what to do next
            raise as_disk_fault(exc, out) from None
        raise OmnigymError(f"cannot write the plot to {out}: {getattr(exc, 'strerror', None) or exc}") from None
    return out


def read_runs(run_dirs, say) -> tuple[dict[Path, dict], dict[Path, list[dict]]]:
    """Each run's config.json and metrics, or one line for the first that is not a run with
    metrics. A run named twice is read once (``say`` tells which)."""
    configs, runs = {}, {}
    for run_dir in map(Path, run_dirs):
        if os.path.realpath(run_dir) in {os.path.realpath(r) for r in runs}:  # Path.resolve raises on a link loop
            say(f"omnigym plot: skipped {run_dir}: named twice, drawn once")
            continue
        configs[run_dir] = load_config_dict(run_dir)
        runs[run_dir] = read_metrics(run_dir)
        if not runs[run_dir]:
            raise OmnigymError(f"{run_dir} logged no metrics yet (its {METRICS_NAME} is empty); plot it once it has")
    return configs, runs


def _say_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def figure(run_dirs, metric: str | tuple[str, ...] | list[str] | None = None, say=None):
    """Overlay runs; runs whose config.json differ in nothing but the seed (``settings``) are
    seeds of one curve, drawn as their mean with a min-max band, and the legend names what
    differs between curves. ``metric``: one name or several (one panel each; the first must have
    been logged, a further one no run logged is left out); None draws each run's headline metric
    (``HEADLINES``: what its own curve.png draws) and a reward or success rate under it. A run
    that logged none of the panels' metrics is left out with one line to ``say`` (default:
    stderr). One run is drawn with its stages (a warm-up) as phases before its own steps. A
    matplotlib Figure."""
    # A Figure drawn on the Agg canvas directly: no pyplot, so no process-wide backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    say = say or _say_to_stderr
    configs, runs = read_runs(run_dirs, say)
    metrics = default_metrics(runs, configs) if metric is None else (metric,) if isinstance(metric, str) \
        else tuple(metric)
    missing = [m for m in metrics if not any(_series(rows, m) is not None for rows in runs.values())]
    if metrics[0] in missing:
        raise OmnigymError(f"no run among {', '.join(map(str, runs))} logged {metrics[0]!r}; they logged: "
                           f"{', '.join(logged_metrics(runs)) or 'nothing'}")
    metrics = tuple(m for m in metrics if m not in missing)  # a further panel no run logged is left out
    for run_dir, rows in list(runs.items()):
        if all(_series(rows, m) is None for m in metrics):
            logged = logged_metrics({run_dir: rows})
            say(f"omnigym plot: skipped {run_dir}: it logged none of {', '.join(metrics)} (it logged: "
                f"{', '.join(logged[:8])}{', ...' if len(logged) > 8 else ''})")
            del runs[run_dir]

    fig = Figure(figsize=(7, 3 + 2.2 * len(metrics)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    xlabel = "global step"
    if len(runs) == 1:
        (run_dir, rows), = runs.items()
        phases = phases_of(stages_of(run_dir), metrics)
        if phases:  # the stages' own steps first, then the run's, on one axis
            algo = configs[run_dir].get("algo", "run")
            xlabel = f"step: {', then '.join(name for name, *_ in phases)} (shaded), then {algo} (after the dashed line)"
    else:
        labels = group_runs({run: configs[run] for run in runs})
    for ax, name in zip(axes, metrics):
        if len(runs) == 1:
            _draw_single_run(ax, run_dir, rows, name, phases)
        else:
            groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
            for run_dir, rows in runs.items():
                series = _series(rows, name)
                if series is not None:
                    groups.setdefault(labels[run_dir], []).append(series)
            for label, curves in groups.items():
                _draw_group(ax, label, curves)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if len(runs) == 1 and phases:  # each phase named above the top panel, where no curve or legend is
        end = phases[-1][1] + max(r["global_step"] for r in phases[-1][2])
        names = [(name, (start + start + max(r["global_step"] for r in rows)) / 2) for name, start, rows in phases]
        for name, middle in names + [(algo, (end + axes[0].get_xlim()[1]) / 2)]:
            axes[0].text(middle, 1.01, name, transform=axes[0].get_xaxis_transform(), ha="center", va="bottom",
                         fontsize=9, color="dimgray")
    axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
    return fig
