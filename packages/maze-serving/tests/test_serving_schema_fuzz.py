"""Schemathesis over the live server's own /openapi.json: no input produces a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from maze_serving.app import create_app
from maze_serving.engine import EngineConfig
from maze_serving.server import serve_in_thread


@pytest.fixture(scope="module")
def fuzz_url(tiny_vlm_dir: Path) -> Iterator[str]:
    # Small generation limits keep each accepted chat request to milliseconds.
    config = EngineConfig(
        model_path=str(tiny_vlm_dir),
        served_model_name="tiny",
        max_new_tokens_limit=4,
        default_max_tokens=2,
        request_timeout_s=20,
        max_pending=64,
    )
    app = create_app(config, max_body_bytes=1 << 20)
    with serve_in_thread(app, wait_model=True) as url:
        yield url


EXAMPLES_PER_MODE = 12


@pytest.mark.slow
def test_no_server_errors(fuzz_url: str) -> None:
    schema: Any = schemathesis.openapi.from_url(f"{fuzz_url}/openapi.json")
    calls: list[tuple[str, int]] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 9  # every route is in the schema and gets fuzzed
    for op in operations:
        modes = list(schemathesis.GenerationMode)
        if op.method.upper() == "GET":  # no parameters: nothing to make invalid
            modes = [schemathesis.GenerationMode.POSITIVE]
        for mode in modes:

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES_PER_MODE,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),  # pyright: ignore[reportArgumentType]
            )
            def check(case: Any) -> None:
                response = case.call(timeout=30)
                calls.append((f"{case.method} {case.path}", response.status_code))
                assert response.status_code < 500, (
                    f"{case.method} {case.path} -> {response.status_code}: "
                    f"{response.text[:500]}\nbody: {str(case.body)[:500]}"
                )

            check()
    statuses = {code for _, code in calls}
    assert len(calls) >= 4 * EXAMPLES_PER_MODE and 200 in statuses and 400 in statuses
