"""Training metrics to JSONL, TensorBoard and a Prometheus endpoint, under SkyRL's names.

Metric keys are SkyRL's (``reward/avg_raw_reward``, ``eval/all/pass_at_1``,
``policy/policy_loss``, ``timing/step``, ...) so dashboards and habits carry over between the
local engine and the cluster. On Prometheus a key becomes a gauge named ``mazerl_`` + the key
with every non-alphanumeric character replaced by ``_`` (``mazerl_reward_avg_raw_reward``),
plus ``mazerl_global_step``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

PROM_PREFIX = "mazerl_"


def mirror_metrics(mirror: Any) -> dict[str, float]:
    """A ``weight_sync.BackgroundMirror``'s counts as metrics; none without a mirror."""
    if mirror is None:
        return {}
    s = mirror.stats()
    return {
        "mirror/s3_uploaded": float(s.uploaded),
        "mirror/s3_failures": float(s.failures),
        "mirror/s3_pending": float(s.pending),
    }


def prometheus_name(key: str) -> str:
    """The Prometheus gauge name for metric ``key`` (see the module docs)."""
    return PROM_PREFIX + re.sub(r"[^a-zA-Z0-9]", "_", key)


class MetricsSink:
    """Fan one dict of scalars per step out to every configured backend."""

    def __init__(
        self,
        jsonl_path: Path | None = None,
        tensorboard_dir: Path | None = None,
        prometheus_port: int | None = None,
        prometheus_host: str = "127.0.0.1",
    ) -> None:
        self._jsonl = None
        if jsonl_path is not None:
            jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            self._jsonl = jsonl_path.open("a", encoding="utf-8")
        self._tb: Any = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(tensorboard_dir))
        self._registry: Any = None
        self._gauges: dict[str, Any] = {}
        self._server: Any = None
        self.prometheus_port: int | None = None
        if prometheus_port is not None:
            from prometheus_client import CollectorRegistry, start_http_server

            self._registry = CollectorRegistry()
            self._server, _thread = start_http_server(
                prometheus_port, addr=prometheus_host, registry=self._registry
            )
            self.prometheus_port = int(self._server.server_port)

    def _gauge(self, key: str) -> Any:
        gauge = self._gauges.get(key)
        if gauge is None:
            from prometheus_client import Gauge

            gauge = Gauge(prometheus_name(key), f"SkyRL metric {key}", registry=self._registry)
            self._gauges[key] = gauge
        return gauge

    def log(self, step: int, metrics: dict[str, float]) -> None:
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"global_step": step, **finite}) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in finite.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._registry is not None:
            self._gauge("global_step").set(step)
            for k, v in finite.items():
                self._gauge(k).set(v)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
