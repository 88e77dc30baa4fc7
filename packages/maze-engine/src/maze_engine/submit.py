"""Ray job submission: ``maze-train`` run as a job on a Ray cluster, through Ray's job client.

The address is ``sagemaker_ray://<raycluster>/<namespace>`` (HyperPod; needs the
``toolkit-for-ray-on-sagemaker-ai`` package where the command runs), a Ray dashboard URL or
``host:port`` (read as ``http://host:port``, the dashboard's job server).
:func:`build_job` checks the config and describes the job; :func:`connect`, :func:`start` and
:func:`follow` submit it with Ray's ``JobSubmissionClient`` and stream its logs until it ends.
Every failure to reach or talk to the job server is one :class:`JobServerError` naming the
address and what to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import re
import shlex
import socket
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from maze_engine.config import CONFIG_DIR, load_config, shipped_configs
from maze_engine.errors import ConfigError, JobClientMissingError, JobServerError
from maze_engine.schema import override_keys

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

FORWARDED_ENV_VARS = ("MAZERL_RUN", "MAZERL_SFT_CHECKPOINT", "MAZERL_S3_URI")
"""Variables the shipped configs read (``${oc.env:...}``); forwarded to the Ray job if set."""

_K8S_NAME = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_ADDRESS = re.compile(
    rf"sagemaker_ray://{_K8S_NAME}/{_K8S_NAME}"  # HyperPod: <raycluster>/<namespace>
    r"|https?://[^\s/:]+(?::\d{1,5})?/?"  # a Ray dashboard
    r"|[^\s/:]+:\d{1,5}"  # host:port of a dashboard
)
SAGEMAKER_SCHEME = "sagemaker_ray"
SAGEMAKER_PACKAGE = "toolkit-for-ray-on-sagemaker-ai"
"""Provides the ``sagemaker_ray`` module Ray's job client imports for that scheme."""
CONNECT_TIMEOUT_S = 10.0
"""How long :func:`connect` waits for the job server's port before giving up."""
_LOG_TAIL = re.compile(r",? last available logs\b.*$")
"""Ray's announcement of the log lines it appends to a failed job's message."""


@dataclass(frozen=True)
class RayJob:
    """One ``maze-train`` run as a Ray job: where it goes, what it runs, its runtime env."""

    address: str
    """``sagemaker_ray://...`` or the job server's URL (``host:port`` becomes ``http://``)."""
    entrypoint: tuple[str, ...]
    runtime_env: dict[str, Any] = field(default_factory=dict[str, Any])
    no_wait: bool = False

    def command(self) -> list[str]:
        """The equivalent ``ray job submit`` argv (what ``--dry-run`` prints)."""
        return [
            "ray",
            "job",
            "submit",
            "--address",
            self.address,
            "--runtime-env-json",
            json.dumps(self.runtime_env, sort_keys=True),
            *(["--no-wait"] if self.no_wait else []),
            "--",
            *self.entrypoint,
        ]


@dataclass(frozen=True)
class JobOutcome:
    """How a submitted job ended, as the job server reports it."""

    job_id: str
    status: str
    """Ray's ``JobStatus`` value: ``SUCCEEDED``, ``FAILED``, ``STOPPED`` (or ``PENDING`` /
    ``RUNNING`` for a job that was not followed)."""
    message: str | None = None
    """The job server's message, whole: for a failed entrypoint Ray appends the job's last log
    lines (up to 20,000 characters)."""
    driver_exit_code: int | None = None

    @property
    def succeeded(self) -> bool:
        return self.status == "SUCCEEDED"

    @property
    def reason(self) -> str | None:
        """The message's first line, without the log tail Ray announces there; None if none.

        The tail is the job's last log lines, which following the job streamed already.
        """
        lines = (self.message or "").strip().splitlines()
        return _LOG_TAIL.sub("", lines[0]) if lines else None


def build_job(
    cfg_path: str | os.PathLike[str],
    overrides: Sequence[str],
    address: str,
    *,
    entrypoint_args: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    no_wait: bool = False,
    engine: str = "skyrl",
    validate: bool = True,
) -> RayJob:
    """The Ray job that runs ``maze-train`` with this config on the cluster.

    ``address`` is ``sagemaker_ray://<raycluster>/<namespace>`` (needs the
    ``toolkit-for-ray-on-sagemaker-ai`` package where the command runs), a dashboard URL
    (``http://head:8265``) or ``host:port``. ``cfg_path`` is a shipped config name (always
    present in the image) or an absolute path the head pod can read, e.g. on ``/shared``. With
    ``validate`` the config and overrides are checked here first, so a typo fails before
    submission. ``env_vars`` and the shipped configs' variables (``MAZERL_RUN``,
    ``MAZERL_SFT_CHECKPOINT``, when set here) go into the job's runtime env, with
    ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` so SkyRL's own ``ray.init(runtime_env=...)`` in the job
    merges instead of failing on a shared variable.
    """
    if not _ADDRESS.fullmatch(address):
        raise ConfigError(
            f"{address!r} is not a Ray job address: use sagemaker_ray://<raycluster>/<namespace> "
            "(lowercase Kubernetes names), http(s)://<host>[:port] or <host>:<port>",
            key="address",
        )
    override_keys(list(overrides))
    raw = Path(cfg_path)
    shipped = CONFIG_DIR / (raw.name if raw.suffix else f"{raw.name}.yaml")
    if len(raw.parts) == 1 and shipped.is_file():
        config_arg = shipped.stem
    elif raw.is_absolute():
        config_arg = str(raw)
    else:
        raise ConfigError(
            f"{os.fspath(cfg_path)!r}: give a shipped config name or an absolute path the cluster "
            "can read (e.g. under /shared)",
            key="config",
            allowed=shipped_configs(),
        )
    if validate and (config_arg == shipped.stem or raw.is_file()):
        load_config(
            config_arg if config_arg == shipped.stem else raw, list(overrides), validate=False
        )
    forwarded = {k: os.environ[k] for k in FORWARDED_ENV_VARS if os.environ.get(k)}
    # SkyRL's initialize_ray calls ray.init(runtime_env=...) inside the job; Ray refuses to merge
    # that with the job's runtime env when both set the same variable, unless told to let the
    # driver's (SkyRL's) values win.
    runtime_env = {
        "env_vars": {**forwarded, **dict(env_vars or {}), "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}
    }
    return RayJob(
        address=address if "://" in address else f"http://{address}",
        entrypoint=(
            "maze-train",
            "--engine",
            engine,
            "--config",
            config_arg,
            *entrypoint_args,
            *overrides,
        ),
        runtime_env=runtime_env,
        no_wait=no_wait,
    )


def build_submit_command(
    cfg_path: str | os.PathLike[str],
    overrides: Sequence[str],
    address: str,
    **kwargs: Any,
) -> list[str]:
    """:func:`build_job`'s job as a ``ray job submit`` argv; join with ``shlex.join`` to print."""
    return build_job(cfg_path, overrides, address, **kwargs).command()


def _what_to_check(address: str) -> str:
    if address.startswith(f"{SAGEMAKER_SCHEME}://"):
        return (
            "check the RayCluster name and namespace, and that this machine can reach the "
            "HyperPod cluster (kubectl context, AWS credentials)"
        )
    return (
        "check that the Ray head is running and that its dashboard port (8265 by default) is "
        "reachable from this machine"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unreachable(address: str, reason: str) -> JobServerError:
    reason = reason.strip().splitlines()[0] if reason.strip() else "no answer"
    return JobServerError(
        f"cannot reach the Ray job server at {address}: {reason}; {_what_to_check(address)}"
    )


def _probe(address: str, timeout: float) -> None:
    """Fail fast (and bounded) where Ray's client would wait on an unanswered connect."""
    url = urlsplit(address)
    host = url.hostname or ""
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except ValueError as exc:  # a port outside 0-65535
        raise _unreachable(address, str(exc)) from None
    except TimeoutError:
        raise _unreachable(address, f"no answer within {timeout:g} s") from None
    except OSError as exc:
        raise _unreachable(address, (exc.strerror or str(exc)).lower()) from None


@contextlib.contextmanager
def _explicit_address() -> Generator[None]:
    # Ray's client lets RAY_API_SERVER_ADDRESS / RAY_ADDRESS override the address it is given;
    # here the address on the command line is the one meant.
    saved = {
        k: os.environ.pop(k) for k in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS") if k in os.environ
    }
    try:
        yield
    finally:
        os.environ.update(saved)


def require_job_client(address: str) -> None:
    """Check that Ray's job client can resolve ``address``'s scheme here.

    Raises:
        JobClientMissingError: ``sagemaker_ray://`` without ``toolkit-for-ray-on-sagemaker-ai``.
    """
    if address.startswith(f"{SAGEMAKER_SCHEME}://") and not importlib.util.find_spec(
        SAGEMAKER_SCHEME
    ):
        raise JobClientMissingError(
            f"{SAGEMAKER_SCHEME}:// addresses need the {SAGEMAKER_PACKAGE} package, which is not "
            f"installed here (pip install {SAGEMAKER_PACKAGE})"
        )


def connect(address: str, *, timeout: float = CONNECT_TIMEOUT_S) -> JobSubmissionClient:
    """A job client for ``address`` (as :class:`RayJob` holds it), after checking it answers.

    Raises:
        JobClientMissingError: ``sagemaker_ray://`` without ``toolkit-for-ray-on-sagemaker-ai``.
        JobServerError: Nothing answers at ``address``, or it is not a Ray job server.
    """
    require_job_client(address)
    scheme = address.split("://", 1)[0]
    if scheme in ("http", "https"):
        _probe(address, timeout)
    from ray.job_submission import JobSubmissionClient

    # Ray's job client pins its loggers at INFO and logs each connection step; the command's own
    # lines (and the job's logs) are what the user reads.
    for name in ("ray.dashboard.modules.job.sdk", "ray.dashboard.modules.dashboard_sdk"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        with _explicit_address():
            return JobSubmissionClient(address)
    except ConnectionError as exc:
        raise _unreachable(address, str(exc)) from None
    except (RuntimeError, OSError, ValueError) as exc:  # it answers, but not as Ray's job API
        raise JobServerError(
            f"no Ray job server answers at {address}: {_first_line(exc)}; check that this is "
            "the address of the Ray head's dashboard (port 8265 by default)"
        ) from None


def start(client: JobSubmissionClient, job: RayJob) -> str:
    """Submit ``job``; returns its submission id.

    Raises:
        JobServerError: The job server refused or did not take the job.
    """
    try:
        return client.submit_job(entrypoint=shlex.join(job.entrypoint), runtime_env=job.runtime_env)
    except (ConnectionError, RuntimeError, OSError, ValueError) as exc:
        raise JobServerError(
            f"the Ray job server at {job.address} did not take the job: {_first_line(exc)}"
        ) from None


def follow(
    client: JobSubmissionClient, job_id: str, address: str, write: Callable[[str], None]
) -> JobOutcome:
    """Stream the job's logs to ``write`` until it ends; returns how it ended.

    Raises:
        JobServerError: The log stream or the status query failed; the job may still run.
    """

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    try:
        asyncio.run(tail())
        info = client.get_job_info(job_id)
    except Exception as exc:  # aiohttp's and Ray's errors alike: the job itself may be fine
        raise JobServerError(
            f"lost Ray job {job_id} at {address}: {_first_line(exc)}; it may still be running: "
            f"ray job status {job_id} --address {address}"
        ) from None
    return JobOutcome(
        job_id=job_id,
        status=str(info.status.value if hasattr(info.status, "value") else info.status),
        message=info.message,
        driver_exit_code=info.driver_exit_code,
    )
