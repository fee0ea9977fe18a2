"""Learning-curve PNGs: one run, or several seeds of several configurations overlaid."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from omnigym.errors import OmnigymError
from omnigym.track.files import as_disk_fault, load_config_dict, read_metrics


def _label(run_dir: Path) -> str:
    cfg = load_config_dict(run_dir)
    return f"{cfg.get('algo', '?')} {cfg.get('env_id', cfg.get('task', ''))}".strip()


def plot_runs(run_dirs, out, metric: str = "charts/episodic_return", points: int = 200) -> Path:
    """Overlay runs; runs with the same algorithm and env are seeds of one curve, drawn as
    their mean with a min-max band, interpolated onto a common step grid."""
    # A Figure drawn on the Agg canvas directly: no pyplot, so no process-wide backend switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for run_dir in map(Path, run_dirs):
        rows = [r for r in read_metrics(run_dir) if metric in r]
        if rows:
            groups[_label(run_dir)].append((np.array([r["global_step"] for r in rows]), np.array([r[metric] for r in rows])))
    if not groups:
        raise OmnigymError(f"no run among {', '.join(map(str, run_dirs))} logged {metric!r}")

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, curves in groups.items():
        grid = np.linspace(0, min(steps[-1] for steps, _ in curves), points)
        ys = np.stack([np.interp(grid, steps, values) for steps, values in curves])
        ax.plot(grid, ys.mean(0), label=f"{label} ({len(curves)} run{'s' if len(curves) > 1 else ''})")
        if len(curves) > 1:
            ax.fill_between(grid, ys.min(0), ys.max(0), alpha=0.25)
    ax.set_xlabel("global step")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    if not str(out) or out.is_dir() or not out.suffix:
        raise OmnigymError(f"--out {str(out)!r} must name an image file, e.g. runs/plot.png")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except (OSError, ValueError) as exc:  # an unwritable place, or a suffix matplotlib cannot write
        if as_disk_fault(exc, out) is not None:  # a full disk: the caller says what to do next
            raise as_disk_fault(exc, out) from None
        raise OmnigymError(f"cannot write the plot to {out}: {getattr(exc, 'strerror', None) or exc}") from None
    return out
