"""Series a dashboard queries exist, at zero, before the first request."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from maze_serving.engine import EngineConfig, ServingEngine
from maze_serving.metrics import GENERATION_ENDPOINTS, ServingMetrics


def _samples(metrics: ServingMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_latency_series_of_every_generation_endpoint_start_at_zero() -> None:
    """Born at its first request, a histogram has no earlier sample to rate() against: a burst
    of requests between two scrapes would leave every latency quantile NaN."""
    samples = _samples(ServingMetrics())
    for endpoint in GENERATION_ENDPOINTS:
        key = (("endpoint", endpoint),)
        assert samples[("maze_serving_e2e_request_latency_seconds_count", key)] == 0
        inf = (("endpoint", endpoint), ("le", "+Inf"))
        assert samples[("maze_serving_e2e_request_latency_seconds_bucket", inf)] == 0


def test_token_series_of_the_served_model_start_at_zero() -> None:
    engine = ServingEngine(EngineConfig(model_path="/models/tiny-vlm", served_model_name="tiny"))
    try:
        samples = _samples(engine.metrics)
        for name in ("maze_serving_prompt_tokens_total", "maze_serving_generation_tokens_total"):
            assert samples[(name, (("model", "tiny"),))] == 0
        assert not any(labels == (("model", "tiny-vlm"),) for _, labels in samples)
    finally:
        engine.close()
