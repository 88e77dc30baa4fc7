from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from weight_sync import AdapterStore, LeaseError, VersionNotFoundError
from weight_sync.synthetic import adapter_files, tiny


def _publish_n(store: AdapterStore, n: int) -> None:
    for seed in range(n):
        store.publish(adapter_files(tiny(), seed=seed))


def test_gc_keeps_newest_k(store: AdapterStore):
    _publish_n(store, 5)
    report = store.gc(keep=2)
    assert report.removed == [1, 2, 3]
    assert report.kept == [4, 5]
    assert store.versions() == [4, 5]
    assert sorted(os.listdir(store.root / "versions")) == ["v000000004", "v000000005"]
    assert os.listdir(store.root / ".trash") == []
    with pytest.raises(ValueError, match="keep must be >= 1"):
        store.gc(keep=0)


def test_publish_with_keep_collects(store: AdapterStore):
    for seed in range(4):
        store.publish(adapter_files(tiny(), seed=seed), keep=2)
    assert store.versions() == [3, 4]


def test_pinned_version_survives_gc_until_released(store: AdapterStore):
    _publish_n(store, 3)
    with store.pin(1, "engine-a", ttl=60) as lease:
        assert lease.path.exists()
        report = store.gc(keep=1)
        assert report.pinned == [1]
        assert report.removed == [2]
        store.verify(1, use_cache=False)
    assert not lease.path.exists()
    assert store.gc(keep=1).removed == [1]
    assert store.versions() == [3]


def test_expired_lease_does_not_protect(store: AdapterStore):
    _publish_n(store, 2)
    lease = store.pin(1, "engine-b", ttl=0.05)
    time.sleep(0.1)
    report = store.gc(keep=1)
    assert report.removed == [1]
    assert report.expired_leases_removed == 1
    assert not lease.path.exists()
    with pytest.raises(LeaseError, match="lease is gone"):
        lease.renew(10)


def test_lease_renew_extends_expiry(store: AdapterStore):
    _publish_n(store, 2)
    lease = store.pin(1, "engine-c", ttl=0.2)
    first = lease.expires_at
    lease.renew(60)
    assert lease.expires_at > first + 50
    time.sleep(0.3)
    assert store.gc(keep=1).pinned == [1]
    info = json.loads(lease.path.read_bytes())
    assert info["reader"] == "engine-c"
    assert info["pid"] == os.getpid()
    lease.release()


def test_pin_errors(store: AdapterStore):
    with pytest.raises(VersionNotFoundError, match="cannot pin version 1"):
        store.pin(1, "r1")
    _publish_n(store, 1)
    with pytest.raises(LeaseError, match="reader id"):
        store.pin(1, "bad/reader")
    with pytest.raises(LeaseError, match="ttl must be > 0"):
        store.pin(1, "r1", ttl=0)
    with pytest.raises(VersionNotFoundError):
        store.pin(2, "r1")
    assert [e for e in os.listdir(store.root / "leases") if not e.startswith(".")] == []


def test_lease_held_by_another_process_is_honoured(store: AdapterStore):
    _publish_n(store, 3)
    code = (
        "import sys, time\n"
        "from weight_sync import AdapterStore\n"
        "lease = AdapterStore(sys.argv[1]).pin(1, 'other-proc', ttl=60)\n"
        "print('pinned', flush=True)\n"
        "sys.stdin.readline()\n"
        "lease.release()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(store.root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    try:
        assert proc.stdout.readline().strip() == "pinned"
        assert store.gc(keep=1).pinned == [1]
        store.verify(1, use_cache=False)
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    assert store.gc(keep=1).removed == [1]


def test_gc_collects_leftovers_of_crashed_publishers(store: AdapterStore):
    _publish_n(store, 2)
    (store.root / ".staging" / "deadbeef").mkdir()
    (store.root / ".staging" / "deadbeef" / "adapter_model.safetensors").write_bytes(b"torn")
    (store.root / ".trash" / "v000000000.abc").mkdir()
    (store.root / ".latest.tmp.123").write_bytes(b"{")
    # Renamed into versions/ but killed before the pointer moved: never published.
    orphan = store.root / "versions" / "v000000003"
    orphan.mkdir()
    (orphan / "manifest.json").write_bytes(b"{}")
    with pytest.raises(VersionNotFoundError, match="version 3 is not published"):
        store.get(3)
    report = store.gc(keep=5)
    assert sorted(report.leftovers_removed) == [
        ".latest.tmp.123",
        ".staging/deadbeef",
        ".trash/v000000000.abc",
        "versions/v000000003",
    ]
    assert store.versions() == [1, 2]
    # And a retry of the orphaned version number now succeeds.
    assert store.publish(adapter_files(tiny(), seed=9), version=3).version == 3


def test_pin_and_gc_race_never_loses_a_pinned_version(store: AdapterStore):
    _publish_n(store, 2)
    violations: list[str] = []
    pins = 0
    stop = threading.Event()
    first_pin = threading.Event()

    def reader() -> None:
        nonlocal pins
        deadline = time.monotonic() + 3.0
        reader_store = AdapterStore(store.root)
        while time.monotonic() < deadline and not stop.is_set():
            try:
                lease = reader_store.pin(1, "racer", ttl=30)
            except VersionNotFoundError:
                return  # gc won the race fairly: v1 is gone and was never pinned meanwhile
            pins += 1
            first_pin.set()
            for _ in range(3):
                if not (reader_store.version_path(1) / "manifest.json").exists():
                    violations.append("pinned version vanished")
            lease.release()

    t = threading.Thread(target=reader)
    t.start()
    assert first_pin.wait(timeout=10)
    gc_store = AdapterStore(store.root)
    deadline = time.monotonic() + 3.0
    while t.is_alive() and time.monotonic() < deadline:
        gc_store.gc(keep=1)
    stop.set()
    t.join(timeout=10)
    assert violations == []
    assert pins > 0
