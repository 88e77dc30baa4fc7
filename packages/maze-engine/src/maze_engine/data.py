"""Datasets for both engines, and the local engine's resumable prompt batches.

:func:`export_datasets` writes the train / validation files that ``data.train_data`` /
``data.val_data`` name, from the ``mazes:`` section, with a manifest of the settings beside
them: both engines call it, so a resumed run (or the other engine) trains on the same mazes.
Rows are SkyRL dataset rows (maze-env's exporter). :class:`PromptLoader` draws each epoch as a
permutation from ``(seed, epoch)``, so a checkpointed ``(epoch, position)`` resumes exactly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from maze_engine.errors import ConfigError, DatasetError
from maze_env.render import DATASET_MANIFEST

if TYPE_CHECKING:
    from maze_engine.config import MazerlConfig

log = logging.getLogger(__name__)

DATA_MANIFEST = DATASET_MANIFEST
"""Written next to the exported datasets: the settings they were built with (``cell_px`` among
them, which ``maze_env.render.read_rendering`` reads)."""
EVAL_REWARD_SPEC = "task"
"""Validation rows score 1 for a solved maze, else 0: ``eval/all/pass_at_1`` is the solve rate."""

REQUIRED = ("prompt", "env_class", "seed", "preset")


def read_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Every row of the parquet/JSONL files, checked for the columns the maze env needs."""
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


@dataclass(frozen=True, slots=True)
class MazeDatasets:
    """Files :func:`export_datasets` wrote (or found up to date) and how they were built."""

    train: Path
    validation: Path
    manifest: Path | None
    """None when the files are the user's own (no manifest beside them)."""
    slack: int
    """Turns beyond ``optimal moves + stop`` in every row's ``step_budget``."""
    reused: bool


def eval_slack(max_turns: int, eval_set: str) -> int:
    """Slack that makes the eval set's longest maze take exactly ``max_turns`` turns.

    Raises:
        ConfigError: on ``generator.max_turns`` when some maze of the set cannot be finished
            in that many turns (VisGym's 15 leaves the 16-move easy mazes unsolvable).
    """
    from maze_env import EvalSetError, get_eval_set

    try:
        es = get_eval_set(eval_set)
    except EvalSetError as e:
        raise ConfigError(str(e), key="mazes.eval_set") from e
    worst = max(m.optimal_moves for m in es.mazes)
    slack = max_turns - (worst + 1)
    if slack < 0:
        raise ConfigError(
            f"{max_turns} turns cannot finish every maze of {eval_set!r}: the longest needs "
            f"{worst} moves + stop, so at least {worst + 1}",
            key="generator.max_turns",
        )
    return slack


def dataset_settings(config: MazerlConfig) -> dict[str, object]:
    """What the manifest records: everything that decides the datasets' bytes."""
    from maze_env import __version__ as maze_env_version

    mazes = dataclasses.asdict(config.mazes)
    del mazes["report_sets"]  # scored, never written to the datasets
    return {
        "format": 3,  # 3: training mazes avoid the eval set's layouts, not only its mazes
        "maze_env": maze_env_version,
        **mazes,
        "slack": eval_slack(config.max_turns, config.mazes.eval_set),
        "eval_reward_spec": EVAL_REWARD_SPEC,
    }


def _mismatch(recorded: dict[str, object], settings: dict[str, object], data_dir: Path) -> str:
    key = next((k for k in settings if recorded.get(k) != settings[k]), None)
    if key is None:  # a manifest with keys this version does not write
        what, was = "the data settings differ and", repr(recorded)
    else:
        name = {"slack": "generator.max_turns"}.get(key, f"mazes.{key}")
        what, was = f"{name} gives {key}={settings[key]!r} but", repr(recorded.get(key))
    return (
        f"{what} the datasets in {data_dir} were exported with {was}; start a new run "
        f"(MAZERL_RUN=... or trainer.export_path=...) or remove {data_dir}"
    )


def _training_seeds(config: MazerlConfig) -> list[int]:
    from maze_env import MazeSpec, get_eval_set
    from maze_env.export import train_seeds

    mazes = config.mazes
    spec, es = MazeSpec.parse(mazes.train_preset), get_eval_set(mazes.eval_set)
    # The report sets' layouts are held out as well: their figures also claim unseen mazes.
    avoid = [m for n in (mazes.eval_set, *mazes.report_sets) for m in get_eval_set(n).mazes]
    try:
        return train_seeds(mazes.train_size, spec=spec, avoid=avoid, by="layout")
    except ValueError as exc:
        if not mazes.allow_eval_overlap:
            raise ConfigError(
                f"{exc}; choose a larger mazes.train_preset or a smaller mazes.train_size, or "
                "set mazes.allow_eval_overlap=true to train on eval layouts",
                key="mazes.train_preset",
            ) from exc
        log.info("mazes.allow_eval_overlap: training mazes repeat %s layouts", es.name)
        return train_seeds(mazes.train_size, spec=spec)


def validation_rows(eval_set: str, *, slack: int, cell_px: int) -> list[dict[str, Any]]:
    """Rows of fixed eval set ``eval_set``, scored with ``task`` (``EVAL_REWARD_SPEC``)."""
    from maze_env import get_eval_set
    from maze_env.export import build_rows
    from maze_env.render import Style

    es = get_eval_set(eval_set)
    rows = build_rows(
        es.spec, es.seeds, split="validation", slack=slack, style=Style(cell_px=cell_px)
    )
    for row in rows:
        row["reward_spec"] = {**row["reward_spec"], "spec": EVAL_REWARD_SPEC}
    return rows


def export_datasets(config: MazerlConfig, *, overwrite: bool = False) -> MazeDatasets:
    """The datasets ``data.train_data[0]`` / ``data.val_data[0]`` name, exported if needed.

    Files that exist without a manifest are the user's own and are used as they are. Files this
    function wrote are reused while the manifest matches the config; when it does not (e.g.
    ``mazes.train_preset`` changed for an existing run directory) that is a
    :class:`ConfigError` naming the key, since training would otherwise go on, silently, on the
    old mazes. Training rows carry ``mazes.reward_spec``; validation rows are the eval set
    scored with ``task``. Every row's step budget is ``optimal moves + 1 + slack``, with the
    slack from :func:`eval_slack`.
    """
    from maze_env import MazeSpec
    from maze_env.export import build_rows, write_rows
    from maze_env.render import Style
    from weight_sync.fs import atomic_write_json, read_json

    train = Path(config.skyrl.data.train_data[0])
    validation = Path(config.skyrl.data.val_data[0])
    manifest = train.parent / DATA_MANIFEST
    settings = dataset_settings(config)
    slack = cast(int, settings["slack"])
    if not overwrite and train.is_file() and validation.is_file():
        recorded = read_json(manifest)
        if not isinstance(recorded, dict):
            return MazeDatasets(train, validation, None, slack, reused=True)
        if recorded == settings:
            return MazeDatasets(train, validation, manifest, slack, reused=True)
        raise ConfigError(_mismatch(cast(dict[str, object], recorded), settings, train.parent))

    mazes = config.mazes
    batch = int(config.skyrl.trainer.train_batch_size)
    if mazes.train_size < batch:  # SkyRL's loader drops a short batch: no step would run
        raise ConfigError(
            f"{batch} prompts per step is more than the {mazes.train_size} training mazes "
            "(mazes.train_size)",
            key="trainer.train_batch_size",
        )
    rows = build_rows(
        MazeSpec.parse(mazes.train_preset),
        _training_seeds(config),
        split="train",
        slack=slack,
        style=Style(cell_px=mazes.cell_px),
    )
    for row in rows:
        row["reward_spec"] = {**row["reward_spec"], "spec": mazes.reward_spec}
    val_rows = validation_rows(mazes.eval_set, slack=slack, cell_px=mazes.cell_px)
    write_rows(rows, train)
    write_rows(val_rows, validation)
    atomic_write_json(manifest, settings)
    return MazeDatasets(train, validation, manifest, slack, reused=False)


def overlapping_layouts(
    train: Sequence[dict[str, Any]], validation: Sequence[dict[str, Any]]
) -> int:
    """How many training rows share a validation maze's layout (its walls, whatever the corners)."""
    from maze_env import generate

    def layout(row: dict[str, Any]) -> str:
        return generate(str(row["preset"]), int(row["seed"])).layout_hash()

    held_out = {layout(r) for r in validation}
    return sum(layout(r) in held_out for r in train)


def check_held_out(
    config: MazerlConfig, train: Sequence[dict[str, Any]], validation: Sequence[dict[str, Any]]
) -> None:
    """Fail the run when training rows share a layout with the eval set, unless allowed.

    Raises:
        ConfigError: on ``mazes.allow_eval_overlap`` when a training row repeats an eval maze.
    """
    if config.mazes.allow_eval_overlap:
        return
    shared = overlapping_layouts(train, validation)
    if shared:
        raise ConfigError(
            f"{shared} training rows share a layout with the eval set {config.mazes.eval_set}: "
            "the eval would measure memorised mazes; use other training files or set "
            "mazes.allow_eval_overlap=true",
            key="mazes.allow_eval_overlap",
        )
