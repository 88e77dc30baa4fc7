"""The Ray entrypoint and the `ray job submit` command for HyperPod."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from maze_engine.skyrl_cluster import (
    EXIT_CONFIG_ERROR,
    EXIT_NEEDS_GPU_IMAGE,
    REFERENCE_CONFIG,
    GpuImageRequiredError,
    SkyRLConfigError,
    build_submit_command,
    main,
    require_gpu_stack,
)

_HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(_HAS_VLLM, reason="vLLM is installed: this is the GPU image")
def test_entrypoint_without_vllm_exits_with_the_gpu_image_message(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "maze_engine.skyrl_cluster", "--config", REFERENCE_CONFIG],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == EXIT_NEEDS_GPU_IMAGE, proc.stderr
    assert "skyrl[fsdp]" in proc.stderr
    assert "GPU container image" in proc.stderr
    assert "vllm" in proc.stderr
    assert not list(tmp_path.iterdir())  # failed before writing anything
    with pytest.raises(GpuImageRequiredError, match="--dry-run"):
        require_gpu_stack()


def test_dry_run_prints_the_resolved_skyrl_config(capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    code = main(["--dry-run", "--config", REFERENCE_CONFIG, "trainer.run_name=dry"])
    out = capsys.readouterr().out
    assert code == 0
    resolved = yaml.safe_load(out)
    assert resolved["trainer"]["ckpt_path"] == "/shared/runs/dry/ckpt"
    assert resolved["generator"]["max_turns"] == 21
    assert "# datasets: /shared/runs/dry/data (eval easy-64, slack 4)" in out


def test_config_errors_exit_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", "trainer.polcy.model.path=x"]) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "config error: trainer.polcy: unknown key" in err
    assert "'trainer.policy'" in err
    assert main(["--dry-run", "generator.max_turns=15"]) == EXIT_CONFIG_ERROR
    assert "generator.max_turns: 15 turns cannot finish" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--dry-run", "--no-such-flag"])


def _submit_params(argv: list[str]) -> dict[str, object]:
    """Parse the argv with Ray's own `ray job submit` CLI (click), without running it."""
    from ray.dashboard.modules.job.cli import job_cli_group

    assert argv[:3] == ["ray", "job", "submit"]
    submit = job_cli_group.commands["submit"]
    return dict(submit.make_context("submit", argv[3:]).params)


def test_submit_command_for_hyperpod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAZERL_SFT_CHECKPOINT", "/shared/models/visgym-sft")
    monkeypatch.delenv("MAZERL_RUN", raising=False)
    overrides = ["trainer.run_name=hp1", "trainer.epochs=10"]
    argv = build_submit_command(
        REFERENCE_CONFIG,
        overrides,
        "sagemaker_ray://maze-raycluster/mazerl",
        entrypoint_args=["--train-size", "256"],
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
        "python", "-m", "maze_engine.skyrl_cluster", "--config", REFERENCE_CONFIG,
        "--train-size", "256", *overrides,
    )  # fmt: skip


def test_submit_command_accepts_ray_dashboard_addresses(tmp_path: Path) -> None:
    cfg = tmp_path / "mine.yaml"  # absolute, not present: validated on the cluster
    for address in ("http://127.0.0.1:8265", "https://ray.example.com", "10.0.0.5:8265"):
        argv = build_submit_command(str(cfg) + ".missing", [], address)
        assert _submit_params(argv)["address"] == address


@pytest.mark.parametrize(
    "address",
    ["", "sagemaker_ray://Upper/ns", "sagemaker_ray://only-cluster", "ray job", "ftp://x:1"],
)
def test_submit_command_rejects_bad_addresses(address: str) -> None:
    with pytest.raises(SkyRLConfigError, match="not a Ray job address") as e:
        build_submit_command(REFERENCE_CONFIG, [], address)
    assert e.value.key == "address"


def test_submit_command_checks_config_before_submitting() -> None:
    with pytest.raises(SkyRLConfigError) as e:
        build_submit_command(REFERENCE_CONFIG, ["trainer.stratgy=fsdp"], "127.0.0.1:8265")
    assert e.value.key == "trainer.stratgy"
    with pytest.raises(SkyRLConfigError, match="absolute path") as e:
        build_submit_command("configs/mine.yaml", [], "127.0.0.1:8265")
    assert e.value.key == "config"
    with pytest.raises(SkyRLConfigError, match="not key=value"):
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
