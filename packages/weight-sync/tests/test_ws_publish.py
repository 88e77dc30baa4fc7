from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weight_sync import (
    AdapterStore,
    InvalidAdapterError,
    Manifest,
    VersionConflictError,
    VersionNotFoundError,
)
from weight_sync._hashing import new_hasher
from weight_sync.synthetic import adapter_files, tiny, write_adapter


def _digest(alg: str, data: bytes) -> str:
    h = new_hasher(alg)
    h.update(data)
    return h.hexdigest()


def test_publish_directory_layout_manifest_and_pointer(store: AdapterStore, adapter_dir: Path):
    pv = store.publish(adapter_dir, version=7, step=700, producer="trainer-0")

    assert pv.path == store.root / "versions" / "v000000007"
    assert sorted(os.listdir(pv.path)) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
    ]
    manifest = Manifest.from_json((pv.path / "manifest.json").read_bytes(), "m")
    assert (manifest.version, manifest.step, manifest.producer) == (7, 700, "trainer-0")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        data = (adapter_dir / name).read_bytes()
        assert (pv.path / name).read_bytes() == data
        assert manifest.files[name].size == len(data)
        assert manifest.files[name].digest == _digest(manifest.hash_algorithm, data)
    pointer = json.loads((store.root / "latest").read_bytes())
    assert pointer["version"] == 7
    assert pointer["dir"] == "versions/v000000007"
    mraw = (pv.path / "manifest.json").read_bytes()
    assert pointer["manifest_sha256"] == hashlib.sha256(mraw).hexdigest()
    # Nothing left behind in staging, and the lock file is the only other entry.
    assert os.listdir(store.root / ".staging") == []
    latest = store.latest()
    assert latest is not None
    assert latest.version == 7
    assert latest.step == 700


def test_publish_in_memory_files_and_auto_versions(store: AdapterStore):
    first = store.publish(adapter_files(tiny(), seed=3))
    second = store.publish(adapter_files(tiny(), seed=4), step=99)
    assert (first.version, second.version) == (1, 2)
    assert (first.step, second.step) == (1, 99)
    assert store.versions() == [1, 2]
    expected = adapter_files(tiny(), seed=4)["adapter_model.safetensors"]
    assert (second.path / "adapter_model.safetensors").read_bytes() == expected


def test_large_adapter_round_trips_byte_exact(store: AdapterStore, tmp_path: Path):
    # Several chunks, so the pipelined copy+hash path is exercised end to end.
    src = write_adapter(tmp_path / "big", tiny(rank=64, num_layers=9, hidden=1024), seed=9)
    pv = store.publish(src)
    data = (src / "adapter_model.safetensors").read_bytes()
    assert len(data) > 8 << 20
    assert (pv.path / "adapter_model.safetensors").read_bytes() == data
    alg = pv.manifest.hash_algorithm
    assert pv.manifest.files["adapter_model.safetensors"].digest == _digest(alg, data)
    store.verify(pv.version, use_cache=False)


@pytest.mark.parametrize("older", [3, 5])
def test_publishing_an_older_or_equal_version_is_refused(
    store: AdapterStore, adapter_dir: Path, older: int
):
    store.publish(adapter_dir, version=5)
    with pytest.raises(VersionConflictError, match=f"cannot publish version {older}; latest is 5"):
        store.publish(adapter_dir, version=older)
    assert store.versions() == [5]
    store.verify(5, use_cache=False)


def test_negative_version_or_step_is_refused(store: AdapterStore, adapter_dir: Path):
    with pytest.raises(VersionConflictError, match="version must be an integer >= 0"):
        store.publish(adapter_dir, version=-1)
    with pytest.raises(VersionConflictError, match="step must be an integer >= 0"):
        store.publish(adapter_dir, step=-5)
    _assert_nothing_published(store)


def _assert_nothing_published(store: AdapterStore) -> None:
    assert store.latest() is None
    assert os.listdir(store.root / "versions") == []
    assert os.listdir(store.root / ".staging") == []


def test_missing_weights_are_rejected(store: AdapterStore, adapter_dir: Path):
    (adapter_dir / "adapter_model.safetensors").unlink()
    with pytest.raises(InvalidAdapterError, match=r"missing adapter_model\.safetensors"):
        store.publish(adapter_dir)
    _assert_nothing_published(store)


def test_missing_config_is_rejected(store: AdapterStore, adapter_dir: Path):
    (adapter_dir / "adapter_config.json").unlink()
    with pytest.raises(InvalidAdapterError, match=r"missing adapter_config\.json"):
        store.publish(adapter_dir)
    _assert_nothing_published(store)


def test_corrupt_config_is_rejected(store: AdapterStore, adapter_dir: Path):
    (adapter_dir / "adapter_config.json").write_text('{"r": 8,')
    with pytest.raises(InvalidAdapterError, match=r"adapter_config\.json: not valid JSON"):
        store.publish(adapter_dir)
    _assert_nothing_published(store)


def test_truncated_safetensors_is_rejected_and_old_version_survives(
    store: AdapterStore, adapter_dir: Path
):
    good = store.publish(adapter_dir)
    weights = adapter_dir / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) - 100])
    with pytest.raises(InvalidAdapterError, match="header implies"):
        store.publish(adapter_dir)
    assert store.versions() == [good.version]
    store.verify(good.version, use_cache=False)
    assert os.listdir(store.root / ".staging") == []


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x01\x02", "too short"),
        ((2**40).to_bytes(8, "little") + b"{}", "implausible safetensors header length"),
        ((6).to_bytes(8, "little") + b"{nope}", "header is not JSON"),
        ((20).to_bytes(8, "little") + b"{}", "header is truncated"),
    ],
)
def test_garbage_safetensors_is_rejected(
    store: AdapterStore, adapter_dir: Path, blob: bytes, message: str
):
    (adapter_dir / "adapter_model.safetensors").write_bytes(blob)
    with pytest.raises(InvalidAdapterError, match=message):
        store.publish(adapter_dir)
    _assert_nothing_published(store)


def test_nested_directory_and_bad_names_are_rejected(store: AdapterStore, adapter_dir: Path):
    (adapter_dir / "sub").mkdir()
    with pytest.raises(InvalidAdapterError, match="nested directories"):
        store.publish(adapter_dir)
    files = adapter_files(tiny(), seed=1)
    with pytest.raises(InvalidAdapterError, match="invalid adapter file name"):
        store.publish({**files, "../evil": b"x"})
    with pytest.raises(InvalidAdapterError, match="invalid adapter file name"):
        store.publish({**files, "manifest.json": b"{}"})
    with pytest.raises(InvalidAdapterError, match="not a directory"):
        store.publish(adapter_dir / "nope")
    _assert_nothing_published(store)


def test_empty_extra_file_is_rejected(store: AdapterStore, adapter_dir: Path):
    (adapter_dir / "README.md").write_bytes(b"")
    with pytest.raises(InvalidAdapterError, match=r"README\.md: file is empty"):
        store.publish(adapter_dir)
    _assert_nothing_published(store)


def test_get_unknown_or_unpublished_version(store: AdapterStore, adapter_dir: Path):
    with pytest.raises(VersionNotFoundError, match="not published"):
        store.get(1)
    store.publish(adapter_dir, version=2)
    with pytest.raises(VersionNotFoundError, match="version 3 is not published"):
        store.get(3)
    with pytest.raises(VersionNotFoundError, match="does not exist"):
        store.get(1)
    assert store.get(2).version == 2


FORK_AFTER_PUBLISH = """
import os, sys
from weight_sync import AdapterStore
from weight_sync.synthetic import adapter_files, tiny
store = AdapterStore(sys.argv[1])
store.publish(adapter_files(tiny(), seed=1))  # starts the I/O worker threads
pid = os.fork()
if pid == 0:
    code = 0
    try:
        AdapterStore(sys.argv[1]).publish(adapter_files(tiny(), seed=2))
    except BaseException:
        code = 1
    os._exit(code)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_publish_works_in_a_child_forked_after_publishing(tmp_path: Path):
    # A forked child has no worker threads; it must not wait forever for them.
    res = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_PUBLISH, str(tmp_path / "root")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    store = AdapterStore(tmp_path / "root")
    assert store.versions() == [1, 2]
    store.verify(2, use_cache=False)
