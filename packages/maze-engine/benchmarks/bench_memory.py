"""Memory of the main job, per process: the learner (driver), each Ray rollout worker, Ray itself.

    uv run python packages/maze-engine/benchmarks/bench_memory.py [--run DIR] [key=value ...]

Runs ``maze-train`` (the main job; extra arguments are its ``key=value`` overrides, e.g.
``trainer.max_training_steps=2`` for a short run) as a child process in a fresh ``--run`` dir
and samples its whole process tree every ``--interval`` seconds. Printed per process: peak RSS
(what ``/usr/bin/time`` reports; it counts shared library pages, e.g. CUDA torch's libraries,
in every process that maps them) and peak USS (memory only that process holds), the peak of
the tree's total at one instant, and the learner's peak within each phase of the run (a phase
starts at each line the job prints).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

MB = 2**20


@dataclass
class Peak:
    """The largest RSS and USS seen for one process."""

    role: str
    rss: int = 0
    uss: int = 0


def _role(proc: psutil.Process, root: int) -> str:
    if proc.pid == root:
        return "learner (maze-train driver)"
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "?"
    if "RolloutWorker" in cmd:
        return "rollout worker"
    if "default_worker.py" in cmd or cmd.startswith("ray::"):
        return "ray worker (idle)" if "IDLE" in cmd else f"ray worker {cmd[:40]}"
    if "ray" in cmd:
        for name in ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor", "agent"):
            if name in cmd:
                return f"ray {name}"
        return "ray other"
    return cmd[:50]


def sample(root: psutil.Process, peaks: dict[int, Peak]) -> tuple[int, int]:
    """Update ``peaks`` from the tree under ``root``; returns its total RSS and USS now."""
    total_rss = total_uss = 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for p in procs:
        try:
            mem = p.memory_full_info()
        except psutil.Error:
            continue
        peak = peaks.get(p.pid)
        if peak is None or peak.role != "rollout worker":
            # Ray renames a worker's process once an actor lands on it: classify it again.
            role = _role(p, root.pid)
            peak = peaks[p.pid] = Peak(role, peak.rss if peak else 0, peak.uss if peak else 0)
        peak.rss, peak.uss = max(peak.rss, mem.rss), max(peak.uss, mem.uss)
        total_rss += mem.rss
        total_uss += mem.uss
    return total_rss, total_uss


def main(argv: list[str] | None = None) -> int:
    """Run the main job and print the memory table."""
    p = argparse.ArgumentParser(description="per-process memory of the main job")
    p.add_argument("--run", type=Path, default=Path("runs/bench-memory"))
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    shutil.rmtree(args.run, ignore_errors=True)
    exe = shutil.which("maze-train") or sys.exit("maze-train is not installed")
    cmd = [exe, f"trainer.export_path={args.run}", "local.progress=false", *args.overrides]
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines arrive when printed: phase marks
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    root = psutil.Process(child.pid)
    phases: list[tuple[str, int]] = [("start-up (imports, data, model load)", 0)]

    def follow() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            if line.strip():
                phases.append((line.strip()[:70], 0))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    peaks: dict[int, Peak] = {}
    tree_rss = tree_uss = 0
    while child.poll() is None:
        rss, uss = sample(root, peaks)
        tree_rss, tree_uss = max(tree_rss, rss), max(tree_uss, uss)
        learner = peaks.get(root.pid)
        if learner is not None:
            try:
                now = root.memory_info().rss
            except psutil.Error:
                now = 0
            name, top = phases[-1]
            phases[-1] = (name, max(top, now))
        time.sleep(args.interval)
    reader.join(timeout=10)
    wall = time.perf_counter() - t0
    print(f"\n{' '.join(cmd[1:])}\nexit {child.returncode}, {wall:.0f} s wall\n")
    print(f"{'process':<34}{'peak RSS MB':>12}{'peak USS MB':>12}")
    order = sorted(peaks.values(), key=lambda k: (not k.role.startswith("learner"), -k.rss))
    ray_rss = ray_uss = 0
    for peak in order:
        if peak.role.startswith(("learner", "rollout worker")):
            print(f"{peak.role:<34}{peak.rss / MB:>12.0f}{peak.uss / MB:>12.0f}")
        else:
            ray_rss, ray_uss = ray_rss + peak.rss, ray_uss + peak.uss
    print(f"{'Ray system processes (sum)':<34}{ray_rss / MB:>12.0f}{ray_uss / MB:>12.0f}")
    print(f"{'whole tree at its peak':<34}{tree_rss / MB:>12.0f}{tree_uss / MB:>12.0f}")
    print("\nlearner peak RSS by phase (the phase ends where the job prints its next line)")
    for name, top in phases:
        if top:
            print(f"  {top / MB:>7.0f} MB  after: {name}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
