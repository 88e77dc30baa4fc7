import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from maze_engine.checkpoint import LATEST_FILE, CheckpointError, CheckpointManager, rank_file


def _writer(payload: bytes):
    def write(d: Path) -> None:
        (d / "policy").mkdir()
        (d / rank_file("model")).write_bytes(payload)
        (d / "trainer_state.pt").write_bytes(b"state")

    return write


def test_layout_latest_pointer_and_retention(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, max_ckpts_to_keep=2)
    for step in (1, 2, 3):
        ckpt = mgr.save(step, _writer(f"weights-{step}".encode()))
        assert ckpt.path == tmp_path / f"global_step_{step}"
        assert (ckpt.path / "policy" / "model_world_size_1_rank_0.pt").exists()
        assert (tmp_path / LATEST_FILE).read_text().strip() == str(step)
    assert mgr.steps() == [3, 2]
    latest = mgr.latest_valid()
    assert latest is not None and latest.step == 3
    with pytest.raises(CheckpointError, match="never overwritten"):
        mgr.save(3, _writer(b"x"))


def test_corrupt_newest_falls_back_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _writer(b"one"))
    mgr.save(2, _writer(b"two"))
    (tmp_path / "global_step_2" / rank_file("model")).write_bytes(b"tw0")  # same size, other bytes
    with caplog.at_level(logging.WARNING):
        latest = mgr.latest_valid()
    assert latest is not None and latest.step == 1
    assert "global_step_2" in caplog.text and "sha256" in caplog.text
    (tmp_path / "global_step_1" / "trainer_state.pt").unlink()
    assert mgr.latest_valid() is None


def test_writer_failure_leaves_nothing(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)

    def boom(d: Path) -> None:
        (d / "partial").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        mgr.save(5, boom)
    assert list(tmp_path.iterdir()) == []


def test_resume_modes(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    assert mgr.resolve("latest") is None
    mgr.save(4, _writer(b"four"))
    assert mgr.resolve("none") is None
    got = mgr.resolve("from_path", tmp_path / "global_step_4")
    assert got is not None and got.step == 4
    with pytest.raises(CheckpointError, match="resume_path"):
        mgr.resolve("from_path")
    with pytest.raises(CheckpointError, match="latest, none, from_path"):
        mgr.resolve("sometimes")


def test_sigkill_mid_write_never_yields_a_torn_checkpoint(tmp_path: Path) -> None:
    # A child writes checkpoints of growing size in a loop and is killed at once; whatever is
    # left, latest_valid() is a checkpoint whose every file verifies, and staging is pruned.
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from maze_engine.checkpoint import CheckpointManager
        mgr = CheckpointManager(Path({str(tmp_path)!r}))
        step = 0
        def write(d):
            (d / "policy").mkdir()
            (d / "policy" / "model_world_size_1_rank_0.pt").write_bytes(os.urandom(1 << 20))
        while True:
            step += 1
            mgr.save(step, write)
            print(step, flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.kill()
    proc.wait(timeout=30)
    mgr = CheckpointManager(tmp_path)
    latest = mgr.latest_valid()
    assert latest is not None and latest.step >= 3
    mgr.verify(latest.path)
    mgr.prune()
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]
