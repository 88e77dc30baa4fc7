"""Checkpoints in SkyRL's layout, written so a crash at any instant leaves a usable run.

Layout under ``ckpt_path`` (what SkyRL's FSDP trainer writes, so tools and people find files
where they expect them)::

    global_step_N/
        policy/model_world_size_W_rank_R.pt       LoRA parameters, per rank
        policy/optim_world_size_W_rank_R.pt       optimizer state, per rank
        policy/extra_state_world_size_W_rank_R.pt RNG states, per rank
        policy/lora_adapter/                      consolidated PEFT adapter, with the
                                                  rendering and context records of the run
        data.pt                                   dataloader position
        trainer_state.pt                          global step, config
        manifest.json                             size + sha256 of every file (weight-sync's format)
    latest_ckpt_global_step.txt                   written last

Each checkpoint is written into ``.global_step_N.staging-<id>`` on the same filesystem, fsynced,
then renamed into place; ``latest_ckpt_global_step.txt`` is replaced atomically afterwards. A
loader verifies the manifest and, if the newest checkpoint is torn or corrupt, logs why and
falls back to the newest one that verifies.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch

from maze_engine.errors import CheckpointError
from maze_engine.faults import fault
from weight_sync import WeightSyncError, fs

log = logging.getLogger(__name__)

LATEST_FILE = "latest_ckpt_global_step.txt"
MANIFEST = fs.MANIFEST_NAME
_STEP_DIR = re.compile(r"global_step_(\d+)")
ResumeMode = Literal["latest", "none", "from_path"]
RESUME_MODES: tuple[ResumeMode, ...] = ("latest", "none", "from_path")


def rank_file(
    kind: Literal["model", "optim", "extra_state"], world_size: int = 1, rank: int = 0
) -> str:
    """Where SkyRL keeps one rank's ``kind`` state inside a checkpoint directory."""
    return f"policy/{kind}_world_size_{world_size}_rank_{rank}.pt"


@dataclass(frozen=True)
class Checkpoint:
    """A published checkpoint: its global step and its ``global_step_<N>`` directory."""

    step: int
    path: Path


class CheckpointManager:
    """Save, verify, prune and find checkpoints under one ``ckpt_path``."""

    def __init__(self, root: Path, max_ckpts_to_keep: int = -1) -> None:
        self.root = Path(root)
        self.max_ckpts_to_keep = max_ckpts_to_keep

    def save(self, step: int, write: Callable[[Path], None]) -> Checkpoint:
        """Run ``write(staging_dir)`` to fill a checkpoint, then publish it atomically."""
        if step < 0:
            raise CheckpointError(f"global step must be >= 0, got {step}")
        final = self.root / f"global_step_{step}"
        if final.exists():
            raise CheckpointError(f"{final} already exists; checkpoints are never overwritten")
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".global_step_{step}.staging-{uuid.uuid4().hex[:12]}"
        staging.mkdir()
        try:
            write(staging)
            # The manifest is written after every file is fsynced: on disk, it vouches for them.
            fs.write_manifest(staging, step=step, producer="maze-engine", recursive=True)
            os.rename(staging, final)
            fs.fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fs.atomic_write_text(self.root / LATEST_FILE, f"{step}\n")
        self.prune()
        return Checkpoint(step, final)

    def steps(self) -> list[int]:
        """Steps of published checkpoint directories, newest first (verified or not)."""
        if not self.root.is_dir():
            return []
        found = [
            int(m.group(1))
            for p in self.root.iterdir()
            if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()
        ]
        return sorted(found, reverse=True)

    def verify(self, path: Path) -> None:
        """Raise :class:`CheckpointError` unless every file matches the manifest."""
        try:
            fs.verify_manifest(path)
        except WeightSyncError as exc:
            raise CheckpointError(f"{path}: {exc}") from exc

    def latest_valid(self) -> Checkpoint | None:
        """The newest checkpoint that verifies; logs every newer one that does not."""
        pointer = self.root / LATEST_FILE
        if pointer.exists():
            try:
                pointed = int(pointer.read_text().strip())
            except ValueError:
                log.warning("%s is unreadable; scanning checkpoint directories instead", pointer)
            else:
                if pointed not in self.steps():
                    log.warning(
                        "%s names step %d, which has no directory; scanning instead",
                        pointer,
                        pointed,
                    )
        for step in self.steps():
            path = self.root / f"global_step_{step}"
            try:
                self.verify(path)
            except CheckpointError as exc:
                log.warning(
                    "skipping corrupt or partial checkpoint: %s; trying the previous one", exc
                )
                continue
            return Checkpoint(step, path)
        return None

    def resolve(self, mode: str, resume_path: str | Path | None = None) -> Checkpoint | None:
        """What SkyRL's ``resume_mode`` / ``resume_path`` select."""
        if mode == "none":
            return None
        if mode == "latest":
            return self.latest_valid()
        if mode == "from_path":
            if resume_path is None:
                raise CheckpointError("trainer.resume_mode=from_path needs trainer.resume_path")
            path = Path(resume_path)
            m = _STEP_DIR.fullmatch(path.name)
            if m is None:
                raise CheckpointError(
                    f"trainer.resume_path must be a global_step_N directory, got {path}"
                )
            self.verify(path)
            return Checkpoint(int(m.group(1)), path)
        raise CheckpointError(
            f"trainer.resume_mode must be one of {', '.join(RESUME_MODES)}; got {mode!r}"
        )

    def prune(self) -> None:
        """Keep the newest ``max_ckpts_to_keep`` (all if < 1) and drop staging left by crashes."""
        for p in self.root.glob(".global_step_*.staging-*"):
            shutil.rmtree(p, ignore_errors=True)
        if self.max_ckpts_to_keep < 1:
            return
        for step in self.steps()[self.max_ckpts_to_keep :]:
            shutil.rmtree(self.root / f"global_step_{step}", ignore_errors=True)


@dataclass
class TrainState:
    """Everything a local-engine checkpoint holds besides the consolidated adapter."""

    lora: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    loader: dict[str, int]
    global_step: int
    history: list[dict[str, float]]
    eval_before: float | None
    reports_before: dict[str, float] = field(default_factory=dict[str, float])
    """Solve rate on each of ``mazes.report_sets`` before GRPO."""


def write_train_state(
    d: Path,
    state: TrainState,
    *,
    adapter_config: dict[str, Any],
    describe_adapter: Callable[[Path], object] | None = None,
) -> None:
    """Fill checkpoint directory ``d`` in SkyRL's layout (world size 1) from ``state``.

    The RNG states are this process's own; the adapter is consolidated into
    ``policy/lora_adapter`` with lora-consolidate, as the cluster's head node does, and
    ``describe_adapter(adapter_dir)`` then writes what its readers need beside it (how its
    policy saw the mazes), so a checkpoint's adapter evaluates and serves as the run's published
    ones do.
    """
    from lora_consolidate import consolidate

    (d / "policy").mkdir()
    torch.save(state.lora, d / rank_file("model"))
    torch.save({"optimizer": state.optimizer, "scheduler": state.scheduler}, d / rank_file("optim"))
    torch.save(
        {
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        },
        d / rank_file("extra_state"),
    )
    fault("checkpoint", state.global_step)
    torch.save(state.loader, d / "data.pt")
    torch.save(
        {
            "global_step": state.global_step,
            "history": state.history,
            "eval_before": state.eval_before,
            "reports_before": state.reports_before,
        },
        d / "trainer_state.pt",
    )
    (d / "policy" / "fsdp_config.json").write_text(
        json.dumps({"world_size": 1, "strategy": "local"})
    )
    consolidate(d / "policy", d / "policy" / "lora_adapter", adapter_config=adapter_config)
    if describe_adapter is not None:
        describe_adapter(d / "policy" / "lora_adapter")


def read_train_state(d: Path, lora_names: Sequence[str]) -> TrainState:
    """Read what :func:`write_train_state` wrote and restore this process's RNG states.

    Raises:
        CheckpointError: the checkpoint lacks one of ``lora_names``.
    """
    lora = cast(dict[str, torch.Tensor], torch.load(d / rank_file("model"), weights_only=True))
    missing = [k for k in lora_names if k not in lora]
    if missing:
        raise CheckpointError(f"{d}: checkpoint lacks LoRA parameters such as {missing[0]}")
    opt = torch.load(d / rank_file("optim"), weights_only=False)
    extra = torch.load(d / rank_file("extra_state"), weights_only=False)
    torch.set_rng_state(extra["torch_rng"])
    np.random.set_state(extra["numpy_rng"])
    random.setstate(extra["python_rng"])
    loader = torch.load(d / "data.pt", weights_only=False)
    ts = torch.load(d / "trainer_state.pt", weights_only=False)
    return TrainState(
        lora=lora,
        optimizer=opt["optimizer"],
        scheduler=opt["scheduler"],
        loader=loader,
        global_step=int(ts["global_step"]),
        history=list(ts["history"]),
        eval_before=ts.get("eval_before"),
        reports_before=dict(ts.get("reports_before", {})),
    )
