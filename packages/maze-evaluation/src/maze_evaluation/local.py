"""In-process backend: a model directory (+ optional PEFT adapter) played by maze-policy.

Episodes run through :func:`maze_policy.rollout.run_episodes`, the trainer's own rollout loop,
in batches so results are written as each batch finishes. Needs the ``local`` extra.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from maze_evaluation.episodes import Job, Played
from maze_evaluation.errors import BackendError
from maze_evaluation.records import Identity
from maze_policy.sampling import SamplingParams

ADAPTER_FILES = ("adapter_config.json",)


class LocalBackend:
    """Plays episodes in-process with a model directory and an optional PEFT adapter."""

    def __init__(
        self,
        model_dir: str | Path,
        adapter_dir: str | Path | None = None,
        *,
        batch_size: int = 8,
        threads: int | None = None,
        version: int | None = None,
        context: str = "full",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        try:
            import torch

            from maze_policy.contexts import check_context
            from maze_policy.errors import ModelLoadError
            from maze_policy.model import load_vlm
            from maze_policy.policy import Policy
        except ImportError as exc:
            raise BackendError(
                f"the in-process backend needs the 'local' extra (pip install 'maze-evaluation[local]'): {exc}"
            ) from exc
        self.context = check_context(context)
        if threads is not None:
            torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        self.batch_size = batch_size
        try:
            model, processor = load_vlm(self.model_dir)
        except ModelLoadError as exc:
            raise BackendError(str(exc)) from exc
        self._base: Any = model
        self._peft: Any = None
        self._processor = processor
        self._policy_cls = Policy
        self.policy: Any = Policy(model, processor)
        self._identity = Identity("local", str(self.model_dir), None, version, self.context)
        if adapter_dir is not None:
            self.load_adapter(adapter_dir, version)

    @property
    def identity(self) -> Identity:
        return self._identity

    def load_adapter(self, adapter_dir: str | Path, version: int | None = None) -> None:
        """Switch to the PEFT adapter in ``adapter_dir`` (the previous one is dropped)."""
        path = Path(adapter_dir)
        missing = [f for f in ADAPTER_FILES if not (path / f).is_file()]
        if missing:
            raise BackendError(
                f"{path}: not a PEFT adapter directory (missing {', '.join(missing)})"
            )
        name = f"eval{0 if version is None else version}"
        try:
            if self._peft is None:
                from peft import PeftModel

                self._peft = PeftModel.from_pretrained(self._base, str(path), adapter_name=name)
            else:
                old = self._peft.active_adapter
                self._peft.load_adapter(str(path), adapter_name=name)
                self._peft.set_adapter(name)
                if old != name:
                    self._peft.delete_adapter(old)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise BackendError(f"{path}: cannot load adapter onto {self.model_dir}: {exc}") from exc
        self._peft.eval()
        self.policy = self._policy_cls(self._peft, self._processor)
        self._identity = Identity("local", str(self.model_dir), str(path), version, self.context)

    def play(
        self, jobs: Sequence[Job], sampling: SamplingParams, on_done: Callable[[Played], None]
    ) -> None:
        from maze_policy.rollout import run_episodes

        for start in range(0, len(jobs), self.batch_size):
            chunk = jobs[start : start + self.batch_size]
            t0 = time.monotonic()
            # Sampled runs seed each batch from its first episode's seed: reproducible for the
            # same batch composition (greedy runs do not depend on it).
            episodes = run_episodes(
                self.policy,
                [j.row for j in chunk],
                sampling=sampling,
                seed=chunk[0].seed,
                context=self.context,
            )
            per = (time.monotonic() - t0) / len(chunk)
            for job, ep in zip(chunk, episodes, strict=True):
                on_done(Played(job, list(ep.replies), float(ep.reward), per))
