from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import weight_sync.fs as fs_mod
from weight_sync import AdapterStore, VerificationError, VersionNotFoundError, WeightSyncError
from weight_sync._hashing import hash_path_mapped, new_hasher

Doc = dict[str, Any]


@pytest.fixture(params=["xxh3-128", "sha256"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> AdapterStore:
    """Every check here must hold whichever checksum the manifests record."""
    return AdapterStore(tmp_path / "root", hash_algorithm=request.param)


def _digest(alg: str, data: bytes) -> str:
    h = new_hasher(alg)
    h.update(data)
    return h.hexdigest()


def _rewrite_manifest(path: Path, edit: Callable[[Doc], object]) -> None:
    doc = json.loads((path / "manifest.json").read_bytes())
    edit(doc)
    (path / "manifest.json").write_text(json.dumps(doc))


def test_flipped_byte_in_weights_is_detected(store: AdapterStore, adapter_dir: Path):
    pv = store.publish(adapter_dir)
    store.verify(pv.version)  # fills the cache
    weights = pv.path / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    st = weights.stat()
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # hide the change from mtime
    # ctime still moved, so even the cached verification re-hashes and catches it.
    alg = store.hash_algorithm
    with pytest.raises(VerificationError, match=rf"adapter_model\.safetensors: {alg}"):
        store.verify(pv.version)
    with pytest.raises(VerificationError, match="does not match the manifest"):
        store.latest()


def test_truncated_file_is_detected(store: AdapterStore, adapter_dir: Path):
    pv = store.publish(adapter_dir)
    weights = pv.path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(VerificationError, match=r"size \d+ != \d+ recorded in the manifest"):
        store.verify(pv.version, use_cache=False)


def test_missing_manifest_is_damage_not_absence(store: AdapterStore, adapter_dir: Path):
    pv = store.publish(adapter_dir)
    (pv.path / "manifest.json").unlink()
    with pytest.raises(VerificationError, match=r"manifest\.json: manifest is missing"):
        store.verify(pv.version)


def test_missing_and_extra_files_are_detected(store: AdapterStore, adapter_dir: Path):
    pv = store.publish(adapter_dir)
    (pv.path / "stray.bin").write_bytes(b"x")
    with pytest.raises(VerificationError, match=r"'stray\.bin' is not in the manifest"):
        store.verify(pv.version)
    (pv.path / "stray.bin").unlink()
    (pv.path / "adapter_config.json").unlink()
    with pytest.raises(
        VerificationError, match=r"'adapter_config\.json' in the manifest is missing"
    ):
        store.verify(pv.version)


def test_manifest_that_lies_about_a_hash_is_caught_for_old_versions(
    store: AdapterStore, adapter_dir: Path
):
    old = store.publish(adapter_dir)
    store.publish(adapter_dir)
    alg = store.hash_algorithm
    right = json.loads((old.path / "manifest.json").read_bytes())["files"]["adapter_config.json"]
    assert right[alg] == _digest(alg, (adapter_dir / "adapter_config.json").read_bytes())

    def lie(doc: Doc) -> None:
        # Right size, wrong digest of the right length.
        doc["files"]["adapter_config.json"][alg] = "0" * len(right[alg])

    _rewrite_manifest(old.path, lie)
    with pytest.raises(VerificationError, match=rf"adapter_config\.json: {alg}"):
        store.verify(old.version, use_cache=False)


def test_manifest_that_lies_consistently_is_caught_by_the_pointer(
    store: AdapterStore, adapter_dir: Path
):
    pv = store.publish(adapter_dir)
    # Swap the weights and write a manifest that matches the swapped bytes: only the pointer's
    # record of the manifest's own sha256 can tell.
    weights = pv.path / "adapter_model.safetensors"
    forged = weights.read_bytes()[::-1]
    weights.write_bytes(forged)

    def forge(doc: Doc) -> None:
        alg = doc.get("hash_algorithm", "sha256")
        doc["files"]["adapter_model.safetensors"][alg] = _digest(alg, forged)

    _rewrite_manifest(pv.path, forge)
    with pytest.raises(VerificationError, match="sha256 does not match the one recorded in"):
        store.verify(pv.version, use_cache=False)


def _set(key: str, value: object) -> Callable[[Doc], object]:
    return lambda doc: doc.update({key: value})


def _set_file(name: str, key: str, value: object) -> Callable[[Doc], object]:
    def edit(doc: Doc) -> None:
        files: dict[str, dict[str, object]] = doc["files"]
        entry = dict(files.get(name) or next(iter(files.values())))
        entry[key] = value
        files[name] = entry

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("version", 99), "manifest says version 99"),
        (_set("total_size", 1), "total_size 1 != sum of file sizes"),
        (_set("format", "other"), "unknown manifest format"),
        (_set("files", {}), "'files' must be a non-empty object"),
        (_set_file("adapter_config.json", "size", -1), "size must be an integer"),
        (_set_file("../x", "size", 1), "invalid file name"),
        (_set("hash_algorithm", "md5"), "unknown hash_algorithm 'md5'"),
    ],
)
def test_malformed_manifest_fields(
    store: AdapterStore, adapter_dir: Path, edit: Callable[[Doc], object], message: str
):
    old = store.publish(adapter_dir)
    store.publish(adapter_dir)
    _rewrite_manifest(old.path, edit)
    with pytest.raises(VerificationError, match=message):
        store.verify(old.version, use_cache=False)


def test_unparsable_manifest_and_pointer(store: AdapterStore, adapter_dir: Path):
    pv = store.publish(adapter_dir)
    (store.root / "latest").write_text("{broken")
    with pytest.raises(VerificationError, match="latest: not valid JSON"):
        store.latest()
    (store.root / "latest").write_text(
        json.dumps(
            {
                "format": "weight-sync/latest/v1",
                "version": 1,
                "manifest_sha256": "f" * 64,
                "updated_at": 0,
            }
        )
    )
    (pv.path / "manifest.json").write_bytes(b"\x00\xff")
    with pytest.raises(VerificationError):
        store.verify(1)


def test_verification_cache_avoids_rehashing_unchanged_files(
    store: AdapterStore, adapter_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    pv = store.publish(adapter_dir)
    calls: list[Path] = []
    real = hash_path_mapped

    def counting(path: Path, alg: str):
        calls.append(path)
        return real(path, alg)

    monkeypatch.setattr(fs_mod, "hash_path_mapped", counting)
    store.verify(pv.version)
    assert len(calls) == 2
    store.verify(pv.version)
    assert len(calls) == 2  # cached
    store.verify(pv.version, use_cache=False)
    assert len(calls) == 4  # explicit full re-hash


def test_verify_of_removed_version(store: AdapterStore, adapter_dir: Path):
    store.publish(adapter_dir)
    store.publish(adapter_dir)
    store.gc(keep=1)
    with pytest.raises(VersionNotFoundError, match="does not exist"):
        store.verify(1)


def test_manifest_switched_to_another_algorithm_is_caught(store: AdapterStore, adapter_dir: Path):
    # Relabelling the digests as the other algorithm must not pass: each is checked as named.
    old = store.publish(adapter_dir)
    store.publish(adapter_dir)
    alg = store.hash_algorithm
    other = "sha256" if alg == "xxh3-128" else "xxh3-128"

    def relabel(doc: Doc) -> None:
        for entry in doc["files"].values():
            entry[other] = (entry.pop(alg) * 2)[: {"sha256": 64, "xxh3-128": 32}[other]]
        doc["hash_algorithm"] = other

    _rewrite_manifest(old.path, relabel)
    with pytest.raises(VerificationError, match=f"{other} .* does not match the manifest"):
        store.verify(old.version, use_cache=False)


def test_manifest_without_hash_algorithm_is_sha256(tmp_path: Path, adapter_dir: Path):
    # What every manifest written before the field existed looks like.
    store = AdapterStore(tmp_path / "root", hash_algorithm="sha256")
    pv = store.publish(adapter_dir)
    doc = json.loads((pv.path / "manifest.json").read_bytes())
    assert "hash_algorithm" not in doc
    for name, entry in doc["files"].items():
        assert set(entry) == {"size", "sha256"}
        assert entry["sha256"] == hashlib.sha256((adapter_dir / name).read_bytes()).hexdigest()
    reader = AdapterStore(store.root, hash_algorithm="xxh3-128")  # a reader set up for fast
    assert reader.verify(pv.version, use_cache=False).manifest.hash_algorithm == "sha256"


def test_fast_manifest_names_its_algorithm(tmp_path: Path, adapter_dir: Path):
    store = AdapterStore(tmp_path / "root", hash_algorithm="xxh3-128")
    pv = store.publish(adapter_dir)
    doc = json.loads((pv.path / "manifest.json").read_bytes())
    assert doc["hash_algorithm"] == "xxh3-128"
    for name, entry in doc["files"].items():
        assert set(entry) == {"size", "xxh3-128"}
        assert entry["xxh3-128"] == _digest("xxh3-128", (adapter_dir / name).read_bytes())
    assert store.verify(pv.version, use_cache=False).manifest.hash_algorithm == "xxh3-128"


def test_unknown_or_unavailable_algorithm_is_refused(
    tmp_path: Path, adapter_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(WeightSyncError, match="unknown hash algorithm 'md5'"):
        AdapterStore(tmp_path / "root", hash_algorithm="md5")
    fast = AdapterStore(tmp_path / "root", hash_algorithm="xxh3-128")
    pv = fast.publish(adapter_dir)
    monkeypatch.setitem(sys.modules, "xxhash", None)  # as if not installed
    assert AdapterStore(tmp_path / "root").hash_algorithm == "sha256"  # auto falls back
    with pytest.raises(WeightSyncError, match=r"pip install 'weight-sync\[fast\]'"):
        AdapterStore(tmp_path / "root", hash_algorithm="xxh3-128")
    with pytest.raises(WeightSyncError, match="need the xxhash package"):
        fast.verify(pv.version, use_cache=False)
