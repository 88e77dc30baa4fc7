import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from maze_env import MazeSpec, generate
from maze_env.evalsets import get_eval_set
from maze_env.export import ENV_CLASS, build_rows, export_datasets, train_seeds, write_rows


def _read(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def test_parquet_export_matches_skyrl_row_contract(tmp_path: Path) -> None:
    paths = export_datasets(tmp_path, train_size=12)
    train, val = _read(paths["train"]), _read(paths["validation"])
    assert len(train) == 12 and len(val) == 64
    assert [r["seed"] for r in val] == list(range(64))
    for row in train + val:
        assert row["env_class"] == ENV_CLASS
        maze = generate(row["preset"], row["seed"])
        assert row["step_budget"] == maze.step_budget()
        assert row["reward_spec"]["ground_truth"]["optimal_moves"] == maze.optimal_moves
        assert row["env_config"] == {"cell_px": 25, "slack": 4}
        system, user = row["prompt"]
        assert system["role"] == "system" and user["role"] == "user"
        parts: list[dict[str, Any]] = user["content"]
        image = next(p for p in parts if p["type"] == "image_url")
        assert image["image_url"]["url"].startswith("data:image/png;base64,")
    assert not list(tmp_path.glob(".*.tmp"))


def test_training_seeds_avoid_eval_mazes() -> None:
    eval_mazes = get_eval_set("easy-64").mazes
    # Offset 0 starts on the eval seeds themselves: every one of them must be skipped.
    seeds = train_seeds(80, spec=MazeSpec.parse("easy"), offset=0, avoid=eval_mazes)
    assert not set(seeds) & set(range(64))
    banned = {m.content_hash() for m in eval_mazes}
    assert all(generate("easy", s).content_hash() not in banned for s in seeds)


def test_repeat_keeps_a_grpo_group_on_one_maze(tmp_path: Path) -> None:
    rows = build_rows(MazeSpec.parse("easy"), [5, 6], split="train", repeat=4)
    assert [r["seed"] for r in rows] == [5, 5, 5, 5, 6, 6, 6, 6]
    path = write_rows(rows, tmp_path / "g.jsonl", "jsonl")
    assert [json.loads(line)["seed"] for line in path.read_text().splitlines()] == [5] * 4 + [6] * 4
    with pytest.raises(ValueError, match="repeat"):
        build_rows(MazeSpec.parse("easy"), [1], split="train", repeat=0)


def test_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_rows([{"bad": object()}], tmp_path / "x.jsonl", "jsonl")
    assert list(tmp_path.iterdir()) == []


def test_too_small_a_maze_space_is_an_error_not_a_hang() -> None:
    tiny = get_eval_set("tiny-64")
    with pytest.raises(ValueError, match="too few distinct mazes"):
        train_seeds(4, spec=tiny.spec, avoid=tiny.mazes, max_scan=2000)


def test_training_seeds_can_avoid_whole_layouts() -> None:
    eval_mazes = get_eval_set("small-64").mazes
    spec = MazeSpec.parse("7x7")
    by_maze = train_seeds(200, spec=spec, avoid=eval_mazes)
    by_layout = train_seeds(200, spec=spec, avoid=eval_mazes, by="layout")
    held_out = {m.layout_hash() for m in eval_mazes}
    # 7x7 has 192 layouts: the same walls with other corners slip past a per-maze check.
    assert any(generate(spec, s).layout_hash() in held_out for s in by_maze)
    assert not any(generate(spec, s).layout_hash() in held_out for s in by_layout)
    with pytest.raises(ValueError, match="by must be"):
        train_seeds(1, spec=spec, by="corners")  # pyright: ignore[reportArgumentType]
