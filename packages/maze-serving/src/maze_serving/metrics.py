"""Prometheus metrics of one server (own registry, so several apps can live in one process).

Names follow vLLM's (``num_requests_running``, ``prompt_tokens_total``, ``generation_tokens_total``,
``e2e_request_latency_seconds``, ``time_to_first_token_seconds``) under a ``maze_serving_``
prefix, so dashboards built for ``vllm:`` series map one to one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Where requests are generated. Their labelled series exist from the start, at zero, as vLLM
# creates its own up front: a series born at its first request has no earlier sample, so
# rate() misses the requests before its second scrape and histogram_quantile() answers NaN.
GENERATION_ENDPOINTS = ("/v1/chat/completions", "/invocations")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServingMetrics:
    """The server's Prometheus collectors, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "maze_serving_requests",
            "HTTP requests by endpoint and status code.",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "maze_serving_e2e_request_latency_seconds",
            "End-to-end latency of generation requests.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "maze_serving_time_to_first_token_seconds",
            "Time to the first streamed token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "maze_serving_prompt_tokens", "Prompt tokens processed.", ["model"], registry=r
        )
        self.generation_tokens = Counter(
            "maze_serving_generation_tokens", "Tokens generated.", ["model"], registry=r
        )
        self.batch_size = Histogram(
            "maze_serving_batch_size",
            "Requests generated together in one batched generate call.",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.requests_running = Gauge(
            "maze_serving_num_requests_running",
            "Admitted generation requests (running + queued).",
            registry=r,
        )
        self.active_adapter_version = Gauge(
            "maze_serving_active_adapter_version",
            "weight-sync version served as '<base>:latest' (-1: none yet).",
            registry=r,
        )
        self.active_adapter_version.set(-1)
        self.adapters_loaded = Gauge(
            "maze_serving_adapters_loaded", "LoRA adapters held in memory.", registry=r
        )
        self.requests_waiting = Gauge(
            "maze_serving_num_requests_waiting",
            "Admitted generation requests queued for the next batch (vLLM's num_requests_waiting).",
            registry=r,
        )
        # source: "watch" (a weight-sync version followed with --watch) or "in_place"
        # (SkyRL's /skyrl/v1/load_lora_adapter replacing an adapter under its name).
        self.adapter_reloads = Counter(
            "maze_serving_adapter_reloads",
            "Adapters reloaded and now served, by source.",
            ["source"],
            registry=r,
        )
        self.adapter_reload_failures = Counter(
            "maze_serving_adapter_reload_failures",
            "Adapter reloads refused or failed (the previous adapter keeps serving), by source.",
            ["source"],
            registry=r,
        )

        for endpoint in GENERATION_ENDPOINTS:
            self.latency.labels(endpoint)

    def count_model(self, model: str) -> None:
        """Start ``model``'s token series at zero (see ``GENERATION_ENDPOINTS``)."""
        self.prompt_tokens.labels(model)
        self.generation_tokens.labels(model)

    def render(self) -> bytes:
        return generate_latest(self.registry)
