import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from maze_engine.decisions import layout_class
from maze_env import get_eval_set
from maze_env.render import read_rendering
from maze_policy.contexts import read_context

_HAS_VLLM = importlib.util.find_spec("vllm") is not None


def run(
    *args: str, timeout: int = 900, cwd: Path | None = None, config: str | None = "smoke_5x5"
) -> subprocess.CompletedProcess[str]:
    """``maze-train ARGS``, with ``--config`` for local-engine runs and warm starts."""
    argv = list(args)
    if config is not None and "--config" not in argv and "skyrl" not in argv:
        at = 1 if argv[:1] == ["warm-start"] else 0
        argv[at:at] = ["--config", config]
    return subprocess.run(
        [sys.executable, "-m", "maze_trainer.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
    )


def test_dry_run_prints_the_resolved_config() -> None:
    proc = run("--dry-run", "generator.n_samples_per_prompt=3")
    assert proc.returncode == 0, proc.stderr
    assert "n_samples_per_prompt: 3" in proc.stdout and "local: LocalConfig(" in proc.stdout
    assert "mazes: MazeDataConfig(train_preset='5x5'" in proc.stdout


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("trainer.bogus=1", "trainer.bogus"),
        ("local.bogus=1", "local.bogus"),
        ("mazes.bogus=1", "mazes.bogus"),
        ("mazes.eval_set=nope", "mazes.eval_set"),
        ("mazes.reward_spec=shiny", "mazes.reward_spec"),
        ("trainer.resume_mode=sometimes", "resume_mode"),
        # tiny-64's mazes need 4 moves + stop: fewer turns would leave them unsolvable.
        ("generator.max_turns=4", "generator.max_turns: 4 turns cannot finish"),
        ("local.sft_mazes=512", "local.sft_mazes"),
        ("local.warm_start.steps=-1", "local.warm_start.steps"),
    ],
)
def test_config_errors_name_the_key(override: str, needle: str) -> None:
    proc = run("--dry-run", override)
    assert proc.returncode == 2
    assert needle in proc.stderr and "maze-train: config error" in proc.stderr


def test_changed_settings_for_an_existing_run_directory_are_a_config_error(tmp_path: Path) -> None:
    from maze_engine.config import load_config
    from maze_engine.data import export_datasets

    export_datasets(load_config("smoke_5x5", [f"trainer.export_path={tmp_path}"]))
    proc = run(f"trainer.export_path={tmp_path}", "mazes.train_preset=7x7")
    assert proc.returncode == 2, proc.stderr
    assert "maze-train: config error: mazes.train_preset gives train_preset='7x7'" in proc.stderr


def test_not_an_override() -> None:
    proc = run("stray")
    assert proc.returncode == 2 and "key=value" in proc.stderr


def test_skyrl_engine_validates_and_needs_the_gpu_image() -> None:
    proc = run("--engine", "skyrl", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "Qwen3-VL-8B" in proc.stdout
    proc = run("--engine", "skyrl", "--submit", "sagemaker_ray://maze-cluster/default", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.startswith("ray job submit")
        and "sagemaker_ray://maze-cluster/default" in proc.stdout
    )


@pytest.mark.skipif(_HAS_VLLM, reason="vLLM is installed: this is the GPU image")
def test_skyrl_engine_without_vllm_exits_3_with_the_gpu_image_message(tmp_path: Path) -> None:
    proc = run("--engine", "skyrl", "--config", "maze_grpo_qwen3vl8b", cwd=tmp_path, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "skyrl[fsdp]" in proc.stderr
    assert "GPU container image" in proc.stderr
    assert "vllm" in proc.stderr
    assert not list(tmp_path.iterdir())  # failed before writing anything


def test_skyrl_dry_run_prints_the_resolved_config_and_the_datasets() -> None:
    import yaml

    proc = run("--engine", "skyrl", "--dry-run", "trainer.run_name=dry", "mazes.train_size=64")
    assert proc.returncode == 0, proc.stderr
    resolved = yaml.safe_load(proc.stdout.split("\nmazes: ")[0])
    assert resolved["trainer"]["ckpt_path"] == "/shared/runs/dry/ckpt"
    assert resolved["generator"]["max_turns"] == 21
    assert "mazes" not in resolved and "local" not in resolved  # never handed to SkyRL
    assert (
        "mazes: MazeDataConfig(train_preset='easy', train_size=64, eval_set='easy-64', cell_px=25"
        in proc.stdout
    )
    assert "# datasets: /shared/runs/dry/data (slack 4)" in proc.stdout


def test_skyrl_config_errors_exit_2_naming_the_key() -> None:
    proc = run("--engine", "skyrl", "--dry-run", "trainer.polcy.model.path=x")
    assert proc.returncode == 2
    assert "config error: trainer.polcy: unknown key" in proc.stderr
    assert "'trainer.policy'" in proc.stderr
    proc = run("--engine", "skyrl", "--dry-run", "generator.max_turns=15")
    assert proc.returncode == 2
    assert "generator.max_turns: 15 turns cannot finish" in proc.stderr
    proc = run("--engine", "skyrl", "--dry-run", "--no-such-flag")
    assert proc.returncode == 2 and "--no-such-flag" in proc.stderr


@pytest.mark.parametrize(
    ("engine", "config"), [("skyrl", "maze_grpo_qwen3vl8b"), ("local", "smoke_5x5")]
)
def test_submit_dry_run_prints_the_maze_train_job_the_cluster_runs(
    engine: str, config: str
) -> None:
    address = "sagemaker_ray://maze-cluster/default"
    proc = run("--engine", engine, "--submit", address, "--dry-run", "mazes.train_size=64")
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert argv[:5] == ["ray", "job", "submit", "--address", address]
    entrypoint = argv[argv.index("--") + 1 :]
    assert entrypoint == [
        "maze-train", "--engine", engine, "--config", config, "mazes.train_size=64",
    ]  # fmt: skip
    assert f"-- maze-train --engine {engine} --config {config}" in proc.stdout
    # The job's command is one this CLI accepts: validated here as the cluster would read it.
    check = run(*entrypoint[1:], "--dry-run")
    assert check.returncode == 0, check.stderr
    assert "train_size=64" in check.stdout
    # A bad key fails here, before anything is submitted.
    bad = run("--engine", engine, "--submit", address, "--dry-run", "mazes.train_szie=64")
    assert bad.returncode == 2 and "mazes.train_szie: unknown key" in bad.stderr
    assert "ray job submit" not in bad.stdout


def test_warm_start_trains_evaluates_and_saves_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "ws"
    proc = run(
        "warm-start",
        "--out",
        str(out),
        "local.warm_start.steps=3",
        "local.warm_start.batch_size=2",
        "local.warm_start.warmup_steps=1",
        "local.warm_start.eval_mazes=2",
        "local.warm_start.max_new_tokens=8",
        "local.warm_start.eval_every=3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "base: random init" in proc.stdout  # smoke_5x5's local.tiny_base
    # Scored on the eval set's first mazes (tiny-64 for smoke_5x5) at the main job's budget.
    assert re.search(r"^before: tiny-64 solve [\d.]+% \(\d/2\)", proc.stdout, re.M), proc.stdout
    assert re.search(r"^after 3 steps / \d+ s: tiny-64 solve [\d.]+% \(\d/2\)", proc.stdout, re.M)
    assert f"saved {out}" in proc.stdout
    report = json.loads((out / "sft_report.json").read_text())
    assert report["steps_done"] == 3 and len(report["losses"]) == 3
    assert report["config"]["spec"] == "5x5" and report["config"]["batch_size"] == 2
    assert [e["step"] for e in report["evals"]] == [3]  # local.warm_start.eval_every
    # First moves on the eval set are tracked after the last step (track_every is 200).
    (moves,) = report["first_moves"]
    classes = {layout_class(m) for m in get_eval_set("tiny-64").mazes}
    assert moves["step"] == 3 and set(moves) == {"step", "all", *classes}
    assert all(0.0 <= v <= 1.0 for k, v in moves.items() if k != "step")
    assert "first_move/all" in proc.stdout
    from maze_policy.model import load_vlm

    model, _processor = load_vlm(out)
    assert model is not None
    # --base continues from a saved model instead of building a fresh one.
    again = run(
        "warm-start",
        "--out",
        str(tmp_path / "ws2"),
        "--base",
        str(out),
        "local.warm_start.steps=1",
        "local.warm_start.batch_size=1",
        "local.warm_start.warmup_steps=1",
        "local.warm_start.eval_mazes=1",
        "local.warm_start.max_new_tokens=8",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert not (tmp_path / "ws2" / "_init").exists()
    assert json.loads((tmp_path / "ws2" / "sft_report.json").read_text())["steps_done"] == 1
    # Without --base it starts where the main job starts: the config's local.tiny_base.
    pretrained = run(
        "warm-start",
        "--config",
        "tiny_local",
        "--out",
        str(tmp_path / "ws3"),
        "local.warm_start.steps=0",
        "local.warm_start.eval_mazes=1",
        "local.warm_start.max_new_tokens=8",
    )
    assert pretrained.returncode == 0, pretrained.stderr[-3000:]
    assert "base: tiny-qwen3vl-route-v2" in pretrained.stdout
    assert "before: small-64 solve" in pretrained.stdout


def test_probe_reports_every_layout_class_of_the_eval_set() -> None:
    """The shipped perception base transcribes mazes; asked to move, it answers no move, and
    such a first reply counts as a bad first move (not as none)."""
    proc = run("probe", "tiny-qwen3vl-perception", "--eval-set", "tiny-64", config=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and "/" in line.split("|")[1]
    ]
    es = get_eval_set("tiny-64")
    assert {r[0] for r in rows} == {layout_class(m) for m in es.mazes}
    assert sum(int(r[1]) for r in rows) == len(es.mazes)
    for _cls, _n, first, neighbours in rows:
        assert first == "0%"
        assert int(neighbours.rstrip("%")) >= 90  # what its pretraining taught it

    proc = run("probe", "no-such-model", config=None)
    assert proc.returncode == 2
    assert "maze-train probe: no shipped artifact 'no-such-model'" in proc.stderr


def test_warm_start_usage_and_config_errors() -> None:
    proc = run("warm-start", "--out", "x", "local.warm_start.stpes=3")
    assert proc.returncode == 2
    assert "maze-train: config error: local.warm_start.stpes: unknown key" in proc.stderr
    assert "'local.warm_start.steps'" in proc.stderr
    proc = run("warm-start", "--out", "x", "stray")
    assert proc.returncode == 2 and "key=value" in proc.stderr
    proc = run("warm-start")
    assert proc.returncode == 2 and "--out" in proc.stderr


def test_short_local_run_trains_checkpoints_and_reports(tmp_path: Path) -> None:
    proc = run(
        f"trainer.export_path={tmp_path}",
        "trainer.max_training_steps=1",
        "trainer.train_batch_size=2",
        "trainer.policy_mini_batch_size=2",
        "generator.n_samples_per_prompt=2",
        "generator.sampling_params.max_generate_length=8",
        "trainer.ckpt_interval=1",
        "trainer.eval_interval=0",
        "trainer.eval_before_train=true",
        "generator.max_turns=5",  # tiny-64's 4 moves + stop: no slack
        "local.warm_start.steps=2",
        "local.warm_start.route_rehearsal=2",
        "local.route_rehearsal=2",
        "local.context=latest",
        "local.rollout_workers=0",
        "mazes.train_size=4",
        "local.progress=false",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final adapter:" in proc.stdout
    assert "in context 'latest', recorded beside the adapter" in proc.stdout
    # The exported adapter says what it was trained in, for maze-eval and maze-serve to follow.
    assert read_context(tmp_path / "final_adapter") == "latest"
    # The three stages of the main job, each figure the one its run recorded.
    m = re.search(
        r"tiny-64 solve rate: random init ([\d.]+)% -> warm start "
        r"\(2 oracle steps \+ 2 route questions each\) "
        r"([\d.]+)% -> GRPO ([\d.]+)% "
        r"\(global step 1; 2 route questions rehearsed after each update\)",
        proc.stdout,
    )
    assert m, proc.stdout
    report = json.loads((tmp_path / "base_model" / "sft_report.json").read_text())
    assert float(m[1]) == pytest.approx(100 * report["base_solve_rate"], abs=0.005)
    evals = [
        json.loads(line)["eval/all/pass_at_1"]
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
        if "eval/all/pass_at_1" in line
    ]
    assert [float(m[2]), float(m[3])] == pytest.approx([100 * e for e in evals], abs=0.005)
    assert (tmp_path / "final_adapter" / "adapter_model.safetensors").exists()
    ckpt_adapter = tmp_path / "ckpt" / "global_step_1" / "policy" / "lora_adapter"
    assert (ckpt_adapter / "adapter_config.json").exists()
    # A checkpoint's adapter says the same, so evaluating or serving it mid-run is not asked
    # in another context (a per-turn policy asked in 'full' solves nothing).
    assert read_context(ckpt_adapter) == "latest"
    rendering = read_rendering(ckpt_adapter)
    assert rendering is not None and rendering.cell_px == 32
    assert (tmp_path / "ckpt" / "latest_ckpt_global_step.txt").read_text().strip() == "1"
    assert (tmp_path / "metrics.jsonl").read_text().count("reward/avg_raw_reward") == 1
    from PIL import Image

    with Image.open(tmp_path / "curves.png") as im:  # drawn at the end of the run
        assert im.format == "PNG" and im.width > 800


def test_ray_rollout_workers_from_a_relative_run_dir(tmp_path: Path) -> None:
    """Two Ray actors on a local Ray instance generate the rollouts and load each published
    adapter; paths in the config are relative to the caller's directory, as with the default
    ``./runs/...``, and must still resolve inside the workers."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": ""}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "maze_trainer.cli",
            "trainer.export_path=./runs/ray-test",
            "trainer.max_training_steps=2",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=2",
            "generator.n_samples_per_prompt=2",
            "generator.sampling_params.max_generate_length=8",
            "trainer.ckpt_interval=2",
            "trainer.eval_interval=0",
            "trainer.eval_before_train=false",
            "local.warm_start.steps=2",
            "local.rollout_workers=2",
            "mazes.train_size=4",
            "local.progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "runs" / "ray-test"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/turns_per_second" in r]
    # Version 1 is the initial adapter the workers start from; each step publishes the next one
    # and the workers load it before the following step's rollouts.
    assert [r["adapter/version"] for r in steps] == [2.0, 3.0]
    assert all(r["rollout/avg_turns"] >= 1 for r in steps)
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_submit_to_an_unreachable_address_is_one_line_and_exit_4() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    proc = run("--engine", "skyrl", "--submit", address, timeout=300)
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(
        f"maze-train: cannot reach the Ray job server at http://{address}: connection refused; "
        "check that the Ray head is running"
    )


@pytest.mark.skipif(
    importlib.util.find_spec("sagemaker_ray") is not None,
    reason="toolkit-for-ray-on-sagemaker-ai is installed",
)
def test_submit_to_hyperpod_without_its_package_is_one_line_and_exit_5() -> None:
    proc = run("--engine", "skyrl", "--submit", "sagemaker_ray://maze-cluster/default")
    assert proc.returncode == 5, proc.stderr
    assert proc.stderr.strip() == (
        "maze-train: sagemaker_ray:// addresses need the toolkit-for-ray-on-sagemaker-ai "
        "package, which is not installed here (pip install toolkit-for-ray-on-sagemaker-ai)"
    )


def test_plot_redraws_the_curves_from_metrics_jsonl(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    from maze_trainer import cli

    rows = [{"global_step": 0, "eval/all/pass_at_1": 0.5}]
    rows += [
        {"global_step": s, "reward/avg_raw_reward": 0.5, "reward/avg_pass_at_8": 1.0,
         "policy/policy_entropy": 0.05, "timing/generate": 2.0, "timing/policy_train": 3.0,
         "timing/sync_weights": 0.1, "timing/step": 5.2}
        for s in (1, 2, 3)
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = run("plot", str(tmp_path), config=None, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "curves.png")
    with Image.open(tmp_path / "curves.png") as im:
        assert im.format == "PNG" and im.width > 800 and im.height > 500
    monkeypatch.setattr(cli, "_quiet_skyrl_logs", lambda: None)  # SkyRL's loguru, this process
    out = tmp_path / "elsewhere" / "c.png"
    assert cli.main(["plot", str(tmp_path), "--out", str(out)]) == 0
    assert out.is_file()
    capsys.readouterr()
    assert cli.main(["plot", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"maze-train: {tmp_path / 'nope' / 'metrics.jsonl'}: cannot read the metrics file: "
        "No such file or directory"
    )


class StandInJobServer:
    """Ray's job REST API on 127.0.0.1, as much of it as Ray's job client uses to submit a job,
    follow its logs and read its outcome; the job 'runs' by printing two lines and ending as
    ``status`` says."""

    def __init__(self, status: str, message: str, exit_code: int | None) -> None:
        import asyncio
        import threading

        import ray
        from aiohttp import web

        self.submitted: list[dict[str, object]] = []
        self.status, self.message, self.exit_code = status, message, exit_code
        app = web.Application()

        async def version(_: web.Request) -> web.Response:
            return web.json_response({"version": "stand-in", "ray_version": ray.__version__})

        async def submit(request: web.Request) -> web.Response:
            self.submitted.append(await request.json())
            return web.json_response({"job_id": "raysubmit_1", "submission_id": "raysubmit_1"})

        async def info(_: web.Request) -> web.Response:
            job = self.submitted[-1]
            return web.json_response({
                "type": "SUBMISSION", "submission_id": "raysubmit_1", "status": self.status,
                "entrypoint": job["entrypoint"], "message": self.message,
                "driver_exit_code": self.exit_code,
            })  # fmt: skip

        async def tail(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.send_str("job says hello\n")
            await ws.send_str("job says bye\n")
            await ws.close()
            return ws

        app.add_routes([
            web.get("/api/version", version), web.post("/api/jobs/", submit),
            web.get("/api/jobs/{id}", info), web.get("/api/jobs/{id}/logs/tail", tail),
        ])  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # pyright: ignore[reportOptionalMemberAccess, reportAttributeAccessIssue, reportPrivateUsage, reportUnknownMemberType, reportUnknownVariableType]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def test_submit_streams_the_job_logs_and_exits_with_its_outcome(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from maze_trainer import cli

    monkeypatch.setattr(cli, "_quiet_skyrl_logs", lambda: None)  # SkyRL's loguru, this process
    server = StandInJobServer("SUCCEEDED", "Job entrypoint command failed with exit code 2", 2)
    address = f"127.0.0.1:{server.port}"
    argv = ["--engine", "skyrl", "--submit", address, "mazes.train_size=64"]
    try:
        assert cli.main([*argv, "--dry-run"]) == 0
        dry = shlex.split(capsys.readouterr().out.strip().splitlines()[-1])
        outcomes: dict[str, tuple[int, str, str]] = {}
        for status in ("SUCCEEDED", "FAILED", "STOPPED"):
            server.status = status
            code = cli.main(argv)
            out, err = capsys.readouterr()
            outcomes[status] = (code, out, err)
    finally:
        server.close()
    # What reached the server is the job --dry-run prints as `ray job submit`.
    assert len(server.submitted) == 3
    for job in server.submitted:
        assert job["entrypoint"] == shlex.join(dry[dry.index("--") + 1 :])
        assert job["runtime_env"] == json.loads(dry[dry.index("--runtime-env-json") + 1])
    for status, (code, out, err) in outcomes.items():
        assert out.startswith(f"maze-train: submitted Ray job raysubmit_1 to http://{address};")
        assert "job says hello\njob says bye\n" in out
        if status == "SUCCEEDED":
            assert code == 0 and not err
            assert out.strip().endswith("maze-train: Ray job raysubmit_1 succeeded")
        else:
            assert code == 1
            assert err.strip() == (
                f"maze-train: Ray job raysubmit_1 {status.lower()} (exit code 2): Job entrypoint "
                "command failed with exit code 2"
            )
