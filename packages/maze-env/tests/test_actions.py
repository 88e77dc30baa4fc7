import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maze_env import MAX_ACTION_CHARS, Action, Direction, ParseFailure, parse_action

R, U, L, D = (Action.move(d) for d in Direction)
STOP = Action.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("('move', 0)", R),
        ('("move", 1)', U),
        ("( 'move' ,2 )", L),
        ("('move', 3)", D),
        ("('stop', 'stop')", STOP),
        ("<action>up</action>", U),
        ("<ACTION> Left </ACTION>", L),
        ("<action>('move', 3)</action>", D),
        ("<action>move right</action>", R),
        ("<action>stop</action>", STOP),
        ("down", D),
        ("  Stop. ", STOP),
        ("go left", L),
        ("`('move', 0)`", R),
        # Last valid action wins, like VisGym.
        ("first ('move', 0) then ('move', 1)", U),
        ("('move', 2) and then ('move', 9)", L),
        # A complete action tag is authoritative over tuples elsewhere.
        ("I considered ('move', 0). <action>down</action>", D),
        ("<action>up</action> ... <action>left</action>", L),
        (
            "<observation>blue at left</observation><justification>x</justification><action>right</action>",
            R,
        ),
    ],
)
def test_accepted_forms(text: str, expected: Action) -> None:
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("I would like to go somewhere", "no_action"),
        ("<action>jump</action>", "invalid_tag"),
        ("<action>up</action> no wait <action></action>", "invalid_tag"),
        ("('move', 7)", "invalid_move"),
        ("('stop', 'go')", "invalid_move"),
        ("up down", "no_action"),
        ("<action>up", "no_action"),
    ],
)
def test_failures_have_codes_and_reasons(text: str, code: str) -> None:
    result = parse_action(text)
    assert isinstance(result, ParseFailure)
    assert result.code == code
    assert result.reason


def test_non_text_and_bytes() -> None:
    assert parse_action(b"<action>up</action>") == U
    assert parse_action(b"\xff\xfe('move', 0)") == R
    failure = parse_action(12345)
    assert isinstance(failure, ParseFailure) and failure.code == "not_text"


def test_non_ascii_that_grows_when_lowercased_keeps_offsets() -> None:
    assert parse_action("İİİ<action>up</action>") == U
    assert parse_action("<ACTION>İ down</ACTION>") == ParseFailure(
        "invalid_tag", "<action> tag holds no valid action: 'İ down'"
    )


def test_length_cap() -> None:
    result = parse_action("x" * (MAX_ACTION_CHARS + 1) + "<action>up</action>")
    assert isinstance(result, ParseFailure) and result.code == "too_long"
    assert str(MAX_ACTION_CHARS) in result.reason
    assert parse_action("y" * 100 + "<action>up</action>", max_chars=200) == U


def test_round_trip_forms() -> None:
    for action in (R, U, L, D, STOP):
        assert parse_action(action.to_visgym()) == action
        assert parse_action(action.to_tag()) == action


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=2000))
def test_any_text_gives_a_typed_result(text: str) -> None:
    result = parse_action(text)
    assert isinstance(result, Action | ParseFailure)
    if isinstance(result, ParseFailure):
        assert result.reason


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["<action>", "</action>", "('move', ", "1)", "'stop'", "(", ")", "up", " ", "\x00", "é"]
        ),
        max_size=300,
    )
)
def test_adversarial_fragments_give_typed_results(parts: list[str]) -> None:
    assert isinstance(parse_action("".join(parts)), Action | ParseFailure)


@pytest.mark.parametrize(
    "unit",
    ["<action>", "</action>", "('move', ", "(" + " " * 7, "<action>('move', 1", "('stop', 'stop'"],
)
def test_parse_time_is_linear_in_input(unit: str) -> None:
    # Judged by the ratio for 10x the input, so it holds on slow and loaded machines alike.
    def cost(n: int) -> float:
        text = unit * n
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            parse_action(text, max_chars=10**8)
            best = min(best, time.perf_counter() - t0)
        return best

    small, large = cost(20_000), cost(200_000)
    assert large < max(small, 1e-4) * 30


def test_action_word_names_the_action_and_round_trips_through_its_tag() -> None:
    actions = [Action.move(d) for d in Direction] + [Action.stop()]
    assert [a.word for a in actions] == ["right", "up", "left", "down", "stop"]
    for a in actions:
        parsed = parse_action(a.to_tag())
        assert isinstance(parsed, Action) and parsed == a and parsed.word == a.word
    tuple_move = parse_action("('move', 3)")
    assert isinstance(tuple_move, Action) and tuple_move.word == "down"
