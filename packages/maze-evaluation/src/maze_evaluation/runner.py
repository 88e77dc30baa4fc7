"""Evaluate a backend on a named eval set: jobs, resume, records, progress."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from maze_env import DEFAULT_SLACK, Style, verify_eval_set
from maze_env.export import build_rows
from maze_evaluation.episodes import Backend, Job, Played
from maze_evaluation.errors import ResultsFileError
from maze_evaluation.records import EvalRecord, Identity, make_record
from maze_evaluation.results import ResultsWriter, read_records
from maze_policy.sampling import SamplingParams
from maze_policy.seeds import derive_seed

DEFAULT_CELL_PX = 32
"""The local trainer's default rendering (one grid square per Qwen3-VL token)."""
DEFAULT_TEMPERATURE = 1.0
"""Temperature of sampled runs (``samples`` > 1) when none is given."""
DEFAULT_MAX_NEW_TOKENS = 256
"""Tokens per reply: room for the observation, justification and action tags."""


def eval_rows(
    eval_set: str,
    *,
    limit: int | None = None,
    cell_px: int = DEFAULT_CELL_PX,
    slack: int = DEFAULT_SLACK,
) -> list[dict[str, object]]:
    """The eval set's dataset rows, exactly as the trainer's validation split exports them."""
    es = verify_eval_set(eval_set)
    seeds = es.seeds if limit is None else es.seeds[:limit]
    return build_rows(es.spec, seeds, split="validation", slack=slack, style=Style(cell_px=cell_px))


def sampling_params(
    samples: int, temperature: float | None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
) -> SamplingParams:
    """Sampling parameters for an eval run.

    Greedy for one sample and no ``temperature``; otherwise sampled at ``temperature``
    (default :data:`DEFAULT_TEMPERATURE`), top-p 1.
    """
    if temperature is not None and temperature <= 0:
        raise ValueError(f"sampling needs temperature > 0, got {temperature}")
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        greedy=samples == 1 and temperature is None,
    )


def _check_counts(samples: int, limit: int | None) -> None:
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")


def _previous_records(path: Path | None, eval_set: str, *, resume: bool) -> list[EvalRecord]:
    """The records already in ``path`` (a torn last line repaired).

    ``path`` must be new or empty unless ``resume``, and may hold only ``eval_set``.
    """
    if path is None or not path.exists() or path.stat().st_size == 0:
        return []
    if not resume:
        raise ResultsFileError(
            f"{path} already exists; pass resume=True (--resume) or another path"
        )
    existing = read_records(path, repair=True)
    other = {r.eval_set for r in existing} - {eval_set}
    if other:
        raise ResultsFileError(
            f"{path} holds results for eval set {sorted(other)}, not {eval_set!r}"
        )
    return existing


def _check_same_source(
    path: Path | None, existing: Iterable[EvalRecord], identity: Identity
) -> None:
    """Refuse to mix replies of another backend, model, adapter, version or context into one file."""
    mine = (identity.backend, identity.model, identity.adapter, identity.version, identity.context)
    theirs = {
        (r.backend, r.model, r.adapter, r.version, str(r.extra.get("context", "full")))
        for r in existing
    } - {mine}
    if theirs:
        raise ResultsFileError(
            f"{path} holds results of {sorted(map(str, theirs))}, not {mine}; resume with the same "
            "backend, model, adapter and context, or write to another file"
        )


def _row_seed(row: Mapping[str, Any]) -> int:
    return int(str(row["seed"]))


def _pending_jobs(
    rows: Sequence[Mapping[str, Any]], samples: int, seed: int, done: set[tuple[int, int]]
) -> list[Job]:
    """Every (row, sample) not in ``done``, each with its own derived sampling seed."""
    return [
        Job(row, s, derive_seed(seed, _row_seed(row), s))
        for row in rows
        for s in range(samples)
        if (_row_seed(row), s) not in done
    ]


class _Recorder:
    """Turns finished episodes into records: appended to the results file, shown as progress."""

    def __init__(
        self,
        eval_set: str,
        identity: Identity,
        path: Path | None,
        existing: Sequence[EvalRecord],
        *,
        total: int,
        pending: int,
        progress: bool,
    ) -> None:
        self.eval_set = eval_set
        self.identity = identity
        self.records = list(existing)
        self._solved = sum(r.solved for r in existing)
        self._writer = None if path is None else ResultsWriter(path)
        self._bar = tqdm(
            total=total, initial=total - pending, disable=not progress, desc=eval_set, unit="ep"
        )

    def __call__(self, played: Played) -> None:
        rec = make_record(
            eval_set=self.eval_set,
            row=played.job.row,
            sample=played.job.sample,
            replies=played.replies,
            reward=played.reward,
            identity=self.identity,
            elapsed_s=played.elapsed_s,
        )
        if self._writer is not None:
            self._writer.write(rec)
        self.records.append(rec)
        self._solved += rec.solved
        self._bar.update(1)
        self._bar.set_postfix(solved=self._solved)

    def close(self) -> None:
        self._bar.close()
        if self._writer is not None:
            self._writer.close()


def _of_run(
    records: Iterable[EvalRecord], rows: Sequence[Mapping[str, Any]], samples: int
) -> list[EvalRecord]:
    """The records of this run's (maze, sample) keys, sorted by key."""
    wanted = {(_row_seed(r), s) for r in rows for s in range(samples)}
    return sorted((r for r in records if r.key in wanted), key=lambda r: r.key)


def evaluate(
    backend: Backend,
    *,
    eval_set: str = "easy-64",
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    samples: int = 1,
    temperature: float | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    limit: int | None = None,
    seed: int = 0,
    cell_px: int = DEFAULT_CELL_PX,
    slack: int = DEFAULT_SLACK,
    progress: bool = True,
) -> list[EvalRecord]:
    """Play every (maze, sample) not yet in ``out`` and return all records, sorted by key.

    Greedy when ``samples`` is 1 and no ``temperature`` is given; otherwise each episode samples
    at ``temperature`` (default 1.0) with its own seed. Records are appended to ``out`` as they
    finish; with ``resume`` an existing file is continued, otherwise it must not exist.
    """
    _check_counts(samples, limit)
    sampling = sampling_params(samples, temperature, max_new_tokens)
    rows = eval_rows(eval_set, limit=limit, cell_px=cell_px, slack=slack)
    path = None if out is None else Path(out)
    existing = _previous_records(path, eval_set, resume=resume)
    identity = backend.identity
    _check_same_source(path, existing, identity)
    jobs = _pending_jobs(rows, samples, seed, {r.key for r in existing})
    recorder = _Recorder(
        eval_set,
        identity,
        path,
        existing,
        total=len(rows) * samples,
        pending=len(jobs),
        progress=progress,
    )
    try:
        backend.play(jobs, sampling, recorder)
    finally:
        recorder.close()
    return _of_run(recorder.records, rows, samples)


def load_results(paths: Sequence[str | os.PathLike[str]]) -> list[EvalRecord]:
    """The records of every results file in ``paths``, in order."""
    out: list[EvalRecord] = []
    for p in paths:
        out.extend(read_records(p))
    return out
