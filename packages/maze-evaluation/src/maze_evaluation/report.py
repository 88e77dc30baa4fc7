"""PNG report and episode GIFs, drawn with PIL over maze-env's own rendering."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw

from maze_env import Renderer, Style
from maze_evaluation.records import EvalRecord
from maze_evaluation.stats import summarize

BG = (255, 255, 255)
INK = (20, 20, 20)
BAR = (60, 120, 200)
PATH = (255, 150, 0)


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


def write_report(
    records: Sequence[EvalRecord],
    path: str | os.PathLike[str],
    *,
    max_failed: int = 16,
    cell_px: int = 12,
    columns: int = 4,
) -> Path:
    """Solve rate by optimal path length (bars), then a grid of failed mazes with their paths."""
    s = summarize(records)
    lengths = list(s.by_optimal_length.items())
    bar_w, gap, chart_h, margin = 28, 8, 200, 40
    failed = [r for r in records if not r.solved][:max_failed]
    thumbs = [_path_image(r, cell_px) for r in failed]
    tw = max((t.width for t in thumbs), default=0)
    th = max((t.height for t in thumbs), default=0)
    rows = (len(thumbs) + columns - 1) // columns
    width = max(margin * 2 + len(lengths) * (bar_w + gap), margin * 2 + columns * (tw + gap), 420)
    height = margin + 30 + chart_h + 40 + (30 + rows * (th + 24) if thumbs else 0) + margin
    img = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(img)
    lo, hi = s.ci95
    d.text(
        (margin, 10),
        f"{s.eval_set}: solved {s.solved}/{s.episodes} = {s.solve_rate:.1%} (95% CI {lo:.1%}-{hi:.1%})",
        fill=INK,
    )
    top = margin + 20
    base = top + chart_h
    d.line((margin - 4, base, width - margin, base), fill=INK)
    d.text((4, top - 6), "100%", fill=INK)
    for i, (length, (solved, n)) in enumerate(lengths):
        x = margin + i * (bar_w + gap)
        h = int(chart_h * solved / n) if n else 0
        d.rectangle((x, base - h, x + bar_w, base), fill=BAR)
        d.text((x + 2, base + 4), length, fill=INK)
        d.text((x + 2, base - h - 12), f"{solved}/{n}", fill=INK)
    d.text((margin, base + 20), "solve rate by optimal path length (moves)", fill=INK)
    y0 = base + 40
    if thumbs:
        d.text(
            (margin, y0),
            f"failed mazes ({len(failed)} of {s.episodes - s.solved}), taken path in orange",
            fill=INK,
        )
        for i, (rec, t) in enumerate(zip(failed, thumbs, strict=True)):
            x = margin + (i % columns) * (tw + gap)
            y = y0 + 20 + (i // columns) * (th + 24)
            img.paste(t, (x, y))
            d.text((x, y + t.height + 2), f"seed {rec.seed}/{rec.sample} {rec.failure}", fill=INK)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    img.save(out, format="PNG")
    return out


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
