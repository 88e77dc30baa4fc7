"""Write a whole output directory or nothing.

Everything is written into a hidden staging directory beside the target (same parent, hence the
same filesystem, which matters on Lustre/NFS where rename is only atomic within one filesystem),
fsynced, then renamed into place. Any exception removes the staging directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Generator
from pathlib import Path

from lora_consolidate.errors import OutputExistsError


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    # Directory fsync makes the rename itself durable; not every platform allows opening a dir.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def staged_directory(out: Path, *, overwrite: bool = False) -> Generator[Path]:
    """Yield an empty staging directory; on clean exit it atomically becomes ``out``."""
    out = Path(out).absolute()
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out}: output already exists (pass overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:12]
    staging = out.parent / f".{out.name}.staging-{token}"
    staging.mkdir()
    try:
        yield staging
        _fsync_tree(staging)
        if out.exists():
            # Two renames: the old tree leaves, the new one arrives; readers see one or the other.
            retired = out.parent / f".{out.name}.old-{token}"
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
