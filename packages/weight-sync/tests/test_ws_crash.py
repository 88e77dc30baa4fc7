"""A publisher SIGKILLed at random points, 100 times, while readers load in a loop.

Readers (separate processes: one raw loop with leases, one ``Subscriber``) must never see a
torn or unverifiable version: every hand-over verifies against the manifest and the bytes are
compared with what the publisher was asked to write. Publishers are forked from a warm
spawner so each kill costs milliseconds, not an interpreter start-up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from weight_sync import AdapterStore

COMMON = """
import sys, os, json, time
from pathlib import Path
from weight_sync import AdapterStore
from weight_sync.synthetic import adapter_files, tiny, write_adapter
SHAPE = tiny(rank=16, num_layers=2, hidden=256)  # ~260 KB
EXPECTED = [adapter_files(SHAPE, seed=s) for s in range(4)]
root = Path(sys.argv[1])
"""

SPAWNER = (
    COMMON
    + """
sources = [write_adapter(root.parent / f"src{s}", SHAPE, seed=s) for s in range(4)]

def publish_forever(durable):
    store = AdapterStore(root, durable=durable)
    while True:
        v = (store.latest_version() or 0) + 1
        # Alternate the two write paths: directory copy and in-memory files.
        src = sources[v % 4] if v % 2 else EXPECTED[v % 4]
        store.publish(src, version=v, step=v * 10, keep=3, lock_timeout=5)

print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "go":
        pid = os.fork()
        if pid == 0:
            try:
                publish_forever(cmd[1] == "durable")
            finally:
                os._exit(1)
        print(pid, flush=True)
    elif cmd[0] == "reap":
        _, status = os.waitpid(int(cmd[1]), 0)
        print(status, flush=True)
"""
)

READER = (
    COMMON
    + """
from weight_sync import Subscriber, VerificationError, VersionNotFoundError
mode, stop = sys.argv[2], Path(sys.argv[3])
store = AdapterStore(root)
failures, loads, gone, versions = [], 0, 0, set()

def check(pv):
    global loads
    want = EXPECTED[pv.version % 4]
    if sorted(pv.manifest.files) != sorted(want):
        failures.append(f"v{pv.version}: files {sorted(pv.manifest.files)}")
    for name, data in want.items():
        if (pv.path / name).read_bytes() != data:
            failures.append(f"v{pv.version}: {name} differs from what was published")
    if pv.step != pv.version * 10:
        failures.append(f"v{pv.version}: step {pv.step}")
    loads += 1
    versions.add(pv.version)

if mode == "loop":
    while not stop.exists():
        try:
            v = store.latest_version()
        except VerificationError as exc:
            failures.append(f"pointer: {exc}")
            continue
        if v is None:
            time.sleep(0.001)
            continue
        try:
            with store.pin(v, f"loop-{os.getpid()}", ttl=30):
                check(store.verify(v, use_cache=False))
        except VersionNotFoundError:
            gone += 1
        except VerificationError as exc:
            failures.append(str(exc))
        time.sleep(0.002)  # an engine does real work between loads; leave CPU to the rest
else:
    with Subscriber(store, poll_interval=0.01, reader=f"sub-{os.getpid()}") as sub:
        last = None
        while not stop.exists():
            pv = sub.wait_for_newer(last, timeout=0.1)
            if sub.last_error is not None:
                failures.append(str(sub.last_error))
                sub.last_error = None
            if pv is not None:
                try:
                    check(pv)
                except FileNotFoundError as exc:
                    failures.append(f"pinned version vanished: {exc}")
                last = pv.version
print(json.dumps({"failures": failures, "loads": loads, "gone": gone,
                  "versions": len(versions)}), flush=True)
"""
)

KILLS = 100


def test_sigkill_publisher_100_times_while_readers_load(tmp_path: Path):
    root = tmp_path / "root"
    store = AdapterStore(root)
    stop = tmp_path / "stop"
    rng = random.Random(1234)
    spawner = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert spawner.stdin is not None
    assert spawner.stdout is not None
    readers = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(root), mode, str(stop)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for mode in ("loop", "subscriber")
    ]
    torn_leftovers = 0
    started = time.monotonic()
    try:
        assert spawner.stdout.readline().strip() == "ready"
        for i in range(KILLS):
            # fsync makes publishes slow, so without it kills land in many more of them;
            # a SIGKILL loses no page cache, so both modes must be equally safe here.
            durable = i % 2 == 1
            spawner.stdin.write("go durable\n" if durable else "go fast\n")
            spawner.stdin.flush()
            pid = int(spawner.stdout.readline())
            time.sleep(rng.uniform(0.0, 0.3 if durable else 0.08))
            os.kill(pid, signal.SIGKILL)
            spawner.stdin.write(f"reap {pid}\n")
            spawner.stdin.flush()
            status = int(spawner.stdout.readline())
            assert os.WIFSIGNALED(status), f"publisher exited by itself: status {status}"
            assert os.WTERMSIG(status) == signal.SIGKILL
            staged = list((root / ".staging").iterdir()) if (root / ".staging").exists() else []
            torn_leftovers += bool(staged)
            assert time.monotonic() - started < 50, "crash loop too slow"
    finally:
        stop.touch()
        spawner.stdin.close()
        spawner.wait(timeout=30)
    results: list[dict[str, Any]] = []
    for proc in readers:
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))

    print(f"kills={KILLS} torn_leftovers={torn_leftovers} readers={results}")
    for res in results:
        assert res["failures"] == []
        assert res["loads"] > 0
    assert results[1]["versions"] >= 5  # the subscriber saw many versions come and go
    # Kills landed mid-publish (torn staging dirs existed), yet nothing torn was ever read.
    assert torn_leftovers > 0

    # The store is healthy: no stale lock, every kept version verifies, leftovers collected.
    latest = store.latest_version()
    assert latest is not None
    assert latest > 10
    final = store.publish(tmp_path / "src1", version=latest + 1, step=(latest + 1) * 10)
    assert final.version == latest + 1
    report = store.gc(keep=3)
    for v in store.versions():
        store.verify(v, use_cache=False)
    assert os.listdir(root / ".staging") == []
    assert len(store.versions()) == 3
    assert report.kept == store.versions()
