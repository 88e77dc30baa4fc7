"""Node-loss drill (``node_loss_drill.py``): a job loses its rollout workers' Ray node mid-run.

The job must fail on its own, promptly and saying why; resubmitted to the cluster with a
replacement node (RayJob's retry), it must resume from the latest checkpoint and end with the
adapter of an uninterrupted run of the same config, byte for byte.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import node_loss_drill as nld

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

KILL_AT = 3  # after step 3 of 4, checkpoints every 2 steps: 1 step lost
SUPERVISOR_LOST = "The actor died unexpectedly before finishing this task."


def test_a_lost_worker_node_fails_the_job_and_the_retry_resumes_bit_identical(
    tmp_path: Path,
) -> None:
    with nld.drill_cluster(tmp_path, reference_on_head=True) as (cluster, base, worker):
        # The uninterrupted run beside the drill, its workers on the head: the kill spares it.
        ref_run = tmp_path / "reference"
        ref_job = nld.submit(cluster, ref_run, "reference", base, resource=nld.HEAD_RESOURCE)
        result = nld.drill(
            cluster,
            tmp_path / "drill",
            base,
            worker=nld.FIRST_WORKER,
            worker_id=worker,
            kill_at=KILL_AT,
            replacement="worker1",
        )
        ref = nld.finish_reference(ref_job, ref_run)
        job_logs = {r.job_id: cluster.job_log(r.job_id) for r in result.failure.failed_retries}
    f = result.failure
    print(nld.report(ref, [result]))
    # The rollout workers ran on the node that was killed, the retry's on its replacement.
    assert result.worker_nodes == [worker, worker]
    assert result.retry_nodes == [result.worker_id] * 2 and result.worker_id != worker
    # The job failed by itself, promptly, naming what happened (no hang on dead actors).
    assert f.exit_code == 1
    assert f.reason.startswith("maze-train: Ray job raysubmit_") and "\n" not in f.reason
    assert f.reason.endswith(
        "failed (exit code 6): Job entrypoint command failed with exit code 6"
    ), f.reason
    assert f.job_error.startswith("maze-train: a rollout worker was lost while "), f.job_error
    assert f.job_error.endswith("resume from the latest checkpoint (global step 2)")
    assert f.detect_s < 60, f.detect_s
    # A retry submitted before the head marks the lost node dead may have its job supervisor
    # sent there and fail before it starts; it is submitted again, within RayJob's backoffLimit.
    # Any other failure before resuming fails the drill (Ray's job log names the node).
    for why in f.failed_retries:
        assert why.said.startswith("maze-train: Ray job raysubmit_"), why.said
        assert why.said.endswith(" failed: Job supervisor actor died: " + SUPERVISOR_LOST)
        assert f"its node has died. Node Id: {worker}" in job_logs[why.job_id], job_logs
    # The retry resumed from the checkpoint the killed attempt left, and redid only what it lost.
    assert (f.kill_step, f.resumed_step, f.steps_lost) == (KILL_AT, 2, 1)
    assert result.resumed_steps == [3, 4]
    # Byte for byte the uninterrupted run's adapter, which training did move after step 2.
    assert result.digest == ref.digest
    assert nld.tensors_changed(ref_run, 2) > 0
