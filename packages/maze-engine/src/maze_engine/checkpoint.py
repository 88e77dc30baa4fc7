"""Checkpoints in SkyRL's layout, written so a crash at any instant leaves a usable run.

Layout under ``ckpt_path`` (what SkyRL's FSDP trainer writes, so tools and people find files
where they expect them)::

    global_step_N/
        policy/model_world_size_W_rank_R.pt       LoRA parameters, per rank
        policy/optim_world_size_W_rank_R.pt       optimizer state, per rank
        policy/extra_state_world_size_W_rank_R.pt RNG states, per rank
        policy/lora_adapter/                      consolidated PEFT adapter
        data.pt                                   dataloader position
        trainer_state.pt                          global step, config
        manifest.json                             size + sha256 of every file (ours)
    latest_ckpt_global_step.txt                   written last

Each checkpoint is written into ``.global_step_N.staging-<id>`` on the same filesystem, fsynced,
then renamed into place; ``latest_ckpt_global_step.txt`` is replaced atomically afterwards. A
loader verifies the manifest and, if the newest checkpoint is torn or corrupt, logs why and
falls back to the newest one that verifies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

LATEST_FILE = "latest_ckpt_global_step.txt"
MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"global_step_(\d+)")
ResumeMode = Literal["latest", "none", "from_path"]
RESUME_MODES: tuple[ResumeMode, ...] = ("latest", "none", "from_path")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message names the path and the reason."""


def rank_file(
    kind: Literal["model", "optim", "extra_state"], world_size: int = 1, rank: int = 0
) -> str:
    return f"policy/{kind}_world_size_{world_size}_rank_{rank}.pt"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class Checkpoint:
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
            files = sorted(p for p in staging.rglob("*") if p.is_file())
            manifest = {
                "global_step": step,
                "created_at": time.time(),
                "files": {
                    str(p.relative_to(staging)): {"size": p.stat().st_size, "sha256": _sha256(p)}
                    for p in files
                },
            }
            for p in files:
                with p.open("rb") as f:
                    os.fsync(f.fileno())
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
            for d in sorted({p.parent for p in files} | {staging}, key=lambda d: -len(d.parts)):
                _fsync_dir(d)
            os.rename(staging, final)
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _write_atomic(self.root / LATEST_FILE, f"{step}\n".encode())
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
        manifest_path = path / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
            files: dict[str, dict[str, object]] = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: missing or unreadable {MANIFEST} ({exc})") from exc
        for rel, meta in files.items():
            f = path / rel
            if not f.is_file():
                raise CheckpointError(f"{path}: {rel} is missing")
            if f.stat().st_size != meta.get("size"):
                raise CheckpointError(
                    f"{path}: {rel} has {f.stat().st_size} bytes, manifest says {meta.get('size')}"
                )
            if _sha256(f) != meta.get("sha256"):
                raise CheckpointError(f"{path}: {rel} does not match its sha256 in {MANIFEST}")

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
