"""``maze-train --submit`` against a real Ray head on this machine (job server on 127.0.0.1).

The command is the installed ``maze-train`` in a subprocess, the job runs ``maze-train
--engine local`` on the head; what is checked is what a user sees (streamed logs, one line and
the exit code) and what the job server and the run directory say afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Generator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import raynodes

pytestmark = pytest.mark.timeout(900)

# One GRPO step of a 2-step warm start, rollouts in the job's own process, a checkpoint.
TINY = [
    "trainer.max_training_steps=1",
    "trainer.train_batch_size=2",
    "trainer.policy_mini_batch_size=2",
    "generator.n_samples_per_prompt=2",
    "generator.sampling_params.max_generate_length=8",
    "trainer.ckpt_interval=1",
    "trainer.eval_interval=0",
    "trainer.eval_before_train=false",
    "local.warm_start.steps=2",
    "local.rollout_workers=0",
    "mazes.train_size=4",
    "local.progress=false",
    "local.tensorboard=false",
]
SUBMITTED = re.compile(r"^maze-train: submitted Ray job (raysubmit_\w+) to (\S+);", re.M)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Generator[raynodes.JobCluster]:
    with raynodes.job_cluster(keep=tmp_path_factory.mktemp("ray-logs")) as c:
        yield c


def submit(cluster: raynodes.JobCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``maze-train --submit`` of the 5x5 smoke config with ``args``."""
    exe = str(Path(sys.executable).with_name("maze-train"))
    return subprocess.run(
        [exe, "--submit", cluster.address, "--config", "smoke_5x5", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **raynodes.RAY_ENV},
    )


def job_info(cluster: raynodes.JobCluster, job_id: str) -> tuple[str, int | None]:
    from ray.job_submission import JobSubmissionClient

    info = JobSubmissionClient(cluster.url).get_job_info(job_id)
    return str(info.status.value), info.driver_exit_code


def test_submit_a_short_local_run_to_a_real_ray_head(
    cluster: raynodes.JobCluster, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = submit(cluster, "--engine", "local", f"trainer.export_path={run}", *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not proc.stderr.strip(), proc.stderr
    m = SUBMITTED.search(proc.stdout)
    assert m and m[2] == cluster.url, proc.stdout[:500]
    job_id = m[1]
    # The job's own output came through, before the verdict.
    streamed = proc.stdout[m.end() :]
    assert f"Running entrypoint for job {job_id}: maze-train --engine local" in streamed
    assert f"final adapter: {run / 'final_adapter'}" in streamed
    assert streamed.rstrip().endswith(f"maze-train: Ray job {job_id} succeeded")
    assert job_info(cluster, job_id) == ("SUCCEEDED", 0)
    # The outputs are where the config puts them: the job ran on this machine's head node.
    assert (run / "final_adapter" / "adapter_model.safetensors").is_file()
    assert (run / "ckpt" / "latest_ckpt_global_step.txt").read_text().strip() == "1"
    adapter = run / "ckpt" / "global_step_1" / "policy" / "lora_adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows if "reward/avg_raw_reward" in r] == [1]


def test_a_job_that_fails_on_the_cluster_exits_1_with_one_line(
    cluster: raynodes.JobCluster, tmp_path: Path
) -> None:
    # Valid here, wrong for this cluster: no node declares the resource the workers ask for,
    # which only the job finds out, and within local.ray.start_timeout_s rather than never.
    proc = submit(
        cluster,
        "--engine",
        "local",
        f"trainer.export_path={tmp_path / 'run'}",
        *TINY,
        "local.rollout_workers=1",
        "local.ray.worker_resources={gpu_node: 1}",
        "local.ray.start_timeout_s=5",
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = SUBMITTED.search(proc.stdout)
    assert m, proc.stdout[:500]
    job_id = m[1]
    assert (
        "maze-train: rollout workers did not start (1 asked for): 1 of 1 calls (starting) "
        "unfinished after 5 s; they need {'CPU': 1.0, 'gpu_node': 1}, the alive Ray nodes offer "
        "{'CPU': 1.0, 'gpu_node': 0.0} in all" in proc.stdout
    ), proc.stdout[-3000:]
    # One line: the job's verdict, without the log tail Ray appends to its message.
    assert proc.stderr.splitlines() == [
        f"maze-train: Ray job {job_id} failed (exit code 6): Job entrypoint command failed "
        "with exit code 6"
    ]
    assert job_info(cluster, job_id) == ("FAILED", 6)
