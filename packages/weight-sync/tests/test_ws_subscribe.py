from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from weight_sync import AdapterStore, PublishedVersion, Subscriber, VerificationError
from weight_sync.synthetic import adapter_files, tiny

PUBLISHER = """
import sys, time
from weight_sync import AdapterStore
from weight_sync.synthetic import adapter_files, tiny
store = AdapterStore(sys.argv[1])
for seed in range(int(sys.argv[2])):
    time.sleep(float(sys.argv[3]))
    store.publish(adapter_files(tiny(), seed=seed))
"""


def _spawn_publisher(root: Path, count: int, delay: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", PUBLISHER, str(root), str(count), str(delay)])


def test_timeout_when_nothing_is_published(store: AdapterStore):
    with Subscriber(store, poll_interval=0.05) as sub:
        t = time.monotonic()
        assert sub.wait_for_newer(None, timeout=0.2) is None
        assert 0.15 <= time.monotonic() - t < 2.0


@pytest.mark.parametrize("use_inotify", [True, False], ids=["inotify", "polling"])
def test_sees_versions_from_another_process(store: AdapterStore, use_inotify: bool):
    # Polling interval is long in inotify mode, so a prompt wake-up proves inotify worked.
    poll = 5.0 if use_inotify else 0.05
    with Subscriber(store, poll_interval=poll, use_inotify=use_inotify) as sub:
        assert sub.uses_inotify is use_inotify
        proc = _spawn_publisher(store.root, 3, 0.3)
        try:
            seen: list[int] = []
            last = None
            while len(seen) < 3:
                pv = sub.wait_for_newer(last, timeout=30)
                assert pv is not None
                assert pv.published_at is not None
                assert sub.noticed_at is not None
                # Noticed well within a poll interval of the pointer update.
                assert sub.noticed_at - pv.published_at < (1.0 if use_inotify else 2.0)
                seen.append(pv.version)
                last = pv.version
        finally:
            assert proc.wait(timeout=60) == 0
    assert seen == sorted(seen)
    assert seen[-1] == 3


def test_corrupt_latest_is_never_handed_over(store: AdapterStore):
    store.publish(adapter_files(tiny(), seed=1))
    bad = store.publish(adapter_files(tiny(), seed=2))
    weights = bad.path / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with Subscriber(store, poll_interval=0.05) as sub:
        assert sub.wait_for_newer(1, timeout=0.3) is None
        assert isinstance(sub.last_error, VerificationError)
        assert "adapter_model.safetensors" in str(sub.last_error)
        good = store.publish(adapter_files(tiny(), seed=3))
        pv = sub.wait_for_newer(1, timeout=5)
        assert pv is not None
        assert pv.version == good.version


def test_iterator_and_callback(store: AdapterStore):
    with Subscriber(store, poll_interval=0.05) as sub:
        proc = _spawn_publisher(store.root, 2, 0.2)
        try:
            got = [pv.version for pv in sub.iter_versions(idle_timeout=3.0)]
        finally:
            assert proc.wait(timeout=60) == 0
    assert got[-1] == 2
    assert got == sorted(set(got))

    calls: list[PublishedVersion] = []
    with Subscriber(store, poll_interval=0.05) as sub:
        stop = threading.Event()
        publisher = threading.Timer(0.2, lambda: store.publish(adapter_files(tiny(), seed=7)))
        publisher.start()
        n = sub.run(calls.append, after=2, stop=stop, max_versions=1)
        publisher.join()
    assert n == 1
    assert [c.version for c in calls] == [3]
    assert (calls[0].path / "adapter_config.json").exists()


def test_stop_event_ends_iteration(store: AdapterStore):
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    with Subscriber(store, poll_interval=0.05) as sub:
        t = time.monotonic()
        assert list(sub.iter_versions(stop=stop)) == []
        assert time.monotonic() - t < 5


def test_subscriber_pins_the_version_it_handed_over(store: AdapterStore):
    store.publish(adapter_files(tiny(), seed=1))
    with Subscriber(store, poll_interval=0.05, reader="engine-0", lease_ttl=60) as sub:
        first = sub.wait_for_newer(None, timeout=5)
        assert first is not None
        assert first.version == 1
        store.publish(adapter_files(tiny(), seed=2))
        store.publish(adapter_files(tiny(), seed=3))
        assert store.gc(keep=1).pinned == [1]  # the engine still runs version 1
        second = sub.wait_for_newer(1, timeout=5)
        assert second is not None
        assert second.version == 3
        assert store.gc(keep=1).removed == [1]  # pin moved to version 3
        assert [le.version for le in store.leases()] == [3]
    assert store.leases() == []
