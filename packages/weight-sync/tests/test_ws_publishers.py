"""Two publishers at once, and a publisher killed while holding the lock (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from weight_sync import AdapterStore, PublisherBusyError, VersionConflictError

SLOW_PUBLISHER = """
import sys, time
from weight_sync import AdapterStore
from weight_sync.synthetic import adapter_files, tiny

def hook(name, offset):
    print("writing", name, flush=True)
    time.sleep(float(sys.argv[3]))

store = AdapterStore(sys.argv[1], write_hook=hook)
store.publish(adapter_files(tiny(), seed=5), version=int(sys.argv[2]))
print("done", flush=True)
"""


def _start_slow(root: Path, version: int, pause: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_PUBLISHER, str(root), str(version), str(pause)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("writing"), line
    return proc


def test_second_publisher_gets_a_clear_error(store: AdapterStore, adapter_dir: Path):
    store.publish(adapter_dir, version=1)
    proc = _start_slow(store.root, 2, pause=1.0)
    try:
        with pytest.raises(PublisherBusyError, match=f"pid {proc.pid} on .*refusing to publish"):
            store.publish(adapter_dir, version=3)
        with pytest.raises(PublisherBusyError, match="refusing to gc"):
            store.gc(keep=1, lock_timeout=0.1)
        store.verify(1, use_cache=False)  # readers are unaffected meanwhile
    finally:
        assert proc.wait(timeout=30) == 0
    assert store.versions() == [1, 2]
    assert store.publish(adapter_dir).version == 3
    for v in (1, 2, 3):
        store.verify(v, use_cache=False)


def test_waiting_publisher_with_same_version_is_refused_after_the_first(
    store: AdapterStore, adapter_dir: Path
):
    proc = _start_slow(store.root, 4, pause=0.3)
    try:
        with pytest.raises(VersionConflictError, match="latest is 4"):
            store.publish(adapter_dir, version=4, lock_timeout=30)
    finally:
        assert proc.wait(timeout=30) == 0
    assert store.versions() == [4]
    store.verify(4, use_cache=False)


def test_publisher_killed_mid_write_leaves_no_stale_lock(store: AdapterStore, adapter_dir: Path):
    store.publish(adapter_dir, version=1)
    proc = _start_slow(store.root, 2, pause=30.0)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert len(os.listdir(store.root / ".staging")) == 1  # the torn leftover
    assert store.latest_version() == 1
    # The kernel dropped the flock with the process: no waiting, no manual cleanup.
    pv = store.publish(adapter_dir, version=2)
    assert pv.version == 2
    assert os.listdir(store.root / ".staging") == []
    for v in (1, 2):
        store.verify(v, use_cache=False)
