"""Hostile input: typed results, never an exception, and time linear in the input.

The fuzz loop and the timing checks are bounded in count and wall time (well under 20 s each on
a CI core). Linearity is judged by the ratio of two input sizes' times, not by absolute time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maze_env import Action, ParseFailure, generate, parse_action
from maze_verifier import (
    EpisodeScore,
    PathAnswer,
    PathFailure,
    get_spec,
    has_all_tags,
    parse_path,
    score_episode,
    score_path,
    tag_fraction,
    verify_texts,
)

MAZE = generate("easy", 99)
BIG = 10**9  # caps lifted, so the timing checks measure real scans rather than the refusal

FRAGMENTS = [
    "<action>", "</action>", "<observation>", "</observation>", "<justification>",
    "</justification>", "<answer>", "</answer>", "<|", "|>", "<|up|>", "<|right|>", "(", ")",
    "('move', ", "0", "3", "9", "-1", "'stop'", "\"", "'", ",", "[", "]", "{", "}", "up", "down",
    "left", "right", "stop", "move", "R", "U", "L", "D", " ", "\n", "\t", "\x00", "\ufffd", "İ",
    "\ud800", "→", "é", "🙂", "<", ">", "/", "\\", "|", "#", "0x", "1e309", "NaN",
]  # fmt: skip
SEEDS = [
    "<observation>at start</observation><justification>goal is right</justification><action>right</action>",
    "('move', 3)",
    "<answer>RRDDLU</answer>",
    '["right", "down", "stop"]',
    "<|up|><|left|><|stop|>",
    "I will go ('move', 0) then <action>('stop', 'stop')</action>",
]


def _check_all(text: str) -> None:
    action = parse_action(text)
    assert isinstance(action, Action | ParseFailure)
    if isinstance(action, ParseFailure):
        assert action.reason
    path = parse_path(text)
    assert isinstance(path, PathAnswer | PathFailure)
    if isinstance(path, PathAnswer):
        assert 0 < len(path.actions) <= 4097
    else:
        assert path.reason
    assert isinstance(has_all_tags(text), bool)
    s = score_path(MAZE, text, "visgym_sft_efficiency")
    assert 0.0 <= s.reward <= 1.0 + 1e-9


def _mutate(rng: random.Random, text: str) -> str:
    op = rng.randrange(5)
    i = rng.randrange(len(text) + 1)
    if op == 0:
        return text[:i] + rng.choice(FRAGMENTS) + text[i:]
    if op == 1 and text:
        j = min(len(text), i + rng.randrange(1, 8))
        return text[:i] + text[j:]
    if op == 2 and text:
        j = min(len(text), i + rng.randrange(1, 32))
        return text[:i] + text[i:j] * rng.randrange(2, 6) + text[i:]
    if op == 3:
        return text[:i] + chr(rng.randrange(0x110000)) + text[i:]
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randrange(1, 40)))


@pytest.mark.slow
def test_fuzz_mutation_loop_returns_typed_results() -> None:
    rng = random.Random(1234)
    corpus = list(SEEDS)
    deadline = time.monotonic() + 10.0
    done = 0
    for done in range(1, 4001):  # noqa: B007 - the count is reported below
        text = _mutate(rng, rng.choice(corpus))
        if len(text) > 4000:
            text = text[:4000]
        _check_all(text)
        if rng.random() < 0.1:
            corpus.append(text)
        if time.monotonic() > deadline:
            break
    assert done >= 500, f"fuzz loop ran only {done} cases in 10 s"
    # A whole episode of fuzzed replies through both scoring paths must agree.
    turns = [_mutate(rng, rng.choice(SEEDS)) for _ in range(40)]
    ref = score_episode(MAZE, turns, "visgym_sft")
    batch = verify_texts([MAZE], [turns], spec="visgym_sft").episode(0)
    assert batch["reward"] == pytest.approx(ref.reward)
    assert batch["turns"] == ref.turns


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=300), st.lists(st.sampled_from(FRAGMENTS), max_size=80).map("".join)
    )
)
def test_property_any_text_gives_typed_results(text: str) -> None:
    _check_all(text)


@settings(max_examples=100, deadline=None)
@given(
    data=st.binary(max_size=300),
    other=st.one_of(st.none(), st.integers(), st.floats(), st.lists(st.integers())),
)
def test_property_bytes_and_non_text(data: bytes, other: object) -> None:
    assert isinstance(parse_path(data), PathAnswer | PathFailure)
    bad = parse_path(other)
    assert isinstance(bad, PathFailure)
    assert bad.code == "not_text"
    s = score_episode(MAZE, [data, other, data], "visgym_sft")
    assert isinstance(s, EpisodeScore)
    assert s.turns == 3


def test_megabyte_replies_are_refused_by_the_cap_with_a_reason() -> None:
    huge = "<action>up</action>" * 100_000  # 1.9 MB
    r = parse_path(huge)
    assert isinstance(r, PathFailure)
    assert r.code == "too_long"
    assert "cap" in r.reason
    s = score_episode(MAZE, [huge], "visgym_sft")
    assert s.parse_failures == ("too_long",)
    assert s.tag_fraction == 0.0  # refused replies are not scanned for format credit


def _best_time(fn: Callable[[str], object], text: str, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(text)
        best = min(best, time.perf_counter() - t0)
    return best


PATHOLOGICAL: dict[str, str] = {
    "open_tags": "<action>",
    "close_tags": "</action>",
    "empty_pairs": "<observation></observation>",
    "nested_opens": "<justification><justification>x",
    "tuple_prefixes": "('move', ",
    "open_parens": "( ",
    "alphamaze_opens": "<|",
    "answer_opens": "<answer>",
    "letters": "RLUD",
    "words": "right, ",
    "brackets": "[",
}
FUNCTIONS: dict[str, Callable[[str], object]] = {
    "parse_action": lambda t: parse_action(t, max_chars=BIG),
    "parse_path": lambda t: parse_path(t, max_chars=BIG, max_moves=BIG),
    "has_all_tags": has_all_tags,
    "tag_fraction": lambda t: tag_fraction([t, t]),
    "score_episode": lambda t: score_episode(
        MAZE, [t, t, t], get_spec("visgym_sft"), max_chars=BIG
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("fn_name", list(FUNCTIONS))
def test_time_is_linear_in_input(fn_name: str) -> None:
    fn = FUNCTIONS[fn_name]
    worst: list[tuple[float, str]] = []
    for name, unit in PATHOLOGICAL.items():
        small = unit * (200_000 // len(unit))
        large = unit * (2_000_000 // len(unit))
        # Floor at 1 ms: below it timer and cache noise dominate, and a quadratic scan of 200 KB
        # (4e10 steps, or 2.5e9 bytes of memchr for an rfind-from-start loop) takes far longer.
        t_small = max(_best_time(fn, small), 1e-3)
        t_large = _best_time(fn, large)
        worst.append((t_large / t_small, name))
    ratio, name = max(worst)
    # 10x the input: linear gives ~10, quadratic ~100. 40 leaves room for cache effects (200 KB
    # fits in L2, 2 MB does not) and for noisy neighbours on a shared CI core.
    assert ratio < 40, (
        f"{fn_name} on {name!r}: 10x input took {ratio:.1f}x time ({sorted(worst)[-3:]})"
    )
