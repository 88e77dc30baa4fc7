"""Ray nodes as processes on this machine: start them, SIGKILL them, leave nothing behind.

Each node is one ``ray start --block`` process group. :class:`JobCluster` is a head whose job
server (the dashboard) listens on 127.0.0.1, plus worker nodes, each node with its own
``--temp-dir``, so no other ``ray.init()`` on the machine finds it through ``/tmp/ray``. The
cluster rehearsal (``rehearsal.py``), ``test_ray_job_submit.py`` and the node-loss drill
(``node_loss_drill.py``) start their nodes here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",  # workers run this interpreter, nothing is shipped
    "RAY_USAGE_STATS_ENABLED": "0",
}
STATE_API_ATTEMPTS = 5
"""Requests :class:`JobCluster` sends the head's state API before a dropped one fails a poll."""
NODE_IP = "127.0.0.2"
"""The address :class:`JobCluster`'s nodes advertise. Ray replaces 127.0.0.1 (and localhost) by
the machine's outward address; any other loopback address it keeps, so drivers, raylets and
the GCS talk over the loopback interface."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 just now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayNode:
    """One ``ray start --block`` process group (raylet and the workers it starts)."""

    proc: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        """SIGKILL every process of the node at once, as a lost instance.

        Ray's workers start in process groups of their own, so the tree is walked.
        """
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        psutil.wait_procs(procs, timeout=30)


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start_node(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> RayNode:
    """``ray start --block ARGS`` in a process group of its own, output to ``log``.

    The interpreter's bin directory leads ``PATH``, so a job entrypoint such as ``maze-train``
    is this environment's whichever way the caller was started.
    """
    env = {**os.environ, **RAY_ENV, **(env or {})}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("RAY_ADDRESS", None)
    out = log.open("wb")
    proc = subprocess.Popen(
        [_ray_cli(), "start", "--block", "--disable-usage-stats", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: kill() takes raylet and workers
    )
    return RayNode(proc, log)


# The head's dashboard starts about ten Python subprocesses; on a loaded 2-core machine they
# can take longer than Ray's start-up timeouts (30 s per module, 60 s in all), after which the
# head runs on without a job server.
SLOW_START_ENV = {
    "RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT": "240",
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "300",
}


def _node_args(temp_dir: Path, num_cpus: int, resources: Mapping[str, float]) -> list[str]:
    return [
        f"--temp-dir={temp_dir}",
        f"--node-ip-address={NODE_IP}",
        f"--num-cpus={num_cpus}",
        f"--resources={json.dumps(dict(resources))}",
        f"--dashboard-agent-listen-port={free_port()}",  # default 52365: one node per machine
        # A fixed port, or the head's client server looks it up in the GCS and, on a loaded
        # machine, gives up (30 s) before the raylet registers, which stops the whole head.
        f"--runtime-env-agent-port={free_port()}",
        "--object-store-memory=150000000",
    ]


@dataclass
class JobCluster:
    """A Ray head with its job server on 127.0.0.1 and worker nodes, all on this machine."""

    root: Path
    """Short (Ray's socket paths are length-limited): each node's temp dir and log are here."""
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    nodes: dict[str, RayNode] = field(default_factory=dict[str, RayNode])
    _before: dict[str, set[str]] = field(default_factory=dict[str, set[str]])
    _wants: dict[str, dict[str, float]] = field(default_factory=dict[str, dict[str, float]])

    @property
    def address(self) -> str:
        """The job server as ``maze-train --submit`` takes it."""
        return f"127.0.0.1:{self.dashboard_port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start_head(
        self,
        num_cpus: int = 1,
        resources: Mapping[str, float] | None = None,
        timeout: float = 300.0,
    ) -> None:
        """The head, its job server answering; one retry if the head fails to start.

        ``ray start --block`` stops every process of the node when one of them exits.
        """
        for attempt in (1, 2):
            node = start_node(
                [
                    "--head",
                    f"--port={self.gcs_port}",
                    f"--ray-client-server-port={free_port()}",  # default 10001: one per machine
                    "--dashboard-host=127.0.0.1",
                    f"--dashboard-port={self.dashboard_port}",
                    *_node_args(self.root / f"head{attempt}", num_cpus, resources or {}),
                ],
                self.root / f"head{attempt}.log",
                SLOW_START_ENV,
            )
            self.nodes["head"] = node
            if self._wait_job_server(node, timeout):
                return
            node.kill()
            self.gcs_port, self.dashboard_port = free_port(), free_port()
        raise RuntimeError(f"the Ray head did not start; see {self.root}/head*.log")

    def _wait_job_server(self, node: RayNode, timeout: float) -> bool:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and node.proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/api/version", timeout=5).status_code == 200:
                    return True
            if b"Failed to start the dashboard" in node.log.read_bytes():
                return False  # the head would run on without a job server
            time.sleep(0.5)
        return False

    def start_worker(self, name: str, resources: Mapping[str, float], num_cpus: int = 2) -> None:
        """Start worker node ``name`` declaring ``resources``; :meth:`wait_worker` sees it join."""
        self._before[name] = set(self.alive_nodes())
        self._wants[name] = dict(resources)
        args = _node_args(self.root / name, num_cpus, resources)
        self.nodes[name] = start_node(
            [f"--address={NODE_IP}:{self.gcs_port}", *args], self.root / f"{name}.log"
        )

    def joined(self, name: str) -> str | None:
        """The node id of worker ``name`` once the head reports it alive, else None."""
        if self.nodes[name].proc.poll() is not None:
            raise RuntimeError(f"worker node {name} exited; see {self.root / name}.log")
        fresh = [
            n
            for n, total in self.alive_nodes().items()
            if n not in self._before[name] and _has(total, self._wants[name])
        ]
        return fresh[0] if fresh else None

    def wait_worker(self, name: str, timeout: float = 120.0) -> str:
        """Until worker ``name`` has joined; returns its node id."""
        deadline = time.monotonic() + timeout
        while (node_id := self.joined(name)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker node {name} did not join within {timeout} s")
            time.sleep(0.5)
        return node_id

    def add_worker(self, name: str, resources: Mapping[str, float], num_cpus: int = 2) -> str:
        """Start worker node ``name`` and wait until it has joined; returns its node id."""
        self.start_worker(name, resources, num_cpus)
        return self.wait_worker(name)

    def alive_nodes(self) -> dict[str, dict[str, float]]:
        """Node id -> total resources of every node the head reports alive."""
        nodes = self._list_nodes()
        return {
            str(n.node_id): dict(cast(Mapping[str, float], n.resources_total))
            for n in nodes
            if n.state == "ALIVE"
        }

    def _list_nodes(self) -> list[Any]:
        """The head's node list; a request its state API drops is sent again.

        Seen while a node registers on a loaded 2-core machine (``ServerUnavailable``); every
        poll of the cluster's nodes goes through here, and a head that answers none of
        ``STATE_API_ATTEMPTS`` requests, a second apart, still raises.
        """
        from ray.util.state import list_nodes
        from ray.util.state.exception import ServerUnavailable

        for _ in range(STATE_API_ATTEMPTS - 1):
            with contextlib.suppress(ServerUnavailable):
                return cast(list[Any], list_nodes(address=self.url, timeout=10))
            time.sleep(1.0)
        return cast(list[Any], list_nodes(address=self.url, timeout=10))

    def is_dead(self, node_id: str) -> bool:
        """Whether the head no longer reports ``node_id`` alive (it misses health checks first)."""
        return node_id not in self.alive_nodes()

    def job_log(self, submission_id: str) -> str:
        """The job's driver log on the head: its supervisor's messages, then the entrypoint's."""
        logs = sorted(self.root.glob(f"head*/session_latest/logs/job-driver-{submission_id}.log"))
        return logs[-1].read_text(errors="replace") if logs else ""

    def kill(self, name: str) -> None:
        """SIGKILL node ``name``: its raylet, its daemons and every worker process it started."""
        self.nodes.pop(name).kill()

    def close(self) -> None:
        """Kill every node, then any process still naming this cluster's directory."""
        import psutil

        for name in list(self.nodes):
            self.kill(name)
        # A process that left its node's tree (reparented) still names its node's temp dir.
        left = [
            p
            for p in psutil.process_iter(["cmdline"])
            if f"{self.root}{os.sep}" in " ".join(p.info["cmdline"] or ()) and p.pid != os.getpid()
        ]
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(left, timeout=30)


def _has(total: Mapping[str, float], wanted: Mapping[str, float]) -> bool:
    return all(total.get(k, 0.0) >= v for k, v in wanted.items())


@contextlib.contextmanager
def job_cluster(
    head_cpus: int = 1,
    head_resources: Mapping[str, float] | None = None,
    keep: Path | None = None,
) -> Generator[JobCluster]:
    """A :class:`JobCluster` with its head up, torn down on exit.

    Its directory is a short one under /tmp, removed afterwards; ``keep`` names where the node
    logs (``ray start``'s output and each node's session logs) are copied first.
    """
    cluster = JobCluster(Path(tempfile.mkdtemp(prefix="rj", dir="/tmp")))
    try:
        cluster.start_head(head_cpus, head_resources)
        yield cluster
    finally:
        cluster.close()
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for log in cluster.root.glob("*.log"):
                shutil.copy(log, keep / log.name)
            # Each node's own logs (raylet, GCS, job supervisors, workers): why an actor died.
            for logs in cluster.root.glob("*/session_latest/logs"):
                shutil.copytree(logs, keep / logs.parents[1].name, dirs_exist_ok=True)
        shutil.rmtree(cluster.root, ignore_errors=True)
