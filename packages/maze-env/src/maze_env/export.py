"""Datasets as SkyRL reads them: one row per maze, parquet (or JSONL).

Columns: ``data_source``, ``prompt`` (OpenAI messages with the maze image), ``env_class``,
``reward_spec``, ``seed``, ``preset``, ``step_budget``, ``extra_info`` and ``env_config``
(``cell_px`` and ``slack`` used for the rendering and budget). SkyRL hands every
column except ``prompt`` and ``env_class`` to the environment as ``extras``, so the env rebuilds
the very maze the prompt shows from ``preset`` + ``seed``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from maze_env.errors import ExportError
from maze_env.evalsets import get_eval_set
from maze_env.maze import DEFAULT_SLACK, Maze, MazeSpec, generate
from maze_env.prompts import Message, initial_messages, text_part
from maze_env.render import DEFAULT_STYLE, Style
from weight_sync import fs

ENV_CLASS = "maze"
"""The skyrl-gym ``env_class`` that maze-verifier registers."""

TRAIN_SEED_OFFSET = 1_000_000
"""Training seeds start here, far from the eval sets' small seeds."""

Format = Literal["parquet", "jsonl"]


def _uniform(messages: list[Message]) -> list[Message]:
    # Parquet needs one type per column: give every message a list of parts.
    return [
        {
            **m,
            "content": [text_part(m["content"])] if isinstance(m["content"], str) else m["content"],
        }
        for m in messages
    ]


def maze_row(
    maze: Maze, *, split: str, index: int, slack: int = DEFAULT_SLACK, style: Style = DEFAULT_STYLE
) -> dict[str, Any]:
    """One SkyRL dataset row: the first-turn prompt plus what the env needs to rebuild the episode.

    Raises:
        ValueError: ``maze`` has no seed.
    """
    if maze.seed is None:
        raise ValueError("dataset rows need seeded mazes, so the env can rebuild them")
    budget = maze.step_budget(slack)
    preset = maze.spec.name
    return {
        "data_source": f"mazerl/{preset}",
        "prompt": _uniform(initial_messages(maze, budget, style=style)),
        "env_class": ENV_CLASS,
        "reward_spec": {"method": "rule", "ground_truth": {"optimal_moves": maze.optimal_moves}},
        "seed": maze.seed,
        "preset": preset,
        "step_budget": budget,
        "extra_info": {"split": split, "index": index, "seed": maze.seed, "preset": preset},
        # SkyRL hands an undeclared env class an empty env_config, so the settings the images
        # were rendered with travel in the row itself (maze-verifier reads extras["env_config"]).
        "env_config": {"cell_px": style.cell_px, "slack": slack},
    }


def train_seeds(
    n: int,
    *,
    spec: MazeSpec,
    offset: int = TRAIN_SEED_OFFSET,
    avoid: Iterable[Maze] = (),
    max_scan: int | None = None,
    by: Literal["maze", "layout"] = "maze",
) -> list[int]:
    """``n`` seeds from ``offset`` upward, skipping any that reproduce a maze in ``avoid``.

    Small mazes repeat (easy has ~400k distinct layouts, 5x5 only 16), so a training seed can
    land on an eval maze; skipping those keeps the eval set unseen. ``by="maze"`` skips the same
    walls with the same start and goal (``Maze.content_hash``); ``by="layout"`` skips the same
    walls with any corners (``Maze.layout_hash``), so no route of an avoided layout is shown.
    Raises ``ValueError`` when ``max_scan`` seeds (default ``100 * n + 10_000``) do not yield
    ``n``: the spec has too few layouts outside ``avoid``.
    """
    if by not in ("maze", "layout"):
        raise ValueError(f"by must be 'maze' or 'layout', got {by!r}")

    def key(m: Maze) -> str:
        return m.content_hash() if by == "maze" else m.layout_hash()

    banned = {key(m) for m in avoid}
    limit = 100 * n + 10_000 if max_scan is None else max_scan
    out: list[int] = []
    seed = offset
    while len(out) < n:
        if seed - offset >= limit:
            raise ValueError(
                f"only {len(out)} of {n} {spec.name} mazes found outside the {len(banned)} avoided "
                f"layouts in {limit} seeds: this size has too few distinct mazes to keep them apart"
            )
        if key(generate(spec, seed)) not in banned:
            out.append(seed)
        seed += 1
    return out


def build_rows(
    spec: MazeSpec,
    seeds: Sequence[int],
    *,
    split: str,
    repeat: int = 1,
    slack: int = DEFAULT_SLACK,
    style: Style = DEFAULT_STYLE,
) -> list[dict[str, Any]]:
    """Dataset rows for ``seeds``, in order.

    ``repeat`` > 1 writes each maze that many times in a row, so a trainer that expands GRPO
    groups from the dataset gives every member of a group the same maze.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    rows: list[dict[str, Any]] = []
    for i, seed in enumerate(seeds):
        row = maze_row(generate(spec, seed), split=split, index=i, slack=slack, style=style)
        rows.extend([row] * repeat)
    return rows


def write_rows(rows: list[dict[str, Any]], path: Path, fmt: Format = "parquet") -> Path:
    """Write atomically (``weight_sync.fs``: temp file in the same directory, fsync, rename)."""
    if fmt == "parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ExportError(
                "parquet export needs pyarrow: pip install 'maze-env[parquet]'"
            ) from exc
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), sink)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        data = sink.getbuffer()
    else:
        data = memoryview("".join(json.dumps(row) + "\n" for row in rows).encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    fs.atomic_write_bytes(path, data)
    return path


def export_datasets(
    out_dir: Path,
    *,
    train_size: int = 256,
    train_spec: MazeSpec | str = "easy",
    eval_set: str = "easy-64",
    repeat: int = 1,
    slack: int = DEFAULT_SLACK,
    style: Style = DEFAULT_STYLE,
    fmt: Format = "parquet",
    seed_offset: int = TRAIN_SEED_OFFSET,
) -> dict[str, Path]:
    """Write ``train`` and ``validation`` files; the validation split is the named eval set."""
    spec = MazeSpec.parse(train_spec) if isinstance(train_spec, str) else train_spec
    es = get_eval_set(eval_set)
    seeds = train_seeds(train_size, spec=spec, offset=seed_offset, avoid=es.mazes)
    ext = "parquet" if fmt == "parquet" else "jsonl"
    train = build_rows(spec, seeds, split="train", repeat=repeat, slack=slack, style=style)
    val = build_rows(es.spec, es.seeds, split="validation", slack=slack, style=style)
    return {
        "train": write_rows(train, out_dir / f"train.{ext}", fmt),
        "validation": write_rows(val, out_dir / f"validation.{ext}", fmt),
    }
