import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maze_env import get_eval_set
from maze_evaluation import (
    EndpointBackend,
    EndpointError,
    EvalRecord,
    ResultsFileError,
    chat_url,
    evaluate,
    sampling_params,
    summarize,
)
from maze_evaluation.testing import ScriptedServer
from maze_policy.sampling import SamplingParams

SET = "small-64"
N = 6


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv


def run(url: str, model: str, **kw: Any) -> tuple[EndpointBackend, list[EvalRecord]]:
    backend_kw = {k: kw.pop(k) for k in ("retries", "concurrency", "timeout") if k in kw}
    backend = EndpointBackend(url, model, backoff=0.01, **backend_kw)
    return backend, evaluate(backend, eval_set=SET, limit=N, progress=False, **kw)


def test_oracle_solves_every_maze_optimally(server: ScriptedServer) -> None:
    _, recs = run(server.url, "oracle")
    mazes = get_eval_set(SET).mazes[:N]
    assert [r.seed for r in recs] == list(get_eval_set(SET).seeds[:N])
    for r, maze in zip(recs, mazes, strict=True):
        assert r.solved and r.failure == "solved" and r.reward == 1.0
        assert r.moves == r.optimal_moves == maze.optimal_moves
        assert r.path == [list(p) for p in maze.shortest_path]
        assert r.turns == maze.optimal_moves + 1
        assert r.bumps == r.loops == r.parse_failures == 0
        assert r.backend == "endpoint" and r.model.endswith("#oracle")
    s = summarize(recs)
    assert s.solve_rate == 1.0 and s.ci95[1] == 1.0 and s.failures["solved"] == N


@pytest.mark.parametrize(
    ("policy", "kind", "counter"),
    [
        ("bumper", "out_of_budget", "bumps"),
        ("garbage", "out_of_budget", "parse_failures"),
        ("stopper", "wrong_stop", None),
        ("looper", "out_of_budget", "loops"),
    ],
)
def test_bad_policies_fail_with_the_right_kind(
    server: ScriptedServer, policy: str, kind: str, counter: str | None
) -> None:
    _, recs = run(server.url, policy)
    s = summarize(recs)
    assert s.solve_rate == 0.0 and s.failures[kind] == N
    for r in recs:
        assert not r.solved and r.reward == 0.0 and r.failure == kind
        if kind == "out_of_budget":
            assert r.turns == r.step_budget
        if counter == "bumps":
            assert r.bumps == r.turns and r.moves == 0
        if counter == "parse_failures":
            assert r.parse_failures == r.turns and r.parse_failure_codes
            assert s.episodes_with_parse_failures == N
        if counter == "loops":
            # Back and forth: every move after the first returns to a visited square.
            assert r.loops == r.moves - 1 and r.moves == r.turns
        if kind == "wrong_stop":
            assert r.turns == 1 and r.path == [r.path[0]]


def test_requests_carry_the_conversation_with_images() -> None:
    with ScriptedServer() as srv:
        _, recs = run(srv.url, "oracle", samples=1)
        bodies = srv.bodies
    turns = sum(r.turns for r in recs)
    assert len(bodies) == turns
    longest = max(bodies, key=lambda b: len(b["messages"]))
    roles = [m["role"] for m in longest["messages"]]
    assert roles[0] == "system" and roles[1] == "user" and roles[2] == "assistant"
    images = [
        p["image_url"]["url"]
        for m in longest["messages"]
        if isinstance(m["content"], list)
        for p in m["content"]
        if p["type"] == "image_url"
    ]
    assert len(images) == roles.count("user") and all(
        u.startswith("data:image/png;base64,") for u in images
    )
    assert all(b["temperature"] == 0.0 and "seed" not in b for b in bodies)


@pytest.mark.parametrize("context", ["latest", "recent"])
def test_a_per_turn_context_sends_each_turn_as_the_policy_was_trained(
    context: str, tmp_path: Path
) -> None:
    out = tmp_path / "r.jsonl"
    with ScriptedServer() as srv:
        backend = EndpointBackend(srv.url, "oracle", context=context)
        recs = evaluate(backend, eval_set=SET, limit=N, out=out, progress=False)
        bodies = srv.bodies
    assert all(r.solved for r in recs) and len(bodies) == sum(r.turns for r in recs)
    assert all(r.extra == {"context": context} for r in recs)
    expect = ["system", "assistant", "user"] if context == "recent" else ["system", "user"]
    # Every turn after the first is one frame (and the previous reply), never the history.
    firsts = [b for b in bodies if "Here is a" in json.dumps(b["messages"])]
    assert len(firsts) == N and all(len(b["messages"]) == 2 for b in firsts)
    rest = [b for b in bodies if b not in firsts]
    assert len(rest) == len(bodies) - N > 0
    assert all([m["role"] for m in b["messages"]] == expect for b in rest)
    # A results file keeps one context: resuming it in another is refused, not mixed.
    with (
        ScriptedServer() as srv,
        pytest.raises(ResultsFileError, match=f"'{context}'.*resume with the same"),
    ):
        evaluate(
            EndpointBackend(srv.url, "oracle"), eval_set=SET, out=out, resume=True, progress=False
        )
    with pytest.raises(ValueError, match="context must be one of full, latest, recent"):
        EndpointBackend("http://127.0.0.1:1", "oracle", context="window")


def test_the_route_context_sends_each_frame_with_the_route_question(tmp_path: Path) -> None:
    from maze_policy.contexts import ROUTE_QUESTION

    with ScriptedServer() as srv:
        backend = EndpointBackend(srv.url, "oracle", context="route")
        recs = evaluate(backend, eval_set=SET, limit=N, out=tmp_path / "r.jsonl", progress=False)
        bodies = srv.bodies
    # The scripted oracle reads the maze from the frame alone, so it still solves every maze.
    assert all(r.solved for r in recs) and len(bodies) == sum(r.turns for r in recs) > N
    assert all(r.extra == {"context": "route"} for r in recs)
    for b in bodies:  # the opening too: one user message, its frame, then the question
        [message] = b["messages"]
        assert message["role"] == "user"
        assert [p["type"] for p in message["content"]] == ["image_url", "text"]
        assert message["content"][1]["text"] == ROUTE_QUESTION


def test_samples_use_temperature_and_distinct_seeds(server: ScriptedServer) -> None:
    with ScriptedServer() as srv:
        _, recs = run(srv.url, "oracle", samples=2)
        bodies = srv.bodies
    assert len(recs) == 2 * N and {r.sample for r in recs} == {0, 1}
    assert all(b["temperature"] == 1.0 for b in bodies)
    assert len({b["seed"] for b in bodies}) == 2 * N
    s = summarize(recs)
    assert s.samples == 2 and s.pass_at == {"1": 1.0, "2": 1.0}


def test_retries_ride_over_injected_429_and_5xx() -> None:
    with ScriptedServer(faults=[429, 500, 503, 502]) as srv:
        backend, recs = run(srv.url, "oracle", concurrency=2)
        assert all(r.solved for r in recs)
        assert srv.requests == sum(r.turns for r in recs) + 4
    assert backend.retried == 4


def test_retries_exhausted_is_a_clear_error(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    with (
        ScriptedServer(faults=[500] * 50) as srv,
        pytest.raises(EndpointError, match=r"failed after 3 attempts; last error: HTTP 500"),
    ):
        run(srv.url, "oracle", retries=2, out=out)


def test_refused_request_is_not_retried(server: ScriptedServer) -> None:
    with pytest.raises(EndpointError, match="refused the request: HTTP 400"):
        run(server.url, "no-such-policy")


def test_unreachable_endpoint_fails_after_retries() -> None:
    with ScriptedServer() as srv:
        url = srv.url
    with pytest.raises(EndpointError, match="ConnectError"):
        run(url, "oracle", retries=1, timeout=2)


def test_chat_url_forms() -> None:
    assert chat_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"


def test_sampling_defaults_are_evaluations_own() -> None:
    assert sampling_params(1, None) == SamplingParams(1.0, 1.0, 256, greedy=True)
    assert sampling_params(4, None) == SamplingParams(1.0, 1.0, 256, greedy=False)
    assert sampling_params(1, 0.7, 32) == SamplingParams(0.7, 1.0, 32, greedy=False)
    with pytest.raises(ValueError, match="sampling needs temperature > 0, got 0"):
        sampling_params(1, 0.0)


def test_endpoint_side_imports_no_torch() -> None:
    code = (
        "import sys, maze_evaluation, maze_evaluation.runner, maze_evaluation.endpoint; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
