"""``maze-infra endpoint``: the served adapter as a SageMaker real-time endpoint.

    maze-infra endpoint deploy --name NAME --image ECR_URI --adapter s3://BUCKET/PREFIX/
                               --base-model s3://BUCKET/PREFIX/ --role ROLE_ARN
                               [--instance-type ml.g6e.xlarge] [--instance-count 1]
                               [--startup-timeout 1800] [--wait] [--dry-run]
    maze-infra endpoint describe NAME [--json]
    maze-infra endpoint delete NAME

``deploy`` creates three resources with the SageMaker Python SDK's typed resources
(``sagemaker.core.resources``): a Model running the ``mazerl-serve`` image (started by
SageMaker as ``<image> serve``) with ``MAZE_MODEL`` and ``MAZE_ADAPTER`` set, which is how
``maze-serve serve`` learns where the base model and the adapter are; an EndpointConfig with one
production variant; and the Endpoint. Model and config are named ``NAME-<UTC time>`` so that a
redeploy never collides with the resources a running endpoint still uses. If a step fails, what
this run created is deleted again before the error is reported.

Every flag is validated before any AWS call. Options are flags rather than a spec file: each
deploy changes the image tag and the adapter prefix, the rest has defaults, and the command
line is what gets reviewed in a release runbook.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from maze_infra._aws import (
    REGION_PATTERN,
    ErrorStyle,
    aws_options,
    bounded_session,
    is_not_found,
    noted,
    one_line,
    sagemaker_core,
)
from maze_infra.errors import InfraError, OperationError, SpecError

DEFAULT_INSTANCE_TYPE = "ml.g6e.xlarge"
VARIANT = "AllTraffic"
# Download of an 8B base model and its load run while maze-serve answers /ping 503; SageMaker
# allows 60..3600 s for the container to start answering 200.
DEFAULT_STARTUP_TIMEOUT_S = 1800
# The image's torch wheel is built for CUDA 13; this AMI has the NVIDIA 580 driver it needs
# (SageMaker's default GPU AMIs ship 535/550, CUDA 12.x).
GPU_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
# The environment that ``maze-serve serve`` reads (apps/server/src/maze_server/cli.py).
ENV_MODEL = "MAZE_MODEL"
ENV_ADAPTER = "MAZE_ADAPTER"
TAG_KEY = "mazerl-endpoint"

_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
_NAME_MAX = 63
_STAMP = "%Y%m%d-%H%M%S"
_S3 = re.compile(r"s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<key>\S+)")
_ECR = re.compile(
    r"(?P<account>\d{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)"
    r"\.amazonaws\.com(?:\.cn)?/(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127})|@sha256:[0-9a-f]{64})?"
)
_ROLE = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")
_INSTANCE = re.compile(r"ml\.[a-z0-9-]+\.[a-z0-9]+")
_MAX_MESSAGE = 400
_NEEDS = "SageMaker endpoints"
# `with _aws("what it does"):` turns the SDKs' exceptions into one-line typed errors.
_aws = ErrorStyle(
    max_chars=_MAX_MESSAGE,  # cut, so that the rollback note after it stays in view
    denied_is_credentials=False,  # a denied action is the service refusing it: exit 1
    invalid_model_is_input=False,  # requests are typed shapes: only an answer can fail to parse
).calling


@dataclass(frozen=True)
class EndpointSpec:
    """What one ``deploy`` creates; :meth:`validate` checks every field without AWS.

    Attributes:
        name: The endpoint name (SageMaker's name pattern, at most 63 characters).
        image: The ``mazerl-serve`` image in ECR, in the endpoint's region.
        adapter: ``s3://`` prefix of the LoRA adapter (``adapter_config.json`` + weights).
        base_model: ``s3://`` prefix or absolute path in the image of the base model.
        role: The execution role SageMaker assumes to pull the image and read S3.
        instance_type: An ``ml.*`` hosting instance type.
        instance_count: Instances behind the variant.
        startup_timeout_s: Seconds SageMaker waits for ``/ping`` to answer 200.
    """

    name: str
    image: str
    adapter: str
    base_model: str
    role: str
    instance_type: str = DEFAULT_INSTANCE_TYPE
    instance_count: int = 1
    startup_timeout_s: int = DEFAULT_STARTUP_TIMEOUT_S

    def validate(self, region: str | None = None) -> None:
        """Check every field; ``region``, when known, must be the image's ECR region.

        Raises:
            SpecError: A field is malformed; the error names it.
        """
        if region is not None and not REGION_PATTERN.fullmatch(region):
            raise SpecError(f"{region!r} is not an AWS region", field="region")
        if not _NAME.fullmatch(self.name) or len(self.name) > _NAME_MAX:
            raise SpecError(
                f"{self.name!r} is not a SageMaker name (letters, digits and '-', "
                f"starting and ending alphanumeric, at most {_NAME_MAX} characters)",
                field="name",
            )
        ecr = _ECR.fullmatch(self.image)
        if not ecr:
            raise SpecError(
                f"{self.image!r} is not an ECR image URI "
                "(ACCOUNT.dkr.ecr.REGION.amazonaws.com/REPOSITORY[:TAG|@sha256:DIGEST])",
                field="image",
            )
        if region and ecr["region"] != region:
            raise SpecError(
                f"the image is in {ecr['region']} but the endpoint would be in {region}; "
                "SageMaker pulls images from its own region",
                field="image",
            )
        _check_s3(self.adapter, "adapter")
        if self.base_model.startswith("s3://"):
            _check_s3(self.base_model, "base_model")
        elif not re.fullmatch(r"/\S*", self.base_model):
            raise SpecError(
                f"{self.base_model!r} is neither an s3:// prefix nor an absolute path in the image",
                field="base_model",
            )
        if not _ROLE.fullmatch(self.role):
            raise SpecError(
                f"{self.role!r} is not an IAM role ARN (arn:aws:iam::ACCOUNT:role/NAME)",
                field="role",
            )
        if not _INSTANCE.fullmatch(self.instance_type):
            raise SpecError(
                f"{self.instance_type!r} is not a SageMaker instance type (ml.FAMILY.SIZE)",
                field="instance_type",
            )
        if self.instance_count < 1:
            raise SpecError(
                f"must be at least 1, got {self.instance_count}", field="instance_count"
            )
        if not 60 <= self.startup_timeout_s <= 3600:
            raise SpecError(
                f"SageMaker allows 60..3600 seconds, got {self.startup_timeout_s}",
                field="startup_timeout",
            )

    def container_env(self) -> dict[str, str]:
        """The container environment: where ``maze-serve serve`` finds the model and adapter."""
        return {ENV_MODEL: self.base_model, ENV_ADAPTER: self.adapter}

    def gpu(self) -> bool:
        """Whether the instance type is a GPU family (g*, p*)."""
        return self.instance_type.split(".")[1][:1] in ("g", "p")


@dataclass(frozen=True)
class Plan:
    """The names one deploy uses and the requests it sends, as SageMaker's API spells them."""

    spec: EndpointSpec
    model_name: str
    config_name: str

    def requests(self) -> dict[str, dict[str, Any]]:
        """CreateModel, CreateEndpointConfig and CreateEndpoint parameters (for ``--dry-run``)."""
        tags = [{"Key": TAG_KEY, "Value": self.spec.name}]
        variant: dict[str, Any] = {
            "VariantName": VARIANT,
            "ModelName": self.model_name,
            "InstanceType": self.spec.instance_type,
            "InitialInstanceCount": self.spec.instance_count,
            "ContainerStartupHealthCheckTimeoutInSeconds": self.spec.startup_timeout_s,
        }
        if self.spec.gpu():
            variant["InferenceAmiVersion"] = GPU_AMI
        return {
            "CreateModel": {
                "ModelName": self.model_name,
                "PrimaryContainer": {
                    "Image": self.spec.image,
                    "Environment": self.spec.container_env(),
                },
                "ExecutionRoleArn": self.spec.role,
                "Tags": tags,
            },
            "CreateEndpointConfig": {
                "EndpointConfigName": self.config_name,
                "ProductionVariants": [variant],
                "Tags": tags,
            },
            "CreateEndpoint": {
                "EndpointName": self.spec.name,
                "EndpointConfigName": self.config_name,
                "Tags": tags,
            },
        }


def plan(spec: EndpointSpec, now: float | None = None) -> Plan:
    """Name the model and endpoint config of one deploy: ``NAME-YYYYmmdd-HHMMSS`` (UTC).

    Args:
        spec: A validated spec.
        now: Seconds since the epoch (default: the current time).

    Returns:
        The plan; a long endpoint name is shortened so the derived names fit 63 characters.
    """
    stamp = time.strftime(_STAMP, time.gmtime(time.time() if now is None else now))
    base = spec.name[: _NAME_MAX - len(stamp) - 1].rstrip("-")
    name = f"{base}-{stamp}"
    return Plan(spec=spec, model_name=name, config_name=name)


@dataclass
class Deployment:
    """What :func:`deploy` did: the plan and the endpoint's last seen status."""

    plan: Plan
    status: str
    created: list[str] = field(default_factory=list[str])


@dataclass(frozen=True)
class Variant:
    """One production variant of a described endpoint."""

    name: str
    instance_type: str | None
    desired: int | None
    current: int | None
    model: str | None


@dataclass(frozen=True)
class Description:
    """What :func:`describe` reports about an endpoint."""

    name: str
    status: str
    config: str | None
    variants: list[Variant]
    image: str | None
    env: dict[str, str]
    failure_reason: str | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the description."""
        return {
            "name": self.name,
            "status": self.status,
            "config": self.config,
            "variants": [v.__dict__ for v in self.variants],
            "image": self.image,
            "env": self.env,
            "failure_reason": self.failure_reason,
        }


# --- AWS access ---------------------------------------------------------------------------


def _check_s3(uri: str, name: str) -> None:
    m = _S3.fullmatch(uri)
    if not m or ".." in m["bucket"] or not m["key"].strip("/"):
        raise SpecError(f"{uri!r} is not an s3://BUCKET/PREFIX/ URI", field=name)


def _resources() -> Any:
    """sagemaker-core's resources module, or :class:`MissingExtraError`."""
    return sagemaker_core("resources", needs=_NEEDS)[0]


def _drop_empty_structures(parsed: dict[str, Any], **_: Any) -> None:
    # Emulators (moto) answer Describe* with empty {} for absent structures (VpcConfig,
    # DataCaptureConfig) where SageMaker omits them; the typed resources reject those.
    for key in [k for k, v in parsed.items() if isinstance(v, dict) and not v]:
        del parsed[key]


def aws_session(
    region: str | None = None,
    *,
    profile: str | None = None,
    endpoint_url: str | None = None,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 60.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 session whose clients have bounded timeouts and retries.

    sagemaker-core builds its clients from the session it is given; this session's
    ``client()`` adds ``endpoint_url`` (when given) and the timeouts to every one of them.

    Args:
        region: AWS region (default: ``AWS_REGION``, else the environment's or the profile's).
        profile: A named profile of the shared AWS config.
        endpoint_url: Another SageMaker endpoint (a VPC endpoint, an emulator).
        connect_timeout_s: Seconds to open a connection.
        read_timeout_s: Seconds to wait for a response.
        max_attempts: Attempts per call, the first included (unless ``AWS_MAX_ATTEMPTS`` or
            ``AWS_RETRY_MODE`` say otherwise).

    Returns:
        A ``boto3.session.Session`` with ``region_name`` set.

    Raises:
        MissingExtraError: The ``aws`` extra is not installed.
        CredentialsError: The profile does not exist.
        SpecError: No region is given or configured.
    """
    session = bounded_session(
        region,
        profile=profile,
        endpoint_url=endpoint_url,
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        max_attempts=max_attempts,
        needs=_NEEDS,
    )
    for op in ("DescribeModel", "DescribeEndpointConfig", "DescribeEndpoint"):
        session.events.register(f"after-call.sagemaker.{op}", _drop_empty_structures)
    return session


def _value(x: Any) -> Any:
    """A resource attribute, with sagemaker-core's ``Unassigned`` sentinel as ``None``."""
    from sagemaker.core.utils.utils import Unassigned

    return None if isinstance(x, Unassigned) else x


# --- operations --------------------------------------------------------------------------


def deploy(
    spec: EndpointSpec,
    session: Any,
    *,
    wait: bool = False,
    wait_timeout_s: float = 3600.0,
    poll_s: float = 15.0,
    now: float | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> Deployment:
    """Create the model, endpoint config and endpoint; roll back what this run created on failure.

    Args:
        spec: What to deploy (validated here first).
        session: From :func:`aws_session`.
        wait: Poll until the endpoint is ``InService`` (a ``Failed`` endpoint is rolled back).
        wait_timeout_s: How long ``wait`` polls; on timeout the endpoint is left creating.
        poll_s: Seconds between polls.
        now: Time used in the derived names (default: now).
        log: Receives one line per step.

    Returns:
        The plan, the endpoint's status and the resources created.

    Raises:
        SpecError: A field is malformed.
        CredentialsError: Credentials missing or refused.
        ServiceUnreachableError: SageMaker did not answer.
        OperationError: The endpoint name is taken, SageMaker refused a step, or the endpoint
            failed to start (or, with ``wait``, was not up in time).
    """
    res = _resources()
    from sagemaker.core.shapes import ContainerDefinition, ProductionVariant, Tag

    region: str = session.region_name
    spec.validate(region)
    p = plan(spec, now)
    kw: dict[str, Any] = {"session": session, "region": region}
    with _aws(f"look up endpoint {spec.name}"):
        existing = _get_or_none(res.Endpoint, {"endpoint_name": spec.name}, kw)
    if existing is not None:
        raise OperationError(
            f"endpoint {spec.name} already exists ({_value(existing.endpoint_status)}); "
            f"delete it first (maze-infra endpoint delete {spec.name}); nothing was created"
        )
    req = p.requests()
    tags = [Tag(key=TAG_KEY, value=spec.name)]
    done = Deployment(plan=p, status="")
    # Rollback order: newest first; each entry may exist even when its create call raised.
    created: list[tuple[str, str]] = []
    try:
        created.append(("model", p.model_name))
        with _aws(f"create model {p.model_name}"):
            res.Model.create(
                model_name=p.model_name,
                primary_container=ContainerDefinition(
                    image=spec.image, environment=spec.container_env()
                ),
                execution_role_arn=spec.role,
                tags=tags,
                **kw,
            )
        log(f"model     {p.model_name}")
        created.append(("config", p.config_name))
        variant = req["CreateEndpointConfig"]["ProductionVariants"][0]
        with _aws(f"create endpoint config {p.config_name}"):
            res.EndpointConfig.create(
                endpoint_config_name=p.config_name,
                production_variants=[
                    ProductionVariant(
                        variant_name=VARIANT,
                        model_name=p.model_name,
                        instance_type=spec.instance_type,
                        initial_instance_count=spec.instance_count,
                        container_startup_health_check_timeout_in_seconds=spec.startup_timeout_s,
                        inference_ami_version=variant.get("InferenceAmiVersion"),
                    )
                ],
                tags=tags,
                **kw,
            )
        log(f"config    {p.config_name}")
        created.append(("endpoint", spec.name))
        with _aws(f"create endpoint {spec.name}"):
            endpoint = res.Endpoint.create(
                endpoint_name=spec.name, endpoint_config_name=p.config_name, tags=tags, **kw
            )
        done.status = str(_value(endpoint.endpoint_status))
        log(f"endpoint  {spec.name}: {done.status}")
        if wait:
            done.status = _wait(endpoint, wait_timeout_s, poll_s, log)
    except BaseException as exc:
        note = _rollback(created, session, exc)
        if isinstance(exc, InfraError):
            raise noted(exc, note) from exc
        raise
    done.created = [f"{kind} {name}" for kind, name in created]
    return done


class _StillCreatingError(OperationError):
    """The wait timed out; the endpoint keeps creating and is not rolled back."""


def _wait(endpoint: Any, timeout_s: float, poll_s: float, log: Callable[[str], None]) -> str:
    deadline = time.monotonic() + timeout_s
    status = str(_value(endpoint.endpoint_status))
    while status != "InService":
        if status == "Failed":
            reason = _value(endpoint.failure_reason) or "no reason given"
            raise OperationError(
                f"endpoint {endpoint.endpoint_name} failed: {one_line(reason, _MAX_MESSAGE)}"
            )
        if time.monotonic() >= deadline:
            # Not rolled back by the caller: SageMaker may still bring it up.
            raise _StillCreatingError(
                f"endpoint {endpoint.endpoint_name} is still {status} after {timeout_s:.0f} s; "
                f"follow it with maze-infra endpoint describe {endpoint.endpoint_name}"
            )
        time.sleep(poll_s)
        with _aws(f"describe endpoint {endpoint.endpoint_name}"):
            endpoint.refresh()
        new = str(_value(endpoint.endpoint_status))
        if new != status:
            log(f"endpoint  {endpoint.endpoint_name}: {new}")
        status = new
    return status


def _rollback(created: list[tuple[str, str]], session: Any, cause: BaseException) -> str:
    """Delete ``created`` newest first; a one-line account of what happened."""
    if not created:
        return "nothing was created"
    if isinstance(cause, _StillCreatingError):
        return "left in place: " + ", ".join(f"{k} {n}" for k, n in created)
    deleted: list[str] = []
    left: list[str] = []
    config = next((n for k, n in created if k == "config"), None)
    for kind, name in reversed(created):
        try:
            if _delete_one(kind, name, session, only_with_config=config):
                deleted.append(f"{kind} {name}")
        except InfraError as exc:
            left.append(f"{kind} {name} ({exc})")
    parts = [f"rolled back: deleted {', '.join(deleted) or 'nothing (none was created)'}"]
    if left:
        parts.append("could not delete " + "; ".join(left) + ": delete by hand")
    return "; ".join(parts)


_KEYS = {"model": "model_name", "config": "endpoint_config_name", "endpoint": "endpoint_name"}


def _delete_one(kind: str, name: str, session: Any, *, only_with_config: str | None = None) -> bool:
    """Delete one resource (kind: model, config or endpoint); ``False`` when there is none.

    With ``only_with_config``, an endpoint is deleted only if it uses that config: a rollback
    must not delete an endpoint of the same name that another deploy created meanwhile.
    """
    res = _resources()
    cls = {"model": res.Model, "config": res.EndpointConfig, "endpoint": res.Endpoint}[kind]
    kw: dict[str, Any] = {"session": session, "region": session.region_name}
    with _aws(f"delete {kind} {name}"):
        found = _get_or_none(cls, {_KEYS[kind]: name}, kw)
        if found is None:
            return False
        if (
            kind == "endpoint"
            and only_with_config is not None
            and _value(found.endpoint_config_name) != only_with_config
        ):
            return False
        try:
            found.delete()
        except Exception as exc:
            if is_not_found(exc):  # deleted meanwhile
                return False
            raise
    return True


def describe(name: str, session: Any) -> Description:
    """Status, variants, image, container environment and failure reason of an endpoint.

    Raises:
        SpecError: ``name`` is not a SageMaker name.
        OperationError: There is no such endpoint.
    """
    _check_name(name)
    res = _resources()
    kw: dict[str, Any] = {"session": session, "region": session.region_name}
    ep = _endpoint_or_fail(res, name, kw)
    config_name = _value(ep.endpoint_config_name)
    live: dict[str, Any] = {}
    summaries: list[Any] = _value(ep.production_variants) or []
    for summary in summaries:
        live[summary.variant_name] = summary
    configured: dict[str, Any] = {}
    models: dict[str, Any] = {}
    if config_name:
        with _aws(f"describe endpoint config {config_name}"):
            cfg = _get_or_none(res.EndpointConfig, {"endpoint_config_name": config_name}, kw)
        pvs: list[Any] = (_value(cfg.production_variants) if cfg else None) or []
        for v in pvs:
            configured[v.variant_name] = v
    variants: list[Variant] = []
    names: list[str] = list(dict.fromkeys([*configured, *live]))
    for vname in names:
        c, s = configured.get(vname), live.get(vname)
        model = _value(c.model_name) if c else None
        variants.append(
            Variant(
                name=vname,
                instance_type=_value(c.instance_type) if c else None,
                desired=_value(s.desired_instance_count) if s else None,
                current=_value(s.current_instance_count) if s else None,
                model=model,
            )
        )
        if model and model not in models:
            with _aws(f"describe model {model}"):
                models[model] = _get_or_none(res.Model, {"model_name": model}, kw)
    image, env = None, {}
    first = next((m for m in models.values() if m is not None), None)
    if first is not None and (pc := _value(first.primary_container)) is not None:
        image, env = _value(pc.image), dict(_value(pc.environment) or {})
    return Description(
        name=name,
        status=str(_value(ep.endpoint_status)),
        config=config_name,
        variants=variants,
        image=image,
        env=env,
        failure_reason=_value(ep.failure_reason),
    )


def _endpoint_or_fail(res: Any, name: str, kw: dict[str, Any]) -> Any:
    with _aws(f"describe endpoint {name}"):
        ep = _get_or_none(res.Endpoint, {"endpoint_name": name}, kw)
    if ep is None:
        raise OperationError(f"no endpoint named {name} in {kw['region']}")
    return ep


def _get_or_none(cls: Any, key: dict[str, str], kw: dict[str, Any]) -> Any:
    """``cls.get(...)``, or ``None`` where SageMaker says there is no such resource."""
    try:
        return cls.get(**key, **kw)
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def delete(name: str, session: Any) -> list[str]:
    """Delete the endpoint, then its endpoint config and the config's models.

    Returns:
        ``"<kind> <name>"`` for each resource deleted.

    Raises:
        SpecError: ``name`` is not a SageMaker name.
        OperationError: There is no such endpoint, or SageMaker refused a deletion.
    """
    _check_name(name)
    res = _resources()
    kw: dict[str, Any] = {"session": session, "region": session.region_name}
    ep = _endpoint_or_fail(res, name, kw)
    config_name = _value(ep.endpoint_config_name)
    models: list[str] = []
    if config_name:
        with _aws(f"describe endpoint config {config_name}"):
            cfg = _get_or_none(res.EndpointConfig, {"endpoint_config_name": config_name}, kw)
        pvs: list[Any] = (_value(cfg.production_variants) if cfg else None) or []
        for v in pvs:
            if (m := _value(v.model_name)) and m not in models:
                models.append(m)
    deleted: list[str] = []
    with _aws(f"delete endpoint {name}"):
        ep.delete()
    deleted.append(f"endpoint {name}")
    if config_name and _delete_one("config", config_name, session):
        deleted.append(f"config {config_name}")
    deleted += [f"model {m}" for m in models if _delete_one("model", m, session)]
    return deleted


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name) or len(name) > _NAME_MAX:
        raise SpecError(f"{name!r} is not a SageMaker endpoint name", field="name")


# --- command line ------------------------------------------------------------------------


def register(groups: Any) -> None:
    """Add ``endpoint deploy|describe|delete`` to ``maze-infra``."""
    aws = aws_options(profile_and_endpoint=True)
    group = groups.add_parser(
        "endpoint",
        help="SageMaker real-time endpoints for the served adapter",
        description="Deploy, describe and delete the SageMaker endpoint that serves an adapter.",
    )
    sub = group.add_subparsers(
        dest="endpoint_command", required=True, metavar="{deploy,describe,delete}"
    )

    d = sub.add_parser(
        "deploy",
        parents=[aws],
        help="create model, endpoint config and endpoint",
        description="Create a SageMaker model (the mazerl-serve image with the adapter and base "
        "model locations in its environment), an endpoint config and the endpoint. "
        "What a failed run created is deleted again.",
    )
    d.add_argument("--name", required=True, help="endpoint name")
    d.add_argument(
        "--image", required=True, help="mazerl-serve image URI in ECR (same region as the endpoint)"
    )
    d.add_argument("--adapter", required=True, help="s3:// prefix of the LoRA adapter")
    d.add_argument(
        "--base-model",
        required=True,
        help="s3:// prefix (or absolute path in the image) of the adapter's base model",
    )
    d.add_argument("--role", required=True, help="execution role ARN SageMaker assumes")
    d.add_argument(
        "--instance-type",
        default=DEFAULT_INSTANCE_TYPE,
        help="hosting instance type (default %(default)s)",
    )
    d.add_argument("--instance-count", type=int, default=1, help="instances (default %(default)s)")
    d.add_argument(
        "--startup-timeout",
        type=int,
        default=DEFAULT_STARTUP_TIMEOUT_S,
        metavar="SECONDS",
        help="how long SageMaker waits for /ping to answer 200 (60-3600, default %(default)s)",
    )
    d.add_argument("--wait", action="store_true", help="wait until the endpoint is InService")
    d.add_argument(
        "--wait-timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long --wait waits (default %(default)s)",
    )
    d.add_argument(
        "--dry-run", action="store_true", help="validate and print the requests; call nothing"
    )
    d.set_defaults(command=_deploy_command)

    s = sub.add_parser(
        "describe", parents=[aws], help="status, variants and failure reason of an endpoint"
    )
    s.add_argument("name", help="endpoint name")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(command=_describe_command)

    x = sub.add_parser(
        "delete", parents=[aws], help="delete an endpoint, its endpoint config and its model"
    )
    x.add_argument("name", help="endpoint name")
    x.set_defaults(command=_delete_command)


def _session_from(args: argparse.Namespace) -> Any:
    return aws_session(args.region, profile=args.profile, endpoint_url=args.endpoint_url)


def _deploy_command(args: argparse.Namespace) -> int:
    spec = EndpointSpec(
        name=args.name,
        image=args.image,
        adapter=args.adapter,
        base_model=args.base_model,
        role=args.role,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        startup_timeout_s=args.startup_timeout,
    )
    if args.dry_run:
        region = args.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        spec.validate(region)
        print(json.dumps(plan(spec).requests(), indent=2))
        return 0
    spec.validate(args.region)  # before the SDK import: bad input fails fast
    session = _session_from(args)
    deploy(spec, session, wait=args.wait, wait_timeout_s=args.wait_timeout, log=print)
    return 0


def _describe_command(args: argparse.Namespace) -> int:
    _check_name(args.name)
    d = describe(args.name, _session_from(args))
    if args.json:
        print(json.dumps(d.to_json(), indent=2, default=str))
        return 0
    print(f"endpoint  {d.name}")
    print(f"status    {d.status}")
    print(f"config    {d.config or '-'}")
    for v in d.variants:
        print(
            f"variant   {v.name}: {v.instance_type or '?'} x{v.desired if v.desired is not None else '?'}"
            f" (running {v.current if v.current is not None else '?'}), model {v.model or '?'}"
        )
    print(f"image     {d.image or '-'}")
    for label, key in (("base", ENV_MODEL), ("adapter", ENV_ADAPTER)):
        if key in d.env:
            print(f"{label:<9} {d.env[key]}")
    if d.failure_reason:
        print(f"failure   {one_line(d.failure_reason, _MAX_MESSAGE)}")
    return 0


def _delete_command(args: argparse.Namespace) -> int:
    _check_name(args.name)
    for line in delete(args.name, _session_from(args)):
        print(f"deleted {line}")
    return 0
