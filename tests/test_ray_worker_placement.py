"""Rollout workers placed on a Ray node that was lost a moment ago (``start_ray_workers``).

A SIGKILLed node takes placements until the head marks it dead (missed health checks), so a
job retried at once after a node loss can have its workers start there and die. They must be
replaced and land on the node that took its place; a worker whose model fails to load must
fail the start at once, not be retried.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import raynodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

RESOURCE = "mazerl_rollout"


@pytest.fixture(scope="module")
def cluster() -> Generator[raynodes.JobCluster]:
    """A head with no rollout resource and worker node ``w0`` with one; this process joins.

    Shared by both tests (a cluster takes ~30 s to start): the load failure needs any node with
    the resource free, the replacement test needs ``w0`` alive; it kills ``w0`` itself and its
    worker at the end, so the other test can run after it as well as before.
    """
    import ray

    with pytest.MonkeyPatch.context() as env:
        for k, v in raynodes.RAY_ENV.items():
            env.setenv(k, v)
        with raynodes.job_cluster(head_cpus=1) as c:
            c.add_worker("w0", {RESOURCE: 1}, num_cpus=1)
            ray.init(address=f"{raynodes.NODE_IP}:{c.gcs_port}", log_to_driver=False)
            try:
                yield c
            finally:
                ray.shutdown()


def _args(tmp_path: Path, model: Path) -> tuple[Any, ...]:
    from maze_policy.lora import lora_config

    lora = lora_config(rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    return (str(model), lora, 1, str(tmp_path / "sync"))


def test_a_worker_whose_model_fails_to_load_is_not_replaced(
    cluster: raynodes.JobCluster, tmp_path: Path
) -> None:
    from maze_engine.config import LocalRayConfig
    from maze_engine.errors import RolloutWorkerError
    from maze_engine.workers import start_ray_workers

    said: list[str] = []
    settings = LocalRayConfig(worker_resources={RESOURCE: 1}, start_timeout_s=240)
    with pytest.raises(RolloutWorkerError, match="rollout workers did not start") as info:
        start_ray_workers(1, _args(tmp_path, tmp_path / "no-model"), settings, say=said.append)
    assert said == []
    assert "ActorDiedError" in str(info.value)


def test_a_worker_placed_on_a_just_lost_node_is_replaced_on_its_successor(
    cluster: raynodes.JobCluster, tmp_path: Path
) -> None:
    from maze_engine.config import LocalRayConfig
    from maze_engine.workers import start_ray_workers
    from maze_policy.model import build_tiny_vlm

    model = build_tiny_vlm(tmp_path / "model", seed=0)
    lost = cluster.wait_worker("w0")
    cluster.kill("w0")
    said: list[str] = []
    started: list[list[Any]] = []
    settings = LocalRayConfig(worker_resources={RESOURCE: 1}, start_timeout_s=240)
    # Asked for before the head knows: Ray places the worker on the lost node, the only one
    # declaring the resource. The successor starts after that, as a recreated pod does.
    t = threading.Thread(
        target=lambda: started.append(
            start_ray_workers(1, _args(tmp_path, model), settings, say=said.append)
        )
    )
    t.start()
    time.sleep(1.0)
    cluster.start_worker("w1", {RESOURCE: 1}, num_cpus=1)
    t.join(timeout=300)
    assert started, "start_ray_workers raised or did not return; see the thread's traceback"
    import ray

    (worker,) = started[0]
    successor = cluster.wait_worker("w1")
    assert ray.get(worker.node_id.remote()) == successor != lost
    # Once as a rule (the worker dies when the head marks the node dead); a loaded machine may
    # place a replacement there too before that.
    assert said and all(s.startswith("a rollout worker was lost while starting") for s in said)
    assert said[0].endswith("starting a replacement (1 of 3)"), said
    ray.kill(worker)
