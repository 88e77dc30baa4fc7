"""Training curves from ``metrics.jsonl``: ``curves.png`` in the run directory.

Four panels over the global step: the eval set's greedy solve rate, the sampled rollouts'
reward and pass@k, the policy's entropy and KL, and each step's time by phase. A metric a run
did not log (the KL when ``trainer.algorithm.use_kl_loss`` is off) is named as not logged
instead of drawn. matplotlib is imported on first use, with the headless Agg backend.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maze_engine.errors import MetricsFileError
from weight_sync import fs

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
EVAL_KEY = "eval/all/pass_at_1"
KL_KEY = "policy/policy_kl"
ENTROPY_KEY = "policy/policy_entropy"
PHASES = (
    ("timing/generate", "rollouts"),
    ("timing/policy_train", "policy update"),
    ("timing/sync_weights", "adapter publish + load"),
)
"""The parts of ``timing/step``, drawn stacked; the rest of the step is drawn as 'other'."""
CHECKPOINT_KEY = "timing/save_checkpoint"
_PASS_AT = re.compile(r"reward/avg_pass_at_(\d+)")
_MUTED = "#777777"


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """One merged row per global step, in step order, from a ``metrics.jsonl`` file.

    A resumed run appends to the same file, so a step can appear more than once (and the final
    eval shares the last step's number): later lines update earlier ones. A torn last line (a
    killed writer) is skipped.

    Raises:
        MetricsFileError: The file is missing, a line before the last is not JSON, or there
            are no rows.
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise MetricsFileError(f"{p}: cannot read the metrics file: {exc.strerror}") from exc
    steps: dict[int, dict[str, float]] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row.pop("global_step"))
        except (ValueError, KeyError, TypeError) as exc:
            if i == len(lines) - 1:
                break
            raise MetricsFileError(f"{p}: line {i + 1} is not a metrics row: {exc}") from exc
        steps.setdefault(step, {}).update({k: float(v) for k, v in row.items()})
    if not steps:
        raise MetricsFileError(f"{p}: no metrics rows yet")
    return [{"global_step": float(s), **steps[s]} for s in sorted(steps)]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # headless: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _series(rows: Sequence[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["global_step"], r[key]) for r in rows if key in r]
    return [x for x, _ in pts], [y for _, y in pts]


def _not_logged(ax: Axes, what: str) -> None:
    ax.text(
        0.5, 0.5, what, transform=ax.transAxes, ha="center", va="center", color=_MUTED, wrap=True
    )


def _percent(ax: Axes) -> None:
    from matplotlib.ticker import PercentFormatter

    ax.set_ylim(-0.03, 1.03)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))


def _steps_axis(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("global step")
    ax.grid(alpha=0.3)


def _eval_panel(ax: Axes, rows: Sequence[dict[str, float]]) -> None:
    ax.set_title("eval solve rate (greedy)")
    xs, ys = _series(rows, EVAL_KEY)
    if not xs:
        _not_logged(ax, "no eval logged\n(trainer.eval_interval, trainer.eval_before_train)")
    else:
        ax.plot(xs, ys, marker="o", color="C0")
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(f"{y:.0%}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center")
    _percent(ax)
    _steps_axis(ax)


def _reward_panel(ax: Axes, rows: Sequence[dict[str, float]]) -> None:
    ax.set_title("training rollouts: reward and pass@k")
    keys = sorted(
        {k for r in rows for k in r if _PASS_AT.fullmatch(k)},
        key=lambda k: int(k.rsplit("_", 1)[1]),
    )
    lines: list[tuple[str, str, dict[str, Any]]] = [
        ("reward/avg_raw_reward", "mean reward", {"linewidth": 4, "alpha": 0.35})
    ]
    lines += [(k, f"pass@{k.rsplit('_', 1)[1]}", {"linewidth": 1.5}) for k in keys]
    values: list[float] = []
    for key, label, style in lines:
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker="." if len(xs) < 60 else None, label=label, **style)
            values += ys
    if not values:
        _not_logged(ax, "no training steps logged yet")
    else:
        ax.legend(loc="lower right", fontsize="small")
        if min(values) >= 0 and max(values) <= 1:  # the task reward is 0/1: same scale as pass@k
            ax.set_ylim(-0.03, 1.03)
    _steps_axis(ax)


def _policy_panel(ax: Axes, rows: Sequence[dict[str, float]]) -> None:
    xs, ys = _series(rows, ENTROPY_KEY)
    kx, ky = _series(rows, KL_KEY)
    ax.set_title(
        "policy entropy and KL to the base"
        if kx
        else "policy entropy (KL not logged: use_kl_loss is off)"
    )
    if xs:
        ax.plot(xs, ys, color="C2", marker="." if len(xs) < 60 else None)
        ax.set_ylabel("entropy (nats/token)", color="C2")
    if kx:
        twin = ax.twinx()
        twin.plot(kx, ky, color="C3", marker="." if len(kx) < 60 else None)
        twin.set_ylabel("KL", color="C3")
    if not xs and not kx:
        _not_logged(ax, "entropy and KL not logged")
    _steps_axis(ax)


def _timing_panel(ax: Axes, rows: Sequence[dict[str, float]]) -> None:
    ax.set_title("step time by phase")
    steps = [r for r in rows if "timing/step" in r]
    if not steps:
        _not_logged(ax, "no step timings logged yet")
        _steps_axis(ax)
        return
    xs = [r["global_step"] for r in steps]
    parts = [(label, [r.get(key, 0.0) for r in steps]) for key, label in PHASES]
    known = [sum(v) for v in zip(*(p for _, p in parts), strict=True)]
    parts.append(
        ("other", [max(0.0, r["timing/step"] - k) for r, k in zip(steps, known, strict=True)])
    )
    if any(CHECKPOINT_KEY in r for r in steps):
        parts.append(("checkpoint save", [r.get(CHECKPOINT_KEY, 0.0) for r in steps]))
    bottom = [0.0] * len(xs)
    width = 0.8 if len(xs) < 2 else 0.8 * min(b - a for a, b in itertools.pairwise(xs))
    for i, (label, values) in enumerate(parts):
        ax.bar(xs, values, width=width, bottom=bottom, label=label, color=f"C{i}", linewidth=0)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("seconds")
    ax.set_ylim(0, max(bottom) * 1.3)  # headroom for the legend
    ax.legend(loc="upper center", ncols=3, fontsize="small")
    _steps_axis(ax)


def curves_figure(rows: Sequence[dict[str, float]], *, title: str = "") -> Figure:
    """The 2 x 2 figure of a run's curves (see the module docs); ``rows`` as :func:`read_metrics`.

    The policy panel gains a second y axis (a twin) when the KL was logged.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), dpi=90, layout="constrained")
    _eval_panel(axes[0][0], rows)
    _reward_panel(axes[0][1], rows)
    _policy_panel(axes[1][0], rows)
    _timing_panel(axes[1][1], rows)
    # One step range for every panel (a one-step run would otherwise get fractional ticks).
    first, last = rows[0]["global_step"], rows[-1]["global_step"]
    pad = max(0.6, 0.03 * (last - first))
    for ax in axes.flat:
        ax.set_xlim(first - pad, last + pad)
    if title:
        fig.suptitle(title)
    return fig


def save_png(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as a PNG, atomically (a viewer never reads half a file), and close it."""
    from PIL import Image

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png")
    finally:
        _pyplot().close(fig)
    # A 256-colour palette keeps a chart's look at about a third of the RGBA size.
    buf.seek(0)
    with Image.open(buf) as im:
        small = im.convert("RGB").quantize(colors=256)
    buf = io.BytesIO()
    small.save(buf, format="PNG", optimize=True)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fs.atomic_write_bytes(out, buf.getvalue(), durable=False)
    return out


def write_curves(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    title: str | None = None,
) -> Path:
    """Draw ``run_dir/metrics.jsonl`` into ``out`` (default ``run_dir/curves.png``).

    Args:
        run_dir: A run directory (``trainer.export_path``).
        out: Where the PNG goes.
        title: Figure title (default: the run directory's name).

    Returns:
        The PNG's path.

    Raises:
        MetricsFileError: No readable metrics in the run directory.
    """
    run = Path(run_dir)
    rows = read_metrics(run / METRICS_FILE)
    fig = curves_figure(rows, title=run.resolve().name if title is None else title)
    return save_png(fig, run / CURVES_FILE if out is None else out)
