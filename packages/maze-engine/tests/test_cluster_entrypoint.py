"""The SkyRL cluster path's entry (``maze_engine.cluster``), the Ray job that runs ``maze-train``
on HyperPod, and what submitting it says when the job server cannot be reached."""

from __future__ import annotations

import http.server
import importlib.util
import json
import socket
import threading
from pathlib import Path

import pytest

from maze_engine.cluster import require_gpu_stack, run_training
from maze_engine.config import REFERENCE_CONFIG, SMOKE_CONFIG, load_config
from maze_engine.errors import (
    ConfigError,
    GpuImageRequiredError,
    JobClientMissingError,
    JobServerError,
)
from maze_engine.submit import build_job, build_submit_command, connect, require_job_client

_HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(_HAS_VLLM, reason="vLLM is installed: this is the GPU image")
def test_training_without_vllm_raises_the_gpu_image_error_before_writing(tmp_path: Path) -> None:
    with pytest.raises(GpuImageRequiredError, match="--dry-run") as e:
        require_gpu_stack()
    assert "skyrl[fsdp]" in str(e.value) and "GPU container image" in str(e.value)
    assert "vllm" in str(e.value)
    data = tmp_path / "data"
    config = load_config(
        REFERENCE_CONFIG,
        [f"data.train_data=[{data}/train.parquet]", f"data.val_data=[{data}/validation.parquet]"],
    )
    assert config.data_dir == data
    with pytest.raises(GpuImageRequiredError, match="maze-train --engine skyrl --submit"):
        run_training(config)
    assert not list(tmp_path.iterdir())  # failed before exporting the datasets


def _submit_params(argv: list[str]) -> dict[str, object]:
    """Parse the argv with Ray's own `ray job submit` CLI (click), without running it."""
    from ray.dashboard.modules.job.cli import job_cli_group

    assert argv[:3] == ["ray", "job", "submit"]
    submit = job_cli_group.commands["submit"]
    return dict(submit.make_context("submit", argv[3:]).params)


def test_submit_command_for_hyperpod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAZERL_SFT_CHECKPOINT", "/shared/models/visgym-sft")
    monkeypatch.delenv("MAZERL_RUN", raising=False)
    # Dataset settings are config keys now (the old --train-size flag is mazes.train_size).
    overrides = ["trainer.run_name=hp1", "trainer.epochs=10", "mazes.train_size=128"]
    argv = build_submit_command(
        REFERENCE_CONFIG,
        overrides,
        "sagemaker_ray://maze-raycluster/mazerl",
        entrypoint_args=["--dry-run"],
        env_vars={"WANDB_MODE": "offline"},
        no_wait=True,
    )
    params = _submit_params(argv)
    assert params["address"] == "sagemaker_ray://maze-raycluster/mazerl"
    assert params["no_wait"] is True
    runtime_env = json.loads(str(params["runtime_env_json"]))
    assert runtime_env == {
        "env_vars": {
            "MAZERL_SFT_CHECKPOINT": "/shared/models/visgym-sft",
            "WANDB_MODE": "offline",
            "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1",
        }
    }
    assert params["entrypoint"] == (
        "maze-train", "--engine", "skyrl", "--config", REFERENCE_CONFIG, "--dry-run", *overrides,
    )  # fmt: skip


def test_submit_command_for_the_local_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAZERL_RUN", raising=False)
    monkeypatch.delenv("MAZERL_SFT_CHECKPOINT", raising=False)
    argv = build_submit_command(
        SMOKE_CONFIG, ["local.rollout_workers=4"], "127.0.0.1:8265", engine="local"
    )
    params = _submit_params(argv)
    assert params["no_wait"] is False
    assert json.loads(str(params["runtime_env_json"])) == {
        "env_vars": {"RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}
    }
    assert params["entrypoint"] == (
        "maze-train", "--engine", "local", "--config", SMOKE_CONFIG, "local.rollout_workers=4",
    )  # fmt: skip


def test_submit_command_accepts_ray_dashboard_addresses(tmp_path: Path) -> None:
    cfg = tmp_path / "mine.yaml"  # absolute, not present: validated on the cluster
    for address in ("http://127.0.0.1:8265", "https://ray.example.com"):
        argv = build_submit_command(str(cfg) + ".missing", [], address)
        assert _submit_params(argv)["address"] == address
    # Ray's own client reads a bare host:port as a GCS address; here it is the job server's.
    job = build_job(str(cfg) + ".missing", [], "10.0.0.5:8265")
    assert job.address == "http://10.0.0.5:8265"
    assert _submit_params(job.command())["address"] == "http://10.0.0.5:8265"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_to_a_closed_port_is_one_error_naming_the_address() -> None:
    address = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(JobServerError) as e:
        connect(address, timeout=5)
    message = str(e.value)
    assert message.startswith(f"cannot reach the Ray job server at {address}: connection refused")
    assert "dashboard port" in message and "\n" not in message


def test_connect_to_a_server_that_is_not_ray_is_one_error() -> None:
    # Something answers, but not Ray's job API: the version check fails, reported the same way.
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(JobServerError, match=f"no Ray job server answers at {address}: 501"):
            connect(address, timeout=5)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(
    importlib.util.find_spec("sagemaker_ray") is not None,
    reason="toolkit-for-ray-on-sagemaker-ai is installed",
)
def test_sagemaker_addresses_name_the_package_they_need() -> None:
    with pytest.raises(JobClientMissingError, match="toolkit-for-ray-on-sagemaker-ai"):
        require_job_client("sagemaker_ray://maze-raycluster/mazerl")
    require_job_client("http://127.0.0.1:8265")  # plain dashboards need nothing more


@pytest.mark.parametrize(
    "address",
    ["", "sagemaker_ray://Upper/ns", "sagemaker_ray://only-cluster", "ray job", "ftp://x:1"],
)
def test_submit_command_rejects_bad_addresses(address: str) -> None:
    with pytest.raises(ConfigError, match="not a Ray job address") as e:
        build_submit_command(REFERENCE_CONFIG, [], address)
    assert e.value.key == "address"


def test_submit_command_checks_config_before_submitting() -> None:
    with pytest.raises(ConfigError) as e:
        build_submit_command(REFERENCE_CONFIG, ["trainer.stratgy=fsdp"], "127.0.0.1:8265")
    assert e.value.key == "trainer.stratgy"
    # The mazes: and local: sections are checked too.
    with pytest.raises(ConfigError) as e:
        build_submit_command(REFERENCE_CONFIG, ["mazes.eval_set=medium-64"], "127.0.0.1:8265")
    assert e.value.key == "mazes.eval_set"
    with pytest.raises(ConfigError) as e:
        build_submit_command(SMOKE_CONFIG, ["local.sft_steps=3"], "127.0.0.1:8265", engine="local")
    assert e.value.key == "local.sft_steps"
    with pytest.raises(ConfigError, match="absolute path") as e:
        build_submit_command("configs/mine.yaml", [], "127.0.0.1:8265")
    assert e.value.key == "config"
    with pytest.raises(ConfigError, match="not key=value"):
        build_submit_command(REFERENCE_CONFIG, ["trainer.epochs"], "127.0.0.1:8265", validate=False)


def test_job_runtime_env_merges_with_skyrls_ray_init() -> None:
    """Inside the job SkyRL calls ray.init(runtime_env=...); Ray merges it with the job's."""
    from ray.runtime_env.runtime_env import RuntimeEnv, _merge_runtime_env  # pyright: ignore[reportPrivateUsage]

    # Two of the variables SkyRL's prepare_runtime_environment sets for an FSDP + vLLM run (not
    # called here: it probes the Ray cluster's GPU nodes).
    skyrl_env = RuntimeEnv(
        env_vars={"NCCL_CUMEM_ENABLE": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
    )
    clash = {"NCCL_CUMEM_ENABLE": "1"}
    argv = build_submit_command(
        REFERENCE_CONFIG, [], "127.0.0.1:8265", env_vars=clash, validate=False
    )
    job_env = json.loads(str(_submit_params(argv)["runtime_env_json"]))
    # Ray reads the override flag from the driver's environment, which job env_vars set.
    override = job_env["env_vars"]["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    merged = _merge_runtime_env(RuntimeEnv(**job_env), skyrl_env, override=override)
    assert merged is not None
    assert merged["env_vars"]["NCCL_CUMEM_ENABLE"] == "0"  # SkyRL's value wins
    assert merged["env_vars"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true"
    assert _merge_runtime_env(RuntimeEnv(**job_env), skyrl_env, override=False) is None
