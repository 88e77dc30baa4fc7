"""HyperPod clusters as data: ``maze-infra cluster create | describe | nodes | delete | fsx-input``.

``infra/hyperpod/cluster.yaml`` describes the cluster. This module loads it into a typed spec (a
malformed one is a :class:`~maze_infra.errors.SpecError` naming the field), turns the spec into
the SageMaker ``CreateCluster`` request, checks that request against the SageMaker service model
shipped in botocore, and then creates, describes, lists the nodes of and deletes the cluster with
sagemaker-core's ``Cluster`` resource (the SageMaker Python SDK v3's typed resource layer), over
a boto3 session whose clients have bounded timeouts and retries.

boto3, botocore and sagemaker-core form the ``aws`` extra; they are imported by the commands
that use them, never at import time, so the CLI starts fast without them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO, cast

from maze_infra._aws import (
    AWS_EXTRA,
    ErrorStyle,
    aws_options,
    bounded_session,
    is_not_found,
    noted,
    one_line,
    sagemaker_core,
)
from maze_infra.errors import InfraError, MissingExtraError, OperationError, SpecError

NODE_RECOVERY_MODES = ("Automatic", "None")
# The label HyperPod's health agent puts on each Kubernetes node of an EKS-orchestrated cluster.
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
# Every client of the session gets these (MAX_ATTEMPTS counts the first try); a dead endpoint
# fails in seconds, not minutes.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
MAX_ATTEMPTS = 3
_NEEDS = "HyperPod commands"
# `with _calling("what it does"):` turns the SDKs' exceptions into one-line typed errors.
_calling = ErrorStyle(
    max_chars=None,  # whole: a refusal's list of allowed values is what to choose from
    denied_is_credentials=True,  # a denied action wants another role or profile: exit 5
    invalid_model_is_input=True,  # sagemaker-core validates the request made from the spec
).calling
# A coarse health word for nodes whose Kubernetes health label the API does not report.
_HEALTH_FROM_STATUS = {
    "Running": "ok",
    "Pending": "starting",
    "AttachInProgress": "starting",
    "DeepHealthCheckInProgress": "checking",
    "Failure": "failed",
    "SystemUpdating": "updating",
    "ShuttingDown": "leaving",
    "DetachInProgress": "leaving",
}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# ----------------------------------------------------------------------------------------------
# The spec


@dataclass(frozen=True)
class LifecycleConfig:
    """Where an instance group's lifecycle scripts live and which one runs at node creation.

    Attributes:
        source_s3_uri: The S3 prefix HyperPod copies to each node (``s3://sagemaker-.../``).
        on_create: The script under that prefix run once on every new node.
    """

    source_s3_uri: str
    on_create: str


@dataclass(frozen=True)
class InstanceGroup:
    """One HyperPod instance group.

    Attributes:
        name: The instance group name (unique in the cluster).
        instance_type: A SageMaker instance type, e.g. ``ml.g7e.12xlarge``.
        instance_count: Nodes to create (at least 1).
        execution_role: The IAM role ARN the nodes assume.
        lifecycle: The lifecycle scripts.
        threads_per_core: 1 turns simultaneous multithreading off, 2 keeps it; ``None`` leaves
            the instance type's default.
        ebs_volume_gb: Size of the extra EBS volume HyperPod mounts at ``/opt/sagemaker``.
        deep_health_checks: On-start deep health checks (``InstanceStress``,
            ``InstanceConnectivity``); GPU and Trainium groups only.
    """

    name: str
    instance_type: str
    instance_count: int
    execution_role: str
    lifecycle: LifecycleConfig
    threads_per_core: int | None = None
    ebs_volume_gb: int | None = None
    deep_health_checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class FsxLustre:
    """The FSx for Lustre file system the cluster mounts at ``/shared`` (created beforehand).

    Attributes:
        deployment_type: ``PERSISTENT_2`` and the like.
        storage_capacity_gib: Capacity in GiB.
        per_unit_storage_throughput: MB/s per TiB of storage (persistent deployments).
        data_compression: ``LZ4`` or ``NONE``.
        file_system_type_version: The Lustre version, e.g. ``"2.15"``.
        metadata_mode: ``AUTOMATIC`` or ``USER_PROVISIONED`` (``PERSISTENT_2`` only).
        mount_path: Where pods mount it.
        mount_options: Lustre mount options the PersistentVolume sets.
    """

    deployment_type: str
    storage_capacity_gib: int
    per_unit_storage_throughput: int | None = None
    data_compression: str | None = None
    file_system_type_version: str | None = None
    metadata_mode: str | None = None
    mount_path: str = "/shared"
    mount_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    """A HyperPod cluster on EKS, as ``infra/hyperpod/cluster.yaml`` describes it.

    Attributes:
        name: The cluster name.
        eks_cluster_arn: The EKS cluster HyperPod joins as its orchestrator.
        instance_groups: The instance groups, in order.
        subnets: The VPC subnets of the nodes.
        security_group_ids: The security groups of the nodes.
        node_recovery: ``Automatic`` or ``None``.
        tags: Tags on the cluster.
        fsx_lustre: The shared file system's expected properties (not part of CreateCluster).
    """

    name: str
    eks_cluster_arn: str
    instance_groups: tuple[InstanceGroup, ...]
    subnets: tuple[str, ...]
    security_group_ids: tuple[str, ...]
    node_recovery: str = "Automatic"
    tags: Mapping[str, str] = field(default_factory=dict[str, str])
    fsx_lustre: FsxLustre | None = None


class _Section:
    """Typed reads from one mapping of the spec; every error names the field's path."""

    def __init__(self, raw: object, path: str, known: Collection[str]) -> None:
        self.path = path
        if not isinstance(raw, dict):
            raise SpecError("must be a mapping", field=path or "spec")
        self.data = cast(dict[object, object], raw)
        for key in self.data:
            if key not in known:
                names = ", ".join(sorted(known))
                raise SpecError(f"unknown field (known: {names})", field=self.at(str(key)))

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def string(self, key: str) -> str:
        value = self.data.get(key)
        if value is None:
            raise SpecError("required", field=self.at(key))
        if not isinstance(value, str) or not value.strip():
            raise SpecError("must be a non-empty string", field=self.at(key))
        return value

    def opt_string(self, key: str) -> str | None:
        return self.string(key) if self.has(key) else None

    def integer(self, key: str, *, minimum: int) -> int:
        value = self.data.get(key)
        if value is None:
            raise SpecError("required", field=self.at(key))
        # bool is an int in Python; `count: yes` is a mistake, not 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError("must be an integer", field=self.at(key))
        if value < minimum:
            raise SpecError(f"must be >= {minimum}", field=self.at(key))
        return value

    def opt_integer(self, key: str, *, minimum: int) -> int | None:
        return self.integer(key, minimum=minimum) if self.has(key) else None

    def strings(self, key: str, *, min_items: int = 0) -> tuple[str, ...]:
        value = self.data.get(key)
        if value is None:
            value = []
        if not isinstance(value, list):
            raise SpecError("must be a list", field=self.at(key))
        items = cast(list[object], value)
        if len(items) < min_items:
            raise SpecError(f"must have at least {min_items} item(s)", field=self.at(key))
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item.strip():
                raise SpecError("must be a non-empty string", field=f"{self.at(key)}[{i}]")
        return tuple(cast(list[str], items))

    def section(self, key: str, known: Collection[str]) -> _Section:
        if not self.has(key):
            raise SpecError("required", field=self.at(key))
        return _Section(self.data[key], self.at(key), known)

    def sections(self, key: str, known: Collection[str]) -> list[_Section]:
        value = self.data.get(key)
        if not isinstance(value, list) or not value:
            raise SpecError("must be a non-empty list", field=self.at(key))
        items = cast(list[object], value)
        return [_Section(item, f"{self.at(key)}[{i}]", known) for i, item in enumerate(items)]


def _substitute(value: object, path: str, environ: Mapping[str, str]) -> object:
    """Replaces ``${NAME}`` in every string of ``value`` with the environment's ``NAME``."""
    if isinstance(value, str):

        def lookup(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in environ:
                raise SpecError(f"environment variable {name} is not set", field=path or "spec")
            return environ[name]

        return _ENV_REF.sub(lookup, value)
    if isinstance(value, dict):
        items = cast(dict[object, object], value)
        return {
            k: _substitute(v, f"{path}.{k}" if path else str(k), environ) for k, v in items.items()
        }
    if isinstance(value, list):
        return [
            _substitute(v, f"{path}[{i}]", environ) for i, v in enumerate(cast(list[object], value))
        ]
    return value


def parse_spec(
    raw: object,
    *,
    environ: Mapping[str, str] | None = None,
    name: str | None = None,
    eks_cluster_arn: str | None = None,
) -> ClusterSpec:
    """Checks a parsed cluster spec (the YAML document as Python data) and types it.

    Args:
        raw: The document, as ``yaml.safe_load`` returns it.
        environ: Where ``${NAME}`` references are looked up (default: ``os.environ``).
        name: Overrides the cluster name.
        eks_cluster_arn: Overrides ``orchestrator.eks_cluster_arn``.

    Returns:
        The typed spec.

    Raises:
        SpecError: A field is missing, unknown, of the wrong type or out of range, or names an
            unset environment variable; the message starts with the field's path.
    """
    if isinstance(raw, dict):
        raw = dict(cast(dict[object, object], raw))
        # Overrides replace the raw value before substitution: a flag needs no env variable.
        if name is not None:
            raw["name"] = name
        if eks_cluster_arn is not None:
            orchestrator = raw.get("orchestrator")
            merged = (
                dict(cast(dict[object, object], orchestrator))
                if isinstance(orchestrator, dict)
                else {}
            )
            merged["eks_cluster_arn"] = eks_cluster_arn
            raw["orchestrator"] = merged
    raw = _substitute(raw, "", os.environ if environ is None else environ)
    top = _Section(
        raw,
        "",
        (
            "name",
            "orchestrator",
            "node_recovery",
            "execution_role",
            "lifecycle",
            "vpc",
            "tags",
            "instance_groups",
            "fsx_lustre",
        ),
    )
    orchestrator = top.section("orchestrator", ("eks_cluster_arn",))
    node_recovery = top.opt_string("node_recovery") or "Automatic"
    if node_recovery not in NODE_RECOVERY_MODES:
        raise SpecError(
            f"must be one of {', '.join(NODE_RECOVERY_MODES)}, not {node_recovery!r}",
            field="node_recovery",
        )
    default_role = top.opt_string("execution_role")
    default_lifecycle = (
        _lifecycle(top.section("lifecycle", _LIFECYCLE_KEYS)) if top.has("lifecycle") else None
    )
    vpc = top.section("vpc", ("subnets", "security_group_ids"))
    groups = [
        _instance_group(section, default_role, default_lifecycle)
        for section in top.sections(
            "instance_groups",
            (
                "name",
                "instance_type",
                "instance_count",
                "execution_role",
                "lifecycle",
                "threads_per_core",
                "ebs_volume_gb",
                "deep_health_checks",
            ),
        )
    ]
    seen: set[str] = set()
    for i, group in enumerate(groups):
        if group.name in seen:
            raise SpecError(
                f"duplicate instance group name {group.name!r}", field=f"instance_groups[{i}].name"
            )
        seen.add(group.name)
    return ClusterSpec(
        name=top.string("name"),
        eks_cluster_arn=orchestrator.string("eks_cluster_arn"),
        instance_groups=tuple(groups),
        subnets=vpc.strings("subnets", min_items=1),
        security_group_ids=vpc.strings("security_group_ids", min_items=1),
        node_recovery=node_recovery,
        tags=_tags(top),
        fsx_lustre=_fsx(top.section("fsx_lustre", _FSX_KEYS)) if top.has("fsx_lustre") else None,
    )


_LIFECYCLE_KEYS = ("source_s3_uri", "on_create")
_FSX_KEYS = (
    "deployment_type",
    "storage_capacity_gib",
    "per_unit_storage_throughput",
    "data_compression",
    "file_system_type_version",
    "metadata_mode",
    "mount_path",
    "mount_options",
)


def _lifecycle(section: _Section) -> LifecycleConfig:
    return LifecycleConfig(section.string("source_s3_uri"), section.string("on_create"))


def _instance_group(
    section: _Section, default_role: str | None, default_lifecycle: LifecycleConfig | None
) -> InstanceGroup:
    role = section.opt_string("execution_role") or default_role
    if role is None:
        raise SpecError("required (here or at the top level)", field=section.at("execution_role"))
    if section.has("lifecycle"):
        lifecycle = _lifecycle(section.section("lifecycle", _LIFECYCLE_KEYS))
    elif default_lifecycle is not None:
        lifecycle = default_lifecycle
    else:
        raise SpecError("required (here or at the top level)", field=section.at("lifecycle"))
    return InstanceGroup(
        name=section.string("name"),
        instance_type=section.string("instance_type"),
        instance_count=section.integer("instance_count", minimum=1),
        execution_role=role,
        lifecycle=lifecycle,
        threads_per_core=section.opt_integer("threads_per_core", minimum=1),
        ebs_volume_gb=section.opt_integer("ebs_volume_gb", minimum=1),
        deep_health_checks=section.strings("deep_health_checks"),
    )


def _tags(top: _Section) -> dict[str, str]:
    if not top.has("tags"):
        return {}
    raw = top.data["tags"]
    if not isinstance(raw, dict):
        raise SpecError("must be a mapping of strings", field="tags")
    tags: dict[str, str] = {}
    for key, value in cast(dict[object, object], raw).items():
        if not isinstance(value, str):
            raise SpecError("must be a string", field=f"tags.{key}")
        tags[str(key)] = value
    return tags


def _fsx(section: _Section) -> FsxLustre:
    return FsxLustre(
        deployment_type=section.string("deployment_type"),
        storage_capacity_gib=section.integer("storage_capacity_gib", minimum=1),
        per_unit_storage_throughput=section.opt_integer("per_unit_storage_throughput", minimum=1),
        data_compression=section.opt_string("data_compression"),
        file_system_type_version=section.opt_string("file_system_type_version"),
        metadata_mode=section.opt_string("metadata_mode"),
        mount_path=section.opt_string("mount_path") or "/shared",
        mount_options=section.strings("mount_options"),
    )


def load_spec(
    path: str | os.PathLike[str],
    *,
    environ: Mapping[str, str] | None = None,
    name: str | None = None,
    eks_cluster_arn: str | None = None,
) -> ClusterSpec:
    """Reads and checks a cluster spec file (YAML); see :func:`parse_spec`.

    Raises:
        SpecError: The file is unreadable, not YAML, or not a valid spec.
    """
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        raw: object = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"{path}: not valid YAML{where}: {problem}") from None
    return parse_spec(raw, environ=environ, name=name, eks_cluster_arn=eks_cluster_arn)


# ----------------------------------------------------------------------------------------------
# Requests, and their check against botocore's service models


def create_request(spec: ClusterSpec) -> dict[str, Any]:
    """The boto3 ``create_cluster`` keyword arguments (the API's ``CreateCluster`` input)."""
    groups: list[dict[str, Any]] = []
    for g in spec.instance_groups:
        group: dict[str, Any] = {
            "InstanceGroupName": g.name,
            "InstanceType": g.instance_type,
            "InstanceCount": g.instance_count,
            "ExecutionRole": g.execution_role,
            "LifeCycleConfig": {
                "SourceS3Uri": g.lifecycle.source_s3_uri,
                "OnCreate": g.lifecycle.on_create,
            },
        }
        if g.threads_per_core is not None:
            group["ThreadsPerCore"] = g.threads_per_core
        if g.ebs_volume_gb is not None:
            group["InstanceStorageConfigs"] = [
                {"EbsVolumeConfig": {"VolumeSizeInGB": g.ebs_volume_gb}}
            ]
        if g.deep_health_checks:  # the API wants the key absent rather than an empty list
            group["OnStartDeepHealthChecks"] = list(g.deep_health_checks)
        groups.append(group)
    request: dict[str, Any] = {
        "ClusterName": spec.name,
        "InstanceGroups": groups,
        "VpcConfig": {
            "SecurityGroupIds": list(spec.security_group_ids),
            "Subnets": list(spec.subnets),
        },
        "Orchestrator": {"Eks": {"ClusterArn": spec.eks_cluster_arn}},
        "NodeRecovery": spec.node_recovery,
    }
    if spec.tags:
        request["Tags"] = [{"Key": k, "Value": v} for k, v in spec.tags.items()]
    return request


def fsx_request(spec: ClusterSpec) -> dict[str, Any]:
    """The FSx ``CreateFileSystem`` input for the spec's file system (``--cli-input-json``).

    It goes into the first subnet of the cluster (one Availability Zone) with the cluster's
    security groups.

    Raises:
        SpecError: The spec has no ``fsx_lustre`` section.
    """
    fsx = spec.fsx_lustre
    if fsx is None:
        raise SpecError("required for the file system request", field="fsx_lustre")
    lustre: dict[str, Any] = {"DeploymentType": fsx.deployment_type}
    if fsx.per_unit_storage_throughput is not None:
        lustre["PerUnitStorageThroughput"] = fsx.per_unit_storage_throughput
    if fsx.data_compression is not None:
        lustre["DataCompressionType"] = fsx.data_compression
    if fsx.metadata_mode is not None:
        lustre["MetadataConfiguration"] = {"Mode": fsx.metadata_mode}
    request: dict[str, Any] = {
        "FileSystemType": "LUSTRE",
        "StorageCapacity": fsx.storage_capacity_gib,
        "StorageType": "SSD",
        "SubnetIds": [spec.subnets[0]],
        "SecurityGroupIds": list(spec.security_group_ids),
        "LustreConfiguration": lustre,
        "Tags": [{"Key": "Name", "Value": f"{spec.name}-shared"}]
        + [{"Key": k, "Value": v} for k, v in spec.tags.items()],
    }
    if fsx.file_system_type_version is not None:
        request["FileSystemTypeVersion"] = fsx.file_system_type_version
    return request


@functools.cache
def _service_model(service: str) -> Any:
    try:
        import botocore.session
    except ImportError:
        raise MissingExtraError(f"checking requests needs botocore: {AWS_EXTRA}") from None
    return botocore.session.get_session().get_service_model(service)


def validate_request(
    request: Mapping[str, Any], *, service: str = "sagemaker", operation: str = "CreateCluster"
) -> None:
    """Checks a request against the operation's input shape in botocore's service model.

    botocore's own parameter validation (required members, unknown members, types, minimums)
    runs first; then what it leaves to the service: enum values, maximums and patterns.

    Args:
        request: The boto3 keyword arguments.
        service: The botocore service name.
        operation: The API operation name.

    Raises:
        SpecError: One or more members do not fit; each problem names the member's path.
        MissingExtraError: botocore is not installed.
    """
    shape = _service_model(service).operation_model(operation).input_shape
    import botocore
    from botocore import validate
    from botocore.exceptions import ParamValidationError

    validate_parameters = cast(Any, validate).validate_parameters
    problems: list[str] = []
    try:
        validate_parameters(dict(request), shape)
    except ParamValidationError as exc:
        problems += [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
    problems += _constraint_problems(request, shape, "")
    if problems:
        raise SpecError(
            f"the {operation} request does not fit botocore {botocore.__version__}'s "
            f"{service} service model: " + "; ".join(problems)
        )


def _constraint_problems(value: object, shape: Any, path: str) -> list[str]:
    """Enum, maximum and pattern violations, which botocore's validator does not check."""
    kind: str = shape.type_name
    meta: Mapping[str, Any] = shape.metadata
    out: list[str] = []
    if kind == "structure" and isinstance(value, Mapping):
        for key, item in cast(Mapping[str, object], value).items():
            member = shape.members.get(key)
            if member is not None:  # unknown members are botocore's to report
                out += _constraint_problems(item, member, f"{path}.{key}" if path else key)
    elif kind == "list" and isinstance(value, list | tuple):
        items = cast(Sequence[object], value)
        if "max" in meta and len(items) > meta["max"]:
            out.append(
                f"Invalid length for parameter {path}, value: {len(items)}, valid max length: {meta['max']}"
            )
        for i, item in enumerate(items):
            out += _constraint_problems(item, shape.member, f"{path}[{i}]")
    elif kind == "map" and isinstance(value, Mapping):
        for key, item in cast(Mapping[object, object], value).items():
            out += _constraint_problems(key, shape.key, f"{path} key {key!r}")
            out += _constraint_problems(item, shape.value, f"{path}.{key}")
    elif kind == "string" and isinstance(value, str):
        enum: list[str] = shape.enum
        if enum and value not in enum:
            shown = ", ".join(enum[:10]) + (f", ... ({len(enum)} in all)" if len(enum) > 10 else "")
            out.append(
                f"Invalid value for parameter {path}, value: {value!r}, valid values: {shown}"
            )
        if "max" in meta and len(value) > meta["max"]:
            out.append(
                f"Invalid length for parameter {path}, value: {len(value)}, valid max length: {meta['max']}"
            )
        pattern = meta.get("pattern")
        if pattern and not _matches(pattern, value):
            out.append(
                f"Invalid value for parameter {path}, value: {value!r}, must match pattern {pattern}"
            )
    elif (
        kind in ("integer", "long")
        and isinstance(value, int)
        and not isinstance(value, bool)
        and "max" in meta
        and value > meta["max"]
    ):
        out.append(
            f"Invalid value for parameter {path}, value: {value}, valid max value: {meta['max']}"
        )
    return out


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:  # Java-only syntax such as \p{L}: left to the service
        return None


def _matches(pattern: str, value: str) -> bool:
    # The services match the whole value (Java's Matcher.matches), anchored or not.
    compiled = _compiled(pattern)
    return compiled is None or compiled.fullmatch(value) is not None


# ----------------------------------------------------------------------------------------------
# Talking to SageMaker


def aws_session(region: str | None = None) -> Any:
    """A boto3 session whose every client has bounded timeouts and retries.

    The region is ``region``, else ``AWS_REGION``, else what boto3 finds (``AWS_DEFAULT_REGION``,
    the profile). ``AWS_PROFILE``, ``AWS_ENDPOINT_URL`` and the other ``AWS_*`` settings apply
    as usual; retries are capped at :data:`MAX_ATTEMPTS` attempts unless ``AWS_MAX_ATTEMPTS`` or
    ``AWS_RETRY_MODE`` say otherwise.

    Raises:
        MissingExtraError: boto3 is not installed.
        CredentialsError: ``AWS_PROFILE`` names no profile.
        SpecError: No region is configured, or it is not an AWS region name.
    """
    return bounded_session(
        region,
        profile=None,
        endpoint_url=None,
        connect_timeout_s=CONNECT_TIMEOUT_S,
        read_timeout_s=READ_TIMEOUT_S,
        max_attempts=MAX_ATTEMPTS,
        needs=_NEEDS,
    )


def _sagemaker_core() -> Any:
    """sagemaker-core's modules this file uses: ``Cluster``, ``transform`` and ``serialize``."""
    resources, utils, codec = sagemaker_core(
        "resources", "utils.utils", "utils.code_injection.codec", needs=_NEEDS
    )

    @dataclass(frozen=True)
    class _Core:
        Cluster: Any
        transform: Any
        serialize: Any

    return _Core(resources.Cluster, codec.transform, utils.serialize)


def _plain(value: Any) -> Any:
    """JSON-ready data: datetimes as ISO 8601 strings."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in cast(dict[object, object], value).items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in cast(Sequence[object], value)]
    return value


def create_cluster(
    request: Mapping[str, Any],
    session: Any,
    *,
    wait: bool = False,
    poll_seconds: float = 30.0,
    timeout_seconds: float = 7200.0,
    keep_failed: bool = False,
    progress: TextIO | None = None,
) -> dict[str, Any]:
    """Creates the cluster (sagemaker-core's ``Cluster.create``) from a checked request.

    Args:
        request: The CreateCluster input; check it with :func:`validate_request` first.
        session: A boto3 session (see :func:`aws_session`).
        wait: Poll until the cluster is ``InService``.
        poll_seconds: Seconds between polls.
        timeout_seconds: Give up waiting after this long (the cluster is left as it is).
        keep_failed: When waiting sees ``Failed``, keep the cluster instead of deleting it.
        progress: Where status changes go while waiting (default: stderr).

    Returns:
        The cluster's description (DescribeCluster's fields).

    Raises:
        OperationError: The service refused the request, or the cluster went ``Failed`` (its
            FailureMessage is in the message, and whether it was deleted), or waiting timed out.
        CredentialsError: Credentials are missing or refused.
        ServiceUnreachableError: SageMaker does not answer.
        InfraError: Raised after CreateCluster was accepted, the message says the cluster exists.
    """
    core = _sagemaker_core()
    name = str(request["ClusterName"])
    accepted: dict[str, str] = {}

    def on_create_call(parsed: Any = None, **_: Any) -> None:
        # after-call fires for every CreateCluster response; an ARN means it was accepted.
        if isinstance(parsed, dict) and cast(dict[str, Any], parsed).get("ClusterArn"):
            accepted["arn"] = str(cast(dict[str, Any], parsed)["ClusterArn"])

    session.events.register("after-call.sagemaker.CreateCluster", on_create_call)
    kwargs = core.transform(dict(request), "CreateClusterRequest")
    try:
        with _calling(f"create cluster {name}"):
            cluster = core.Cluster.create(**kwargs, session=session, region=session.region_name)
    except InfraError as exc:
        if "arn" not in accepted:
            raise  # refused: nothing was created
        raise noted(
            exc,
            f"CreateCluster was accepted, so cluster {name} ({accepted['arn']}) exists: "
            f"check it with `maze-infra cluster describe {name}`, "
            f"remove it with `maze-infra cluster delete {name}`",
        ) from None
    if wait:
        _wait_in_service(
            core,
            cluster,
            poll_seconds=poll_seconds,
            timeout_seconds=timeout_seconds,
            keep_failed=keep_failed,
            progress=progress or sys.stderr,
        )
    return _plain(core.serialize(cluster))


def _wait_in_service(
    core: Any,
    cluster: Any,
    *,
    poll_seconds: float,
    timeout_seconds: float,
    keep_failed: bool,
    progress: TextIO,
) -> None:
    name = str(cluster.cluster_name)
    deadline = time.monotonic() + timeout_seconds
    last = ""
    try:
        while True:
            described: dict[str, Any] = core.serialize(cluster)
            status = str(described.get("ClusterStatus", "unknown"))
            if status != last:
                print(f"{name}: {status}", file=progress, flush=True)
                last = status
            if status == "InService":
                return
            if status == "Failed":
                _roll_back(
                    cluster,
                    str(described.get("FailureMessage") or "no FailureMessage given"),
                    keep_failed=keep_failed,
                )
            if time.monotonic() >= deadline:
                raise OperationError(
                    f"cluster {name} is still {status} after {timeout_seconds:g} s; it exists "
                    f"and is left as it is: follow it with `maze-infra cluster describe {name}`"
                )
            time.sleep(poll_seconds)
            try:
                with _calling(f"describe cluster {name}"):
                    cluster.refresh()
            except InfraError as exc:
                raise noted(
                    exc, f"cluster {name} was created and was {last} when waiting stopped"
                ) from None
    except KeyboardInterrupt:
        print(
            f"{name}: stopped waiting; the cluster exists (last status {last})",
            file=progress,
            flush=True,
        )
        raise


def _roll_back(cluster: Any, reason: str, *, keep_failed: bool) -> NoReturn:
    """Deletes a cluster that went Failed; always raises the OperationError that says so."""
    name = str(cluster.cluster_name)
    head = f"cluster {name} went Failed: {one_line(reason)}"
    if keep_failed:
        raise OperationError(
            f"{head}; kept it (--keep-failed): delete it with `maze-infra cluster delete {name}`"
        )
    try:
        with _calling(f"delete cluster {name}"):
            cluster.delete()
    except InfraError as exc:
        raise OperationError(
            f"{head}; deleting it failed ({exc}): it still exists, delete it with `maze-infra cluster delete {name}`"
        ) from None
    raise OperationError(f"{head}; deleted it (DeleteCluster accepted)")


def describe_cluster(name: str, session: Any) -> dict[str, Any]:
    """The cluster's description (DescribeCluster's fields, timestamps as ISO 8601 strings).

    Raises:
        OperationError: The service refused (e.g. no such cluster).
        CredentialsError: Credentials are missing or refused.
        ServiceUnreachableError: SageMaker does not answer.
    """
    core = _sagemaker_core()
    with _calling(f"describe cluster {name}"):
        cluster = core.Cluster.get(cluster_name=name, session=session, region=session.region_name)
    return _plain(core.serialize(cluster))


@dataclass(frozen=True)
class NodeHealth:
    """One node of a cluster and how healthy SageMaker reports it.

    Attributes:
        node_id: The EC2 instance id.
        group: Its instance group.
        instance_type: Its instance type.
        status: ``InstanceStatus.Status`` (Running, Pending, DeepHealthCheckInProgress, Failure...).
        message: ``InstanceStatus.Message``.
        health: The node's ``sagemaker.amazonaws.com/node-health-status`` Kubernetes label when
            DescribeClusterNode reports it (Schedulable, Unschedulable,
            UnschedulablePendingReplacement, UnschedulablePendingReboot), else a word derived from
            the status (ok, starting, checking, failed, updating, leaving, unknown).
        health_source: ``"label"`` or ``"status"``: where ``health`` came from.
    """

    node_id: str
    group: str
    instance_type: str
    status: str
    message: str
    health: str
    health_source: str


def cluster_nodes(name: str, session: Any) -> list[NodeHealth]:
    """Every node of the cluster with its status and health.

    Nodes are listed with sagemaker-core (``Cluster.get_all_nodes``, which pages); each node's
    labels come from boto3's ``describe_cluster_node``, because sagemaker-core's
    ``Cluster.get_node`` fails to parse that response (it feeds the ``NodeDetails`` wrapper to
    the node model).

    Raises:
        OperationError: The service refused (e.g. no such cluster).
        CredentialsError: Credentials are missing or refused.
        ServiceUnreachableError: SageMaker does not answer.
    """
    core = _sagemaker_core()
    nodes: list[NodeHealth] = []
    with _calling(f"list the nodes of cluster {name}"):
        cluster = core.Cluster.get(cluster_name=name, session=session, region=session.region_name)
        summaries: list[dict[str, Any]] = [core.serialize(s) for s in cluster.get_all_nodes()]
        client = session.client("sagemaker", region_name=session.region_name)
        for summary in summaries:
            node_id = str(summary.get("InstanceId", ""))
            details: dict[str, Any] = client.describe_cluster_node(
                ClusterName=name, NodeId=node_id
            )["NodeDetails"]
            labels: dict[str, Any] = details.get("KubernetesConfig", {}).get("CurrentLabels", {})
            state: dict[str, Any] = summary.get("InstanceStatus", {})
            status = str(state.get("Status", "unknown"))
            label = labels.get(HEALTH_LABEL)
            nodes.append(
                NodeHealth(
                    node_id=node_id,
                    group=str(summary.get("InstanceGroupName", "")),
                    instance_type=str(summary.get("InstanceType", "")),
                    status=status,
                    message=one_line(str(state.get("Message", ""))),
                    health=str(label) if label else _HEALTH_FROM_STATUS.get(status, "unknown"),
                    health_source="label" if label else "status",
                )
            )
    return nodes


def delete_cluster(
    name: str,
    session: Any,
    *,
    wait: bool = False,
    poll_seconds: float = 30.0,
    timeout_seconds: float = 3600.0,
) -> str:
    """Deletes the cluster; returns its ARN.

    Args:
        name: The cluster name (or ARN).
        session: A boto3 session (see :func:`aws_session`).
        wait: Poll until DescribeCluster no longer finds it.
        poll_seconds: Seconds between polls.
        timeout_seconds: Give up waiting after this long.

    Raises:
        OperationError: The service refused (e.g. no such cluster), or waiting timed out.
        CredentialsError: Credentials are missing or refused.
        ServiceUnreachableError: SageMaker does not answer.
    """
    core = _sagemaker_core()
    with _calling(f"delete cluster {name}"):
        cluster = core.Cluster.get(cluster_name=name, session=session, region=session.region_name)
        arn = str(core.serialize(cluster).get("ClusterArn", name))
        cluster.delete()
    deadline = time.monotonic() + timeout_seconds
    while wait:
        try:
            with _calling(f"describe cluster {name}"):
                try:
                    cluster.refresh()
                except Exception as exc:
                    if is_not_found(exc):
                        return arn
                    raise
        except InfraError as exc:
            raise noted(exc, f"deletion of cluster {name} was accepted") from None
        if time.monotonic() >= deadline:
            raise OperationError(
                f"cluster {name} is still being deleted after {timeout_seconds:g} s"
            )
        time.sleep(poll_seconds)
    return arn


# ----------------------------------------------------------------------------------------------
# The command group


def register(groups: Any) -> None:
    """Add the ``cluster`` command group to ``maze-infra``."""
    # No --profile or --endpoint-url: the cluster commands read AWS_PROFILE and AWS_ENDPOINT_URL.
    common = aws_options(profile_and_endpoint=False)
    group = groups.add_parser(
        "cluster",
        help="the SageMaker HyperPod cluster: create, describe, nodes, delete",
        description="Create, describe, list the nodes of and delete the HyperPod cluster "
        "described by infra/hyperpod/cluster.yaml.",
    )
    sub = group.add_subparsers(
        dest="cluster_command", required=True, metavar="{create,describe,nodes,delete,fsx-input}"
    )

    create = sub.add_parser("create", parents=[common], help="create the cluster from a spec")
    _spec_arguments(create)
    create.add_argument(
        "--dry-run",
        action="store_true",
        help="print the checked CreateCluster request as JSON; send nothing",
    )
    create.add_argument(
        "--wait",
        action="store_true",
        help="wait until InService; on Failed, report why and delete it",
    )
    create.add_argument(
        "--keep-failed",
        action="store_true",
        help="with --wait: keep a Failed cluster for inspection",
    )
    create.add_argument(
        "--poll-seconds", type=float, default=30.0, help="seconds between status polls (default 30)"
    )
    create.add_argument(
        "--timeout-seconds",
        type=float,
        default=7200.0,
        help="give up waiting after this long (default 7200)",
    )
    create.set_defaults(command=_cmd_create)

    describe = sub.add_parser(
        "describe", parents=[common], help="the cluster's status and instance groups"
    )
    describe.add_argument("name", help="cluster name or ARN")
    describe.add_argument(
        "--json", action="store_true", help="print DescribeCluster's fields as JSON"
    )
    describe.set_defaults(command=_cmd_describe)

    nodes = sub.add_parser(
        "nodes", parents=[common], help="each node's group, type, status and health"
    )
    nodes.add_argument("name", help="cluster name or ARN")
    nodes.add_argument("--json", action="store_true", help="print the nodes as JSON")
    nodes.set_defaults(command=_cmd_nodes)

    delete = sub.add_parser("delete", parents=[common], help="delete the cluster")
    delete.add_argument("name", help="cluster name or ARN")
    delete.add_argument("--wait", action="store_true", help="wait until it is gone")
    delete.add_argument(
        "--poll-seconds", type=float, default=30.0, help="seconds between status polls (default 30)"
    )
    delete.add_argument(
        "--timeout-seconds",
        type=float,
        default=3600.0,
        help="give up waiting after this long (default 3600)",
    )
    delete.set_defaults(command=_cmd_delete)

    fsx = sub.add_parser(
        "fsx-input",
        help="print the checked FSx CreateFileSystem input for `aws fsx create-file-system --cli-input-json`",
    )
    _spec_arguments(fsx)
    fsx.set_defaults(command=_cmd_fsx_input)


def _spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec", type=Path, required=True, help="cluster spec (infra/hyperpod/cluster.yaml)"
    )
    parser.add_argument("--name", help="cluster name (overrides the spec's)")
    parser.add_argument(
        "--eks-cluster-arn",
        help="EKS cluster ARN (overrides the spec's orchestrator.eks_cluster_arn)",
    )


def _load(args: argparse.Namespace) -> ClusterSpec:
    return load_spec(args.spec, name=args.name, eks_cluster_arn=args.eks_cluster_arn)


def _cmd_create(args: argparse.Namespace) -> int:
    request = create_request(_load(args))
    validate_request(request)
    if args.dry_run:
        print(json.dumps(request, indent=2))
        return 0
    described = create_cluster(
        request,
        aws_session(args.region),
        wait=args.wait,
        poll_seconds=args.poll_seconds,
        timeout_seconds=args.timeout_seconds,
        keep_failed=args.keep_failed,
    )
    print(
        f"{described.get('ClusterName')}: {described.get('ClusterStatus')} {described.get('ClusterArn')}"
    )
    return 0


def _cmd_describe(args: argparse.Namespace) -> int:
    described = describe_cluster(args.name, aws_session(args.region))
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    rows = [
        ("cluster", described.get("ClusterName")),
        ("arn", described.get("ClusterArn")),
        ("status", described.get("ClusterStatus")),
        ("created", described.get("CreationTime")),
        ("orchestrator", described.get("Orchestrator", {}).get("Eks", {}).get("ClusterArn")),
        ("node recovery", described.get("NodeRecovery")),
        ("failure", described.get("FailureMessage")),
    ]
    for key, value in rows:
        if value:
            print(f"{key:<14}{value}")
    groups: list[dict[str, Any]] = described.get("InstanceGroups", [])
    if groups:
        print(f"{'group':<20}{'type':<20}nodes (current/target)")
        for g in groups:
            print(
                f"{g.get('InstanceGroupName', ''):<20}{g.get('InstanceType', ''):<20}{g.get('CurrentCount', '?')}/{g.get('TargetCount', '?')}"
            )
    return 0


def _cmd_nodes(args: argparse.Namespace) -> int:
    nodes = cluster_nodes(args.name, aws_session(args.region))
    if args.json:
        print(json.dumps([n.__dict__ for n in nodes], indent=2))
        return 0
    print(f"{'node':<22}{'group':<16}{'type':<18}{'status':<28}health")
    for n in nodes:
        health = n.health if n.health_source == "label" else f"{n.health} (from status)"
        print(f"{n.node_id:<22}{n.group:<16}{n.instance_type:<18}{n.status:<28}{health}")
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    arn = delete_cluster(
        args.name,
        aws_session(args.region),
        wait=args.wait,
        poll_seconds=args.poll_seconds,
        timeout_seconds=args.timeout_seconds,
    )
    print(f"{args.name}: {'deleted' if args.wait else 'deletion requested'} {arn}")
    return 0


def _cmd_fsx_input(args: argparse.Namespace) -> int:
    request = fsx_request(_load(args))
    validate_request(request, service="fsx", operation="CreateFileSystem")
    print(json.dumps(request, indent=2))
    return 0
