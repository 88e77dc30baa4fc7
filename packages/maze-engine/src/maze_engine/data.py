"""Prompt batches for the local engine, with a resumable position.

Rows are SkyRL dataset rows (maze-env's exporter), read from the parquet/JSONL files named by
``data.train_data``. Each epoch is a permutation drawn from ``(seed, epoch)``, so the order
depends only on the seed and a checkpointed ``(epoch, position)`` resumes exactly.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np


class DatasetError(ValueError):
    """A dataset file that is missing, unreadable, or lacks the columns the maze env needs."""


REQUIRED = ("prompt", "env_class", "seed", "preset")


def read_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise DatasetError(f"dataset file {path} does not exist")
        try:
            if path.suffix == ".parquet":
                import pyarrow.parquet as pq

                got = cast(list[dict[str, Any]], pq.read_table(path).to_pylist())  # pyright: ignore[reportUnknownMemberType]
            else:
                got = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            raise DatasetError(f"cannot read dataset {path}: {exc}") from exc
        for i, row in enumerate(got):
            missing = [k for k in REQUIRED if k not in row]
            if missing:
                raise DatasetError(
                    f"{path} row {i} lacks columns {missing}; export it with `maze-env export`"
                )
        rows.extend(got)
    if not rows:
        raise DatasetError(f"no rows in {', '.join(map(str, paths))}")
    return rows


@dataclass
class PromptLoader:
    """Batches of row indices; ``state_dict`` is what ``data.pt`` stores."""

    size: int
    batch_size: int
    seed: int
    epoch: int = 0
    position: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.batch_size > self.size:
            raise DatasetError(
                f"trainer.train_batch_size must be within 1..{self.size} (dataset rows), got {self.batch_size}"
            )

    def _order(self, epoch: int) -> list[int]:
        return [int(i) for i in np.random.default_rng([self.seed, epoch]).permutation(self.size)]

    def next_batch(self) -> list[int]:
        # Batches never straddle epochs: a short tail is dropped, as SkyRL's dataloader does.
        if self.position + self.batch_size > self.size:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position
        self.position += self.batch_size
        return self._order(self.epoch)[start : start + self.batch_size]

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "size": self.size,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("size") != self.size or state.get("seed") != self.seed:
            raise DatasetError(
                f"checkpointed dataloader was for {state.get('size')} rows / seed {state.get('seed')}, "
                f"this run has {self.size} rows / seed {self.seed}"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
