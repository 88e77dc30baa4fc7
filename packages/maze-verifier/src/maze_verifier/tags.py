"""Linear-time detection of ``<name>...</name>`` tags in model output.

Only ``str.find`` / ``str.rfind`` loops, no regexes: every scan moves forward, so a reply with
thousands of unbalanced or nested tags costs one pass over its text. Matching is ASCII
case-insensitive on the tag name.

Pairing rule (the same as ``maze_env.parse_action`` for ``<action>``): a closing tag pairs with
the nearest opening tag before it, so ``<a><a>x</a>`` holds ``x`` and an opening tag with no
closing tag after it counts for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cache

SFT_TAGS: tuple[str, ...] = ("observation", "justification", "action")
"""The tags VisGym's SFT format asks for in every turn."""

_ASCII_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASCII_LOWER = _ASCII_UPPER.lower()
# ``str.lower`` can change a string's length (``"İ".lower()`` has two code points), which would
# shift every index after it; an ASCII-only translation keeps indices aligned with the original.
_FOLD = str.maketrans(_ASCII_UPPER, _ASCII_LOWER)


def fold_ascii(text: str) -> str:
    """Lower-case ASCII letters only, keeping every index of ``text`` valid in the result."""
    # ``lower`` is a fast C loop and keeps lengths on ASCII; ``translate`` with a table is slower.
    return text.lower() if text.isascii() else text.translate(_FOLD)


@cache
def _markers(name: str) -> tuple[str, str]:
    low = name.lower()
    return f"<{low}>", f"</{low}>"


def tag_contents(text: str, name: str, *, folded: str | None = None) -> list[str]:
    """Every paired ``<name>`` body in order of the closing tags, as written in ``text``."""
    low = fold_ascii(text) if folded is None else folded
    open_tag, close_tag = _markers(name)
    out: list[str] = []
    pos = 0
    while True:
        close = low.find(close_tag, pos)
        if close == -1:
            return out
        start = low.rfind(open_tag, pos, close)
        if start != -1:
            out.append(text[start + len(open_tag) : close])
        pos = close + len(close_tag)


def has_nonempty_tag(text: str, name: str, *, folded: str | None = None) -> bool:
    """Whether ``text`` holds a paired ``<name>`` tag whose body is not just whitespace."""
    low = fold_ascii(text) if folded is None else folded
    open_tag, close_tag = _markers(name)
    pos = 0
    while True:
        close = low.find(close_tag, pos)
        if close == -1:
            return False
        start = low.rfind(open_tag, pos, close)
        # ``isspace`` is False for "", so test emptiness first; both scan only this body.
        if start != -1 and close > start + len(open_tag):
            body = low[start + len(open_tag) : close]
            if not body.isspace():
                return True
        pos = close + len(close_tag)


def has_all_tags(text: object, names: Sequence[str] = SFT_TAGS) -> bool:
    """Whether ``text`` is a string holding a non-empty paired tag for every name."""
    if not isinstance(text, str):
        return False
    low = fold_ascii(text)
    return all(has_nonempty_tag(text, n, folded=low) for n in names)


def tag_fraction(turns: Iterable[object], names: Sequence[str] = SFT_TAGS) -> float:
    """Fraction of turns that hold every tag in ``names`` non-empty; 0.0 for no turns."""
    total = hits = 0
    for turn in turns:
        total += 1
        hits += has_all_tags(turn, names)
    return hits / total if total else 0.0
