"""Charts of evaluation results (matplotlib) and episode GIFs (PIL over maze-env's renderer).

- :func:`write_report`: one run: solve rate by optimal path length with 95% intervals, the
  outcome kinds, and a grid of failed mazes with the path the agent took;
- :func:`write_compare`: two runs side by side: solve rates, outcomes, per-maze changes;
- :func:`write_series_chart`: continuous mode: the solve rate of each adapter version;
- :func:`write_gif`: one episode, a frame per square the agent stood on.

Each ``*_figure`` function returns the matplotlib figure; the ``write_*`` ones save it as PNG.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, ImageDraw

from maze_env import Renderer, Style
from maze_evaluation.plotting import (
    KIND_COLOURS,
    MUTED,
    RUN_COLOURS,
    SOLVED,
    kind_label,
    percent_axis,
    pyplot,
    save_png,
    short,
)
from maze_evaluation.records import FAILURE_KINDS, EvalRecord
from maze_evaluation.stats import Summary, summarize, wilson_interval

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INK = (20, 20, 20)
PATH = (255, 150, 0)
SERIES_CHART = "series.png"
"""Continuous mode's chart, next to ``series.jsonl``."""


def _path_image(record: EvalRecord, cell_px: int) -> Image.Image:
    """The maze with the agent at its start and the taken path drawn over it."""
    maze = record.maze()
    img = Image.fromarray(Renderer(maze, Style(cell_px=cell_px)).rgb(), mode="RGB")
    draw = ImageDraw.Draw(img)
    pts = [(c * cell_px + cell_px / 2, r * cell_px + cell_px / 2) for r, c in record.path]
    if len(pts) > 1:
        draw.line(pts, fill=PATH, width=max(2, cell_px // 5), joint="curve")
    if pts:
        x, y = pts[-1]
        h = max(2, cell_px // 4)
        draw.rectangle((x - h, y - h, x + h, y + h), outline=INK, width=2)
    return img


def _errors(rates: Sequence[float], cis: Sequence[tuple[float, float]]) -> list[list[float]]:
    """Matplotlib's asymmetric error bars (below, above) from rates and their intervals."""
    return [
        [max(0.0, r - lo) for r, (lo, _) in zip(rates, cis, strict=True)],
        [max(0.0, hi - r) for r, (_, hi) in zip(rates, cis, strict=True)],
    ]


def _by_length(s: Summary) -> tuple[list[str], list[float], list[tuple[float, float]], list[str]]:
    labels: list[str] = []
    rates: list[float] = []
    cis: list[tuple[float, float]] = []
    counts: list[str] = []
    for length, (solved, n) in s.by_optimal_length.items():
        labels.append(length)
        rates.append(solved / n if n else 0.0)
        cis.append(wilson_interval(solved, n))
        counts.append(f"{solved}/{n}")
    return labels, rates, cis, counts


def _slots(ax: Axes, n: int, minimum: int = 4) -> None:
    """Room for at least ``minimum`` bars, so one or two bars stay bars and not walls."""
    pad = max(0.0, (minimum - n) / 2)
    ax.set_xlim(-0.5 - pad, n - 0.5 + pad)


def _model_label(s: Summary) -> str:
    # Endpoint records name the model as "<url>#<model>"; directories by their path.
    model = s.model.rsplit("#", 1)[1] if "#" in s.model else Path(s.model).name or s.model
    return model + ("" if s.adapter is None else f" + {Path(s.adapter).name}")


def _length_panel(ax: Axes, s: Summary) -> None:
    labels, rates, cis, counts = _by_length(s)
    xs = list(range(len(labels)))
    bars = ax.bar(xs, rates, 0.6, yerr=_errors(rates, cis), capsize=4, color=RUN_COLOURS[0])
    _slots(ax, len(xs))
    ax.bar_label(bars, labels=counts, padding=3, fontsize="small")
    lo, hi = s.ci95
    ax.axhline(s.solve_rate, color=MUTED, linestyle="--", linewidth=1)
    ax.text(
        1.0,
        s.solve_rate,
        f" all {s.solve_rate:.0%}\n [{lo:.0%}, {hi:.0%}]",
        transform=ax.get_yaxis_transform(),
        va="center",
        fontsize="small",
        color=MUTED,
    )
    ax.set_xticks(xs, labels)
    ax.set_xlabel("optimal path length (moves)")
    ax.set_ylabel("solve rate (95% CI)")
    ax.set_title("solve rate by optimal path length")
    percent_axis(ax)
    ax.grid(axis="y", alpha=0.3)


def _outcome_panel(ax: Axes, s: Summary) -> None:
    rows = [(kind_label(k), s.failures[k], KIND_COLOURS[k]) for k in FAILURE_KINDS]
    rows += [
        ("with wall bumps", s.episodes_with_bumps, MUTED),
        ("with loops", s.episodes_with_loops, MUTED),
        ("with parse failures", s.episodes_with_parse_failures, MUTED),
    ]
    ys = list(range(len(rows)))
    bars = ax.barh(ys, [n for _, n, _ in rows], color=[c for _, _, c in rows])
    ax.bar_label(
        bars,
        labels=[f"{n} ({n / s.episodes:.0%})" for _, n, _ in rows],
        padding=3,
        fontsize="small",
    )
    ax.set_yticks(ys, [label for label, _, _ in rows])
    ax.invert_yaxis()
    ax.axhline(len(FAILURE_KINDS) - 0.5, color=MUTED, linewidth=0.8)
    ax.set_xlim(0, s.episodes * 1.3)
    ax.set_xlabel(f"episodes (of {s.episodes})")
    ax.set_title("outcomes")


def _caption(record: EvalRecord, samples: int) -> str:
    who = f"seed {record.seed}" + (f" #{record.sample}" if samples > 1 else "")
    moves = f"{record.moves} move" + ("" if record.moves == 1 else "s")
    return f"{who}: {kind_label(record.failure)}\n{moves}, optimal {record.optimal_moves}"


def report_figure(
    records: Sequence[EvalRecord],
    *,
    max_failed: int = 16,
    cell_px: int = 16,
    columns: int = 4,
) -> Figure:
    """One run's report: two chart panels, then one panel per failed maze shown.

    At most ``max_failed`` failed mazes, ``columns`` to a row, each captioned with its seed,
    outcome and moves.

    Raises:
        ValueError: ``records`` is empty.
    """
    s = summarize(records)
    failed = [r for r in records if not r.solved][: max(0, max_failed)]
    rows = math.ceil(len(failed) / columns)
    plt = pyplot()
    fig = plt.figure(figsize=(10, 3.8 + 2.1 * rows + 0.4), dpi=90, layout="constrained")
    lo, hi = s.ci95
    fig.suptitle(
        f"{short(_model_label(s), 48)} on {s.eval_set}: solved {s.solved}/{s.episodes} = "
        f"{s.solve_rate:.1%} (95% CI {lo:.1%}-{hi:.1%})"
    )
    top, bottom = (
        fig.subfigures(2, 1, height_ratios=[3.8, 2.1 * rows + 0.4]) if rows else (fig, None)
    )
    charts = top.subplots(1, 2, width_ratios=[3, 2])
    _length_panel(charts[0], s)
    _outcome_panel(charts[1], s)
    if bottom is not None:
        bottom.suptitle(
            f"failed mazes ({len(failed)} of {s.episodes - s.solved}): the path taken in "
            "orange, the last square boxed",
            fontsize="medium",
        )
        grid = bottom.subplots(rows, columns, squeeze=False)
        for i, ax in enumerate(grid.flat):
            if i >= len(failed):
                ax.remove()
                continue
            ax.imshow(_path_image(failed[i], cell_px), interpolation="nearest")
            ax.set_title(_caption(failed[i], s.samples), fontsize="small")
            ax.set_axis_off()
    return fig


def write_report(
    records: Sequence[EvalRecord],
    path: str | os.PathLike[str],
    *,
    max_failed: int = 16,
    cell_px: int = 16,
    columns: int = 4,
) -> Path:
    """Save :func:`report_figure` as a PNG at ``path``; returns the path."""
    fig = report_figure(records, max_failed=max_failed, cell_px=cell_px, columns=columns)
    return save_png(fig, path)


def _grouped(
    ax: Axes,
    groups: Sequence[str],
    values: Sequence[Sequence[float]],
    styles: Sequence[Mapping[str, Any]] = ({}, {}),
) -> list[Any]:
    """One bar per run in each group, run A left of run B; returns each run's bars."""
    width = 0.8 / len(values)
    out: list[Any] = []
    for i, (vals, style) in enumerate(zip(values, styles, strict=True)):
        xs = [g + (i - (len(values) - 1) / 2) * width for g in range(len(groups))]
        out.append(ax.bar(xs, vals, width, color=RUN_COLOURS[i], **style))
    ax.set_xticks(range(len(groups)), groups)
    return out


def compare_figure(
    a: Sequence[EvalRecord], b: Sequence[EvalRecord], names: tuple[str, str] = ("A", "B")
) -> Figure:
    """Two runs side by side, in three panels.

    Solve rate overall and by optimal length (95% CI), outcome kinds, and how the episodes both
    runs played changed (solved in both, only in one, in neither).
    """
    sa, sb = summarize(a), summarize(b)
    labels = [f"A: {short(names[0], 30)}", f"B: {short(names[1], 30)}"]
    plt = pyplot()
    fig, axes = plt.subplots(
        1, 3, figsize=(13, 4.6), dpi=90, layout="constrained", width_ratios=[3, 2, 2]
    )
    lengths = sorted({*sa.by_optimal_length, *sb.by_optimal_length}, key=int)
    groups = ["all", *lengths] if len(lengths) > 1 else [f"all ({lengths[0]})"]
    rates: list[list[float]] = []
    cis: list[list[tuple[float, float]]] = []
    for s in (sa, sb):
        pairs = [(s.solved, s.episodes)]
        if len(lengths) > 1:
            pairs += [s.by_optimal_length.get(k, (0, 0)) for k in lengths]
        rates.append([c / n if n else 0.0 for c, n in pairs])
        cis.append([wilson_interval(c, n) for c, n in pairs])
    styles = [{"yerr": _errors(rates[i], cis[i]), "capsize": 3, "label": labels[i]} for i in (0, 1)]
    bars = _grouped(axes[0], groups, rates, styles)
    for bar, rs in zip(bars, rates, strict=True):
        axes[0].bar_label(bar, labels=[f"{r:.0%}" for r in rs], padding=2, fontsize="x-small")
    _slots(axes[0], len(groups), 3)
    axes[0].set_title("solve rate: all mazes, then by optimal path length")
    axes[0].set_xlabel("optimal path length (moves)")
    axes[0].set_ylabel("solve rate (95% CI)")
    percent_axis(axes[0])
    axes[0].set_ylim(0, 1.25)
    axes[0].legend(loc="upper left", fontsize="small", ncols=2)
    axes[0].grid(axis="y", alpha=0.3)

    kinds = [kind_label(k).replace(" ", "\n", 1) for k in FAILURE_KINDS]
    counts = [[float(s.failures[k]) for k in FAILURE_KINDS] for s in (sa, sb)]
    for bar, cs in zip(_grouped(axes[1], kinds, counts), counts, strict=True):
        axes[1].bar_label(bar, labels=[str(int(c)) for c in cs], padding=2, fontsize="x-small")
    axes[1].set_title("outcomes (episodes)")
    axes[1].set_ylim(0, max(max(c) for c in counts) * 1.15 + 1)

    ma = {r.key: r.solved for r in a}
    mb = {r.key: r.solved for r in b}
    both = ma.keys() & mb.keys()
    change = [
        ("solved\nin both", sum(ma[k] and mb[k] for k in both), SOLVED),
        ("only\nin A", sum(ma[k] and not mb[k] for k in both), RUN_COLOURS[0]),
        ("only\nin B", sum(mb[k] and not ma[k] for k in both), RUN_COLOURS[1]),
        ("in\nneither", sum(not ma[k] and not mb[k] for k in both), MUTED),
    ]
    xs = list(range(len(change)))
    bars2 = axes[2].bar(xs, [n for _, n, _ in change], color=[c for _, _, c in change])
    axes[2].bar_label(bars2, padding=2, fontsize="small")
    axes[2].set_xticks(xs, [label for label, _, _ in change])
    axes[2].set_ylim(0, max(1, len(both)) * 1.15)
    axes[2].set_title(f"per-episode changes ({len(both)} in both runs)")
    fig.suptitle(
        f"{sa.eval_set}: {labels[0]} ({sa.solve_rate:.1%} of {sa.episodes}) vs "
        f"{labels[1]} ({sb.solve_rate:.1%} of {sb.episodes})"
    )
    return fig


def write_compare(
    a: Sequence[EvalRecord],
    b: Sequence[EvalRecord],
    path: str | os.PathLike[str],
    names: tuple[str, str] = ("A", "B"),
) -> Path:
    """Save :func:`compare_figure` as a PNG at ``path``; returns the path."""
    return save_png(compare_figure(a, b, names), path)


def series_figure(series: Sequence[Mapping[str, Any]]) -> Figure:
    """Solve rate (95% CI) of each evaluated adapter version, from ``series.jsonl`` entries.

    pass@k is drawn too when the versions were sampled more than once per maze.

    Raises:
        ValueError: ``series`` is empty.
    """
    if not series:
        raise ValueError("no evaluated versions to draw")
    entries = sorted(series, key=lambda e: int(e["version"]))
    xs = [int(e["version"]) for e in entries]
    rates = [float(e["solve_rate"]) for e in entries]
    cis = [(float(e["ci95"][0]), float(e["ci95"][1])) for e in entries]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=90, layout="constrained")
    ax.errorbar(
        xs, rates, yerr=_errors(rates, cis), marker="o", capsize=4, color=RUN_COLOURS[0],
        label="solve rate (95% CI)",
    )  # fmt: skip
    for x, r in zip(xs, rates, strict=True):
        ax.annotate(f"{r:.0%}", (x, r), textcoords="offset points", xytext=(8, 4), fontsize="small")
    ks = sorted({k for e in entries for k in e.get("pass_at", {}) if k != "1"}, key=int)
    for i, k in enumerate(ks):
        pts = [
            (int(e["version"]), float(e["pass_at"][k]))
            for e in entries
            if k in e.get("pass_at", {})
        ]
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker=".",
            linestyle="--",
            color=f"C{i + 1}",
            label=f"pass@{k}",
        )
    ax.set_xticks(
        xs,
        [f"v{v}\nstep {e.get('step', '?')}" for v, e in zip(xs, entries, strict=True)]
        if len(xs) <= 12
        else None,
    )
    ax.margins(x=0.08)  # room for the last point's label
    ax.set_xlabel("adapter version (training step)")
    ax.set_ylabel("solve rate")
    percent_axis(ax)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    last = entries[-1]
    ax.set_title(
        f"{last['eval_set']}: solve rate per adapter version ({last['episodes']} episodes each)"
    )
    return fig


def write_series_chart(series: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Save :func:`series_figure` as a PNG at ``path``; returns the path."""
    return save_png(series_figure(series), path)


def write_gif(
    record: EvalRecord,
    path: str | os.PathLike[str],
    *,
    cell_px: int = 32,
    frame_ms: int = 300,
) -> Path:
    """An animated GIF of the episode: one frame per square the agent stood on."""
    renderer = Renderer(record.maze(), Style(cell_px=cell_px))
    positions = [(int(r), int(c)) for r, c in record.path] or [record.maze().start]
    frames = [Image.fromarray(renderer.rgb(p), mode="RGB") for p in positions]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    durations = [frame_ms] * (len(frames) - 1) + [frame_ms * 4]  # hold the last frame
    frames[0].save(
        out, format="GIF", save_all=True, append_images=frames[1:], duration=durations, loop=0
    )
    return out
