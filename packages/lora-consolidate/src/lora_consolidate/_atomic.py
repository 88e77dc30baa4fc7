"""Write a whole output directory or nothing (``weight_sync.fs.staged_dir``).

An existing output directory is refused unless the caller asks to replace it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator
from pathlib import Path

from lora_consolidate.errors import OutputExistsError
from weight_sync import fs


@contextlib.contextmanager
def staged_directory(out: Path, *, overwrite: bool = False) -> Generator[Path]:
    """Yield an empty staging directory; on clean exit it atomically becomes ``out``.

    Raises ``OutputExistsError`` up front, before any work, when ``out`` exists and
    ``overwrite`` is false.
    """
    out = Path(out).absolute()
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out}: output already exists (pass overwrite to replace it)")
    with fs.staged_dir(out) as staging:
        yield staging
