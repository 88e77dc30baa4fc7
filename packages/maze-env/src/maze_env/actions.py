"""Actions and the text parser that turns model output into one.

Accepted forms, as VisGym and chat models write them:

* VisGym tuples: ``('move', 0)`` (0 right, 1 up, 2 left, 3 down) and ``('stop', 'stop')``;
* tags: ``<action>up</action>``, ``<action>('move', 1)</action>``, ``<action>move up</action>``;
* bare words when the whole reply is one: ``up``, ``move left``, ``stop``.

When a reply holds several, the last one wins (VisGym keeps the last valid tuple). A complete
``<action>`` tag is authoritative: if the last tag holds no valid action the reply is invalid,
even if a tuple appears elsewhere, because the model said what it meant inside the tag.

The parser never raises and runs in time linear in the input: it uses ``str.rfind`` and regexes
without nested quantifiers, and refuses inputs past a length cap before scanning them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal


class Direction(IntEnum):
    """VisGym's move codes."""

    RIGHT = 0
    UP = 1
    LEFT = 2
    DOWN = 3

    @property
    def word(self) -> str:
        return self.name.lower()


DIRECTION_DELTAS: dict[Direction, tuple[int, int]] = {
    Direction.RIGHT: (0, 1),
    Direction.UP: (-1, 0),
    Direction.LEFT: (0, -1),
    Direction.DOWN: (1, 0),
}


@dataclass(frozen=True, slots=True)
class Action:
    """A parsed action: a move in ``direction``, or ``stop`` (``direction`` is None)."""

    kind: Literal["move", "stop"]
    direction: Direction | None = None

    @classmethod
    def move(cls, direction: Direction | int) -> Action:
        return cls("move", Direction(direction))

    @classmethod
    def stop(cls) -> Action:
        return cls("stop")

    def to_visgym(self) -> str:
        """The tuple string VisGym's env accepts."""
        if self.kind == "stop":
            return "('stop', 'stop')"
        return f"('move', {int(self.direction or 0)})"

    @property
    def word(self) -> str:
        """The action's word in the prompt's vocabulary: ``stop`` or a direction (``up``, ...)."""
        return "stop" if self.kind == "stop" else (self.direction or Direction.RIGHT).word

    def to_tag(self) -> str:
        return f"<action>{self.word}</action>"


ParseErrorCode = Literal[
    "not_text", "empty", "too_long", "no_action", "invalid_tag", "invalid_move"
]


@dataclass(frozen=True, slots=True)
class ParseFailure:
    """Why a reply holds no usable action. ``code`` is stable for metrics; ``reason`` is for people."""

    code: ParseErrorCode
    reason: str


ParseResult = Action | ParseFailure

MAX_ACTION_CHARS = 65_536
"""Default cap on reply length; longer replies are refused without scanning."""

_TUPLE = re.compile(
    r"""\(\s*(?P<q1>['"])(?P<name>move|stop)(?P=q1)\s*,\s*(?:(?P<num>-?\d{1,6})|(?P<q2>['"])(?P<arg>[a-z]{1,8})(?P=q2))\s*\)""",
    re.IGNORECASE,
)
_WORD = re.compile(r"(?:(?:move|go)\s+)?(right|up|left|down|stop)", re.IGNORECASE)
_WORDS = {d.word: d for d in Direction}
_OPEN, _CLOSE = "<action>", "</action>"
_TRIM = " \t\r\n`'\".!,;:"
# ASCII-only case folding keeps string positions stable: str.lower() lengthens some non-ASCII
# characters (e.g. "İ"), which would shift offsets found in the folded copy.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _from_tuple(m: re.Match[str]) -> ParseResult:
    name = m.group("name").lower()
    num, arg = m.group("num"), m.group("arg")
    if name == "stop":
        if arg is not None and arg.lower() == "stop":
            return Action.stop()
        return ParseFailure(
            "invalid_move", f"stop takes 'stop' as its argument, got {m.group(0)!r}"
        )
    if num is not None and num.lstrip("-").isdigit() and 0 <= int(num) <= 3:
        return Action.move(int(num))
    if arg is not None and arg.lower() in _WORDS:
        return Action.move(_WORDS[arg.lower()])
    return ParseFailure(
        "invalid_move", f"move direction must be 0-3 (right, up, left, down), got {m.group(0)!r}"
    )


def _from_fragment(text: str) -> ParseResult | None:
    """A whole fragment that is one tuple or one action word; None if it is neither."""
    s = text.strip(_TRIM)
    if len(s) > 64:
        return None
    m = _TUPLE.fullmatch(s)
    if m is not None:
        return _from_tuple(m)
    w = _WORD.fullmatch(s)
    if w is not None:
        word = w.group(1).lower()
        return Action.stop() if word == "stop" else Action.move(_WORDS[word])
    return None


def parse_action(text: object, *, max_chars: int = MAX_ACTION_CHARS) -> ParseResult:
    """Parse one turn's reply. Never raises; see the module docstring for the accepted forms."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        return ParseFailure("not_text", f"expected text, got {type(text).__name__}")
    if len(text) > max_chars:
        return ParseFailure(
            "too_long", f"reply has {len(text)} characters, over the cap of {max_chars}"
        )
    if not text.strip():
        return ParseFailure("empty", "reply is empty")

    lowered = text.translate(_ASCII_LOWER)
    close = lowered.rfind(_CLOSE)
    if close != -1:
        open_ = lowered.rfind(_OPEN, 0, close)
        if open_ != -1:
            inner = text[open_ + len(_OPEN) : close]
            parsed = _from_fragment(inner)
            if parsed is not None:
                return parsed
            shown = inner.strip()
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return ParseFailure("invalid_tag", f"<action> tag holds no valid action: {shown!r}")

    # Last *valid* tuple wins (VisGym); if every tuple is invalid, report the last one.
    found: ParseResult | None = None
    for m in _TUPLE.finditer(text):
        parsed = _from_tuple(m)
        if isinstance(parsed, Action) or not isinstance(found, Action):
            found = parsed
    if found is not None:
        return found

    parsed = _from_fragment(text)
    if parsed is not None:
        return parsed
    return ParseFailure(
        "no_action",
        "no action found; answer with ('move', k) for k in 0-3 (right, up, left, down), "
        "('stop', 'stop'), or <action>up|down|left|right|stop</action>",
    )
