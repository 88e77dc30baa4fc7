"""Continuous mode: evaluate every adapter version a weight-sync store publishes.

Each version gets its own results file (``v000007.jsonl``, resumable) and one line in
``series.jsonl`` with its summary; ``series.png`` charts the solve rate per version and is
redrawn after each one. A restart skips versions already in the series.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from maze_evaluation.episodes import Backend
from maze_evaluation.errors import ResultsFileError
from maze_evaluation.report import SERIES_CHART, write_series_chart
from maze_evaluation.runner import evaluate
from maze_evaluation.stats import Summary, summarize
from weight_sync import AdapterStore, PublishedVersion, Subscriber

SERIES = "series.jsonl"
log = logging.getLogger(__name__)


def read_series(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of ``out_dir/series.jsonl`` (empty if absent); a torn last line is dropped.

    Raises:
        ResultsFileError: A line before the last is not JSON.
    """
    path = Path(out_dir) / SERIES
    if not path.exists():
        return []
    out: list[dict[str, Any]] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            if i == len(lines) - 1:
                break  # torn by a kill; that version is evaluated again
            raise ResultsFileError(f"{path}: line {i + 1} is not JSON: {exc}") from exc
    return out


def _append_series(out_dir: Path, pv: PublishedVersion, summary: Summary) -> None:
    entry = {
        "version": pv.version,
        "step": pv.step,
        "published_at": pv.published_at,
        "evaluated_at": time.time(),
        **summary.to_dict(),
    }
    with (out_dir / SERIES).open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def follow(
    sync_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    backend_for: Callable[[PublishedVersion], Backend],
    *,
    idle_timeout: float | None = None,
    max_versions: int | None = None,
    poll_interval: float = 0.5,
    stop: threading.Event | None = None,
    on_summary: Callable[[int, Summary], None] | None = None,
    **eval_kwargs: Any,
) -> list[Summary]:
    """Evaluate each published version newer than the series holds, until told to stop.

    Stops when ``idle_timeout`` seconds pass without a new version, ``max_versions`` were
    evaluated, or ``stop`` is set. ``eval_kwargs`` go to :func:`evaluate`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done = [int(e["version"]) for e in read_series(out)]
    after = max(done) if done else None
    summaries: list[Summary] = []
    with Subscriber(AdapterStore(sync_dir), poll_interval=poll_interval, reader="maze-eval") as sub:
        for pv in sub.iter_versions(after, idle_timeout=idle_timeout, stop=stop):
            backend = backend_for(pv)
            records = evaluate(
                backend, out=out / f"v{pv.version:06d}.jsonl", resume=True, **eval_kwargs
            )
            s = summarize(records)
            _append_series(out, pv, s)
            try:
                write_series_chart(read_series(out), out / SERIES_CHART)
            except (OSError, ValueError) as exc:  # a chart is never worth stopping the follower
                log.warning("could not draw %s: %s", out / SERIES_CHART, exc)
            summaries.append(s)
            if on_summary is not None:
                on_summary(pv.version, s)
            if max_versions is not None and len(summaries) >= max_versions:
                break
    return summaries
