"""Benchmark: publish vs a plain copy of the same bytes; subscriber hand-over vs a plain read.

    uv run python packages/weight-sync/benchmarks/bench_publish.py --dir DIR [--rounds 5]
        [--latency-samples 30] [--rank 32] [--poll-interval 0.02]

DIR is a work directory on the filesystem to measure; everything written there is removed.
Publish is timed with each checksum (``xxh3-128``, the default where ``xxhash`` is installed,
and ``sha256``, what older manifests use) beside ``shutil.copytree`` with and without fsync.
The subscriber process times its hand-over (pin + verify every file + return) of each publish
and, right after it, one plain read of the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from weight_sync._hashing import SHA256, XXH3_128, fast_available, hash_path_mapped
from weight_sync.fs import fsync_dir, hash_file
from weight_sync.store import AdapterStore
from weight_sync.subscriber import Subscriber
from weight_sync.synthetic import qwen3_vl_8b, write_adapter

Sample = tuple[float, float]  # (wall seconds, CPU seconds of this process, all threads)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(fn: Callable[[], object]) -> Sample:
    os.sync()  # start every timing with no dirty pages from the previous one
    c, t = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t, _cpu() - c


def _copy(src: Path, dst: Path, *, fsync: bool) -> None:
    shutil.copytree(src, dst)
    if fsync:
        for f in dst.iterdir():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dst)


def _hash_all(src: Path, alg: str) -> None:
    for f in src.iterdir():
        if alg == SHA256:
            hash_file(f)  # read into a buffer, as sha256 was always computed
        else:
            hash_path_mapped(f, alg)


_READ_BUF = bytearray(8 << 20)


def _read_all(path: Path) -> int:
    """Read every file of ``path`` once into one 8 MiB buffer; the bytes read."""
    total = 0
    for f in sorted(path.iterdir()):
        with open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(_READ_BUF):
                total += n
    return total


Latency = tuple[list[float], list[float], list[float]]


def _latency(
    root: Path, src: Path, samples: int, *, inotify: bool, poll_interval: float, alg: str
) -> Latency:
    """Publish ``samples`` versions; a subscriber *process* reports when it noticed each.

    Returns the notice latency, the hand-over time and the plain read time, in ms.
    """
    store = AdapterStore(root, hash_algorithm=alg)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--subscriber",
        str(root),
        str(samples),
        str(poll_interval),
        "1" if inotify else "0",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    notice: list[float] = []
    handover: list[float] = []
    read: list[float] = []
    try:
        ready = proc.stdout.readline()
        if ready.strip() != "ready":
            raise SystemExit(f"subscriber failed to start: {ready!r}")
        base = store.latest_version() or 0
        for i in range(1, samples + 1):
            time.sleep(0.05)  # let the subscriber go back to sleep, as in steady state
            store.publish(src, version=base + i, keep=2)
            line = proc.stdout.readline()
            rec = json.loads(line)
            notice.append(rec["notice_ms"])
            handover.append(rec["handover_ms"])
            read.append(rec["read_ms"])
    finally:
        proc.wait(timeout=60)
    return notice, handover, read


def _subscriber_main(root: str, samples: int, poll_interval: float, inotify: bool) -> None:
    store = AdapterStore(root)
    with Subscriber(store, poll_interval=poll_interval, use_inotify=inotify) as sub:
        last = store.latest_version()
        print("ready", flush=True)
        for _ in range(samples):
            pv = sub.wait_for_newer(last, timeout=60)
            if pv is None:
                raise SystemExit("timed out waiting for a version")
            done = time.time()
            assert pv.published_at is not None
            assert sub.noticed_at is not None
            # The peer: the same files read once, straight after (equally hot in the cache).
            t0 = time.perf_counter()
            _read_all(pv.path)
            read_s = time.perf_counter() - t0
            rec = {
                "version": pv.version,
                "notice_ms": (sub.noticed_at - pv.published_at) * 1000,
                "handover_ms": (done - sub.noticed_at) * 1000,
                "read_ms": read_s * 1000,
            }
            print(json.dumps(rec), flush=True)
            last = pv.version


def _fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs):7.3f}  min {min(xs):7.3f}  max {max(xs):7.3f}"


_ROWS = {
    "copy": "plain copy (shutil.copytree)",
    "copy_fsync": "plain copy + fsync",
    "publish": "publish, xxh3-128 (default)",
    "publish_sha256": "publish, sha256",
    "publish_nofsync": "publish, xxh3-128, no fsync",
    "hash": "xxh3-128 of the same bytes (mmap)",
    "hash_sha256": "sha256 of the same bytes (read)",
}


def run_bench(
    *,
    workdir: Path,
    rounds: int,
    latency_samples: int,
    rank: int = 32,
    poll_interval: float = 0.02,
) -> int:
    """Time hashing, copying and publishing a Qwen3-VL-8B-sized adapter, then subscriber latency.

    Everything is written in a temporary directory under ``workdir`` and removed afterwards.
    Returns the exit code (0, or 1 when ``xxhash`` is missing).
    """
    if not fast_available():
        print("xxhash is not installed (pip install 'weight-sync[fast]'); nothing to compare")
        return 1
    shape = qwen3_vl_8b(rank)
    workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="weight-sync-bench-", dir=workdir) as tmp:
        base = Path(tmp)
        src = write_adapter(base / "src", shape, seed=0)
        size = sum(f.stat().st_size for f in src.iterdir())
        print(
            f"adapter: Qwen3-VL-8B rank {rank}, {shape.num_params / 1e6:.1f}M params, "
            f"{size / 1e6:.1f} MB bf16; dir {workdir.resolve()}; {rounds} rounds"
        )
        stores = {
            "publish": AdapterStore(base / "store", hash_algorithm=XXH3_128),
            "publish_sha256": AdapterStore(base / "store-sha256", hash_algorithm=SHA256),
            "publish_nofsync": AdapterStore(
                base / "store-nofsync", durable=False, hash_algorithm=XXH3_128
            ),
        }
        rows: dict[str, list[Sample]] = {k: [] for k in _ROWS}
        for r in range(1, rounds + 1):
            # Interleaved, so drift in the machine's load hits every row alike.
            rows["hash"].append(_timed(lambda: _hash_all(src, XXH3_128)))
            rows["hash_sha256"].append(_timed(lambda: _hash_all(src, SHA256)))
            plain, synced = base / f"c{r}", base / f"s{r}"
            rows["copy"].append(_timed(lambda d=plain: _copy(src, d, fsync=False)))
            rows["copy_fsync"].append(_timed(lambda d=synced: _copy(src, d, fsync=True)))
            shutil.rmtree(plain)
            shutil.rmtree(synced)
            for key, store in stores.items():
                store.gc(keep=1)  # retention is not part of the copy being compared
                rows[key].append(_timed(lambda s=store, v=r: s.publish(src, version=v)))
        med = {k: statistics.median(w for w, _ in v) for k, v in rows.items()}
        print("\nseconds per adapter: wall clock (median, min, max of rounds) | median CPU")
        for key, label in _ROWS.items():
            wall = [w for w, _ in rows[key]]
            cpu = statistics.median(c for _, c in rows[key])
            print(f"  {label:36s}{_fmt(wall)} | cpu {cpu:6.3f}")
        cf = med["copy_fsync"]
        print(
            f"  ratio publish xxh3-128 / (copy + fsync)  {med['publish'] / cf:.2f}x  "
            "(target <= 1.2x)"
        )
        print(f"  ratio publish sha256 / (copy + fsync)    {med['publish_sha256'] / cf:.2f}x")
        print(f"  ratio publish xxh3-128 / plain copy      {med['publish'] / med['copy']:.2f}x")
        print(
            f"  ratio publish no fsync / plain copy      "
            f"{med['publish_nofsync'] / med['copy']:.2f}x"
        )
        for key in ("publish_sha256", "publish_nofsync"):
            shutil.rmtree(stores[key].root)

        if latency_samples > 0:
            print(f"\nsubscriber in another process, {latency_samples} publishes, milliseconds")
            runs = [(True, XXH3_128), (False, XXH3_128), (True, SHA256)]
            for inotify, alg in runs:
                root = base / f"store-{alg}-{int(inotify)}"
                notice, handover, read = _latency(
                    root,
                    src,
                    latency_samples,
                    inotify=inotify,
                    poll_interval=poll_interval if not inotify else 0.5,
                    alg=alg,
                )
                shutil.rmtree(root)
                mode = "inotify" if inotify else f"polling every {poll_interval * 1000:.0f} ms"
                ratio = statistics.median(handover) / statistics.median(read)
                print(f"  {alg}, {mode}: notice     {_fmt(notice)}  (target median <= 50)")
                print(f"  {alg}, {mode}: hand-over  {_fmt(handover)}  (pin + verify all + return)")
                print(f"  {alg}, {mode}: plain read {_fmt(read)}  (same files, read once)")
                print(f"  {alg}, {mode}: ratio hand-over / plain read {ratio:.2f}x  (target <= 2x)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, or with ``--subscriber ...`` act as the subscriber child of the latency test."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 5 and argv[0] == "--subscriber":  # the child process of _latency
        _subscriber_main(argv[1], int(argv[2]), float(argv[3]), argv[4] == "1")
        return 0
    p = argparse.ArgumentParser(description="publish vs plain copy, and subscriber latency")
    p.add_argument("--dir", type=Path, default=Path("."), help="work dir on the disk to test")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--latency-samples", type=int, default=30)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--poll-interval", type=float, default=0.02)
    args = p.parse_args(argv)
    return run_bench(
        workdir=args.dir,
        rounds=args.rounds,
        latency_samples=args.latency_samples,
        rank=args.rank,
        poll_interval=args.poll_interval,
    )


if __name__ == "__main__":
    sys.exit(main())
