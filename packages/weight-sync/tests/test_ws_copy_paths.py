"""The copy falls back from copy_file_range to sendfile to pread/pwrite and hashes the same."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from weight_sync import AdapterStore, InvalidAdapterError
from weight_sync._fsutil import copy_hashed
from weight_sync._hashing import new_hasher
from weight_sync.synthetic import tiny, write_adapter


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    src = write_adapter(tmp_path / "src", tiny(rank=64, num_layers=9, hidden=1024), seed=5)
    return src / "adapter_model.safetensors"


def _unsupported(*args: object, **kwargs: object) -> int:
    raise OSError(errno.EXDEV, "Invalid cross-device link")


@pytest.mark.parametrize("alg", ["sha256", "xxh3-128"])
@pytest.mark.parametrize("disable", [[], ["copy_file_range"], ["copy_file_range", "sendfile"]])
def test_every_copy_path_gives_identical_bytes_and_hash(
    big_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disable: list[str], alg: str
):
    calls: dict[str, int] = {}
    for name in ("copy_file_range", "sendfile", "pread"):
        real = getattr(os, name)

        def wrapped(
            *args: object, _real: Callable[..., object] = real, _name: str = name
        ) -> object:
            calls[_name] = calls.get(_name, 0) + 1
            if _name in disable:
                return _unsupported()
            return _real(*args)

        monkeypatch.setattr(os, name, wrapped)
    dst = tmp_path / "out"
    size, digest = copy_hashed(big_file, dst, "w", hook=None, durable=True, algorithm=alg)
    data = big_file.read_bytes()
    assert dst.read_bytes() == data
    expected = new_hasher(alg)
    expected.update(data)
    assert (size, digest) == (len(data), expected.hexdigest())
    if alg == "sha256":
        assert digest == hashlib.sha256(data).hexdigest()
    used = next(n for n in ("copy_file_range", "sendfile", "pread") if n not in disable)
    assert calls.get(used, 0) > 0


def test_source_modified_during_publish_is_refused(tmp_path: Path, big_file: Path):
    store_root = tmp_path / "root"

    def touch_source(name: str, offset: int) -> None:
        if name == "adapter_model.safetensors" and offset > 0:
            os.utime(big_file)  # what a trainer still writing the file would do

    store = AdapterStore(store_root, write_hook=touch_source)
    with pytest.raises(InvalidAdapterError, match="modified while being published"):
        store.publish(big_file.parent)
    assert store.latest() is None
    assert os.listdir(store_root / ".staging") == []
