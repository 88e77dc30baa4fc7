"""``weight_sync.fs``: atomic files, staged directories and manifests, including writers
SIGKILLed mid-write (forked from a warm spawner so each kill costs milliseconds)."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from weight_sync import Manifest, VerificationError, WeightSyncError, fs

SPAWNER = """
import os, sys
from pathlib import Path
from weight_sync import fs

target = Path(sys.argv[1])

def payload(k):
    # Sizes differ per generation, so a torn file is never a valid payload of another one.
    return bytes([k % 251]) * (64 * 1024 + 1024 * (k % 251))

def write_files_forever(durable):
    k = int.from_bytes(os.urandom(2), "big")
    while True:
        k += 1
        fs.atomic_write_bytes(target, payload(k), durable=durable)

def write_dirs_forever(durable):
    k = int.from_bytes(os.urandom(2), "big")
    while True:
        k += 1
        with fs.staged_dir(target, durable=durable) as tmp:
            for name in ("a.bin", "b.bin", "c.bin"):
                (tmp / name).write_bytes(payload(k))
            fs.write_manifest(tmp, version=k, durable=durable)

print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "go":
        pid = os.fork()
        if pid == 0:
            try:
                work = write_files_forever if cmd[1] == "file" else write_dirs_forever
                work(cmd[2] == "durable")
            finally:
                os._exit(1)
        print(pid, flush=True)
    elif cmd[0] == "reap":
        _, status = os.waitpid(int(cmd[1]), 0)
        print(status, flush=True)
"""


def _is_payload(data: bytes) -> bool:
    if not data:
        return False
    k = data[0]
    return data == bytes([k]) * (64 * 1024 + 1024 * k)


class Spawner:
    def __init__(self, target: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SPAWNER, str(target)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        assert self.stdout.readline().strip() == "ready"

    def ask(self, line: str) -> int:
        self.stdin.write(line + "\n")
        self.stdin.flush()
        return int(self.stdout.readline())

    def kill_after(self, mode: str, durable: bool, delay: float, during: Iterator[None]) -> None:
        """Start a writer, let it run ``delay`` seconds (stepping ``during``), SIGKILL it."""
        pid = self.ask(f"go {mode} {'durable' if durable else 'fast'}")
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            next(during)
        os.kill(pid, signal.SIGKILL)
        status = self.ask(f"reap {pid}")
        assert os.WIFSIGNALED(status), f"writer exited by itself: status {status}"

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def spawner(tmp_path: Path) -> Iterator[Spawner]:
    s = Spawner(tmp_path / "target")
    try:
        yield s
    finally:
        s.close()


def _exchange_supported(where: Path) -> bool:
    """Whether this filesystem swaps two directories with renameat2(RENAME_EXCHANGE)."""
    a, b = where / "xa", where / "xb"
    a.mkdir()
    b.mkdir()
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
        return fn is not None and fn(-100, bytes(a), -100, bytes(b), 2) == 0
    finally:
        a.rmdir()
        b.rmdir()


def _no_exchange(a: Path, b: Path) -> bool:
    return False


def _read_tree(target: Path) -> dict[str, bytes] | None:
    """Every file of ``target`` read through one directory fd, so a swap cannot mix two trees;
    ``None`` when the tree read is no longer the one at ``target`` (swapped out meanwhile)."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        out: dict[str, bytes] = {}
        for name in os.listdir(fd):
            with open(name, "rb", opener=lambda n, flags: os.open(n, flags, dir_fd=fd)) as f:
                out[name] = f.read()
        if os.stat(target).st_ino != os.fstat(fd).st_ino:
            return None
        return out
    except FileNotFoundError:
        return None  # a file of a tree that was swapped out and is being deleted
    finally:
        os.close(fd)


def test_sigkilled_file_writer_never_leaves_a_torn_target(tmp_path: Path, spawner: Spawner):
    target = tmp_path / "target"
    rng = random.Random(7)
    reads = 0

    def read_concurrently() -> Iterator[None]:
        nonlocal reads
        while True:
            if target.exists():
                assert _is_payload(target.read_bytes())
                reads += 1
            yield

    reader = read_concurrently()
    for i in range(40):
        spawner.kill_after("file", i % 2 == 1, rng.uniform(0.005, 0.05), reader)
        if i == 0 and not target.exists():
            continue  # killed before its first rename: nothing was ever published
        assert _is_payload(target.read_bytes()), f"torn target after kill {i}"
    assert reads > 40
    # A kill mid-write leaves at most its own temp file; the target is never one of them.
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "target"]
    assert all(n.startswith(".target.tmp.") for n in leftovers), leftovers


def test_sigkilled_staged_dir_writer_never_leaves_a_half_directory(
    tmp_path: Path, spawner: Spawner
):
    target = tmp_path / "target"
    atomic_swap = _exchange_supported(tmp_path)
    rng = random.Random(11)
    seen: set[int] = set()

    def check(where: Path) -> None:
        manifest = fs.verify_manifest(where)
        assert sorted(manifest.files) == ["a.bin", "b.bin", "c.bin"]
        assert all(_is_payload((where / n).read_bytes()) for n in manifest.files)
        seen.add(manifest.version)

    def read_concurrently() -> Iterator[None]:
        while True:
            tree = _read_tree(target)
            if tree is not None:
                manifest = Manifest.from_json(tree.pop("manifest.json"), str(target))
                assert sorted(tree) == sorted(manifest.files) == ["a.bin", "b.bin", "c.bin"]
                for name, data in tree.items():
                    assert hashlib.sha256(data).hexdigest() == manifest.files[name].digest
                    assert _is_payload(data)
                seen.add(manifest.version)
            yield

    reader = read_concurrently()
    for i in range(30):
        spawner.kill_after("dir", i % 3 == 2, rng.uniform(0.01, 0.08), reader)
        if target.exists():
            check(target)
        elif seen:
            # Only without RENAME_EXCHANGE: killed between renaming the old tree away and the
            # new one in; the old tree is complete beside it.
            assert not atomic_swap, f"target missing after kill {i}"
            (old,) = tmp_path.glob(".target.old-*")
            check(old)
            old.rename(target)
    assert len(seen) > 5
    for leftover in tmp_path.glob(".target.*"):
        assert ".staging-" in leftover.name or ".old-" in leftover.name


def test_staged_dir_error_leaves_old_target_untouched(tmp_path: Path):
    target = tmp_path / "out"
    with fs.staged_dir(target) as tmp:
        (tmp / "w.bin").write_bytes(b"old")

    def fail() -> None:
        with fs.staged_dir(target) as tmp:
            (tmp / "w.bin").write_bytes(b"new, half written")
            (tmp / "extra.bin").write_bytes(b"x")
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fail()
    assert sorted(p.name for p in target.iterdir()) == ["w.bin"]
    assert (target / "w.bin").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # staging dir removed


def test_staged_dir_error_creates_nothing(tmp_path: Path):
    target = tmp_path / "deep" / "out"

    def interrupted() -> None:
        with fs.staged_dir(target) as tmp:
            (tmp / "w.bin").write_bytes(b"x")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert list((tmp_path / "deep").iterdir()) == []


@pytest.mark.parametrize("exchange", [True, False])
def test_staged_dir_replaces_whole_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
):
    if not exchange:
        monkeypatch.setattr(fs, "_exchange", _no_exchange)
    target = tmp_path / "out"
    with fs.staged_dir(target) as tmp:
        (tmp / "old.bin").write_bytes(b"1")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "nested.bin").write_bytes(b"2")
    with fs.staged_dir(target, durable=False) as tmp:
        (tmp / "new.bin").write_bytes(b"3")
    assert [p.name for p in target.iterdir()] == ["new.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # old tree and staging gone


def test_staged_dir_swap_failure_keeps_old_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    target = tmp_path / "out"
    with fs.staged_dir(target) as tmp:
        (tmp / "w.bin").write_bytes(b"old")
    monkeypatch.setattr(fs, "_exchange", _no_exchange)
    real_rename = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        if ".staging-" in str(src):
            raise OSError(28, "No space left on device")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="No space"), fs.staged_dir(target) as tmp:
        (tmp / "w.bin").write_bytes(b"new")
    assert (target / "w.bin").read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_writes_and_read_json(tmp_path: Path):
    path = tmp_path / "state.json"
    assert fs.read_json(path) is None
    fs.atomic_write_json(path, {"step": 3, "names": ["a"]})
    assert path.read_text() == '{\n  "step": 3,\n  "names": [\n    "a"\n  ]\n}\n'
    assert fs.read_json(path) == {"step": 3, "names": ["a"]}
    fs.atomic_write_json(path, {"b": 1, "a": 2}, indent=None, sort_keys=True, durable=False)
    assert path.read_text() == '{"a": 2, "b": 1}\n'
    fs.atomic_write_text(path, "{not json")
    assert fs.read_json(path) is None
    fs.atomic_write_bytes(path, b"\xff\xfe")
    assert fs.read_json(path) is None
    assert fs.read_json(tmp_path) is None  # a directory is unreadable as a file
    fs.atomic_write_text(tmp_path / "t.txt", "line\r\n", durable=False)
    assert (tmp_path / "t.txt").read_bytes() == b"line\r\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "t.txt"]


def test_failed_atomic_write_keeps_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "f.bin"
    fs.atomic_write_bytes(path, b"old")
    with pytest.raises(TypeError):
        fs.atomic_write_json(path, {"x": object()})

    def replace(src: str | Path, dst: str | Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        fs.atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]  # no temp file left


def _filled(d: Path) -> Path:
    d.mkdir()
    (d / "adapter_model.safetensors").write_bytes(os.urandom(300_000))
    (d / "adapter_config.json").write_text('{"r": 8}')
    return d


def test_manifest_round_trip_uses_the_version_format(tmp_path: Path):
    d = _filled(tmp_path / "d")
    written = fs.write_manifest(d, version=4, step=40, producer="test")
    raw = (d / "manifest.json").read_bytes()
    assert json.loads(raw)["format"] == "weight-sync/manifest/v1"
    assert Manifest.from_json(raw, "x") == written == fs.read_manifest(d)
    entry = written.files["adapter_config.json"]
    assert entry.size == 8 and entry.digest == hashlib.sha256(b'{"r": 8}').hexdigest()
    assert fs.verify_manifest(d) == written
    assert fs.verify_manifest(d, written) == written
    assert (written.version, written.step, written.producer) == (4, 40, "test")


def test_verify_catches_a_changed_byte_even_with_a_cache(tmp_path: Path):
    d = _filled(tmp_path / "d")
    fs.write_manifest(d)
    cache: fs.VerifyCache = {}
    fs.verify_manifest(d, cache=cache)
    assert len(cache) == 2
    weights = d / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[123_456] ^= 0x01
    weights.write_bytes(data)  # same size: only the hash can tell
    with pytest.raises(VerificationError, match=r"adapter_model\.safetensors: sha256"):
        fs.verify_manifest(d, cache=cache)


def test_verify_catches_missing_extra_and_resized_files(tmp_path: Path):
    d = _filled(tmp_path / "d")
    manifest = fs.write_manifest(d)
    (d / "stray.bin").write_bytes(b"x")
    with pytest.raises(VerificationError, match=r"'stray\.bin' is not in the manifest"):
        fs.verify_manifest(d)
    (d / "stray.bin").unlink()
    (d / "adapter_config.json").write_text('{"r": 16}')
    with pytest.raises(VerificationError, match="size 9 != 8"):
        fs.verify_manifest(d, manifest)
    (d / "adapter_config.json").unlink()
    with pytest.raises(
        VerificationError, match=r"'adapter_config\.json' in the manifest is missing"
    ):
        fs.verify_manifest(d)
    (d / "manifest.json").unlink()
    with pytest.raises(VerificationError, match="cannot read manifest"):
        fs.verify_manifest(d)
    (d / "manifest.json").write_text("{}")
    with pytest.raises(VerificationError, match="unknown manifest format"):
        fs.verify_manifest(d)


@pytest.mark.parametrize("bad", ["subdir", "dotfile", "empty", "version"])
def test_write_manifest_refuses_what_it_cannot_describe(tmp_path: Path, bad: str):
    d = tmp_path / "d"
    d.mkdir()
    if bad == "subdir":
        (d / "a.bin").write_bytes(b"x")
        (d / "nested").mkdir()
    elif bad == "dotfile":
        (d / ".hidden").write_bytes(b"x")
    elif bad == "version":
        (d / "a.bin").write_bytes(b"x")
    with pytest.raises(WeightSyncError):
        fs.write_manifest(d, version=-1 if bad == "version" else 0)
    assert not (d / "manifest.json").exists()


def test_fs_is_exported_from_the_package():
    import weight_sync

    assert weight_sync.fs is fs
    assert "fs" in weight_sync.__all__
    for name in fs.__all__:
        assert getattr(fs, name) is not None


def test_recursive_manifest_lists_and_verifies_a_nested_tree(tmp_path: Path):
    tree = tmp_path / "global_step_3"
    (tree / "policy" / "lora_adapter").mkdir(parents=True)
    (tree / "data.pt").write_bytes(b"d")
    (tree / "policy" / "model.pt").write_bytes(b"m" * 10)
    # A nested manifest (a consolidated adapter's own) is content, listed like any file.
    (tree / "policy" / "lora_adapter" / "manifest.json").write_text("{}")
    manifest = fs.write_manifest(tree, step=3, producer="test", recursive=True)
    assert sorted(manifest.files) == [
        "data.pt",
        "policy/lora_adapter/manifest.json",
        "policy/model.pt",
    ]
    assert fs.verify_manifest(tree).step == 3
    (tree / "policy" / "stray.pt").write_bytes(b"x")
    with pytest.raises(VerificationError, match=r"stray\.pt"):
        fs.verify_manifest(tree)
    (tree / "policy" / "stray.pt").unlink()
    (tree / "policy" / "model.pt").write_bytes(b"M" * 10)
    with pytest.raises(VerificationError, match=r"model\.pt"):
        fs.verify_manifest(tree)


def test_flat_manifest_still_refuses_subdirectories(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.bin").write_bytes(b"a")
    with pytest.raises(WeightSyncError, match="sub"):
        fs.write_manifest(tmp_path)


@pytest.mark.parametrize("name", ["../escape", "policy/../x", ".hidden/x", "a//b", "/abs"])
def test_manifest_paths_cannot_escape_the_tree(tmp_path: Path, name: str):
    doc = {
        "format": "weight-sync/manifest/v1",
        "version": 0,
        "step": 0,
        "created_at": "t",
        "producer": "p",
        "total_size": 1,
        "files": {name: {"size": 1, "sha256": "0" * 64}},
    }
    with pytest.raises(VerificationError, match="invalid file name"):
        Manifest.from_json(json.dumps(doc).encode(), "m")
