"""Node-loss drill: a training job loses the Ray node its rollout workers run on, and is retried.

On this machine: a Ray head (job server on 127.0.0.1) and a worker node that alone declares
:data:`WORKER_RESOURCE`, each with its own temp dir (``raynodes.JobCluster``). A short
local-engine run is submitted with the real ``maze-train --engine local --submit``, its rollout
workers placed on the worker node (``local.ray.worker_resources``). Once the run has finished a
given step (a checkpoint exists by then) the worker node is SIGKILLed, raylet, daemons and
workers at once; the job must then fail on its own, promptly. A replacement node joins and the
same job is submitted again, as KubeRay's RayJob does within its ``backoffLimit``: same run
directory, ``resume_mode=latest``. It must resume from the latest checkpoint and end with the
adapter an uninterrupted run of the same config ends with, byte for byte.

A retry that fails before it resumes is submitted again, up to the shipped RayJob's
``backoffLimit`` in all, as RayJob would. One such failure is Ray's: until the head has marked
the lost node dead (missed health checks), Ray may forward the lease of the retry's job
supervisor (an actor asking no resources) to that node, and the supervisor dies, before its
entrypoint runs, once the node is marked dead (``Job supervisor actor died``).

``test_node_loss_drill.py`` runs it once; as a benchmark, from the repo root::

    uv run python tests/node_loss_drill.py --repeats 3

repeats it (each repeat a fresh run, killed once at a step drawn from ``--seed``) and prints
per failure the steps lost (the step reached minus the checkpoint resumed from) and the time to
recover, their means, and the uninterrupted run's time. It lives beside the tests because it
is the test's drill, on the tests' Ray node helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).parent))
import raynodes
import yaml

WORKER_RESOURCE = "mazerl_rollout"
"""Custom Ray resource only the rollout-worker node declares; the run's workers ask for it."""
HEAD_RESOURCE = "mazerl_reference"
"""Declared by the head when the reference run shares the cluster with a drill (the test): its
workers go there and survive the kill. Placement changes no computation on one machine."""
FIRST_WORKER = "worker0"
STEPS = 4
CKPT_INTERVAL = 2
JOB_TIMEOUT_S = 600.0
DETECT_TIMEOUT_S = 180.0
"""How long a job may take to fail once its workers' node is gone (it must not hang)."""
_RESUMED = re.compile(r"^resumed from \S+ \(global step (\d+)\)$", re.M)
_SUBMITTED = re.compile(r"^maze-train: submitted Ray job (\S+) to ", re.M)
RAYJOB_MANIFEST = Path(__file__).parents[1] / "infra" / "k8s" / "rayjob-train.yaml"


def backoff_limit() -> int:
    """The shipped RayJob's ``backoffLimit``: how often a failed run is submitted again."""
    return int(yaml.safe_load(RAYJOB_MANIFEST.read_text())["spec"]["backoffLimit"])


class DrillError(AssertionError):
    """The drill did not go as a node loss and a retry should."""


class JobEndedError(DrillError):
    """The job ended before what the drill waited for."""


def overrides(
    run: Path, base: Path, steps: int = STEPS, resource: str = WORKER_RESOURCE
) -> list[str]:
    """The run's config (``smoke_5x5`` plus these): tiny, two Ray workers where ``resource`` is.

    ``base`` is the tiny model after a 3-step warm start: its replies' format credit
    (``visgym_sft``) varies across samples, so advantages are nonzero and the adapter moves at
    every step.
    """
    return [
        f"trainer.export_path={run}",
        f"trainer.policy.model.path={base}",
        f"trainer.max_training_steps={steps}",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "generator.n_samples_per_prompt=2",
        "generator.sampling_params.max_generate_length=12",
        f"trainer.ckpt_interval={CKPT_INTERVAL}",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=false",
        "trainer.policy.optimizer_config.lr=0.01",
        "local.rollout_workers=2",
        f"local.ray.worker_resources={{{resource}: 1}}",
        "local.ray.start_timeout_s=300",
        "mazes.train_size=16",
        "mazes.reward_spec=visgym_sft",
        "local.progress=false",
        "local.tensorboard=false",
    ]


@dataclass
class Job:
    """One ``maze-train --submit`` process and its captured output."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    """When the process exited (a watcher thread notes it, however late :meth:`wait` is)."""

    def __post_init__(self) -> None:
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        self.proc.wait()
        self.ended = time.monotonic()

    @property
    def seconds(self) -> float:
        """Submission to the end, as the user waits for it (so far, while it runs)."""
        return (self.ended or time.monotonic()) - self.started

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise DrillError(f"the job did not end within {timeout:g} s{_tails(self)}") from None

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


def submit(
    cluster: raynodes.JobCluster,
    run: Path,
    name: str,
    base: Path,
    *,
    steps: int = STEPS,
    resource: str = WORKER_RESOURCE,
) -> Job:
    """``maze-train --engine local --submit`` of the drill's config, in the background."""
    run.parent.mkdir(parents=True, exist_ok=True)
    out, err = run.parent / f"{name}.out", run.parent / f"{name}.err"
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("maze-train")),
            "--engine",
            "local",
            "--submit",
            cluster.address,
            "--config",
            "smoke_5x5",
            *overrides(run, base, steps, resource),
        ],
        stdout=out.open("wb"),
        stderr=err.open("wb"),
        env={**os.environ, **raynodes.RAY_ENV},
    )
    return Job(proc, out, err)


def steps_logged(run: Path, since: int = 0) -> list[int]:
    """Global steps of the training-step rows in ``metrics.jsonl`` from byte ``since`` on."""
    try:
        data = (run / "metrics.jsonl").read_bytes()[since:]
    except FileNotFoundError:
        return []
    rows = [json.loads(line) for line in data.splitlines() if line.endswith(b"}")]
    return [int(r["global_step"]) for r in rows if "timing/step" in r]


def metrics_size(run: Path) -> int:
    try:
        return (run / "metrics.jsonl").stat().st_size
    except FileNotFoundError:
        return 0


def adapter_digest(run: Path) -> str:
    """sha256 of the run's final adapter weights (a copy of its last published version)."""
    path = run / "final_adapter" / "adapter_model.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensors_changed(run: Path, step: int) -> int:
    """How many adapter tensors differ between checkpoint ``step`` and the final adapter."""
    import torch
    from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

    name = "adapter_model.safetensors"
    final = load_file(str(run / "final_adapter" / name))
    at = load_file(str(run / "ckpt" / f"global_step_{step}" / "policy" / "lora_adapter" / name))
    if final.keys() != at.keys():
        raise DrillError(f"checkpoint {step} and the final adapter hold different tensors")
    return sum(not torch.equal(final[k], at[k]) for k in final)


def rollout_worker_nodes(cluster: raynodes.JobCluster) -> list[str]:
    """Node ids of the alive ``RolloutWorker`` actors (Ray's state API, through the head)."""
    from ray.util.state import list_actors

    actors = cast(
        list[Any],
        list_actors(
            address=cluster.url,
            filters=[("class_name", "=", "RolloutWorker"), ("state", "=", "ALIVE")],
            timeout=10,
        ),
    )
    return sorted(str(a.node_id) for a in actors)


def _tails(job: Job, chars: int = 3000) -> str:
    """The ends of the job's stdout and stderr: a failed drill says why where it is reported."""
    out, err = job.stdout[-chars:], job.stderr[-chars:]
    return f"\n--- {job.out} (end) ---\n{out}\n--- {job.err} (end) ---\n{err}"


def _wait_for(what: str, done: Any, job: Job, timeout: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if job.proc.poll() is not None:
            raise JobEndedError(
                f"the job ended (exit {job.proc.returncode}) before {what}{_tails(job)}"
            )
        if time.monotonic() > deadline:
            raise DrillError(f"no {what} within {timeout:g} s{_tails(job)}")
        time.sleep(0.2)


@dataclass(frozen=True)
class Reference:
    """The uninterrupted run of the same config."""

    seconds: float
    """Submission to the job's end, as the user waits for it."""
    digest: str


def finish_reference(job: Job, run: Path, steps: int = STEPS) -> Reference:
    """Wait for the uninterrupted run; its adapter is what every drill must end with."""
    code = job.wait(JOB_TIMEOUT_S)
    if code != 0 or steps_logged(run) != list(range(1, steps + 1)):
        raise DrillError(f"the uninterrupted run failed (exit {code}){_tails(job)}")
    return Reference(job.seconds, adapter_digest(run))


@dataclass(frozen=True)
class FailedRetry:
    """A resubmission that ended before it resumed (and was submitted again)."""

    said: str
    """What ``maze-train --submit`` printed on stderr."""
    job_id: str
    """Its Ray submission id: ``JobCluster.job_log`` has Ray's whole account of the failure."""


@dataclass(frozen=True)
class Failure:
    """One node loss and the retry that recovered from it."""

    kill_step: int
    """Steps the killed attempt had finished when its workers' node died."""
    resumed_step: int
    """The checkpoint the resubmitted job resumed from."""
    detect_s: float
    """SIGKILL to ``maze-train --submit`` reporting the job failed."""
    dead_s: float
    """SIGKILL to the head marking the node dead (missed health checks)."""
    joined_s: float
    """SIGKILL to the replacement node having joined (it starts right after the kill)."""
    resumed_s: float
    """SIGKILL to the retry saying it resumed (its workers are up, the checkpoint loaded)."""
    recover_s: float
    """SIGKILL to the retry being back at ``kill_step``: all progress regained (on resuming, if
    the kill came right after a checkpoint)."""
    exit_code: int
    """``maze-train --submit``'s exit code for the failed job."""
    reason: str
    """What it printed on stderr."""
    job_error: str
    """The job's own last line about the lost workers (its ``maze-train``'s message)."""
    failed_retries: tuple[FailedRetry, ...] = ()
    """Each retry that failed before resuming (each submitted again, as RayJob does)."""

    @property
    def steps_lost(self) -> int:
        return self.kill_step - self.resumed_step


@dataclass(frozen=True)
class DrillResult:
    """A drilled run: its failure, what the retry did, and the adapter it ended with."""

    failure: Failure
    seconds: float
    """First submission to the retry's end."""
    digest: str
    worker_nodes: list[str]
    """Nodes the first attempt's rollout workers ran on (all the worker node's)."""
    retry_nodes: list[str]
    """Nodes the retry's rollout workers ran on (all the replacement's)."""
    killed_node: str
    resumed_steps: list[int]
    """Training steps the retry ran (each logged once)."""
    worker: str
    """Name of the replacement node, for the next drill."""
    worker_id: str


def drill(
    cluster: raynodes.JobCluster,
    run: Path,
    base: Path,
    *,
    worker: str,
    worker_id: str,
    kill_at: int,
    replacement: str,
    steps: int = STEPS,
) -> DrillResult:
    """Kill node ``worker`` once the run has finished step ``kill_at``, then retry the job.

    Raises:
        DrillError: The job did not fail on its own, no retry resumed within the RayJob's
            ``backoffLimit``, the one that resumed did not finish, or it did not resume from the
            checkpoint the killed attempt left.
    """
    if not CKPT_INTERVAL <= kill_at < steps:
        raise ValueError(f"kill_at must be in [{CKPT_INTERVAL}, {steps}) so a checkpoint exists")
    first = submit(cluster, run, f"{run.name}-attempt1", base, steps=steps)
    _wait_for(f"step {kill_at}", lambda: max(steps_logged(run), default=0) >= kill_at, first)
    placed = rollout_worker_nodes(cluster)
    if not (run / "ckpt" / "latest_ckpt_global_step.txt").is_file():
        raise DrillError("no checkpoint before the kill")
    cluster.kill(worker)
    killed = time.monotonic()
    # The replacement starts at once, as a lost pod is recreated, while the job fails.
    cluster.start_worker(replacement, {WORKER_RESOURCE: 2})
    code = first.wait(DETECT_TIMEOUT_S)
    detect_s = time.monotonic() - killed
    if code == 0:
        raise DrillError("the job succeeded although its workers' node was killed")
    kill_step = max(steps_logged(run))
    # Resubmitted at once, as RayJob retries a failed job; its workers wait for a node with the
    # resource (local.ray.start_timeout_s). Where they land is checked below.
    offset = metrics_size(run)
    limit = backoff_limit()
    failed_retries: list[FailedRetry] = []
    retry = submit(cluster, run, f"{run.name}-attempt2", base, steps=steps)
    seen: dict[str, float] = {}  # "dead", "joined": seconds after the kill
    new_id: str | None = None

    def marked_dead() -> bool:
        nonlocal new_id
        if "dead" not in seen and cluster.is_dead(worker_id):
            seen["dead"] = time.monotonic() - killed
        if new_id is None and (new_id := cluster.joined(replacement)) is not None:
            seen["joined"] = time.monotonic() - killed
        return "dead" in seen

    def resumed_yet() -> bool:
        marked_dead()
        return _RESUMED.search(retry.stdout) is not None

    while True:
        try:
            _wait_for("a resume", resumed_yet, retry)
            break
        except JobEndedError:
            job_id = _SUBMITTED.search(retry.stdout)
            failed_retries.append(FailedRetry(retry.stderr.strip(), job_id[1] if job_id else ""))
            if len(failed_retries) >= limit:
                raise
        retry = submit(
            cluster, run, f"{run.name}-attempt{len(failed_retries) + 2}", base, steps=steps
        )
    resumed_s = time.monotonic() - killed
    retry_placed = rollout_worker_nodes(cluster)
    _wait_for("the lost node marked dead", marked_dead, retry)
    resumed = _RESUMED.search(retry.stdout)
    if resumed is None or new_id is None:
        raise DrillError("the retry resumed without the replacement node")
    if int(resumed[1]) < kill_step:  # else nothing was lost: recovered on resuming
        _wait_for(f"step {kill_step} again", lambda: kill_step in steps_logged(run, offset), retry)
    recover_s = time.monotonic() - killed
    if retry.wait(JOB_TIMEOUT_S) != 0:
        raise DrillError(f"the resubmitted job failed{_tails(retry)}")
    lost = [ln for ln in first.stdout.splitlines() if "rollout worker was lost" in ln]
    failure = Failure(
        kill_step=kill_step,
        resumed_step=int(resumed[1]),
        detect_s=detect_s,
        dead_s=seen["dead"],
        joined_s=seen["joined"],
        resumed_s=resumed_s,
        recover_s=recover_s,
        exit_code=code,
        reason=first.stderr.strip(),
        job_error=lost[-1] if lost else "",
        failed_retries=tuple(failed_retries),
    )
    return DrillResult(
        failure=failure,
        seconds=retry.seconds + (retry.started - first.started),
        digest=adapter_digest(run),
        worker_nodes=placed,
        retry_nodes=retry_placed,
        killed_node=worker_id,
        resumed_steps=steps_logged(run, offset),
        worker=replacement,
        worker_id=new_id,
    )


@contextlib.contextmanager
def drill_cluster(
    root: Path, *, reference_on_head: bool = False
) -> Generator[tuple[raynodes.JobCluster, Path, str]]:
    """The drill's Ray cluster and base model: yields the cluster, the base and worker0's id.

    The base is warm-started here while the head starts; the head gets 2 CPUs and
    :data:`HEAD_RESOURCE` with ``reference_on_head``. Node logs end up in ``root/ray-logs``.
    """
    from maze_engine.testing import warm_started_base

    with ThreadPoolExecutor(1) as pool:
        base = pool.submit(warm_started_base, root / "base")
        with raynodes.job_cluster(
            head_cpus=2 if reference_on_head else 1,
            head_resources={HEAD_RESOURCE: 2} if reference_on_head else None,
            keep=root / "ray-logs",
        ) as cluster:
            node = cluster.add_worker(FIRST_WORKER, {WORKER_RESOURCE: 2})
            yield cluster, base.result(), node


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def report(ref: Reference, results: Sequence[DrillResult]) -> str:
    """The benchmark's table: per failure, then the means; the uninterrupted run below."""
    lines = [
        "| drill | kill step | resumed from | steps lost | job failed | node marked dead | "
        "replacement joined | retries | resumed | recovered | drilled run | bit-identical |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for i, r in enumerate(results, 1):
        f = r.failure
        lines.append(
            f"| {i} | {f.kill_step} | {f.resumed_step} | {f.steps_lost} | {f.detect_s:.1f} s | "
            f"{f.dead_s:.1f} s | {f.joined_s:.1f} s | {1 + len(f.failed_retries)} | "
            f"{f.resumed_s:.1f} s | {f.recover_s:.1f} s | {r.seconds:.1f} s | "
            f"{'yes' if r.digest == ref.digest else 'NO'} |"
        )
    fs = [r.failure for r in results]
    means = [
        f"{_mean([f.detect_s for f in fs]):.1f} s",
        f"{_mean([f.dead_s for f in fs]):.1f} s",
        f"{_mean([f.joined_s for f in fs]):.1f} s",
        f"{_mean([1 + len(f.failed_retries) for f in fs]):.2f}",
        f"{_mean([f.resumed_s for f in fs]):.1f} s",
        f"{_mean([f.recover_s for f in fs]):.1f} s",
        f"{_mean([r.seconds for r in results]):.1f} s",
    ]
    lines.append(f"| mean | | | {_mean([f.steps_lost for f in fs]):.2f} | {' | '.join(means)} | |")
    lines.append(
        f"| uninterrupted | | | | | | | | | | {ref.seconds:.1f} s | sha256 {ref.digest[:16]} |"
    )
    lines.append(
        "\nTimes after the SIGKILL, except the two run columns (first submission to the end); "
        "retries: submissions after the killed job until one resumed."
    )
    for i, r in enumerate(results, 1):
        lines += [f"drill {i}, failed retry: {why.said}" for why in r.failure.failed_retries]
    return "\n".join(lines)


def main() -> None:
    """Run the reference, then ``--repeats`` drills; exit 1 unless every adapter matches."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="per run (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", type=Path, help="run directories and logs (default: a temp dir)")
    args = p.parse_args()
    from loguru import logger

    logger.remove()  # SkyRL's INFO lines on import (the base model's warm start here)
    logger.add(sys.stderr, level="WARNING")
    root = args.dir or Path(tempfile.mkdtemp(prefix="node-loss-drill-"))
    rng = random.Random(args.seed)
    kills = [rng.randrange(CKPT_INTERVAL, args.steps) for _ in range(args.repeats)]
    print(f"runs in {root}; kill steps {kills} (seed {args.seed})", flush=True)
    t0 = time.monotonic()
    with drill_cluster(root) as (cluster, base, first_node):
        name, node = FIRST_WORKER, first_node
        job = submit(cluster, root / "reference", "reference", base, steps=args.steps)
        ref = finish_reference(job, root / "reference", args.steps)
        print(f"uninterrupted run: {ref.seconds:.1f} s", flush=True)
        results: list[DrillResult] = []
        for i, kill_at in enumerate(kills, 1):
            r = drill(
                cluster,
                root / f"drill{i}",
                base,
                worker=name,
                worker_id=node,
                kill_at=kill_at,
                replacement=f"worker{i}",
                steps=args.steps,
            )
            f = r.failure
            print(
                f"drill {i}: killed after step {f.kill_step}, job failed after {f.detect_s:.1f} s "
                f"({f.reason}), resumed from step {f.resumed_step}, {f.steps_lost} steps lost, "
                f"recovered after {f.recover_s:.1f} s; the job said: {f.job_error}",
                flush=True,
            )
            results.append(r)
            name, node = r.worker, r.worker_id
    print(report(ref, results))
    print(f"total {time.monotonic() - t0:.1f} s")
    raise SystemExit(0 if all(r.digest == ref.digest for r in results) else 1)


if __name__ == "__main__":
    main()
