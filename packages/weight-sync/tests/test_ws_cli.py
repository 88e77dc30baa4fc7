"""The ``weight-sync`` console script, run as a real process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from weight_sync import AdapterStore
from weight_sync.synthetic import adapter_files, tiny

BENCH = Path(__file__).parents[1] / "benchmarks" / "bench_publish.py"


def _exe() -> list[str]:
    script = Path(sys.executable).parent / "weight-sync"
    if script.exists():
        return [str(script)]
    found = shutil.which("weight-sync")
    return [found] if found else [sys.executable, "-m", "weight_sync.cli"]


def ws(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_exe(), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _one_line_error(res: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert res.returncode == code, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("weight-sync: error: ")
    assert fragment in lines[0]


def test_publish_latest_verify_gc(tmp_path: Path, adapter_dir: Path):
    root = str(tmp_path / "root")
    res = ws("publish", str(adapter_dir), "--root", root, "--version", "3", "--step", "30")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("published version 3 (step 30,")
    res = ws("publish", str(adapter_dir), "--root", root, "--json", "--keep", "1")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["version"] == 4
    assert set(doc["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert AdapterStore(root).versions() == [4]

    res = ws("latest", "--root", root, "--json")
    assert res.returncode == 0
    assert json.loads(res.stdout)["path"].endswith("versions/v000000004")
    res = ws("verify", "--root", root)
    assert res.stdout.strip() == "ok version 4: 2 files verified"
    ws("publish", str(adapter_dir), "--root", root)
    res = ws("verify", "--root", root, "--all")
    assert res.stdout.count("ok version") == 2
    res = ws("gc", "--root", root, "--keep", "1")
    assert res.returncode == 0
    assert res.stdout.startswith("kept [5], removed [4]")


def test_bad_input_exits_with_one_line_errors(tmp_path: Path, adapter_dir: Path):
    root = str(tmp_path / "root")
    _one_line_error(ws("latest", "--root", root), 1, "nothing published yet")
    _one_line_error(ws("publish", str(tmp_path / "missing"), "--root", root), 1, "not a directory")
    assert ws("publish", str(adapter_dir), "--root", root, "--version", "5").returncode == 0
    _one_line_error(
        ws("publish", str(adapter_dir), "--root", root, "--version", "2"),
        1,
        "cannot publish version 2; latest is 5",
    )
    weights = Path(root) / "versions" / "v000000005" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[::-1])
    _one_line_error(ws("verify", "--root", root, "5"), 1, "does not match the manifest")
    _one_line_error(ws("latest", "--root", root), 1, "does not match the manifest")
    _one_line_error(ws("verify", "--root", root, "9"), 1, "version 9 is not published")
    _one_line_error(ws("gc", "--root", root, "--keep", "0"), 2, "keep must be >= 1")
    (Path(root) / "latest").write_text("garbage")
    _one_line_error(ws("publish", str(adapter_dir), "--root", root), 1, "latest: not valid JSON")
    assert ws("publish").returncode == 2  # argparse usage error


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_watch_loads_new_versions_into_vllm(
    tmp_path: Path, recorder: tuple[str, list[dict[str, Any]]]
):
    url, seen = recorder
    store = AdapterStore(tmp_path / "root")
    store.publish(adapter_files(tiny(), seed=1))
    proc = subprocess.Popen(
        [
            *_exe(),
            "watch",
            "--root",
            str(store.root),
            "--after",
            "1",
            "--count",
            "2",
            "--vllm-url",
            url,
            "--lora-name",
            "policy-v{version}",
            "--poll-interval",
            "0.05",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    store.publish(adapter_files(tiny(), seed=2))
    first = json.loads(proc.stdout.readline())
    assert first["version"] == 2
    assert proc.stdout.readline().startswith("loaded 'policy-v2'")
    store.publish(adapter_files(tiny(), seed=3))
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "loaded 'policy-v3'" in out
    assert seen == [
        {"lora_name": "policy-v2", "lora_path": str(store.version_path(2))},
        {"lora_name": "policy-v3", "lora_path": str(store.version_path(3))},
    ]


def test_watch_reports_unreachable_server(tmp_path: Path):
    store = AdapterStore(tmp_path / "root")
    store.publish(adapter_files(tiny(), seed=1))
    res = ws(
        "watch",
        "--root",
        str(store.root),
        "--vllm-url",
        "http://127.0.0.1:9",
        "--lora-name",
        "p",
        "--idle-timeout",
        "5",
    )
    _one_line_error(res, 1, "load_lora_adapter for 'p' failed")
    _one_line_error(ws("watch", "--root", str(store.root), "--lora-name", "p"), 1, "go together")


def test_bench_script_runs_small(tmp_path: Path):
    res = subprocess.run(
        [sys.executable, str(BENCH), "--dir", str(tmp_path), "--rank", "1", "--rounds", "1",
         "--latency-samples", "2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    for needle in (
        "plain copy + fsync",
        "ratio publish xxh3-128 / (copy + fsync)",
        "inotify: notice",
        "ratio hand-over / plain read",
    ):
        assert needle in res.stdout
    assert list(tmp_path.iterdir()) == []  # the work dir is cleaned up
