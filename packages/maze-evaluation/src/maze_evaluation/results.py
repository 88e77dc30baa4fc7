"""Results JSONL: one record per line, appended as episodes finish, resumable."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from maze_evaluation.errors import ResultsFileError
from maze_evaluation.records import EvalRecord

log = logging.getLogger(__name__)


def read_records(path: str | os.PathLike[str], *, repair: bool = False) -> list[EvalRecord]:
    """All records in ``path``.

    A torn last line (an interrupted write) is skipped with a warning, and with ``repair`` cut
    off the file so appends start on a clean line; a bad line elsewhere is an error naming the
    file and line.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ResultsFileError(f"{p}: cannot read results ({exc.strerror})") from exc
    lines = data.split(b"\n")
    records: list[EvalRecord] = []
    offset = 0
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        line_start = offset
        offset += len(raw) + 1
        if not raw.strip():
            continue
        try:
            records.append(EvalRecord.from_dict(json.loads(raw)))
        except (ValueError, KeyError, TypeError) as exc:
            # Only text after the final newline can be torn; a bad complete line is corruption.
            if last:
                log.warning("%s: ignoring torn last line %d (%s)", p, i + 1, exc)
                if repair:
                    with p.open("r+b") as f:
                        f.truncate(line_start)
                break
            raise ResultsFileError(f"{p}: line {i + 1} is not a result record: {exc}") from exc
    return records


class ResultsWriter:
    """Appends records, one flushed line each, so a kill loses at most the line being written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = self.path.open("a", encoding="utf-8")

    def write(self, record: EvalRecord) -> None:
        self._f.write(record.to_json() + "\n")
        self._f.flush()

    def write_all(self, records: Iterable[EvalRecord]) -> None:
        for r in records:
            self.write(r)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
