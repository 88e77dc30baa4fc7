"""Evaluate a backend on a named eval set: jobs, resume, records, progress."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from maze_env import DEFAULT_SLACK, Style, verify_eval_set
from maze_env.export import build_rows
from maze_evaluation.episodes import Backend, Job, Played, Sampling, derive_seed
from maze_evaluation.errors import ResultsFileError
from maze_evaluation.records import EvalRecord, make_record
from maze_evaluation.results import ResultsWriter, read_records

DEFAULT_CELL_PX = 32
"""The local trainer's default rendering (one grid square per Qwen3-VL token)."""


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


def evaluate(
    backend: Backend,
    *,
    eval_set: str = "easy-64",
    out: str | os.PathLike[str] | None = None,
    resume: bool = False,
    samples: int = 1,
    temperature: float | None = None,
    max_new_tokens: int = 256,
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
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    greedy = samples == 1 and temperature is None
    sampling = Sampling(
        greedy=greedy,
        temperature=1.0 if temperature is None else temperature,
        max_new_tokens=max_new_tokens,
    )
    rows = eval_rows(eval_set, limit=limit, cell_px=cell_px, slack=slack)
    existing: list[EvalRecord] = []
    path = None if out is None else Path(out)
    if path is not None and path.exists() and path.stat().st_size > 0:
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
    identity = backend.identity
    mine = (identity.backend, identity.model, identity.adapter, identity.version)
    theirs = {(r.backend, r.model, r.adapter, r.version) for r in existing} - {mine}
    if theirs:
        raise ResultsFileError(
            f"{path} holds results of {sorted(map(str, theirs))}, not {mine}; resume with the same "
            "backend, model and adapter, or write to another file"
        )
    done = {r.key for r in existing}
    jobs = [
        Job(row, s, derive_seed(seed, int(str(row["seed"])), s))
        for row in rows
        for s in range(samples)
        if (int(str(row["seed"])), s) not in done
    ]
    new: list[EvalRecord] = []
    writer = None if path is None else ResultsWriter(path)
    bar = tqdm(
        total=len(rows) * samples,
        initial=len(rows) * samples - len(jobs),
        disable=not progress,
        desc=eval_set,
        unit="ep",
    )

    def on_done(played: Played) -> None:
        rec = make_record(
            eval_set=eval_set,
            row=played.job.row,
            sample=played.job.sample,
            replies=played.replies,
            reward=played.reward,
            identity=identity,
            elapsed_s=played.elapsed_s,
        )
        if writer is not None:
            writer.write(rec)
        new.append(rec)
        bar.update(1)
        bar.set_postfix(solved=sum(r.solved for r in (*existing, *new)))

    try:
        backend.play(jobs, sampling, on_done)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    wanted = {(int(str(r["seed"])), s) for r in rows for s in range(samples)}
    return sorted((r for r in (*existing, *new) if r.key in wanted), key=lambda r: r.key)


def load_results(paths: Sequence[str | os.PathLike[str]]) -> list[EvalRecord]:
    out: list[EvalRecord] = []
    for p in paths:
        out.extend(read_records(p))
    return out
