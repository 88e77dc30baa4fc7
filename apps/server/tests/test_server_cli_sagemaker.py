"""``maze-serve`` as a real process: SageMaker ``serve`` (model + S3 adapter via moto) and CLI mode."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from maze_policy.model import build_tiny_vlm, load_vlm
from maze_serving.server import free_port

TARGETS = r".*language_model.*\.(q_proj|v_proj)"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("m") / "tiny", seed=0)


@pytest.fixture(scope="module")
def adapter(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from peft import LoraConfig, get_peft_model

    model, _ = load_vlm(tiny)
    torch.manual_seed(1)
    cfg = LoraConfig(r=4, lora_alpha=64, target_modules=TARGETS, init_lora_weights=False)
    peft_model: Any = get_peft_model(model, cfg)  # pyright: ignore[reportArgumentType]
    out = tmp_path_factory.mktemp("a") / "adapter"
    peft_model.save_pretrained(str(out))
    return out


@pytest.fixture
def moto_env() -> Iterator[dict[str, str]]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    boto3.client("s3").create_bucket(Bucket="sm-models")
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def start(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "maze_server", *args, "--host", "127.0.0.1", "--port", str(port)],
        env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_port(proc: subprocess.Popen[bytes], url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            httpx.get(f"{url}/ping", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise TimeoutError(url)


def check_ping(ping: httpx.Response) -> str:
    """The SageMaker contract: 200 only when ready, else 503 + Retry-After; returns the status."""
    status = str(ping.json()["status"])
    if status == "ready":
        assert ping.status_code == 200, ping.text
    else:
        assert status in ("starting", "loading"), ping.text
        assert ping.status_code == 503 and int(ping.headers["retry-after"]) >= 1
    return status


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while check_ping(httpx.get(f"{url}/ping")) != "ready":
        assert time.monotonic() < deadline
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def test_sagemaker_serve_with_adapter_from_s3(
    tiny: Path, adapter: Path, moto_env: dict[str, str]
) -> None:
    import boto3

    s3: Any = boto3.client("s3")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    for f in adapter.iterdir():
        s3.upload_file(str(f), "sm-models", f"adapters/run1/{f.name}")
    env = {**moto_env, "SM_MODEL_DIR": str(tiny), "MAZE_ADAPTER": "s3://sm-models/adapters/run1"}
    proc, url = start(["serve"], env)
    try:
        wait_port(proc, url)
        t0 = time.monotonic()
        ping = httpx.get(f"{url}/ping", timeout=2)
        assert time.monotonic() - t0 < 2
        check_ping(ping)
        wait_ready(url)
        models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert models == ["tiny", "tiny:adapter"]
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
        inv = httpx.post(f"{url}/invocations", json={**body, "logprobs": True}, timeout=60)
        assert inv.status_code == 200, inv.text
        assert inv.json()["model"] == "tiny:adapter"  # the packaged adapter is the default
        base = httpx.post(f"{url}/invocations", json={**body, "model": "tiny", "logprobs": True})
        lp = [
            [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]
            for r in (inv, base)
        ]
        assert lp[0] != lp[1]
    finally:
        stop(proc)


def test_ping_is_503_while_torch_imports_then_the_app_takes_the_same_port(tiny: Path) -> None:
    """The port opens before the heavy imports: the early responder answers /ping and every
    other route 503 + Retry-After, then the real app on the same socket: 503 while loading,
    200 once ready; no connection is refused in between."""
    proc, url = start(["serve"], {"SM_MODEL_DIR": str(tiny)})
    try:
        wait_port(proc, url)
        seen: list[str] = []
        refused_during_handover = 0
        early_503s = 0
        deadline = time.monotonic() + 120

        def ping_status() -> str | None:
            nonlocal refused_during_handover
            try:
                ping = httpx.get(f"{url}/ping", timeout=2)
            except httpx.TransportError:
                refused_during_handover += 1
                return None
            return check_ping(ping)

        while not seen or seen[-1] != "ready":
            assert time.monotonic() < deadline, seen
            status = ping_status()
            if status is None:
                continue
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == "starting":
                early = httpx.post(f"{url}/invocations", json={"messages": []}, timeout=2)
                # Only the early responder says "starting", and the handover is one-way: a
                # "starting" ping after this request means the early responder answered it.
                if ping_status() == "starting":
                    assert early.status_code == 503 and early.headers["retry-after"] == "5"
                    assert early.json()["error"]["code"] == 503
                    early_503s += 1
            time.sleep(0.02)
        # torch takes seconds to import, so the early responder is always seen first.
        assert seen[0] == "starting" and seen[-1] == "ready", seen
        assert early_503s > 0
        assert refused_during_handover == 0
        assert set(seen) <= {"starting", "loading", "ready"}
        assert httpx.get(f"{url}/health").status_code == 200
    finally:
        stop(proc)


def test_port_in_use_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from maze_server.cli import main

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert main(["--model", "m", "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_cli_mode_with_lora_modules(tiny: Path, adapter: Path) -> None:
    from maze_server.cli import build
    from maze_serving.server import serve_in_thread

    launch = build(
        ["--model", str(tiny), "--served-model-name", "maze", "--lora-modules", f"a={adapter}"]
    )
    assert (launch.host, launch.port) == ("127.0.0.1", 8000)
    with serve_in_thread(launch.app, wait_model=True) as url:
        models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert models == ["maze", "maze:a"]
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "maze:a",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["model"] == "maze:a"


def test_serve_defaults_follow_the_sagemaker_contract(
    tiny: Path, adapter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from maze_server.cli import build

    monkeypatch.setenv("SM_MODEL_DIR", str(adapter))
    monkeypatch.setenv("MAZE_BASE_MODEL", str(tiny))
    launch = build(["serve"])
    assert (launch.host, launch.port) == ("0.0.0.0", 8080)
    engine = launch.app.state.engine
    assert engine.config.model_path == str(tiny) and engine.base_name == "tiny"
    assert engine.config.adapters == {"adapter": str(adapter)}
    assert engine.config.default_adapter == "adapter"


def test_batching_flags(tiny: Path) -> None:
    from maze_server.cli import build

    def config(*flags: str) -> Any:
        return build(["--model", str(tiny), *flags]).app.state.engine.config

    on = config()
    assert (on.batch_max_size, on.batch_wait_ms) == (8, 100.0)  # on by default
    assert config("--no-batching").batch_max_size == 1
    custom = config("--batch-max-size", "4", "--batch-wait-ms", "0")
    assert (custom.batch_max_size, custom.batch_wait_ms) == (4, 0.0)


def test_context_flag_and_env(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from maze_server.cli import build

    def context(*flags: str) -> str:
        return build(["--model", str(tiny), *flags]).app.state.engine.config.context

    monkeypatch.delenv("MAZE_CONTEXT", raising=False)
    assert context() == "full"
    assert context("--context", "latest") == "latest"
    assert context("--context", "route") == "route"
    monkeypatch.setenv("MAZE_CONTEXT", "recent")
    assert context() == "recent" and context("--context", "full") == "full"


def test_the_context_comes_from_the_adapters_unless_given(
    tiny: Path,
    adapter: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import shutil

    from maze_policy.contexts import CONTEXT_FILE, write_context
    from maze_server.cli import main, resolve

    monkeypatch.delenv("MAZE_CONTEXT", raising=False)
    route, full = tmp_path / "route", tmp_path / "full"
    for path, trained in ((route, "route"), (full, "full")):
        shutil.copytree(adapter, path)
        write_context(path, trained)

    def context(*flags: str) -> str:
        return resolve(["--model", str(tiny), *flags]).context

    assert context("--lora-modules", f"r={route}", f"plain={adapter}") == "route"
    assert capsys.readouterr().err == ""
    # An explicit choice wins, and an adapter trained otherwise is named.
    assert context("--lora-modules", f"r={route}", "--context", "full") == "full"
    assert "adapter r was trained in context 'route'" in capsys.readouterr().err
    # One server answers in one context: two adapters that disagree need a choice.
    assert main(["--model", str(tiny), "--lora-modules", f"r={route}", f"f={full}"]) == 2
    err = capsys.readouterr().err
    assert "trained in different contexts (f: full, r: route)" in err
    assert context("--lora-modules", f"r={route}", f"f={full}", "--context", "route") == "route"
    (route / CONTEXT_FILE).write_text('{"context": "window"}')
    assert main(["--model", str(tiny), "--lora-modules", f"r={route}"]) == 2
    assert f"{route / CONTEXT_FILE}: not a context record" in capsys.readouterr().err


def test_cli_usage_errors(
    adapter: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from maze_server.cli import main

    monkeypatch.delenv("MAZE_BASE_MODEL", raising=False)
    cases: tuple[tuple[list[str], str], ...] = (
        ([], "--model is required"),
        (["--model", "m", "--lora-modules", "x"], "NAME=PATH"),
        (["--model", str(adapter)], "MAZE_BASE_MODEL"),
        (["--model", "m", "--batch-max-size", "0"], "--batch-max-size"),
        (["--model", "m", "--context", "window"], "context must be one of full, latest, recent"),
    )
    for args, needle in cases:
        assert main(args) == 2
        assert needle in capsys.readouterr().err


def test_settings_resolve_without_the_heavy_imports(tiny: Path) -> None:
    """``resolve`` runs before the port opens: it must not import torch, the engine or the maze
    env (their imports take the seconds the early responder exists to cover)."""
    code = (
        "import sys\n"
        "from maze_server.cli import resolve\n"
        f"assert resolve(['--model', {str(tiny)!r}, '--context', 'latest']).context == 'latest'\n"
        "heavy = ('torch', 'transformers', 'maze_env', 'maze_serving.engine', 'PIL')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
