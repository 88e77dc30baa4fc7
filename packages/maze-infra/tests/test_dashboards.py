"""Dashboards as code: the committed JSON is the generator's, every query parses, push works.

Push runs against a real HTTP server on 127.0.0.1 that answers the Grafana API routes
grafana-client calls (folders, ``POST /api/dashboards/db``), with a bearer-token check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from maze_infra import dashboards
from maze_infra.cli import main

REPO = Path(__file__).resolve().parents[3]
COMMITTED = REPO / "dashboards"
FILES = ("mazerl-training.json", "mazerl-serving.json", "mazerl-cluster.json")
TOKEN = "glsa_test-token"
# What Grafana substitutes for the template variables (job: the "All" value).
# grafana-client (the `grafana` extra) brings urllib3-future, which installs itself as `urllib3`;
# the workspace's dev environment leaves it out, so these run where the extra is installed (the
# package's own environment, e.g. tests/test_lowest_versions.py's).
HAS_GRAFANA_CLIENT = importlib.util.find_spec("grafana_client") is not None
needs_grafana_client = pytest.mark.skipif(
    not HAS_GRAFANA_CLIENT, reason="grafana-client (maze-infra[grafana]) is not installed"
)
VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$job": ".+"}


def _load(name: str) -> dict[str, Any]:
    return json.loads((COMMITTED / name).read_text())


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row, rows' own nested panels included."""
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        if p["type"] == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def _expand(expr: str) -> list[str]:
    """``expr`` with the template variables as Grafana sends them; one per vLLM prefix."""
    for k, v in VARIABLES.items():
        expr = expr.replace(k, v)
    if "${vllm_prefix}" in expr:
        return [expr.replace("${vllm_prefix}", p) for p in dashboards.VLLM_PREFIXES]
    return [expr]


def _metric_names(node: Any) -> set[str]:
    """Metric names a parsed PromQL expression selects (``__name__`` regexes as given)."""
    if node is None:
        return set()
    if hasattr(node, "matchers") and hasattr(node, "name"):
        names: set[str] = {node.name} if node.name else set()
        names |= {m.value for m in node.matchers.matchers if m.name == "__name__"}
        return names
    out: set[str] = set()
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        out |= _metric_names(getattr(node, attr, None))
    for arg in getattr(node, "args", None) or ():
        out |= _metric_names(arg)
    return out


# ---------------------------------------------------------------------------------- build


def test_committed_files_are_byte_identical_to_the_generator() -> None:
    generated = dashboards.generated_files()
    assert set(generated) >= set(FILES)
    for rel, text in generated.items():
        assert (COMMITTED / rel).read_bytes() == text.encode(), (
            f"{rel}: run maze-infra dashboards build"
        )
    # Stable: a second generation gives the same bytes (no ids, dict order or time in it).
    assert dashboards.generated_files() == generated
    assert main(["dashboards", "check", "--dir", str(COMMITTED)]) == 0


def test_build_then_check_and_check_names_a_changed_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 0
    for rel in dashboards.generated_files():
        assert (tmp_path / rel).is_file()
    assert main(["dashboards", "check", "--dir", str(tmp_path)]) == 0
    capsys.readouterr()
    edited = tmp_path / "mazerl-serving.json"
    edited.write_text(edited.read_text().replace("maze_serving_requests_total", "renamed"))
    (tmp_path / "provisioning/datasources/prometheus.yaml").unlink()
    assert main(["dashboards", "check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert f"{edited} is missing or differs" in err[0]
    assert "provisioning/datasources/prometheus.yaml is missing or differs" in err[1]


def test_without_the_sdk_build_is_exit_3_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # None in sys.modules makes an import fail as if the package were not installed.
    for mod in [m for m in sys.modules if m.split(".")[0] == "grafana_foundation_sdk"]:
        monkeypatch.setitem(sys.modules, mod, None)
    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "pip install 'maze-infra[dashboards]'" in err
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- the JSON


@pytest.mark.parametrize("name", FILES)
def test_every_panel_query_parses_and_uses_the_datasource_variable(name: str) -> None:
    dash = _load(name)
    assert "id" not in dash and dash["uid"] == name.removesuffix(".json")
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    panels = _panels(dash)
    assert len(panels) >= 8
    prefixes = {
        "mazerl-training.json": ("mazerl_",),
        "mazerl-serving.json": ("maze_serving_",),
        "mazerl-cluster.json": ("ray_node_", *dashboards.VLLM_PREFIXES),
    }[name]
    for panel in panels:
        where = f"{name}: panel {panel['title']!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        assert panel.get("description"), where
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", where
            for expr in _expand(target["expr"]):
                assert "$" not in expr, f"{where}: unsubstituted variable in {expr}"
                try:
                    parsed = promql_parser.parse(expr)
                except Exception as exc:  # the binding raises a bare exception type
                    pytest.fail(f"{where}: {expr!r} does not parse: {exc}")
                names = _metric_names(parsed)
                assert names, f"{where}: {expr} selects no metric"
                for metric in names:
                    assert metric.startswith(prefixes), f"{where}: {metric} in {expr}"
    for var in variables.values():
        if var["type"] == "query":  # label_values(<metric>, <label>)
            inner = var["query"].removeprefix("label_values(").rsplit(",", 1)[0]
            assert _metric_names(promql_parser.parse(inner)), var


def test_training_dashboard_covers_what_the_run_reports() -> None:
    exprs = " ".join(t["expr"] for p in _panels(_load(FILES[0])) for t in p["targets"])
    for metric in (
        "mazerl_reward_avg_raw_reward",
        "mazerl_eval_all_pass_at_1",
        "mazerl_reward_avg_pass_at_",
        "mazerl_policy_policy_kl",
        "mazerl_policy_policy_entropy",
        "mazerl_policy_grad_norm",
        "mazerl_timing_step",
        "mazerl_timing_generate",
        "mazerl_weight_sync_publish_s",
        "mazerl_weight_sync_handover_s",
        "mazerl_adapter_version",
        "mazerl_rollout_tokens_per_second",
        "time() - mazerl_checkpoint_last_saved_unixtime",
        "mazerl_checkpoint_resumes",
    ):
        assert metric in exprs, metric
    serving = " ".join(t["expr"] for p in _panels(_load(FILES[1])) for t in p["targets"])
    assert "histogram_quantile(0.99" in serving and 'status=~"[45].."' in serving
    assert "maze_serving_adapter_reloads_total" in serving


def test_provisioning_files_are_grafana_provisioning_yaml() -> None:
    provider = yaml.safe_load((COMMITTED / "provisioning/dashboards/mazerl.yaml").read_text())
    assert provider["apiVersion"] == 1
    (p,) = provider["providers"]
    assert p["type"] == "file" and p["options"]["path"].startswith("/")
    text = (COMMITTED / "provisioning/datasources/prometheus.yaml").read_text()
    assert "Placeholder" in text  # the URL is meant to be replaced, and says so
    source = yaml.safe_load(text)
    (ds,) = source["datasources"]
    assert ds["type"] == "prometheus" and ds["isDefault"] is True
    assert ds["url"].startswith("http")


# ----------------------------------------------------------------------------------- push


@dataclass
class FakeGrafana:
    """Grafana's folder and dashboard routes, in memory."""

    url: str = ""
    folders: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    saved: list[dict[str, Any]] = field(default_factory=list[dict[str, Any]])
    calls: list[str] = field(default_factory=list[str])
    refuse_dashboards: int | None = None
    """Answer POST /api/dashboards/db with this status (and Grafana's error body)."""


def _handler(state: FakeGrafana) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if self.headers.get("Authorization") == f"Bearer {TOKEN}":
                return True
            self._answer(401, {"message": "invalid API key", "traceID": ""})
            return False

        def do_GET(self) -> None:
            state.calls.append(f"GET {self.path}")
            if not self._authorized():
                return
            if self.path.split("?")[0] == "/api/folders":
                self._answer(200, state.folders)
            else:
                self._answer(404, {"message": "not found"})

        def do_POST(self) -> None:
            state.calls.append(f"POST {self.path}")
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if not self._authorized():
                return
            if self.path == "/api/folders":
                folder = {"id": len(state.folders) + 1, "uid": body["uid"], "title": body["title"]}
                state.folders.append(folder)
                self._answer(200, folder)
            elif self.path == "/api/dashboards/db":
                if state.refuse_dashboards is not None:
                    self._answer(
                        state.refuse_dashboards,
                        {"message": "The dashboard has been changed by someone else"},
                    )
                    return
                state.saved.append(body)
                uid = body["dashboard"]["uid"]
                self._answer(
                    200,
                    {"id": 7, "uid": uid, "url": f"/d/{uid}/x", "status": "success", "version": 1},
                )
            else:
                self._answer(404, {"message": "not found"})

    return Handler


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    state = FakeGrafana()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def _push(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``maze-infra dashboards push`` as a process: what a user sees, tracebacks included."""
    env = {**os.environ, "GRAFANA_URL": url, "GRAFANA_TOKEN": token}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "maze_infra.cli",
            "dashboards",
            "push",
            "--dir",
            str(COMMITTED),
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@needs_grafana_client
def test_push_creates_the_folder_and_overwrites_each_dashboard(
    grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GRAFANA_URL", grafana.url + "/")
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--dir", str(COMMITTED), "--folder", "ML Runs"]) == 0
    assert grafana.folders == [{"id": 1, "uid": "ml-runs", "title": "ML Runs"}]
    assert [s["dashboard"]["uid"] for s in grafana.saved] == [f[:-5] for f in FILES]
    for body, name in zip(grafana.saved, FILES, strict=True):
        assert body["overwrite"] is True and body["folderUid"] == "ml-runs"
        assert body["dashboard"] == {**_load(name), "id": None}
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"pushed mazerl / training: {grafana.url}/d/mazerl-training/x"
    assert len(out) == 3
    # Again: the folder is found by its title, not created twice; the dashboards overwritten.
    assert main(["dashboards", "push", "--dir", str(COMMITTED), "--folder", "ML Runs"]) == 0
    assert len(grafana.folders) == 1 and len(grafana.saved) == 6
    assert grafana.calls.count("POST /api/folders") == 1


@needs_grafana_client
def test_push_with_a_refused_token_is_exit_5_in_one_line(grafana: FakeGrafana) -> None:
    proc = _push(grafana.url, "glsa_wrong")
    assert proc.returncode == 5, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"maze-infra: Grafana at {grafana.url} refused the token (401)")
    assert grafana.saved == []


@needs_grafana_client
def test_push_to_a_closed_port_is_exit_4_in_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _push(f"http://127.0.0.1:{port}", TOKEN, "--timeout", "3")
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"maze-infra: cannot reach Grafana at http://127.0.0.1:{port}")


@needs_grafana_client
def test_push_refused_by_grafana_is_exit_1_and_missing_settings_are_named(
    grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    grafana.refuse_dashboards = 412
    monkeypatch.setenv("GRAFANA_URL", grafana.url)
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--dir", str(COMMITTED)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "refused saving dashboard 'mazerl-training' (412)" in line
    assert "changed by someone else" in line

    monkeypatch.delenv("GRAFANA_TOKEN")
    assert main(["dashboards", "push", "--dir", str(COMMITTED)]) == 5
    assert "GRAFANA_TOKEN is not set" in capsys.readouterr().err
    monkeypatch.delenv("GRAFANA_URL")
    assert main(["dashboards", "push", "--dir", str(COMMITTED)]) == 2
    assert "GRAFANA_URL" in capsys.readouterr().err


def test_push_of_a_directory_without_dashboards_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GRAFANA_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "mazerl-training.json" in err and "run maze-infra dashboards build" in err


@pytest.mark.skipif(HAS_GRAFANA_CLIENT, reason="grafana-client is installed here")
def test_push_without_grafana_client_is_exit_3_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GRAFANA_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--dir", str(COMMITTED)]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "pip install 'maze-infra[grafana]'" in line
