"""A rollout worker that Ray's memory monitor kills ends the run with the resumable error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Its own driver process: Ray's memory threshold is set when Ray starts, and this one sits 2 GiB
# above what the node already uses, so the worker writing up to 5 GiB is the one killed.
_DRIVER = """
import json, time
import ray
from ray._private.utils import get_system_memory, get_used_memory  # what the monitor reads
from maze_engine.errors import RolloutWorkerError
from maze_engine.workers import gather

GIB = 2**30
total = get_system_memory()
threshold = (get_used_memory() + 2 * GIB) / total
if threshold > 0.8:
    print(json.dumps({"skip": f"{get_used_memory() / GIB:.1f} of {total / GIB:.1f} GiB in use"}))
    raise SystemExit(0)
ray.init(
    num_cpus=1,
    include_dashboard=False,
    _system_config={"memory_usage_threshold": threshold, "memory_monitor_refresh_ms": 50},
)


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class Hog:
    def ready(self):
        return True

    def eat(self, limit):
        held = []
        while len(held) * 2**27 < limit:
            held.append(bytearray(b"\\x01") * 2**27)  # written, so resident (not lazy zero pages)
            time.sleep(0.02)
        time.sleep(30)
        return len(held)


hog = Hog.remote()
ray.get(hog.ready.remote())
try:
    gather([hog.eat.remote(5 * GIB)], doing="playing rollouts", timeout=120)
    print(json.dumps({"error": None}))
except RolloutWorkerError as exc:
    print(json.dumps({"error": str(exc), "cause": type(exc.__cause__).__name__}))
ray.shutdown()
"""


def test_a_worker_killed_for_memory_raises_the_resumable_worker_error(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "RAY_ADDRESS": "",
        "RAY_AUTH_MODE": "disabled",
        "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in said:
        pytest.skip(f"the node has too little memory free to fill 2 GiB of it: {said['skip']}")
    assert said["error"] is not None, "the worker was not killed: it returned"
    assert said["cause"] == "OutOfMemoryError", said
    assert said["error"].startswith(
        "Ray's memory monitor killed a rollout worker while playing rollouts ("
    ), said["error"]
    assert "low on memory" in said["error"], said["error"]
    assert said["error"].endswith("(local.rollout_workers) or more memory"), said["error"]
