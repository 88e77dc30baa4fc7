"""Hot reload from a weight-sync store (in-flight requests survive) and adapters from S3 (moto)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from weight_sync import AdapterStore

BASE = "tiny"
ServerFactory = Callable[..., AbstractContextManager[str]]


def logprobs(url: str, model: str, messages: list[dict[str, Any]]) -> list[float]:
    body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0}
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={**body, "logprobs": True, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def wait_version(url: str, version: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while metric(url, "maze_serving_active_adapter_version") != version:
        assert time.monotonic() < deadline, f"version {version} never became active"
        time.sleep(0.05)


def test_hot_reload_keeps_in_flight_requests(
    start_server: ServerFactory,
    adapters: list[Path],
    tmp_path: Path,
    maze_messages: list[dict[str, Any]],
) -> None:
    store = AdapterStore(tmp_path / "sync", durable=False)
    with start_server(watch_dir=str(store.root), watch_poll_s=0.1) as url:
        models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert models == [BASE]  # nothing published yet
        store.publish(adapters[0], step=10)
        wait_version(url, 1)
        models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert models == [BASE, f"{BASE}:latest", f"{BASE}:v1"]
        v1 = logprobs(url, f"{BASE}:latest", maze_messages)
        assert v1 == logprobs(url, f"{BASE}:v1", maze_messages)

        # A long streamed request on `latest` (= v1) is in flight when v2 is published.
        started = threading.Event()
        result: dict[str, Any] = {}

        def long_request() -> None:
            body: dict[str, Any] = {"model": f"{BASE}:latest", "messages": maze_messages}
            body["stream"] = True
            body.update(max_tokens=300, ignore_eos=True, stream_options={"include_usage": True})
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
                result["status"] = r.status_code
                events = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()
                result["events"] = events

        t = threading.Thread(target=long_request)
        t.start()
        assert started.wait(30)
        store.publish(adapters[1], step=20)
        t.join(120)
        assert result["status"] == 200 and result["events"][-1] == "[DONE]"
        chunks = [json.loads(e) for e in result["events"][:-1]]
        assert "error" not in chunks[-1] and chunks[-1]["usage"]["completion_tokens"] == 300
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"

        wait_version(url, 2)
        models = [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
        assert models == [BASE, f"{BASE}:latest", f"{BASE}:v2"]  # v1 unloaded once idle
        v2 = logprobs(url, f"{BASE}:latest", maze_messages)
        assert v2 != v1
        r = httpx.post(
            f"{url}/v1/load_lora_adapter", json={"lora_name": "ref2", "lora_path": str(adapters[1])}
        )
        assert r.status_code == 200
        assert logprobs(url, f"{BASE}:ref2", maze_messages) == v2
        gone = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": f"{BASE}:v1", "messages": maze_messages, "max_tokens": 2},
        )
        assert gone.status_code == 404
        assert metric(url, "maze_serving_adapters_loaded") == 2  # v2 and ref2


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    client: Any = boto3.client("s3")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    client.create_bucket(Bucket="models")
    yield client
    server.stop()


def test_adapter_from_s3_prefix(
    moto_s3: Any, server: str, adapters: list[Path], maze_messages: list[dict[str, Any]]
) -> None:
    for f in adapters[0].iterdir():
        moto_s3.upload_file(str(f), "models", f"runs/r1/step_20/{f.name}")
    r = httpx.post(
        f"{server}/v1/load_lora_adapter",
        json={"lora_name": "s3a", "lora_path": "s3://models/runs/r1/step_20"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{server}/v1/load_lora_adapter",
        json={"lora_name": "local", "lora_path": str(adapters[0])},
    )
    assert r.status_code == 200
    assert logprobs(server, f"{BASE}:s3a", maze_messages) == logprobs(
        server, f"{BASE}:local", maze_messages
    )
    missing = httpx.post(
        f"{server}/v1/load_lora_adapter",
        json={"lora_name": "s3b", "lora_path": "s3://models/runs/none"},
        timeout=60,
    )
    assert missing.status_code == 404 and "no objects" in missing.json()["error"]["message"]
    no_bucket = httpx.post(
        f"{server}/v1/load_lora_adapter",
        json={"lora_name": "s3c", "lora_path": "s3://no-such-bucket/x"},
        timeout=60,
    )
    assert no_bucket.status_code == 404


def test_adapter_from_s3_weight_sync_mirror(
    moto_s3: Any, server: str, adapters: list[Path], tmp_path: Path
) -> None:
    from weight_sync import S3Mirror

    store = AdapterStore(tmp_path / "sync", durable=False)
    pv = store.publish(adapters[1], step=5)
    S3Mirror("models", "mirror", moto_s3).upload(pv)
    r = httpx.post(
        f"{server}/v1/load_lora_adapter",
        json={"lora_name": "mirrored", "lora_path": "s3://models/mirror"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert f"{BASE}:mirrored" in [m["id"] for m in httpx.get(f"{server}/v1/models").json()["data"]]


def test_downloads_go_to_a_temp_dir_removed_at_shutdown(
    moto_s3: Any,
    start_server: ServerFactory,
    adapters: list[Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for f in adapters[0].iterdir():
        moto_s3.upload_file(str(f), "models", f"runs/r2/{f.name}")
    with start_server() as url:
        assert list(tmp_path.iterdir()) == []  # nothing downloaded yet, nothing made
        r = httpx.post(
            f"{url}/v1/load_lora_adapter",
            json={"lora_name": "s3", "lora_path": "s3://models/runs/r2"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        (made,) = tmp_path.iterdir()
        assert made.name.startswith("maze-serve-")
        assert any(p.name == "adapter_model.safetensors" for p in made.rglob("*"))
    assert list(tmp_path.iterdir()) == []  # removed when the server stopped
