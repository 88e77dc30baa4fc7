"""The ASGI app: OpenAI chat completions, vLLM LoRA routes, SageMaker ``/ping`` + ``/invocations``.

Every error is an OpenAI error body ``{"error": {"message", "type", "code"}}`` with the status
of its :mod:`maze_serving.errors` class; malformed input is never a 5xx.

Routes are module-level functions on :data:`router`; they reach the engine, its config and the
adapter download cache through ``request.app.state`` (set by :func:`create_app`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from maze_policy.errors import ChatEncodingError
from maze_policy.rollout import in_context
from maze_serving.engine import (
    LOADING_RETRY_AFTER_S,
    EngineConfig,
    GenerationOutput,
    GenerationRequest,
    ServingEngine,
    Ticket,
    check_images,
    sampling_from_request,
)
from maze_serving.errors import (
    BadRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServingError,
)
from maze_serving.metrics import ServingMetrics
from maze_serving.schemas import ChatCompletionRequest, LoadLoraRequest, UnloadLoraRequest
from maze_serving.sources import resolve_location

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
_DONE = "data: [DONE]\n\n"


# --------------------------------------------------------------------------- errors


class _BodyTooLargeError(StarletteHTTPException, PayloadTooLargeError):
    """The streamed body passed the limit.

    An HTTPException first, because FastAPI's body parsing re-raises those and turns any other
    exception into a 400; the HTTPException handler then answers it as a 413.
    """

    def __init__(self, limit: int) -> None:
        message = f"request body is over the {limit} byte limit"
        PayloadTooLargeError.__init__(self, message)
        StarletteHTTPException.__init__(self, 413, message)


def _printable(text: str) -> str:
    """``text`` with any lone surrogate written as an escape, so a UTF-8 body can carry it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _error_response(exc: ServingError) -> JSONResponse:
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    body = exc.body()
    body["error"]["message"] = _printable(str(body["error"]["message"]))
    return JSONResponse(body, status_code=exc.status, headers=headers)


def _http_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        404: "not_found_error",
        405: "method_not_allowed",
        413: "payload_too_large",
    }.get(status, "invalid_request_error" if status < 500 else "internal_error")


async def serving_error_handler(_: Request, exc: ServingError) -> JSONResponse:
    """Answer a :class:`ServingError` with its status, error body and ``Retry-After``.

    Args:
        _: The request that failed.
        exc: The error raised while serving it.

    Returns:
        The OpenAI-style error response.
    """
    return _error_response(exc)


async def validation_error_handler(_: Request, exc: RequestValidationError) -> JSONResponse:
    """Answer a body that fails its schema with a 400 naming the first five problems.

    Args:
        _: The request that failed.
        exc: FastAPI's validation error.

    Returns:
        The OpenAI-style 400 response.
    """
    errs = exc.errors()
    detail = "; ".join(
        # Unicode errors carry their own dotted location (the whole body is checked at once).
        str(e.get("msg", ""))
        if e.get("type") == "invalid_unicode"
        else f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
        for e in errs[:5]
    )
    return _error_response(BadRequestError(f"invalid request: {detail}"))


async def http_error_handler(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Answer Starlette's own errors (404 route, 405 method, 413 body) in the OpenAI shape.

    Args:
        _: The request that failed.
        exc: The HTTP exception raised by routing or body parsing.

    Returns:
        The OpenAI-style error response with the exception's status and headers.
    """
    body = {
        "error": {
            "message": _printable(str(exc.detail)),
            "type": _http_error_type(exc.status_code),
            "code": exc.status_code,
        }
    }
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


# ----------------------------------------------------------------------- middleware


class _Guard:
    """Pure ASGI: body size limit (Content-Length and streamed bytes) and request counting."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, metrics: ServingMetrics) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        status = {"code": 500}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            err = PayloadTooLargeError(f"request body is over the {self.limit} byte limit")
            await _error_response(err)(scope, receive, counting_send)
        else:
            await self.app(scope, self._limited(receive), counting_send)
        self.metrics.requests.labels(path, str(status["code"])).inc()

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that raises :class:`_BodyTooLargeError` once the body passes the limit."""
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _BodyTooLargeError(self.limit)
            return message

        return limited_receive


# ---------------------------------------------------------------------- app state


def get_engine(request: Request) -> ServingEngine:
    """The engine of the app serving ``request`` (a FastAPI dependency).

    Args:
        request: The incoming request.

    Returns:
        ``request.app.state.engine``.
    """
    return cast(ServingEngine, request.app.state.engine)


def get_config(request: Request) -> EngineConfig:
    """The :class:`EngineConfig` the app was created with (a FastAPI dependency).

    Args:
        request: The incoming request.

    Returns:
        ``request.app.state.config``.
    """
    return cast(EngineConfig, request.app.state.config)


def get_cache_dir(request: Request) -> str:
    """Where the app puts adapters downloaded from ``s3://`` (a FastAPI dependency).

    Args:
        request: The incoming request.

    Returns:
        ``create_app``'s ``cache_dir``, else the engine's download directory.
    """
    cache_dir = cast("str | None", request.app.state.cache_dir)
    return cache_dir if cache_dir is not None else get_engine(request).download_dir()


EngineDep = Annotated[ServingEngine, Depends(get_engine)]
ConfigDep = Annotated[EngineConfig, Depends(get_config)]
CacheDirDep = Annotated[str, Depends(get_cache_dir)]


# ------------------------------------------------------------------ chat completions


@dataclass(frozen=True, slots=True)
class _Call:
    """One admitted chat request: what both the JSON and the SSE answer need."""

    engine: ServingEngine
    config: EngineConfig
    ticket: Ticket
    req: GenerationRequest
    rid: str
    created: int
    endpoint: str
    start: float

    def chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.ticket.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def record(self, out: GenerationOutput) -> None:
        """Count the finished request's tokens and latency."""
        metrics = self.engine.metrics
        metrics.prompt_tokens.labels(self.ticket.model).inc(out.prompt_tokens)
        metrics.generation_tokens.labels(self.ticket.model).inc(len(out.token_ids))
        metrics.latency.labels(self.endpoint).observe(time.perf_counter() - self.start)


def _finish_reason(out: GenerationOutput) -> str:
    return "length" if out.finish_reason == "cancelled" else out.finish_reason


def _usage(out: GenerationOutput) -> dict[str, int]:
    n = len(out.token_ids)
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": out.prompt_tokens + n,
    }


def _completion_body(call: _Call, out: GenerationOutput) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": out.text},
        "finish_reason": _finish_reason(out),
        "logprobs": None,
    }
    if out.logprobs is not None:
        choice["logprobs"] = {
            "content": [
                {"token": call.engine.decode([t]), "logprob": lp, "token_id": t}
                for t, lp in zip(out.token_ids, out.logprobs, strict=True)
            ]
        }
    return {
        "id": call.rid,
        "object": "chat.completion",
        "created": call.created,
        "model": call.ticket.model,
        "choices": [choice],
        "usage": _usage(out),
    }


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _generation_request(body: ChatCompletionRequest, config: EngineConfig) -> GenerationRequest:
    """Validate ``body`` against the server's limits; raises 400 / 413 before admission."""
    if (body.n or 1) != 1:
        raise BadRequestError("only n=1 is supported")
    messages = body.as_messages()
    if messages[-1]["role"] != "user":
        raise BadRequestError("the last message must have role 'user'")
    # Cut before the image limits: a long conversation a per-turn policy answers from one frame
    # is not refused for the frames it never reads.
    try:
        messages = in_context(messages, config.context)
    except ChatEncodingError as exc:  # e.g. context route and a last turn with no frame
        raise BadRequestError(str(exc)) from exc
    check_images(messages, config)
    params, seed = sampling_from_request(
        temperature=body.temperature,
        top_p=body.top_p,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        seed=body.seed,
        config=config,
    )
    min_new = params.max_new_tokens if body.ignore_eos else (body.min_tokens or 0)
    return GenerationRequest(messages, params, seed, min_new, bool(body.logprobs))


def _include_usage(body: ChatCompletionRequest) -> bool:
    opts: Any = (body.model_extra or {}).get("stream_options")
    return isinstance(opts, dict) and bool(cast(dict[str, Any], opts).get("include_usage"))


async def _run_chat(
    body: ChatCompletionRequest, endpoint: str, engine: ServingEngine, config: EngineConfig
) -> Response:
    """Validate, admit and answer one chat request (JSON, or SSE when ``stream``)."""
    start = time.perf_counter()
    req = _generation_request(body, config)
    call = _Call(
        engine=engine,
        config=config,
        ticket=engine.admit(body.model),
        req=req,
        rid=f"chatcmpl-{uuid.uuid4().hex}",
        created=int(time.time()),
        endpoint=endpoint,
        start=start,
    )
    if body.stream:
        return await _stream_completion(call, include_usage=_include_usage(body))
    return await _complete(call)


async def _complete(call: _Call) -> Response:
    """The whole completion as one ``chat.completion`` body; 504 past the request timeout."""
    timeout = call.config.request_timeout_s
    cancel = threading.Event()
    try:
        fut = call.engine.submit(call.ticket, call.req, cancel)
        try:
            out = await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        except TimeoutError:
            cancel.set()
            raise RequestTimeoutError(f"request did not finish within {timeout} s") from None
        except ChatEncodingError as exc:
            raise BadRequestError(str(exc)) from exc
    finally:
        call.ticket.release()
    call.record(out)
    return JSONResponse(_completion_body(call, out))


class _TokenFeed:
    """Hands the worker thread's prompt length and tokens to the event loop (thread-safe)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> None:
        self.loop = loop
        self.tokens: asyncio.Queue[int | None] = asyncio.Queue()
        self.prompt: asyncio.Future[int] = loop.create_future()
        self.cancel = threading.Event()
        self.deadline = loop.time() + timeout_s

    def on_prompt(self, n: int) -> None:
        self.loop.call_soon_threadsafe(self._set_prompt, n)

    def _set_prompt(self, n: int) -> None:
        if not self.prompt.done():
            self.prompt.set_result(n)

    def on_token(self, tok: int) -> None:
        self.loop.call_soon_threadsafe(self.tokens.put_nowait, tok)

    def on_done(self, _: Future[GenerationOutput]) -> None:
        self.loop.call_soon_threadsafe(self.tokens.put_nowait, None)


class _Detokenizer:
    """Turns streamed token ids into text deltas, holding back incomplete UTF-8 sequences."""

    def __init__(self, engine: ServingEngine) -> None:
        self.decode = engine.decode
        self.eos = set(engine.eos_ids)
        self.ids: list[int] = []
        self.sent = ""

    def push(self, tok: int) -> str:
        """The text ``tok`` adds ("" for an EOS token or an incomplete character)."""
        if tok in self.eos:
            return ""
        self.ids.append(tok)
        text = self.decode(self.ids)
        if text.endswith("\ufffd") or len(text) <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta

    def rest(self, text: str) -> str:
        """What the final ``text`` has beyond what was already sent."""
        if len(text) > len(self.sent) and text.startswith(self.sent):
            return text[len(self.sent) :]
        return ""


async def _stream_completion(call: _Call, *, include_usage: bool) -> Response:
    """SSE ``chat.completion.chunk`` events; errors before the first token keep their status."""
    feed = _TokenFeed(asyncio.get_running_loop(), call.config.request_timeout_s)
    try:
        fut = call.engine.submit(call.ticket, call.req, feed.cancel, feed.on_token, feed.on_prompt)
        fut.add_done_callback(feed.on_done)
        await _wait_for_prompt(call, feed, fut)
    except BaseException:
        call.ticket.release()
        raise
    stream = _sse_events(call, feed, fut, _Detokenizer(call.engine), include_usage)
    # If the client leaves before the first chunk, the generator never runs its ``finally``;
    # the finalizer still frees the slot and stops the generation (both are idempotent).
    weakref.finalize(stream, feed.cancel.set)
    weakref.finalize(stream, call.ticket.release)
    return StreamingResponse(stream, media_type="text/event-stream")


async def _wait_for_prompt(call: _Call, feed: _TokenFeed, fut: Future[GenerationOutput]) -> None:
    """Wait until the prompt is encoded, so encoding errors still get their status code."""
    timeout = call.config.request_timeout_s
    wrapped = asyncio.wrap_future(fut)
    done, _ = await asyncio.wait(
        {feed.prompt, wrapped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
    )
    if not done:
        feed.cancel.set()
        raise RequestTimeoutError(f"request did not start within {timeout} s")
    if wrapped in done and not feed.prompt.done():
        try:
            wrapped.result()
        except ChatEncodingError as exc:
            raise BadRequestError(str(exc)) from exc


async def _next_token(call: _Call, feed: _TokenFeed) -> int | None:
    """The next generated token, ``None`` once the generation ended; 504 past the deadline."""
    remaining = feed.deadline - feed.loop.time()
    try:
        return await asyncio.wait_for(feed.tokens.get(), max(remaining, 0.001))
    except TimeoutError:
        feed.cancel.set()
        timeout = call.config.request_timeout_s
        raise RequestTimeoutError(f"request did not finish within {timeout} s") from None


def _final_events(call: _Call, out: GenerationOutput, rest: str, include_usage: bool) -> list[str]:
    events: list[str] = []
    if rest:
        events.append(_sse(call.chunk({"content": rest}, None)))
    events.append(_sse(call.chunk({}, _finish_reason(out))))
    if include_usage:
        events.append(_sse({**call.chunk({}, None), "choices": [], "usage": _usage(out)}))
    events.append(_DONE)
    return events


async def _sse_events(
    call: _Call,
    feed: _TokenFeed,
    fut: Future[GenerationOutput],
    text: _Detokenizer,
    include_usage: bool,
) -> AsyncIterator[str]:
    """The SSE body; a mid-stream error becomes an error event, then ``[DONE]``."""
    first = True
    try:
        yield _sse(call.chunk({"role": "assistant", "content": ""}, None))
        try:
            while (tok := await _next_token(call, feed)) is not None:
                if first:
                    call.engine.metrics.ttft.observe(time.perf_counter() - call.start)
                    first = False
                if delta := text.push(tok):
                    yield _sse(call.chunk({"content": delta}, None))
            out = await asyncio.wrap_future(fut)
        except (ServingError, ChatEncodingError) as exc:
            err = exc if isinstance(exc, ServingError) else BadRequestError(str(exc))
            yield _sse(err.body())
            yield _DONE
            return
        # Free the slot before the last events: a client that sends its next request on
        # [DONE] must not find this one still counted (the batcher waits for counted ones).
        call.ticket.release()
        for event in _final_events(call, out, text.rest(out.text), include_usage):
            yield event
        call.record(out)
    finally:
        feed.cancel.set()  # a client that went away stops the generation at the next token
        call.ticket.release()


# --------------------------------------------------------------------------- routes

router = APIRouter()
"""Every route of the server; :func:`create_app` includes it."""


@router.get("/v1/models")
async def list_models(engine: EngineDep) -> dict[str, Any]:
    """OpenAI model list: the base model and every ``<base>:<adapter>``.

    An adapter whose directory records its training mazes' rendering (``maze_rendering.json``)
    also carries ``maze_rendering: {"cell_px": N}``, which ``maze-eval --endpoint`` reads.

    \f

    Args:
        engine: The app's engine.

    Returns:
        ``{"object": "list", "data": [model, ...]}``.
    """  # noqa: D301
    engine.require_ready()
    data: list[dict[str, Any]] = []
    for mid in engine.model_ids():
        entry: dict[str, Any] = {
            "id": mid,
            "object": "model",
            "created": engine.created,
            "owned_by": "maze-serving",
            "root": engine.base_name,
            "parent": None if mid == engine.base_name else engine.base_name,
        }
        cell_px = engine.cell_px(mid)
        if cell_px is not None:  # clients (maze-eval) render mazes as the adapter was trained
            entry["maze_rendering"] = {"cell_px": cell_px}
        version = engine.adapter_version(mid)
        if version is not None:  # trainers check which published version each engine serves
            entry["weight_sync_version"] = version
        data.append(entry)
    return {"object": "list", "data": data}


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, engine: EngineDep, config: ConfigDep
) -> Response:
    """OpenAI chat completions (text + ``image_url`` data-URI parts; ``stream`` for SSE).

    \f

    Args:
        body: The OpenAI request body.
        engine: The app's engine.
        config: The app's engine config (limits, timeout).

    Returns:
        A ``chat.completion`` JSON response, or an SSE stream of chunks.
    """  # noqa: D301
    return await _run_chat(body, "/v1/chat/completions", engine, config)


@router.post("/invocations")
async def invocations(
    body: ChatCompletionRequest, engine: EngineDep, config: ConfigDep
) -> Response:
    """SageMaker inference: a chat-completions body; ``model`` may be omitted.

    \f

    Args:
        body: The OpenAI request body.
        engine: The app's engine.
        config: The app's engine config (limits, timeout).

    Returns:
        Same as ``/v1/chat/completions``.
    """  # noqa: D301
    return await _run_chat(body, "/invocations", engine, config)


@router.get("/ping")
async def ping(engine: EngineDep) -> JSONResponse:
    """SageMaker health check: 200 only once a request can be served, at once either way.

    SageMaker reads a 200 as "ready for traffic", so loading answers 503 + ``Retry-After``.

    \f

    Args:
        engine: The app's engine.

    Returns:
        200 ``{"status": "ready"}``; 503 ``{"status": "loading"}`` with ``Retry-After``, or
        503 ``{"status": "failed", "error"}``.
    """  # noqa: D301
    return _readiness(engine, with_error=True)


@router.get("/health")
async def health(engine: EngineDep) -> JSONResponse:
    """vLLM-style readiness: 200 only once the model is loaded.

    \f

    Args:
        engine: The app's engine.

    Returns:
        ``{"status"}`` with 200 when ready, else 503 (``Retry-After`` while loading).
    """  # noqa: D301
    return _readiness(engine, with_error=False)


def _readiness(engine: ServingEngine, *, with_error: bool) -> JSONResponse:
    body: dict[str, Any] = {"status": engine.status}
    if engine.status == "ready":
        return JSONResponse(body)
    headers: dict[str, str] = {}
    if engine.status == "failed":
        if with_error:
            body["error"] = _printable(engine.load_error or "")
    else:
        headers["Retry-After"] = str(LOADING_RETRY_AFTER_S)
    return JSONResponse(body, status_code=503, headers=headers)


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(
    body: LoadLoraRequest, engine: EngineDep, cache_dir: CacheDirDep
) -> PlainTextResponse:
    """vLLM runtime LoRA loading; ``lora_path`` is a directory or an ``s3://`` prefix.

    \f

    Args:
        body: ``lora_name`` and ``lora_path``.
        engine: The app's engine.
        cache_dir: Where ``s3://`` adapters are downloaded.

    Returns:
        vLLM's plain-text success message.
    """  # noqa: D301, D403
    engine.require_ready()
    path = await asyncio.to_thread(resolve_location, body.lora_path, cache_dir)
    await engine.load_adapter(body.lora_name, path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/skyrl/v1/load_lora_adapter")
async def skyrl_load_lora_adapter(
    body: LoadLoraRequest, engine: EngineDep, cache_dir: CacheDirDep
) -> PlainTextResponse:
    """SkyRL's control-plane LoRA load: replaces an adapter of the same name in place.

    SkyRL's ``RemoteInferenceClient.load_lora_adapter`` posts here on every engine after each
    policy update. A weight-sync version directory is verified against its manifest first.

    \f

    Args:
        body: ``lora_name`` and ``lora_path``.
        engine: The app's engine.
        cache_dir: Where ``s3://`` adapters are downloaded.

    Returns:
        A plain-text success message naming the weight-sync version, if any.
    """  # noqa: D301
    engine.require_ready()
    try:
        path = await asyncio.to_thread(resolve_location, body.lora_path, cache_dir)
        version = await engine.reload_adapter(body.lora_name, path)
    except Exception:  # counted whatever the cause; the error still reaches the client
        engine.metrics.adapter_reload_failures.labels("in_place").inc()
        raise
    engine.metrics.adapter_reloads.labels("in_place").inc()
    which = "" if version is None else f" (weight-sync version {version})"
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' loaded{which}.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoraRequest, engine: EngineDep) -> PlainTextResponse:
    """vLLM runtime LoRA unloading; in-flight requests on the adapter finish first.

    \f

    Args:
        body: ``lora_name``.
        engine: The app's engine.

    Returns:
        vLLM's plain-text success message.
    """  # noqa: D301, D403
    engine.require_ready()
    engine.unload_adapter(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


@router.get("/metrics")
async def prometheus_metrics(engine: EngineDep) -> Response:
    """Prometheus exposition.

    \f

    Args:
        engine: The app's engine (it owns the metrics registry).

    Returns:
        The text exposition format.
    """  # noqa: D301
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# ------------------------------------------------------------------------------ app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncGenerator[None]:
    """Start loading the model when the server starts; stop the engine when it shuts down."""
    engine = cast(ServingEngine, app.state.engine)
    engine.start()
    try:
        yield
    finally:
        engine.close()


def create_app(
    config: EngineConfig,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cache_dir: str | None = None,
    engine: ServingEngine | None = None,
) -> FastAPI:
    """The server app for ``config``; the model starts loading when the app starts up.

    Args:
        config: Model location and the limits the server enforces.
        max_body_bytes: Request bodies over this many bytes get a 413.
        cache_dir: Where adapters downloaded from ``s3://`` paths go (default: the engine's
            download directory, a temp dir removed when the app shuts down).
        engine: A pre-built engine (e.g. one with a ``before_load`` hook); default: a new
            :class:`ServingEngine` for ``config``.

    Returns:
        The FastAPI app; ``app.state.engine`` is its engine.
    """
    eng = engine or ServingEngine(config)
    app = FastAPI(
        title="maze-serving",
        version="0.1.0",
        lifespan=_lifespan,
        description="OpenAI-compatible chat completions for a Qwen-VL model with LoRA adapters.",
    )
    app.state.engine = eng
    app.state.config = config
    app.state.cache_dir = cache_dir
    app.exception_handler(ServingError)(serving_error_handler)
    app.exception_handler(RequestValidationError)(validation_error_handler)
    app.exception_handler(StarletteHTTPException)(http_error_handler)
    app.include_router(router)
    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, metrics=eng.metrics)  # pyright: ignore[reportArgumentType]
    return app
