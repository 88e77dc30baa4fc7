"""Running out of space: a real 2 MiB tmpfs when we may mount one, plus an injected ENOSPC."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from weight_sync import AdapterStore, StorageFullError
from weight_sync.synthetic import adapter_files, tiny, write_adapter


def _assert_only(store: AdapterStore, versions: list[int]) -> None:
    assert store.versions() == versions
    assert store.latest_version() == versions[-1]
    for v in versions:
        store.verify(v, use_cache=False)
    assert os.listdir(store.root / ".staging") == []
    assert os.listdir(store.root / ".trash") == []


def test_injected_enospc_mid_file(tmp_path: Path):
    state = {"armed": False}

    def hook(name: str, offset: int) -> None:
        if state["armed"] and name == "adapter_model.safetensors" and offset >= 8 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")

    store = AdapterStore(tmp_path / "root", write_hook=hook)
    store.publish(adapter_files(tiny(), seed=1))
    src = write_adapter(tmp_path / "big", tiny(rank=64, num_layers=9, hidden=1024), seed=2)
    state["armed"] = True
    with pytest.raises(StorageFullError, match="no space left on device while writing version 2"):
        store.publish(src)
    _assert_only(store, [1])
    # In-memory sources take the other write path; it fails just as cleanly.
    with pytest.raises(StorageFullError):
        store.publish(adapter_files(tiny(rank=64, num_layers=9, hidden=1024), seed=3))
    _assert_only(store, [1])
    state["armed"] = False
    assert store.publish(src).version == 2
    _assert_only(store, [1, 2])


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root; ENOSPC is covered by the injected test")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_real_full_tmpfs(small_tmpfs: Path, tmp_path: Path):
    store = AdapterStore(small_tmpfs / "root")
    medium = write_adapter(tmp_path / "medium", tiny(rank=8, num_layers=14, hidden=256), seed=1)
    big = write_adapter(tmp_path / "big", tiny(rank=8, num_layers=20, hidden=256), seed=2)
    store.publish(medium)
    # ~0.92 MB are used; the ~1.31 MB adapter cannot fit next to it on a 2 MiB filesystem.
    with pytest.raises(StorageFullError, match="no space left on device"):
        store.publish(big)
    _assert_only(store, [1])
    with pytest.raises(StorageFullError):
        store.publish(big, version=5)
    _assert_only(store, [1])
    # Space comes back once the old version is collected.
    assert store.publish(adapter_files(tiny(), seed=3)).version == 2
    store.gc(keep=1)
    assert store.publish(big).version == 3
    _assert_only(store, [2, 3])
