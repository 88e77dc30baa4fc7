"""What each turn of an episode is answered from (torch-free, env-free).

Its own module so that a server can check ``--context`` before it binds its port without
importing the episode loop (which pulls in maze-env and its renderer).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from maze_policy.errors import ContextRecordError

CONTEXTS = ("full", "latest", "recent", "route", "route-recent")
"""What each turn is answered from: the whole conversation; the system prompt and the latest
user turn; those with the previous reply between them; the latest frame alone, asked
:data:`ROUTE_QUESTION`; or that with the previous reply before it (see ``maze_policy.rollout``)."""

PER_TURN_CONTEXTS = ("latest", "recent", "route", "route-recent")
"""The contexts that play each turn as its own token sequence."""

ROUTE_CONTEXTS = ("route", "route-recent")
"""The contexts that ask every frame :data:`ROUTE_QUESTION` in place of the env's text."""

RECENT_CONTEXTS = ("recent", "route-recent")
"""The contexts that keep the policy's previous reply before a later turn."""

ROUTE_QUESTION = "Which way leads from the blue circle to the red square?"
"""What context ``route`` asks of every frame, in place of the env's text: the question the
route base (``tiny-qwen3vl-route``) was pretrained to answer, so its task turns read as its
pretraining did."""


def check_context(context: str) -> str:
    """``context`` if it is one of :data:`CONTEXTS`; a ValueError naming them otherwise."""
    if context not in CONTEXTS:
        raise ValueError(f"context must be one of {', '.join(CONTEXTS)}, got {context!r}")
    return context


CONTEXT_FILE = "maze_context.json"
"""Beside an adapter: the context its policy was trained in, so evaluation and serving use it."""


def write_context(directory: str | os.PathLike[str], context: str) -> Path:
    """Record ``context`` in ``directory/maze_context.json`` (atomically)."""
    from weight_sync.fs import atomic_write_json

    path = Path(directory) / CONTEXT_FILE
    atomic_write_json(path, {"context": check_context(context)})
    return path


def read_context(directory: str | os.PathLike[str]) -> str | None:
    """The context recorded in an adapter directory; None when it records none.

    Raises:
        ContextRecordError: ``maze_context.json`` exists but is not JSON naming one of
            :data:`CONTEXTS`.
    """
    path = Path(directory) / CONTEXT_FILE
    if not path.is_file():
        return None
    try:
        data: object = json.loads(path.read_text())
        context = cast(dict[str, object], data)["context"] if isinstance(data, dict) else None
        if not isinstance(context, str):
            raise TypeError(f"context is {context!r}")
        return check_context(context)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ContextRecordError(f"{path}: not a context record: {exc}") from None


@dataclass(frozen=True)
class ContextChoice:
    """What :func:`choose_context` decided, for its caller to report."""

    context: str
    source: Literal["explicit", "recorded", "default"]
    differing: Mapping[str, str] = field(default_factory=dict[str, str])
    """With an explicit context: each adapter whose record differs from it, and that record
    (answering such an adapter in another context does not serve or score its trained policy)."""


def choose_context(explicit: str | None, recorded: Mapping[str, str]) -> ContextChoice:
    """The context to answer in: ``explicit``, else the one the adapters record, else ``full``.

    ``recorded`` maps each adapter's name to the context it records (adapters recording none are
    left out). One conversation is answered in one context, so records that disagree need an
    explicit choice.

    Raises:
        ValueError: ``explicit`` is not one of :data:`CONTEXTS`, or there is none and the records
            disagree.
    """
    if explicit is not None:
        check_context(explicit)
        differing = {name: found for name, found in recorded.items() if found != explicit}
        return ContextChoice(explicit, "explicit", differing)
    kinds = sorted(set(recorded.values()))
    if len(kinds) > 1:
        named = ", ".join(f"{name}: {found}" for name, found in sorted(recorded.items()))
        raise ValueError(f"the adapters were trained in different contexts ({named})")
    if kinds:
        return ContextChoice(kinds[0], "recorded")
    return ContextChoice("full", "default")


def is_image_part(part: Mapping[str, Any]) -> bool:
    """Whether a message's content ``part`` carries an image.

    It does with an ``image_url`` or ``image`` key, or ``type`` ``image``: the one rule of the
    encoder and of context ``route``, so ``route`` never drops a frame the model would be shown.
    """
    return "image_url" in part or "image" in part or part.get("type") == "image"
