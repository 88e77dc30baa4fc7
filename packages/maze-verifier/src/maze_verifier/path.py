"""Whole-path answers: a list of moves in one response, AlphaMaze style.

Accepted forms, looked for inside the last complete ``<answer>`` tag when there is one, else in
the whole reply:

* AlphaMaze tokens: ``<|right|><|down|>`` (any other ``<|...|>`` token is skipped);
* a JSON list: ``["right", "down"]``, ``[0, 3]`` (VisGym codes), ``[["move", 0], ["stop", "stop"]]``;
* VisGym tuples in sequence: ``('move', 0), ('move', 3), ('stop', 'stop')``;
* words, letters or arrows: ``right, right, down``, ``move up then left``, ``RRDD``, ``R R D D``,
  ``→ → ↓``.

Moves after the first ``stop`` are dropped with a note. Every scan is a single pass (``str.find``
loops, ``str.translate``, ``str.split``, one regex without nested quantifiers, ``json.loads``),
and replies past ``max_chars`` or paths past ``max_moves`` are refused with a reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, cast

from maze_env import Action, Direction
from maze_verifier.tags import fold_ascii

PathErrorCode = Literal["not_text", "empty", "too_long", "no_path", "bad_token", "too_many_moves"]
PathSource = Literal["alphamaze", "json", "tuples", "tokens"]

MAX_PATH_CHARS = 65_536
MAX_PATH_MOVES = 4_096


@dataclass(frozen=True, slots=True)
class PathFailure:
    """Why a reply holds no usable path. ``code`` is stable for metrics; ``reason`` is for people."""

    code: PathErrorCode
    reason: str


@dataclass(frozen=True, slots=True)
class PathAnswer:
    """The parsed path. ``actions`` ends with ``stop`` only if the reply said so."""

    actions: tuple[Action, ...]
    source: PathSource
    in_answer_tag: bool
    notes: tuple[str, ...] = ()


PathResult = PathAnswer | PathFailure

_WORDS: dict[str, Action] = {d.word: Action.move(d) for d in Direction}
_WORDS.update({d.word[0]: Action.move(d) for d in Direction})
_WORDS["stop"] = Action.stop()
_FILLER = frozenset({"move", "go", "then", "and"})
_LETTERS = frozenset("rlud")
_ARROWS = {"→": "right", "↑": "up", "←": "left", "↓": "down"}
# A token is an arrow or a run of anything but ASCII punctuation/space and arrows: ASCII letters
# and digits, and also other code points, so "righté" stays one (unrecognised) word instead of
# being read as "right". One quantifier, scanned lazily: parsing stops at the first bad word.
_TOKEN = re.compile(r"[→↑←↓]|[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f→↑←↓]+")
_TUPLE = re.compile(
    r"""\(\s*['"](move|stop)['"]\s*,\s*(?:(-?\d{1,6})|['"]([a-z]{1,8})['"])\s*\)""",
    re.IGNORECASE,
)
_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"


def _last_answer_body(text: str, folded: str) -> str | None:
    close = folded.rfind(_ANSWER_CLOSE)
    if close == -1:
        return None
    start = folded.rfind(_ANSWER_OPEN, 0, close)
    return None if start == -1 else text[start + len(_ANSWER_OPEN) : close]


class _Builder:
    """Collects actions up to the first stop and at most ``max_moves`` of them."""

    __slots__ = ("actions", "dropped", "max_moves", "overflow", "stopped")

    def __init__(self, max_moves: int) -> None:
        self.actions: list[Action] = []
        self.max_moves = max_moves
        self.stopped = False
        self.dropped = 0
        self.overflow = False

    def add(self, action: Action) -> bool:
        """Record ``action``; False once the caller should stop feeding (overflow)."""
        if self.stopped:
            self.dropped += 1
            return True
        if action.kind == "stop":
            self.stopped = True
        elif len(self.actions) >= self.max_moves:
            self.overflow = True
            return False
        self.actions.append(action)
        return True

    def finish(self, source: PathSource, in_tag: bool) -> PathResult:
        if self.overflow:
            return PathFailure("too_many_moves", f"path has more than {self.max_moves} moves")
        if not self.actions:
            return PathFailure("no_path", f"no moves found in the {source} answer")
        notes = (f"{self.dropped} actions after stop were ignored",) if self.dropped else ()
        return PathAnswer(tuple(self.actions), source, in_tag, notes)


def _alphamaze(region: str, b: _Builder) -> bool:
    """Feed ``<|dir|>`` tokens; False if the region holds none."""
    low = fold_ascii(region)
    pos, found = 0, False
    while True:
        start = low.find("<|", pos)
        if start == -1:
            return found
        end = low.find("|>", start + 2, start + 40)
        if end == -1:
            pos = start + 2
            continue
        word = low[start + 2 : end].strip()
        action = _WORDS.get(word) if len(word) > 1 else None
        if action is not None:
            found = True
            if not b.add(action):
                return True
        pos = end + 2


def _from_json_item(item: Any, i: int) -> Action | PathFailure:
    if isinstance(item, str):
        action = _WORDS.get(item.strip().lower())
        if action is not None:
            return action
    elif isinstance(item, int) and not isinstance(item, bool) and 0 <= item <= 3:
        return Action.move(item)
    elif isinstance(item, list) and len(item) == 2:  # pyright: ignore[reportUnknownArgumentType]
        name, arg = item[0], item[1]  # pyright: ignore[reportUnknownVariableType]
        if name == "stop" and arg == "stop":
            return Action.stop()
        if name == "move" and isinstance(arg, int | str):
            inner = _from_json_item(arg, i)
            if isinstance(inner, Action) and inner.kind == "move":
                return inner
    shown = repr(cast(object, item))
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return PathFailure("bad_token", f"list item {i} is not a move: {shown}")


def _json(region: str, b: _Builder) -> PathFailure | None:
    try:
        items = json.loads(region)
    except (ValueError, RecursionError) as e:
        return PathFailure(
            "bad_token", f"answer looks like a JSON list but does not parse: {str(e)[:80]}"
        )
    if not isinstance(items, list):
        return PathFailure("bad_token", "answer JSON is not a list")
    for i, item in enumerate(items):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        action = _from_json_item(item, i)
        if isinstance(action, PathFailure):
            return action
        if not b.add(action):
            break
    return None


def _tuples(region: str, b: _Builder) -> PathFailure | None:
    for i, m in enumerate(_TUPLE.finditer(region)):
        name, num, arg = m.group(1).lower(), m.group(2), m.group(3)
        action: Action | None = None
        if name == "stop" and arg is not None and arg.lower() == "stop":
            action = Action.stop()
        elif name == "move" and num is not None and num in {"0", "1", "2", "3"}:
            action = Action.move(int(num))
        elif name == "move" and arg is not None and arg.lower() in _WORDS and arg.lower() != "stop":
            action = _WORDS[arg.lower()]
        if action is None:
            return PathFailure("bad_token", f"tuple {i} is not a valid action: {m.group(0)[:40]!r}")
        if not b.add(action):
            break
    return None


def _tokens(region: str, b: _Builder) -> PathFailure | None:
    after_move = False
    for i, m in enumerate(_TOKEN.finditer(fold_ascii(region))):
        word = _ARROWS.get(m.group(), m.group())
        action = _WORDS.get(word)
        if action is None and after_move and word in {"0", "1", "2", "3"}:
            action = Action.move(int(word))
        after_move = word == "move"
        if action is not None:
            if not b.add(action):
                return None
        elif word in _FILLER:
            continue
        elif _LETTERS.issuperset(word):
            for letter in word:
                if not b.add(_WORDS[letter]):
                    return None
        else:
            shown = word if len(word) <= 24 else word[:21] + "..."
            return PathFailure(
                "bad_token",
                f"word {i} ({shown!r}) is not a move; write moves as right/up/left/down (or R/U/L/D) "
                "and optionally stop, inside <answer></answer> if the reply holds other text",
            )
    return None


def parse_path(
    text: object, *, max_chars: int = MAX_PATH_CHARS, max_moves: int = MAX_PATH_MOVES
) -> PathResult:
    """Parse a whole-path answer. Never raises; see the module docstring for the accepted forms."""
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(cast(bytes, text)).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return PathFailure("not_text", f"expected text, got {type(text).__name__}")
    if len(text) > max_chars:
        return PathFailure(
            "too_long", f"reply has {len(text)} characters, over the cap of {max_chars}"
        )
    if not text.strip():
        return PathFailure("empty", "reply is empty")

    folded = fold_ascii(text)
    body = _last_answer_body(text, folded)
    in_tag = body is not None
    region = text if body is None else body
    if not region.strip():
        return PathFailure("empty", "<answer> tag is empty")

    b = _Builder(max_moves)
    if "<|" in region and _alphamaze(region, b):
        return b.finish("alphamaze", in_tag)
    stripped = region.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        failure = _json(stripped, b)
        return failure or b.finish("json", in_tag)
    if "(" in region and _TUPLE.search(region) is not None:
        failure = _tuples(region, b)
        return failure or b.finish("tuples", in_tag)
    failure = _tokens(region, b)
    return failure or b.finish("tokens", in_tag)
