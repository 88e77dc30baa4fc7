"""Lint, format and strict type checks over the whole workspace, as part of the test command."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.parametrize(
    "cmd",
    [("ruff", "check", "."), ("ruff", "format", "--check", "."), ("pyright",)],
    ids=["ruff-check", "ruff-format", "pyright-strict"],
)
def test_workspace_is_clean(cmd: tuple[str, ...]) -> None:
    exe = BIN / cmd[0]
    if not exe.exists():
        found = shutil.which(cmd[0])
        assert found, f"{cmd[0]} is not installed; run `uv sync`"
        exe = Path(found)
    proc = _run(str(exe), *cmd[1:])
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
    )
