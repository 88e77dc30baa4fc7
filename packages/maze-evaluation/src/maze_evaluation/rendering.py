"""Which rendering (pixels per maze square) and context to evaluate with: the adapter's own.

An adapter trained by maze-engine carries ``maze_rendering.json``; ``maze-serve`` reports it per
model in ``/v1/models``. Scoring a model on images unlike its training images measures the wrong
thing, so the recorded rendering wins over the default, and an explicit choice wins over both.
The adapter's ``maze_context.json`` (``maze_policy.contexts``) likewise names what each turn was
answered from in training; an explicit context that differs is kept, with a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import httpx

from maze_env.errors import RenderingError
from maze_env.render import read_rendering
from maze_evaluation.endpoint import chat_url
from maze_evaluation.errors import EvaluationError
from maze_evaluation.runner import DEFAULT_CELL_PX
from maze_policy.contexts import choose_context, read_context
from maze_policy.errors import ContextRecordError


def models_url(endpoint: str) -> str:
    """The ``/v1/models`` URL of an endpoint given as :func:`chat_url` accepts it."""
    return chat_url(endpoint).removesuffix("/chat/completions") + "/models"


def endpoint_cell_px(
    endpoint: str, model: str, *, api_key: str | None = None, timeout: float = 10.0
) -> int | None:
    """``maze_rendering.cell_px`` of ``model`` in the endpoint's model list, if it says one.

    An endpoint that does not answer, or lists no rendering (vLLM, another server), gives None:
    the evaluation itself then reports the endpoint's errors.
    """
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    try:
        resp = httpx.get(models_url(endpoint), headers=headers, timeout=timeout)
        resp.raise_for_status()
        data: Any = resp.json()
    except (httpx.HTTPError, ValueError):
        return None
    entries = cast(list[Any], data.get("data", [])) if isinstance(data, dict) else []
    for entry in entries:
        found = cast(dict[str, Any], entry) if isinstance(entry, dict) else {}
        if found.get("id") != model:
            continue
        rendering = found.get("maze_rendering")
        block = cast(dict[str, Any], rendering) if isinstance(rendering, dict) else {}
        cell_px = block.get("cell_px")
        return cell_px if isinstance(cell_px, int) and not isinstance(cell_px, bool) else None
    return None


def resolve_cell_px(
    explicit: int | None,
    *,
    adapter_dir: Path | None = None,
    endpoint: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
) -> tuple[int, str]:
    """``(cell_px, where it came from)``: explicit, else recorded by the adapter, else default.

    Raises:
        EvaluationError: The adapter's rendering record exists but cannot be read.
    """
    if explicit is not None:
        return explicit, "--cell-px"
    if adapter_dir is not None:
        try:
            style = read_rendering(adapter_dir)
        except RenderingError as exc:
            raise EvaluationError(str(exc)) from exc
        if style is not None:
            return style.cell_px, f"recorded in {adapter_dir}"
    if endpoint is not None and model is not None:
        cell_px = endpoint_cell_px(endpoint, model, api_key=api_key)
        if cell_px is not None:
            return cell_px, f"listed for {model} by {models_url(endpoint)}"
    return DEFAULT_CELL_PX, "default: nothing recorded"


def resolve_context(
    explicit: str | None, *, adapter_dir: Path | None = None
) -> tuple[str, str, str | None]:
    """``(context, where it came from, warning)``: explicit, else the adapter's, else ``full``.

    The warning (None when there is nothing to say) names an explicit context that differs
    from the one the adapter records: its score is not the trained policy's.

    Raises:
        EvaluationError: The adapter's context record exists but cannot be read, or
            ``explicit`` is not a context.
    """
    recorded: dict[str, str] = {}
    if adapter_dir is not None:
        try:
            found = read_context(adapter_dir)
        except ContextRecordError as exc:
            raise EvaluationError(str(exc)) from exc
        if found is not None:
            recorded[str(adapter_dir)] = found
    try:
        choice = choose_context(explicit, recorded)
    except ValueError as exc:
        raise EvaluationError(f"--context: {exc}") from exc
    if choice.source == "explicit":
        found = choice.differing.get(str(adapter_dir))
        warning = (
            None
            if found is None
            else f"warning: the adapter was trained in context {found!r} (recorded in "
            f"{adapter_dir}); answering in {choice.context!r} does not score the trained policy"
        )
        return choice.context, "--context", warning
    if choice.source == "recorded":
        return choice.context, f"recorded in {adapter_dir}", None
    return choice.context, "default: nothing recorded", None
