"""Ray workers started under ``uv run`` use the installed environment; nothing is shipped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

_DRIVER = """
import json, os, sys
import ray
from maze_engine.trainer import init_ray

init_ray()

@ray.remote(num_cpus=0)
def where():
    import maze_policy  # the workspace packages import as installed
    return sys.executable, os.getcwd(), maze_policy.__file__

exe, cwd, pkg = ray.get(where.remote())
print(json.dumps({"driver": sys.executable, "worker": exe, "cwd": cwd, "pkg": pkg}))
ray.shutdown()
"""


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs the uv binary")
def test_workers_run_the_installed_environment_under_uv_run(tmp_path: Path) -> None:
    # Under `uv run`, Ray's uv integration would ship the project as a working_dir package and
    # start every worker with `uv run` in that copy (under --no-sync they cannot import ray).
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ENABLE_UV_RUN_RUNTIME_ENV", None)
    proc = subprocess.run(
        ["uv", "run", "--no-sync", "python", "-c", _DRIVER],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=root,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(facts["worker"]) == Path(facts["driver"])
    assert Path(facts["driver"]).resolve() == Path(sys.executable).resolve()
    assert "runtime_resources" not in facts["cwd"] and "_ray_pkg_" not in facts["pkg"]
    assert "working_dir" not in proc.stderr  # no packaging, so none of its warnings
