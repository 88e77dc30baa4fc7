"""``maze-infra cluster``: the shipped spec, its CreateCluster request, and the commands on moto."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from maze_infra import hyperpod
from maze_infra.cli import main
from maze_infra.errors import SpecError

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "infra" / "hyperpod" / "cluster.yaml"
ON_CREATE = ROOT / "infra" / "hyperpod" / "lifecycle" / "on_create.sh"
ACCOUNT = "123456789012"  # moto's default account
SPEC_ENV = {
    "MAZERL_EKS_CLUSTER_ARN": f"arn:aws:eks:us-east-1:{ACCOUNT}:cluster/mazerl",
    "MAZERL_HYPERPOD_ROLE_ARN": f"arn:aws:iam::{ACCOUNT}:role/mazerl-hyperpod",
    # moto, like the managed instance policy, wants a bucket named sagemaker-*.
    "MAZERL_LIFECYCLE_S3_URI": f"s3://sagemaker-mazerl-{ACCOUNT}/hyperpod/lifecycle/",
    "MAZERL_SUBNET_ID": "subnet-0123456789abcdef0",
    "MAZERL_SECURITY_GROUP_ID": "sg-0123456789abcdef0",
}
# AWS settings a developer's shell may carry that would change what the tests talk to.
_AWS_VARS = (
    "AWS_REGION",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("maze-infra: ")
    return lines[0]


def shipped_raw() -> dict[str, Any]:
    return cast(dict[str, Any], yaml.safe_load(SPEC.read_text()))


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[[str | None], None]:
    """Sets the spec's variables and an isolated AWS environment; call it with an endpoint URL."""
    for var in _AWS_VARS:
        monkeypatch.delenv(var, raising=False)
    for key, value in SPEC_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")

    def point_at(endpoint: str | None) -> None:
        if endpoint is None:
            monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
        else:
            monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)

    return point_at


@pytest.fixture
def moto_env(aws_env: Callable[[str | None], None], moto_server: str) -> str:
    aws_env(moto_server)
    return moto_server


def moto_client(endpoint: str) -> Any:
    import boto3

    return cast(Any, boto3).client(
        "sagemaker",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def moto_spec(tmp_path: Path, name: str) -> Path:
    """The shipped spec with instance types moto knows (its list predates r5d and g7e)."""
    raw = shipped_raw()
    raw["name"] = name
    raw["instance_groups"][0]["instance_type"] = "ml.m5.16xlarge"
    raw["instance_groups"][1]["instance_type"] = "ml.g5.12xlarge"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------------------------
# The spec and its request, checked against botocore's service model


def test_shipped_spec_is_the_reference_topology_and_passes_botocore_validation() -> None:
    from botocore import session as botocore_session
    from botocore import validate

    spec = hyperpod.load_spec(SPEC, environ=SPEC_ENV)
    request = hyperpod.create_request(spec)
    head, gpu = request["InstanceGroups"]
    assert (head["InstanceType"], head["InstanceCount"]) == ("ml.r5d.16xlarge", 1)
    assert (gpu["InstanceType"], gpu["InstanceCount"]) == ("ml.g7e.12xlarge", 3)
    assert gpu["OnStartDeepHealthChecks"] == ["InstanceStress", "InstanceConnectivity"]
    assert "OnStartDeepHealthChecks" not in head  # deep health checks are for GPU groups
    for group in (head, gpu):
        assert group["LifeCycleConfig"] == {
            "SourceS3Uri": SPEC_ENV["MAZERL_LIFECYCLE_S3_URI"],
            "OnCreate": "on_create.sh",
        }
        assert group["ExecutionRole"] == SPEC_ENV["MAZERL_HYPERPOD_ROLE_ARN"]
        assert group["ThreadsPerCore"] in (1, 2)
        assert group["InstanceStorageConfigs"][0]["EbsVolumeConfig"]["VolumeSizeInGB"] > 0
    assert request["Orchestrator"] == {"Eks": {"ClusterArn": SPEC_ENV["MAZERL_EKS_CLUSTER_ARN"]}}
    assert request["NodeRecovery"] == "Automatic"
    assert request["VpcConfig"] == {
        "SecurityGroupIds": [SPEC_ENV["MAZERL_SECURITY_GROUP_ID"]],
        "Subnets": [SPEC_ENV["MAZERL_SUBNET_ID"]],
    }
    assert {"Key": "project", "Value": "mazerl"} in request["Tags"]
    # botocore's own validator, straight, and the wrapper that adds enums/maximums/patterns.
    model: Any = cast(Any, botocore_session).get_session().get_service_model("sagemaker")
    cast(Any, validate).validate_parameters(
        request, model.operation_model("CreateCluster").input_shape
    )
    hyperpod.validate_request(request)
    # The lifecycle script the spec names is the one shipped next to it.
    assert (
        SPEC.parent / "lifecycle" / request["InstanceGroups"][0]["LifeCycleConfig"]["OnCreate"]
    ).is_file()


def _mutate(request: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    mutated = copy.deepcopy(request)
    change(mutated)
    return mutated


def _set(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(request: dict[str, Any]) -> None:
        target: Any = request
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def _drop(path: tuple[str | int, ...]) -> Callable[[dict[str, Any]], None]:
    def change(request: dict[str, Any]) -> None:
        target: Any = request
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return change


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (_set(("InstanceGroups", 1, "InstanceCount"), "3"), "InstanceGroups[1].InstanceCount"),
        (_set(("InstanceGroups", 0, "Colour"), "blue"), 'InstanceGroups[0]: "Colour"'),
        (_set(("NodeRecovery",), "Sometimes"), "NodeRecovery, value: 'Sometimes'"),
        (
            _set(("InstanceGroups", 1, "InstanceType"), "ml.g7e.13xlarge"),
            "InstanceGroups[1].InstanceType",
        ),
        (
            _set(("InstanceGroups", 1, "OnStartDeepHealthChecks"), ["InstanceStress", "GpuVibes"]),
            "InstanceGroups[1].OnStartDeepHealthChecks[1]",
        ),
        (_set(("InstanceGroups", 1, "ThreadsPerCore"), 3), "InstanceGroups[1].ThreadsPerCore"),
        (_set(("ClusterName",), "maze_rl"), "ClusterName"),
        (_set(("Orchestrator", "Eks", "ClusterArn"), "my-eks"), "Orchestrator.Eks.ClusterArn"),
        (_drop(("InstanceGroups", 0, "ExecutionRole")), "ExecutionRole"),
    ],
    ids=[
        "wrong-type",
        "unknown-field",
        "bad-enum",
        "unknown-instance-type",
        "bad-health-check",
        "above-max",
        "pattern",
        "arn-pattern",
        "missing-required",
    ],
)
def test_mutated_request_is_rejected_naming_the_field(
    change: Callable[[dict[str, Any]], None], named: str
) -> None:
    request = hyperpod.create_request(hyperpod.load_spec(SPEC, environ=SPEC_ENV))
    with pytest.raises(SpecError) as caught:
        hyperpod.validate_request(_mutate(request, change))
    assert named in str(caught.value)
    assert caught.value.exit_code == 2
    assert "\n" not in str(caught.value)


def _raw_set(path: tuple[str | int, ...], value: object) -> Callable[[dict[str, Any]], None]:
    return _set(path, value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            _raw_set(("instance_groups", 1, "instance_count"), 0),
            "instance_groups[1].instance_count: must be >= 1",
        ),
        (
            _raw_set(("instance_groups", 0, "instance_count"), "one"),
            "instance_groups[0].instance_count: must be an integer",
        ),
        (
            _raw_set(("instance_groups", 0, "instance_count"), True),
            "instance_groups[0].instance_count: must be an integer",
        ),
        (
            _raw_set(("node_recovery",), "Sometimes"),
            "node_recovery: must be one of Automatic, None",
        ),
        (
            _raw_set(("instance_groups", 0, "colour"), "blue"),
            "instance_groups[0].colour: unknown field",
        ),
        (_drop(("vpc", "subnets")), "vpc.subnets: must have at least 1 item(s)"),
        (
            _raw_set(("instance_groups", 1, "name"), "head"),
            "instance_groups[1].name: duplicate instance group name",
        ),
        (
            _raw_set(("instance_groups", 1, "deep_health_checks"), "InstanceStress"),
            "instance_groups[1].deep_health_checks: must be a list",
        ),
        (_raw_set(("tags", "cost-center"), 42), "tags.cost-center: must be a string"),
        (_drop(("orchestrator",)), "orchestrator: required"),
        (
            _raw_set(("fsx_lustre", "storage_capacity_gib"), -1),
            "fsx_lustre.storage_capacity_gib: must be >= 1",
        ),
    ],
)
def test_spec_errors_name_the_field(change: Callable[[dict[str, Any]], None], message: str) -> None:
    raw = shipped_raw()
    change(raw)
    with pytest.raises(SpecError) as caught:
        hyperpod.parse_spec(raw, environ=SPEC_ENV)
    assert str(caught.value).startswith(message)


def test_unset_variable_names_field_and_variable_and_a_flag_replaces_it() -> None:
    env = {k: v for k, v in SPEC_ENV.items() if k != "MAZERL_EKS_CLUSTER_ARN"}
    with pytest.raises(
        SpecError,
        match=r"^orchestrator\.eks_cluster_arn: environment variable MAZERL_EKS_CLUSTER_ARN is not set$",
    ):
        hyperpod.load_spec(SPEC, environ=env)
    arn = f"arn:aws:eks:eu-west-1:{ACCOUNT}:cluster/other"
    spec = hyperpod.load_spec(SPEC, environ=env, eks_cluster_arn=arn, name="other")
    assert (spec.eks_cluster_arn, spec.name) == (arn, "other")


def test_cli_spec_errors_are_one_line_with_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, aws_env: Callable[[str | None], None]
) -> None:
    aws_env(None)
    raw = shipped_raw()
    raw["instance_groups"][1]["instance_count"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    rc, out, err = run(capsys, "cluster", "create", "--spec", str(bad), "--dry-run")
    assert (rc, out) == (2, "")
    assert one_line(err) == "maze-infra: instance_groups[1].instance_count: must be >= 1"

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    rc, _, err = run(capsys, "cluster", "create", "--spec", str(broken), "--dry-run")
    assert rc == 2 and "not valid YAML" in one_line(err)

    rc, _, err = run(capsys, "cluster", "create", "--spec", str(tmp_path / "missing.yaml"))
    assert rc == 2 and "cannot read" in one_line(err)

    raw = shipped_raw()
    raw["instance_groups"][1]["instance_type"] = "ml.g7e.13xlarge"
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump(raw))
    rc, _, err = run(capsys, "cluster", "create", "--spec", str(unknown), "--dry-run")
    assert rc == 2 and "InstanceGroups[1].InstanceType, value: 'ml.g7e.13xlarge'" in one_line(err)


def test_dry_run_prints_the_checked_request_and_sends_nothing(
    capsys: pytest.CaptureFixture[str],
    aws_env: Callable[[str | None], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No credentials and a dead endpoint: a dry run must not need either.
    aws_env(f"http://127.0.0.1:{closed_port()}")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    rc, out, err = run(
        capsys, "cluster", "create", "--spec", str(SPEC), "--dry-run", "--name", "mazerl-dry"
    )
    assert (rc, err) == (0, "")
    expected = hyperpod.create_request(hyperpod.load_spec(SPEC, name="mazerl-dry"))
    assert json.loads(out) == expected


def test_fsx_input_fits_the_fsx_service_model(
    capsys: pytest.CaptureFixture[str], aws_env: Callable[[str | None], None]
) -> None:
    aws_env(None)
    rc, out, _ = run(capsys, "cluster", "fsx-input", "--spec", str(SPEC))
    assert rc == 0
    request = json.loads(out)
    assert request["FileSystemType"] == "LUSTRE"
    assert request["SubnetIds"] == [SPEC_ENV["MAZERL_SUBNET_ID"]]  # the cluster's subnet: one AZ
    assert request["LustreConfiguration"]["DeploymentType"] == "PERSISTENT_2"
    assert request["StorageCapacity"] == 1200
    hyperpod.validate_request(request, service="fsx", operation="CreateFileSystem")
    request["LustreConfiguration"]["DeploymentType"] = "PERSISTENT_3"
    with pytest.raises(SpecError, match=r"LustreConfiguration\.DeploymentType"):
        hyperpod.validate_request(request, service="fsx", operation="CreateFileSystem")


# ----------------------------------------------------------------------------------------------
# The lifecycle script


def test_on_create_is_executable_bash_that_parses() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    assert ON_CREATE.read_text().startswith("#!/usr/bin/env bash\n")
    assert ON_CREATE.stat().st_mode & stat.S_IXUSR
    subprocess.run([bash, "-n", str(ON_CREATE)], check=True)


_LSBLK = """#!/bin/sh
# Stub: one EBS root volume and the instance-store devices listed in $FAKE_NVME.
if [ "$1" = "-dpno" ]; then
  echo "/dev/nvme0n1 Amazon Elastic Block Store"
  for d in $FAKE_NVME; do echo "$d Amazon EC2 NVMe Instance Storage"; done
elif [ "$1" = "-nro" ] && [ "$2" = "NAME" ]; then
  basename "$3"
fi
"""


@pytest.mark.parametrize(
    ("devices", "mkfs_fails", "formatted"),
    [("/dev/nvme1n1", False, True), ("", False, False), ("/dev/nvme1n1", True, False)],
    ids=["one-instance-store-disk", "no-instance-store", "mkfs-fails"],
)
def test_on_create_formats_only_free_instance_store_nvme(
    tmp_path: Path, devices: str, mkfs_fails: bool, formatted: bool
) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    stubs = tmp_path / "bin"
    stubs.mkdir()
    calls = tmp_path / "calls"
    scripts = {
        "lsblk": _LSBLK,
        "mountpoint": "#!/bin/sh\nexit 1\n",
        "mkfs.xfs": f'#!/bin/sh\necho "mkfs.xfs $*" >> {calls}\nexit {1 if mkfs_fails else 0}\n',
        "mount": f'#!/bin/sh\necho "mount $*" >> {calls}\n',
        "blkid": "#!/bin/sh\necho 0a1b2c3d-uuid\n",
        "df": "#!/bin/sh\necho Size\necho 3.5T\n",
        "mdadm": f'#!/bin/sh\necho "mdadm $*" >> {calls}\n',
    }
    for name, body in scripts.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "FAKE_NVME": devices,
        "MAZERL_LOG_DIR": str(tmp_path / "log"),
        "MAZERL_NVME_MOUNT": str(tmp_path / "nvme"),
        "MAZERL_FSTAB": str(tmp_path / "fstab"),
    }
    done = subprocess.run(
        [bash, str(ON_CREATE)], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, (
        done.stdout + done.stderr
    )  # scratch disk trouble never fails the node
    log = (tmp_path / "log" / "provisioning.log").read_text()
    assert "on_create: done" in log
    recorded = calls.read_text() if calls.exists() else ""
    assert "nvme0n1" not in recorded  # the EBS volume is never touched
    if formatted:
        assert f"mkfs.xfs -f -q {devices}" in recorded
        assert f"mount -o noatime {devices} {tmp_path / 'nvme'}" in recorded
        assert (
            tmp_path / "fstab"
        ).read_text() == f"UUID=0a1b2c3d-uuid {tmp_path / 'nvme'} xfs noatime,nofail 0 2\n"
    else:
        assert "mount" not in recorded and not (tmp_path / "fstab").exists()
    if mkfs_fails:
        assert "WARNING: preparing the instance-store NVMe failed" in log


# ----------------------------------------------------------------------------------------------
# The commands against moto


def test_create_describe_nodes_delete_on_moto(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, moto_env: str
) -> None:
    name = unique("mazerl")
    spec = moto_spec(tmp_path, name)
    rc, out, err = run(
        capsys, "cluster", "create", "--spec", str(spec), "--wait", "--poll-seconds", "0"
    )
    assert rc == 0, err
    assert out.strip() == f"{name}: InService arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/{name}"
    assert err == f"{name}: InService\n"  # --wait's progress

    # What reached the service, read back with plain boto3 (moto keeps the groups as sent).
    sent = hyperpod.create_request(hyperpod.load_spec(spec))
    client = moto_client(moto_env)
    stored = client.describe_cluster(ClusterName=name)
    for group, got in zip(sent["InstanceGroups"], stored["InstanceGroups"], strict=True):
        want = dict(group)
        assert got.pop("TargetCount") == want.pop("InstanceCount")
        got.pop("CurrentCount")
        assert got == want
    assert stored["VpcConfig"] == sent["VpcConfig"]
    tags = client.list_tags(ResourceArn=stored["ClusterArn"])["Tags"]
    assert {"Key": "project", "Value": "mazerl"} in tags

    rc, out, _ = run(capsys, "cluster", "describe", name)
    assert rc == 0
    assert "status        InService" in out
    assert "gpu-workers         ml.g5.12xlarge      3/3" in out
    rc, out, _ = run(capsys, "cluster", "describe", name, "--json")
    described = json.loads(out)
    assert (described["ClusterName"], described["ClusterStatus"]) == (name, "InService")
    assert described["CreationTime"].startswith("20")

    rc, out, _ = run(capsys, "cluster", "nodes", name, "--json")
    assert rc == 0
    nodes = json.loads(out)
    assert sorted(n["group"] for n in nodes) == ["gpu-workers"] * 3 + ["head"]
    assert {(n["status"], n["health"], n["health_source"]) for n in nodes} == {
        ("Running", "ok", "status")
    }
    assert {n["instance_type"] for n in nodes if n["group"] == "head"} == {"ml.m5.16xlarge"}
    rc, out, _ = run(capsys, "cluster", "nodes", name)
    assert rc == 0 and len(out.strip().splitlines()) == 5 and "ok (from status)" in out

    # Another region has no such cluster: the region reaches sagemaker-core's client.
    rc, _, err = run(capsys, "cluster", "describe", name, "--region", "eu-west-1")
    assert rc == 1 and "Could not find cluster" in one_line(err)

    rc, out, err = run(capsys, "cluster", "delete", name, "--wait", "--poll-seconds", "0")
    assert rc == 0, err
    assert out.strip() == f"{name}: deleted arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/{name}"
    rc, _, err = run(capsys, "cluster", "describe", name)
    assert rc == 1
    assert (
        one_line(err)
        == f"maze-infra: describe cluster {name}: ValidationException: Could not find cluster '{name}'."
    )
    rc, _, err = run(capsys, "cluster", "nodes", name)
    assert rc == 1 and "Could not find cluster" in one_line(err)


def test_sagemaker_core_sends_exactly_the_checked_request(tmp_path: Path, moto_env: str) -> None:
    # moto drops Orchestrator and NodeRecovery; the request as it leaves botocore has them.
    name = unique("mazerl-sent")
    request = hyperpod.create_request(hyperpod.load_spec(moto_spec(tmp_path, name)))
    hyperpod.validate_request(request)
    session = hyperpod.aws_session()
    captured: list[dict[str, Any]] = []

    def grab(params: dict[str, Any], **_: Any) -> None:
        captured.append(copy.deepcopy(params))

    session.events.register("provide-client-params.sagemaker.CreateCluster", grab)
    described = hyperpod.create_cluster(request, session)
    assert captured == [request]
    assert described["ClusterStatus"] == "InService"
    hyperpod.delete_cluster(name, session)


def test_clients_have_bounded_timeouts_and_retries(moto_env: str) -> None:
    session = hyperpod.aws_session("us-east-1")
    config = session.client("sagemaker").meta.config
    assert (config.connect_timeout, config.read_timeout) == (
        hyperpod.CONNECT_TIMEOUT_S,
        hyperpod.READ_TIMEOUT_S,
    )
    assert config.retries["total_max_attempts"] == hyperpod.MAX_ATTEMPTS
    # sagemaker-core asks for 10 attempts; the session's bound wins.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # its docstrings' escapes, on first compile
        from sagemaker.core.utils.utils import SageMakerClient

    core = cast(Any, SageMakerClient)(
        session=session, region_name="us-east-1"
    ).sagemaker_client.meta.config
    assert core.retries["total_max_attempts"] == hyperpod.MAX_ATTEMPTS
    assert core.connect_timeout == hyperpod.CONNECT_TIMEOUT_S


def test_service_refusal_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, moto_env: str
) -> None:
    # moto's instance-type list predates ml.r5d and ml.g7e: it refuses the shipped spec as-is.
    name = unique("mazerl-refused")
    rc, out, err = run(capsys, "cluster", "create", "--spec", str(SPEC), "--name", name)
    assert (rc, out) == (1, "")
    line = one_line(err)
    assert line.startswith(f"maze-infra: create cluster {name}: ValidationException: ")
    assert "InstanceType" in line and "exists" not in line
    names = [c["ClusterName"] for c in moto_client(moto_env).list_clusters()["ClusterSummaries"]]
    assert name not in names

    spec = moto_spec(tmp_path, unique("mazerl-twice"))
    assert run(capsys, "cluster", "create", "--spec", str(spec))[0] == 0
    rc, _, err = run(capsys, "cluster", "create", "--spec", str(spec))
    assert rc == 1 and ": ResourceInUse: " in one_line(err)


@pytest.mark.parametrize("keep_failed", [False, True], ids=["rolled-back", "kept"])
def test_wait_reports_failure_message_and_rolls_back(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    moto_env: str,
    monkeypatch: pytest.MonkeyPatch,
    keep_failed: bool,
) -> None:
    from moto.sagemaker import models

    name = unique("mazerl-failed")
    reason = "Lifecycle scripts did not run successfully on node gpu-workers-1"
    original = models.Cluster.describe

    def failing(self: Any) -> dict[str, Any]:
        described = original(self)
        if self.cluster_name == name:  # moto has no Creating -> Failed transition of its own
            described.update(ClusterStatus="Failed", FailureMessage=reason)
        return described

    monkeypatch.setattr(models.Cluster, "describe", failing)
    argv = [
        "cluster",
        "create",
        "--spec",
        str(moto_spec(tmp_path, name)),
        "--wait",
        "--poll-seconds",
        "0",
    ]
    rc, out, err = run(capsys, *argv, *(["--keep-failed"] if keep_failed else []))
    assert (rc, out) == (1, "")
    progress, last = err.strip().splitlines()
    assert progress == f"{name}: Failed"
    assert last.startswith(f"maze-infra: cluster {name} went Failed: {reason}; ")
    names = [c["ClusterName"] for c in moto_client(moto_env).list_clusters()["ClusterSummaries"]]
    if keep_failed:
        assert "kept it (--keep-failed)" in last and name in names
        hyperpod.delete_cluster(name, hyperpod.aws_session())
    else:
        assert last.endswith("deleted it (DeleteCluster accepted)") and name not in names


def test_accepted_create_that_cannot_be_read_back_says_what_exists(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    moto_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moto.sagemaker import exceptions, models

    name = unique("mazerl-unread")

    def refuse(self: Any, cluster_name: str) -> dict[str, Any]:
        raise exceptions.ValidationError(message="describe is unavailable in this test")

    with monkeypatch.context() as patch:
        patch.setattr(models.SageMakerModelBackend, "describe_cluster", refuse)
        rc, _, err = run(capsys, "cluster", "create", "--spec", str(moto_spec(tmp_path, name)))
    assert rc == 1
    line = one_line(err)
    assert "describe is unavailable in this test" in line
    assert (
        f"CreateCluster was accepted, so cluster {name} (arn:aws:sagemaker:us-east-1:{ACCOUNT}:cluster/{name}) exists"
        in line
    )
    assert f"`maze-infra cluster delete {name}`" in line
    assert run(capsys, "cluster", "delete", name)[0] == 0


# ----------------------------------------------------------------------------------------------
# Credentials, reachability, extras


def test_missing_credentials_exit_5(
    capsys: pytest.CaptureFixture[str],
    moto_env: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    rc, out, err = run(capsys, "cluster", "describe", "mazerl")
    assert (rc, out) == (5, "")
    assert "Unable to locate credentials" in one_line(err)
    rc, _, err = run(
        capsys, "cluster", "create", "--spec", str(moto_spec(tmp_path, unique("mazerl-nocreds")))
    )
    assert rc == 5 and "exists" not in one_line(err)


class _Refusing(BaseHTTPRequestHandler):
    """Answers every request the way AWS's JSON protocol refuses credentials."""

    code = "UnrecognizedClientException"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.dumps(
            {"__type": self.code, "message": f"refused for the test ({self.code})"}
        ).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


@pytest.fixture
def refusing_endpoint(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Handler", (_Refusing,), {"code": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "refusing_endpoint",
    ["UnrecognizedClientException", "ExpiredTokenException", "AccessDeniedException"],
    indirect=True,
)
def test_refused_credentials_exit_5(
    capsys: pytest.CaptureFixture[str],
    aws_env: Callable[[str | None], None],
    refusing_endpoint: str,
) -> None:
    aws_env(refusing_endpoint)
    rc, out, err = run(capsys, "cluster", "nodes", "mazerl")
    assert (rc, out) == (5, "")
    assert one_line(err).startswith("maze-infra: list the nodes of cluster mazerl: ")
    assert "refused for the test" in err


def test_unreachable_endpoint_exit_4_quickly(
    capsys: pytest.CaptureFixture[str], aws_env: Callable[[str | None], None], tmp_path: Path
) -> None:
    aws_env(f"http://127.0.0.1:{closed_port()}")
    started = time.monotonic()
    rc, out, err = run(capsys, "cluster", "describe", "mazerl")
    assert (rc, out) == (4, "")
    assert "Could not connect to the endpoint URL" in one_line(err)
    rc, _, err = run(
        capsys, "cluster", "create", "--spec", str(moto_spec(tmp_path, unique("mazerl-down")))
    )
    assert rc == 4 and "exists" not in one_line(err)
    # Three attempts with standard backoff: seconds, not botocore's minutes.
    assert time.monotonic() - started < 20


def test_no_region_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], moto_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    rc, _, err = run(capsys, "cluster", "describe", "mazerl")
    assert rc == 2 and "no AWS region" in one_line(err)


@pytest.mark.parametrize("blocked", ["boto3", "sagemaker.core"])
def test_missing_aws_extra_exit_3(
    capsys: pytest.CaptureFixture[str], moto_env: str, monkeypatch: pytest.MonkeyPatch, blocked: str
) -> None:
    monkeypatch.setitem(sys.modules, blocked, None)  # makes `import` fail as if not installed
    rc, _, err = run(capsys, "cluster", "describe", "mazerl")
    assert rc == 3
    assert "pip install 'maze-infra[aws]'" in one_line(err)


def test_module_imports_no_sdk() -> None:
    code = (
        "import argparse, sys\n"
        "from maze_infra import hyperpod\n"
        "hyperpod.register(argparse.ArgumentParser().add_subparsers())\n"
        "print(sorted(m for m in ('boto3', 'botocore', 'sagemaker', 'yaml') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
