"""``maze-infra endpoint`` against a moto SageMaker on 127.0.0.1: deploy, describe, delete,
rollback of half-created deployments, input validation and the error exit codes."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from maze_infra import endpoint
from maze_infra.cli import main
from maze_infra.errors import OperationError

REGION = "us-east-1"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mazerl-serve:0.1.0"
ROLE = "arn:aws:iam::123456789012:role/mazerl-sagemaker"
ADAPTER = "s3://mazerl-models/adapters/run1/global_step_160/"
BASE = "s3://mazerl-models/base/qwen3-vl-8b-sft/"
MOTO_TYPE = "ml.g4dn.xlarge"  # moto's instance-type list predates g5/g6/g6e
SERVER_CLI = Path(__file__).resolve().parents[3] / "apps/server/src/maze_server/cli.py"


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials; no shared config, profile or instance metadata can leak in."""
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)


@pytest.fixture
def name() -> str:
    """A fresh endpoint name: the moto server is shared by the whole session."""
    return f"mazerl-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sm(moto_server: str) -> Any:
    client: Any = boto3.client(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        "sagemaker",
        region_name=REGION,
        endpoint_url=moto_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return client  # pyright: ignore[reportUnknownVariableType]


def deploy_args(name: str, *extra: str) -> list[str]:
    return [
        "endpoint",
        "deploy",
        "--name",
        name,
        "--image",
        IMAGE,
        "--adapter",
        ADAPTER,
        "--base-model",
        BASE,
        "--role",
        ROLE,
        *extra,
    ]


def aws(url: str) -> list[str]:
    return ["--region", REGION, "--endpoint-url", url]


def left(sm: Any, name: str) -> dict[str, list[str]]:
    """The resources whose names start with ``name`` (moto ignores NameContains)."""
    found: dict[str, list[str]] = {}
    for kind, op, key, field in (
        ("models", "list_models", "Models", "ModelName"),
        ("configs", "list_endpoint_configs", "EndpointConfigs", "EndpointConfigName"),
        ("endpoints", "list_endpoints", "Endpoints", "EndpointName"),
    ):
        pages = sm.get_paginator(op).paginate()
        names = [r[field] for page in pages for r in page[key]]
        found[kind] = [n for n in names if n.startswith(name)]
    return found


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("maze-infra: ") and "Traceback" not in err
    return lines[0]


def spec(name: str, instance_type: str = MOTO_TYPE) -> endpoint.EndpointSpec:
    return endpoint.EndpointSpec(
        name=name,
        image=IMAGE,
        adapter=ADAPTER,
        base_model=BASE,
        role=ROLE,
        instance_type=instance_type,
    )


def test_deploy_creates_model_config_and_endpoint(
    moto_server: str, sm: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(deploy_args(name, "--instance-type", MOTO_TYPE, "--wait", *aws(moto_server))) == 0
    out = capsys.readouterr().out
    assert f"endpoint  {name}: InService" in out

    ep = sm.describe_endpoint(EndpointName=name)
    assert ep["EndpointStatus"] == "InService"
    config_name = ep["EndpointConfigName"]
    assert re.fullmatch(rf"{name}-\d{{8}}-\d{{6}}", config_name)
    (variant,) = sm.describe_endpoint_config(EndpointConfigName=config_name)["ProductionVariants"]
    assert variant["VariantName"] == "AllTraffic"
    assert variant["InstanceType"] == MOTO_TYPE and variant["InitialInstanceCount"] == 1
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == 1800
    assert variant["InferenceAmiVersion"] == endpoint.GPU_AMI  # CUDA 13 driver for the image
    model = sm.describe_model(ModelName=variant["ModelName"])
    assert model["ExecutionRoleArn"] == ROLE
    assert model["PrimaryContainer"]["Image"] == IMAGE
    assert model["PrimaryContainer"]["Environment"] == {"MAZE_MODEL": BASE, "MAZE_ADAPTER": ADAPTER}
    tags = sm.list_tags(ResourceArn=model["ModelArn"])["Tags"]
    assert {"Key": "mazerl-endpoint", "Value": name} in tags

    # The dry run prints the same requests (names aside) and calls nothing.
    assert (
        main([*deploy_args(name, "--instance-type", MOTO_TYPE, "--dry-run"), "--region", REGION])
        == 0
    )
    planned = json.loads(capsys.readouterr().out)
    assert planned["CreateModel"]["PrimaryContainer"] == model["PrimaryContainer"]
    assert planned["CreateEndpointConfig"]["ProductionVariants"][0] == {
        **variant,
        "ModelName": planned["CreateModel"]["ModelName"],
    }


def test_the_container_env_is_what_maze_serve_reads() -> None:
    """maze-serve serve reads these variables (checked in its source: no server import here)."""
    source = SERVER_CLI.read_text()
    for var in spec("x").container_env():
        assert re.search(rf"env(?:\.get\(|\[)\"{var}\"", source), f"maze-serve never reads {var}"


def test_describe_and_delete(
    moto_server: str, sm: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(deploy_args(name, "--instance-type", MOTO_TYPE, *aws(moto_server))) == 0
    capsys.readouterr()
    assert main(["endpoint", "describe", name, *aws(moto_server)]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^status\s+InService$", text, re.M)
    assert re.search(rf"^variant\s+AllTraffic: {MOTO_TYPE} x1 \(running 1\)", text, re.M)
    assert re.search(rf"^adapter\s+{re.escape(ADAPTER)}$", text, re.M)
    assert main(["endpoint", "describe", name, "--json", *aws(moto_server)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["status"] == "InService" and d["image"] == IMAGE and d["failure_reason"] is None
    assert d["variants"][0]["instance_type"] == MOTO_TYPE

    config_name = d["config"]
    assert main(["endpoint", "delete", name, *aws(moto_server)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"deleted endpoint {name}",
        f"deleted config {config_name}",
        f"deleted model {d['variants'][0]['model']}",
    ]
    assert left(sm, name) == {"models": [], "configs": [], "endpoints": []}

    assert main(["endpoint", "delete", name, *aws(moto_server)]) == 1
    assert one_error_line(capsys.readouterr().err) == (
        f"maze-infra: no endpoint named {name} in {REGION}"
    )


def test_a_taken_endpoint_name_creates_nothing(
    moto_server: str, sm: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(deploy_args(name, "--instance-type", MOTO_TYPE, *aws(moto_server))) == 0
    before = left(sm, name)
    # moto would overwrite an endpoint of the same name; SageMaker refuses. Checked up front.
    assert main(deploy_args(name, "--instance-type", MOTO_TYPE, *aws(moto_server))) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "already exists" in line and "nothing was created" in line
    assert left(sm, name) == before


def test_a_config_the_service_refuses_rolls_back_the_model(
    moto_server: str, sm: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # The default ml.g6e.xlarge is not in moto's instance-type list: CreateEndpointConfig fails.
    assert main(deploy_args(name, *aws(moto_server))) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"create endpoint config {name}-" in line and "ml.g6e.xlarge" in line
    assert re.search(rf"rolled back: deleted model {name}-\d{{8}}-\d{{6}}$", line)
    assert left(sm, name) == {"models": [], "configs": [], "endpoints": []}


def test_a_failure_at_the_endpoint_step_rolls_back_config_and_model(
    moto_server: str, sm: Any, name: str
) -> None:
    session = endpoint.aws_session(REGION, endpoint_url=moto_server)

    def point_at_a_missing_config(params: dict[str, Any], **_: Any) -> None:
        params["EndpointConfigName"] = "no-such-config"  # moto then refuses CreateEndpoint

    session.events.register(
        "before-parameter-build.sagemaker.CreateEndpoint", point_at_a_missing_config
    )
    with pytest.raises(OperationError) as caught:
        endpoint.deploy(spec(name), session)
    msg = str(caught.value)
    assert msg.startswith(f"create endpoint {name}: ValidationException")
    assert re.search(
        rf"rolled back: deleted config {name}-\S+, model {name}-\d{{8}}-\d{{6}}$", msg
    ), msg
    assert left(sm, name) == {"models": [], "configs": [], "endpoints": []}


def test_an_endpoint_that_fails_to_start_is_rolled_back_whole(
    moto_server: str, sm: Any, name: str
) -> None:
    """moto's endpoints are InService at once; the answer is rewritten to a real failure."""
    session = endpoint.aws_session(REGION, endpoint_url=moto_server)
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."

    def failed(parsed: dict[str, Any], **_: Any) -> None:
        if "EndpointStatus" in parsed:
            parsed.update(EndpointStatus="Failed", FailureReason=reason)

    session.events.register("after-call.sagemaker.DescribeEndpoint", failed)
    with pytest.raises(OperationError) as caught:
        endpoint.deploy(spec(name), session, wait=True, poll_s=0)
    msg = str(caught.value)
    assert msg.startswith(f"endpoint {name} failed: {reason}")
    assert f"rolled back: deleted endpoint {name}, config {name}-" in msg
    assert left(sm, name) == {"models": [], "configs": [], "endpoints": []}


def test_a_wait_that_times_out_leaves_the_endpoint_creating(
    moto_server: str, sm: Any, name: str
) -> None:
    session = endpoint.aws_session(REGION, endpoint_url=moto_server)

    def creating(parsed: dict[str, Any], **_: Any) -> None:
        if "EndpointStatus" in parsed:
            parsed["EndpointStatus"] = "Creating"

    session.events.register("after-call.sagemaker.DescribeEndpoint", creating)
    with pytest.raises(OperationError, match=r"still Creating after 0 s.*left in place"):
        endpoint.deploy(spec(name), session, wait=True, wait_timeout_s=0, poll_s=0)
    resources = left(sm, name)
    assert resources["endpoints"] == [name] and len(resources["models"]) == 1


BAD_INPUTS = [
    (["--name", "bad_name"], "name"),
    (["--name", "x" * 64], "name"),
    (["--image", "docker.io/library/mazerl-serve:latest"], "image"),
    (["--image", IMAGE.replace("us-east-1", "eu-west-1")], "image"),  # not the endpoint's region
    (["--adapter", "https://mazerl-models.s3.amazonaws.com/adapters/"], "adapter"),
    (["--adapter", "s3://mazerl-models/"], "adapter"),
    (["--base-model", "relative/dir"], "base_model"),
    (["--role", "arn:aws:iam::123456789012:user/someone"], "role"),
    (["--instance-type", "g6e.xlarge"], "instance_type"),
    (["--instance-count", "0"], "instance_count"),
    (["--startup-timeout", "30"], "startup_timeout"),
    (["--region", "moon-1"], "region"),
]


@pytest.mark.parametrize(("override", "field"), BAD_INPUTS, ids=[f for _, f in BAD_INPUTS])
def test_bad_input_names_the_field_before_any_call(
    override: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = dict(zip(deploy_args("ok")[2::2], deploy_args("ok")[3::2], strict=True))
    args.update({"--region": REGION, "--endpoint-url": f"http://127.0.0.1:{closed_port()}"})
    args.update(zip(override[::2], override[1::2], strict=True))
    argv = ["endpoint", "deploy", *[x for kv in args.items() for x in kv]]
    assert main(argv) == 2  # not 4: the closed port was never tried
    assert one_error_line(capsys.readouterr().err).startswith(f"maze-infra: {field}: ")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_service_is_exit_4_after_bounded_retries(
    capsys: pytest.CaptureFixture[str],
) -> None:
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{closed_port()}"
    assert (
        main(["endpoint", "describe", "mazerl-x", "--region", REGION, "--endpoint-url", url]) == 4
    )
    assert time.monotonic() - t0 < 20  # 3 attempts, not botocore's or sagemaker-core's 5-10
    assert "Could not connect to the endpoint URL" in one_error_line(capsys.readouterr().err)


def test_missing_credentials_are_exit_5(
    moto_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert main(["endpoint", "describe", "mazerl-x", *aws(moto_server)]) == 5
    assert "Unable to locate credentials" in one_error_line(capsys.readouterr().err)


@pytest.fixture
def moto_checks_credentials(moto_server: str) -> Iterator[None]:
    """moto authenticates every request against its own IAM while this fixture is active."""

    def set_count(count: str) -> str:
        req = urllib.request.Request(
            f"{moto_server}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return str(json.loads(r.read())["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"])

    previous = set_count("0")
    try:
        yield
    finally:
        set_count(previous)


@pytest.mark.usefixtures("moto_checks_credentials")
def test_refused_credentials_are_exit_5_and_nothing_is_created(
    moto_server: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(deploy_args(name, "--instance-type", MOTO_TYPE, *aws(moto_server))) == 5
    line = one_error_line(capsys.readouterr().err)
    assert "credentials refused: The security token included in the request is invalid" in line


def test_missing_aws_extra_is_exit_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    assert main(["endpoint", "describe", "mazerl-x", "--region", REGION]) == 3
    assert "pip install 'maze-infra[aws]'" in one_error_line(capsys.readouterr().err)


def test_help_and_dry_run_import_no_aws_sdk() -> None:
    code = (
        "import sys\n"
        "from maze_infra.cli import main\n"
        f"assert main({deploy_args('mazerl-x', '--dry-run', '--region', REGION)!r}) == 0\n"
        "assert not {'boto3', 'botocore', 'sagemaker'} & set(sys.modules), sorted(sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["CreateEndpoint"]["EndpointName"] == "mazerl-x"
