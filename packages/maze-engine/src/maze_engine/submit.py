"""Ray job submission: the ``maze-train`` command that runs a config on a Ray cluster.

The address is ``sagemaker_ray://<raycluster>/<namespace>`` (HyperPod; needs the
``toolkit-for-ray-on-sagemaker-ai`` package where the command runs), a Ray dashboard URL or
``host:port``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from maze_engine.config import CONFIG_DIR, load_config, shipped_configs
from maze_engine.errors import ConfigError
from maze_engine.schema import override_keys

FORWARDED_ENV_VARS = ("MAZERL_RUN", "MAZERL_SFT_CHECKPOINT")
"""Variables the shipped configs read (``${oc.env:...}``); forwarded to the Ray job if set."""

_K8S_NAME = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_ADDRESS = re.compile(
    rf"sagemaker_ray://{_K8S_NAME}/{_K8S_NAME}"  # HyperPod: <raycluster>/<namespace>
    r"|https?://[^\s/:]+(?::\d{1,5})?/?"  # a Ray dashboard
    r"|[^\s/:]+:\d{1,5}"  # host:port, which `ray job submit` reads as http://
)


def build_submit_command(
    cfg_path: str | os.PathLike[str],
    overrides: Sequence[str],
    address: str,
    *,
    entrypoint_args: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    no_wait: bool = False,
    engine: str = "skyrl",
    validate: bool = True,
) -> list[str]:
    """The ``ray job submit`` argv that runs ``maze-train`` with this config on the cluster.

    ``address`` is ``sagemaker_ray://<raycluster>/<namespace>`` (needs the
    ``toolkit-for-ray-on-sagemaker-ai`` package where the command runs), a dashboard URL
    (``http://head:8265``) or ``host:port``. ``cfg_path`` is a shipped config name (always
    present in the image) or an absolute path the head pod can read, e.g. on ``/shared``. With
    ``validate`` the config and overrides are checked here first, so a typo fails before
    submission. ``env_vars`` and the shipped configs' variables (``MAZERL_RUN``,
    ``MAZERL_SFT_CHECKPOINT``, when set here) go into the job's runtime env, with
    ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` so SkyRL's own ``ray.init(runtime_env=...)`` in the job
    merges instead of failing on a shared variable. Join with ``shlex.join`` to print it.
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
    return [
        "ray",
        "job",
        "submit",
        "--address",
        address,
        "--runtime-env-json",
        json.dumps(runtime_env, sort_keys=True),
        *(["--no-wait"] if no_wait else []),
        "--",
        "maze-train",
        "--engine",
        engine,
        "--config",
        config_arg,
        *entrypoint_args,
        *overrides,
    ]
