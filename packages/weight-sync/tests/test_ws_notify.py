from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from weight_sync import AdapterStore, NotifyError, PublishedVersion, Subscriber, notify_vllm
from weight_sync.synthetic import adapter_files, tiny


@dataclass
class FakeVllm:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=lambda: [])
    status: int = 200
    delay: float = 0.0


@pytest.fixture
def vllm() -> Iterator[FakeVllm]:
    """A real HTTP server on loopback that answers like vLLM's load_lora_adapter."""
    state = FakeVllm(url="")
    loaded: set[str] = set()
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(
                {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
            )
            if state.delay:
                release.wait(state.delay)
            if self.path != "/v1/load_lora_adapter":
                code, text = 404, "Not Found"
            elif state.status != 200:
                code, text = state.status, "engine error"
            elif body["lora_name"] in loaded and not body.get("load_inplace"):
                code, text = 400, f"The lora adapter '{body['lora_name']}' has already been loaded."
            else:
                loaded.add(body["lora_name"])
                code, text = 200, f"Success: LoRA adapter '{body['lora_name']}' added successfully."
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    release.set()
    server.shutdown()
    server.server_close()


def test_notify_posts_name_and_path(vllm: FakeVllm, store: AdapterStore):
    pv = store.publish(adapter_files(tiny(), seed=1))
    reply = notify_vllm(vllm.url, "policy-v1", pv.path, api_key="sk-test")
    assert "added successfully" in reply
    assert vllm.requests == [
        {
            "path": "/v1/load_lora_adapter",
            "body": {"lora_name": "policy-v1", "lora_path": str(pv.path)},
            "auth": "Bearer sk-test",
        }
    ]
    assert pv.path.is_absolute()


def test_notify_reports_server_errors(vllm: FakeVllm):
    notify_vllm(vllm.url + "/", "same", "/x")
    with pytest.raises(NotifyError, match=r"HTTP 400: The lora adapter 'same' has already"):
        notify_vllm(vllm.url, "same", "/x")
    assert "added" in notify_vllm(vllm.url, "same", "/x", load_inplace=True)
    assert vllm.requests[-1]["body"]["load_inplace"] is True
    vllm.status = 500
    with pytest.raises(NotifyError, match="HTTP 500: engine error"):
        notify_vllm(vllm.url, "other", "/x")


def test_notify_timeout_and_unreachable(vllm: FakeVllm):
    vllm.delay = 5.0
    with pytest.raises(NotifyError, match=r"timed out after 0\.3s"):
        notify_vllm(vllm.url, "slow", "/x", timeout=0.3)
    with pytest.raises(NotifyError, match=r"failed: .*refused"):
        notify_vllm("http://127.0.0.1:9", "x", "/x", timeout=2)
    with pytest.raises(NotifyError, match="lora_name must not be empty"):
        notify_vllm(vllm.url, "", "/x")


def test_subscriber_drives_vllm(vllm: FakeVllm, store: AdapterStore):
    stop = threading.Event()
    loaded: list[int] = []

    def load(pv: PublishedVersion) -> None:
        notify_vllm(vllm.url, f"policy-v{pv.version}", pv.path)
        loaded.append(pv.version)

    with Subscriber(store, poll_interval=0.05) as sub:
        thread = threading.Thread(
            target=sub.run, args=(load,), kwargs={"stop": stop, "max_versions": 2}
        )
        thread.start()
        store.publish(adapter_files(tiny(), seed=1))
        deadline = threading.Event()
        for _ in range(100):
            if loaded:
                break
            deadline.wait(0.05)
        store.publish(adapter_files(tiny(), seed=2))
        thread.join(timeout=20)
        stop.set()
    assert loaded == [1, 2]
    assert [r["body"]["lora_name"] for r in vllm.requests] == ["policy-v1", "policy-v2"]
    assert vllm.requests[1]["body"]["lora_path"] == str(store.version_path(2))
