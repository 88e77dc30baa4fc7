"""Every dashboard panel on this project's metrics returns data from a real Prometheus.

A real Prometheus (``rehearsal.prometheus``) scrapes, every second, a short real ``maze-train``
local run (two GRPO steps with checkpoints and evals, then a second process that resumes and
trains two more) and a real ``maze-serve`` of the run's base model, following the run's
weight-sync store, under a little load (concurrent and streamed requests, errors, in-place
reloads, one refused). Then each panel query of ``dashboards/mazerl-training.json`` and
``dashboards/mazerl-serving.json`` is evaluated through Prometheus' HTTP API with the template
variables as Grafana sends them: a metric renamed in the code without its panel fails here,
naming the panel and the query. The cluster dashboard's Ray and vLLM metrics are checked by
name: Ray's against the installed Ray's own definitions, vLLM's against the list vendored in
``tests/data/vllm_metrics.txt``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import rehearsal as rh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "dashboards"
VLLM_NAMES = Path(__file__).parent / "data" / "vllm_metrics.txt"
# What Grafana sends for the template variables; job is the "All" value.
VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$job": ".+"}
TRAIN = [
    "trainer.train_batch_size=2",
    "trainer.policy_mini_batch_size=2",
    "generator.n_samples_per_prompt=2",
    "generator.sampling_params.max_generate_length=8",
    "generator.max_turns=5",  # tiny-64's 4 moves + stop
    "trainer.ckpt_interval=1",
    "trainer.eval_interval=1",
    "trainer.eval_before_train=false",  # the base model is scored by the evals of each step
    "trainer.algorithm.use_kl_loss=true",  # KL is logged only with the KL loss, as in SkyRL
    "local.rollout_workers=0",
    "local.warm_start.steps=1",
    "local.warm_start.batch_size=1",
    "local.warm_start.warmup_steps=0",
    "local.warm_start.eval_mazes=1",
    "mazes.train_size=4",
    "local.progress=false",
    "local.tensorboard=false",
]


def _panels(name: str) -> list[dict[str, Any]]:
    dash = json.loads((DASHBOARDS / name).read_text())
    out: list[dict[str, Any]] = []
    for p in dash["panels"]:
        out += p.get("panels", []) if p["type"] == "row" else [p]
    return out


def _queries(name: str) -> list[tuple[str, str, str]]:
    """(panel title, expr as written, expr as Grafana sends it) of every target."""
    out: list[tuple[str, str, str]] = []
    for panel in _panels(name):
        for target in panel["targets"]:
            expr = target["expr"]
            sent = expr
            for k, v in VARIABLES.items():
                sent = sent.replace(k, v)
            out.append((panel["title"], expr, sent))
    return out


def _metric_names(node: Any) -> set[str]:
    if node is None:
        return set()
    if hasattr(node, "matchers") and hasattr(node, "name"):
        names: set[str] = {node.name} if node.name else set()
        return names | {m.value for m in node.matchers.matchers if m.name == "__name__"}
    out: set[str] = set()
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        out |= _metric_names(getattr(node, attr, None))
    for arg in getattr(node, "args", None) or ():
        out |= _metric_names(arg)
    return out


def _cluster_metrics(prefix: str) -> set[str]:
    names: set[str] = set()
    for _title, _expr, sent in _queries("mazerl-cluster.json"):
        names |= _metric_names(promql_parser.parse(sent.replace("${vllm_prefix}", prefix)))
    return names


# ------------------------------------------------------------------------- Ray and vLLM


def test_ray_panels_name_metrics_the_installed_ray_defines() -> None:
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    reporter = Path(spec.origin).parent / "dashboard" / "modules" / "reporter"
    # Ray's node metrics are Gauge("node_...") definitions, exported with Ray's ray_ prefix.
    defined = {
        "ray_" + m
        for f in reporter.glob("*.py")
        for m in re.findall(r'Gauge\(\s*"([a-z_]+)"', f.read_text())
    }
    assert "ray_node_cpu_utilization" in defined, reporter
    used = {m for m in _cluster_metrics("vllm:") if m.startswith("ray_")}
    assert len(used) >= 5
    assert used <= defined, (
        f"not defined by Ray {importlib.metadata.version('ray')}: {used - defined}"
    )


def test_vllm_panels_name_metrics_vllm_defines() -> None:
    series: set[str] = set()
    for line in VLLM_NAMES.read_text().splitlines():
        if line and not line.startswith("#"):
            name, kind = line.split()
            series |= (
                {f"{name}{s}" for s in ("_bucket", "_sum", "_count")}
                if kind == "histogram"
                else {name}
            )
    used = {m for m in _cluster_metrics("vllm:") if m.startswith("vllm:")}
    assert len(used) >= 6
    assert used <= series, f"not in vLLM's metrics ({VLLM_NAMES.name}): {used - series}"
    for expected in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert expected in used
    # The same panels under Ray: ':' becomes '_' and Ray adds its ray_ prefix.
    ray_used = {m for m in _cluster_metrics("ray_vllm_") if m.startswith("ray_vllm_")}
    assert ray_used == {"ray_" + m.replace(":", "_") for m in used}


# --------------------------------------------------------------------- the live check


def _need_prometheus() -> None:
    if shutil.which("prometheus") is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus is not installed (.ci/run installs Debian's package)")
        pytest.skip("needs Debian's prometheus package (apt-get install -y prometheus)")


def _write_datasets(run: Path) -> None:
    """Four training mazes and the first four of tiny-64 as the eval set (files the run uses
    as they are: no manifest), so that each eval of the run takes a second, not a minute."""
    from maze_env import MazeSpec, get_eval_set
    from maze_env.export import build_rows, write_rows
    from maze_env.render import Style

    style = Style(cell_px=32)
    es = get_eval_set("tiny-64")
    train = build_rows(MazeSpec.parse("5x5"), range(100, 104), split="train", slack=0, style=style)
    val = build_rows(es.spec, list(es.seeds[:4]), split="validation", slack=0, style=style)
    for row in train + val:
        row["reward_spec"] = {**row["reward_spec"], "spec": "task"}
    write_rows(train, run / "data" / "train.parquet")
    write_rows(val, run / "data" / "validation.parquet")


def _trainer(run: Path, port: int, steps: int, log: Path) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).with_name("maze-train")
    args = ["--config", "smoke_5x5", f"trainer.export_path={run}"]
    args += [f"trainer.max_training_steps={steps}"]
    args += [*TRAIN, f"local.prometheus_port={port}"]
    return subprocess.Popen(
        [str(exe), *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": ""},
    )


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    assert rc == 0, f"{proc.args}: exit {rc}\n{log.read_text()[-3000:]}"


def _wait_for_base_model(run: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the run has written its warm-started base model (its report comes last)."""
    report = run / "base_model" / "sft_report.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            json.loads(report.read_text())
            return
        time.sleep(0.5)
    raise AssertionError(
        f"no base model from the run (exit {proc.poll()}):\n{log.read_text()[-3000:]}"
    )


def _instant(prom: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
    answer = httpx.get(f"{prom}/api/v1/query", params=params, timeout=10).json()
    assert answer.get("status") == "success", f"{expr}: {answer}"
    return answer["data"]["result"]


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


def _last_scrape(prom: str, job: str) -> float:
    """Time of the last successful scrape of ``job`` (its samples all carry it)."""
    (series,) = _instant(prom, f'up{{job="{job}"}}[15m]')
    return max(float(t) for t, v in series["values"] if v == "1")


def _load(url: str, adapter: Path) -> None:
    """Concurrent, streamed and failing requests, an in-place reload and a refused one."""

    def chat(model: str, **kw: Any) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        return httpx.post(f"{url}/v1/chat/completions", json={**body, **kw}, timeout=120)

    with ThreadPoolExecutor(6) as pool:  # several at once: batched, some wait in the queue
        codes = [r.status_code for r in pool.map(chat, ["tiny"] * 6)]
    assert codes == [200] * 6
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200 and "data:" in r.read().decode()
    assert chat("tiny:no-such-adapter").status_code == 404
    assert chat("tiny", max_tokens=10**6).status_code == 400
    load = f"{url}/skyrl/v1/load_lora_adapter"
    ok = httpx.post(load, json={"lora_name": "policy", "lora_path": str(adapter)}, timeout=120)
    assert ok.status_code == 200, ok.text
    bad = httpx.post(load, json={"lora_name": "policy", "lora_path": "/nonexistent"}, timeout=60)
    assert bad.status_code >= 400
    assert chat("tiny:policy").status_code == 200


def test_every_project_panel_returns_data_from_a_real_run_and_server(tmp_path: Path) -> None:
    _need_prometheus()
    started = time.monotonic()
    phases: dict[str, float] = {}
    run = tmp_path / "run"
    _write_datasets(run)
    trainer_port, serve_port = rh.free_port(), rh.free_port()
    with rh.prometheus({"trainer": trainer_port, "serve": serve_port}, tmp_path) as prom:
        first = _trainer(run, trainer_port, 2, tmp_path / "train1.log")
        # The server starts as soon as the run's base model is written: it loads on the core
        # the run (one torch thread) leaves idle.
        _wait_for_base_model(run, first, tmp_path / "train1.log")
        serve_log = tmp_path / "serve.log"
        serve = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("maze-serve")),
                *("--model", str(run / "base_model"), "--served-model-name", "tiny"),
                *("--watch", str(run / "lora_sync"), "--port", str(serve_port), "--threads", "1"),
            ],
            stdout=serve_log.open("wb"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        second: subprocess.Popen[bytes] | None = None
        try:
            _finish(first, tmp_path / "train1.log")
            phases["first run"] = time.monotonic() - started
            # A copy the resumed run cannot replace while the server loads it.
            adapter = shutil.copytree(run / "final_adapter", tmp_path / "adapter")
            second = _trainer(run, trainer_port, 4, tmp_path / "train2.log")
            rh.wait_ready(f"http://127.0.0.1:{serve_port}")
            _finish(second, tmp_path / "train2.log")
            phases["train"] = time.monotonic() - started
            assert "resumed from" in (tmp_path / "train2.log").read_text()

            trained_at = _last_scrape(prom, "trainer")
            missing: list[str] = []
            checked = 0
            for title, expr, sent in _queries("mazerl-training.json"):
                checked += 1
                if not _finite(_instant(prom, sent, trained_at)):
                    missing.append(f"mazerl-training.json panel {title!r}: {expr} (sent: {sent})")
            (resumes,) = _instant(prom, "mazerl_checkpoint_resumes", trained_at)
            assert float(resumes["value"][1]) == 1.0

            # Right before the queries: rate() windows of 1 m must hold the load.
            _load(f"http://127.0.0.1:{serve_port}", adapter)
            phases["load"] = time.monotonic() - started
            pending = _queries("mazerl-serving.json")
            deadline = time.monotonic() + 45  # counters need two scrapes before rate() answers
            while pending and time.monotonic() < deadline:
                pending = [q for q in pending if not _finite(_instant(prom, q[2]))]
                if pending:
                    time.sleep(1)
            checked += len(_queries("mazerl-serving.json"))
            missing += [
                f"mazerl-serving.json panel {title!r}: {expr} (sent: {sent})"
                for title, expr, sent in pending
            ]
            assert not missing, "panels without data:\n" + "\n".join(missing)
            assert checked >= 30

            for metric, job in (
                ("mazerl_global_step", "trainer"),
                ("maze_serving_num_requests_running", "serve"),
            ):  # the job variable's label_values query
                values = httpx.get(
                    f"{prom}/api/v1/label/job/values", params={"match[]": metric}, timeout=10
                ).json()["data"]
                assert job in values, (metric, values)
        finally:
            for proc in (serve, first, second):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=30)
    phases["queries"] = time.monotonic() - started
    print(
        "dashboards against Prometheus, s since start:", {k: round(v, 1) for k, v in phases.items()}
    )
