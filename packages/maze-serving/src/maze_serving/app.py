"""The ASGI app: OpenAI chat completions, vLLM LoRA routes, SageMaker ``/ping`` + ``/invocations``.

Every error is an OpenAI error body ``{"error": {"message", "type", "code"}}`` with the status
of its :mod:`maze_serving.errors` class; malformed input is never a 5xx.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from maze_engine.chat import ChatEncodingError
from maze_serving.engine import (
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


class _BodyTooLarge(StarletteHTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body is over the {limit} byte limit")


def _error_response(exc: ServingError) -> JSONResponse:
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _http_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        404: "not_found_error",
        405: "method_not_allowed",
        413: "payload_too_large",
    }.get(status, "invalid_request_error" if status < 500 else "internal_error")


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
            seen = 0

            async def limited_receive() -> Message:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > self.limit:
                        raise _BodyTooLarge(self.limit)
                return message

            await self.app(scope, limited_receive, counting_send)
        self.metrics.requests.labels(path, str(status["code"])).inc()


def _completion_body(
    rid: str, created: int, model: str, out: GenerationOutput, engine: ServingEngine
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": out.text},
        "finish_reason": "length" if out.finish_reason == "cancelled" else out.finish_reason,
        "logprobs": None,
    }
    if out.logprobs is not None:
        choice["logprobs"] = {
            "content": [
                {"token": engine.decode([t]), "logprob": lp, "token_id": t}
                for t, lp in zip(out.token_ids, out.logprobs, strict=True)
            ]
        }
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": len(out.token_ids),
            "total_tokens": out.prompt_tokens + len(out.token_ids),
        },
    }


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def create_app(
    config: EngineConfig,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cache_dir: str | None = None,
    engine: ServingEngine | None = None,
) -> FastAPI:
    """The server app for ``config``; the model starts loading when the app starts up.

    ``cache_dir`` receives adapters downloaded from ``s3://`` paths (default: a temp dir).
    ``engine`` lets a caller supply a pre-built engine (e.g. one with a ``before_load`` hook).
    """
    eng = engine or ServingEngine(config)
    metrics = eng.metrics
    cache = cache_dir or tempfile.mkdtemp(prefix="maze-serve-cache-")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncGenerator[None]:
        eng.start()
        try:
            yield
        finally:
            eng.close()

    app = FastAPI(
        title="maze-serving",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible chat completions for a Qwen-VL model with LoRA adapters.",
    )
    app.state.engine = eng

    @app.exception_handler(ServingError)
    async def _serving_error(_: Request, exc: ServingError) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        errs = exc.errors()
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errs[:5]
        )
        return _error_response(BadRequestError(f"invalid request: {detail}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        body = {
            "error": {
                "message": str(exc.detail),
                "type": _http_error_type(exc.status_code),
                "code": exc.status_code,
            }
        }
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def run_chat(body: ChatCompletionRequest, endpoint: str) -> Response:
        start = time.perf_counter()
        if (body.n or 1) != 1:
            raise BadRequestError("only n=1 is supported")
        messages = body.as_messages()
        if messages[-1]["role"] != "user":
            raise BadRequestError("the last message must have role 'user'")
        check_images(messages, config)
        params, seed = sampling_from_request(
            temperature=body.temperature,
            top_p=body.top_p,
            max_tokens=body.max_completion_tokens or body.max_tokens,
            seed=body.seed,
            config=config,
        )
        min_new = params.max_new_tokens if body.ignore_eos else (body.min_tokens or 0)
        req = GenerationRequest(messages, params, seed, min_new, bool(body.logprobs))
        ticket = eng.admit(body.model)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        if body.stream:
            return await _stream(
                ticket, req=req, rid=rid, created=created, body=body, endpoint=endpoint, start=start
            )
        cancel = threading.Event()
        try:
            fut = eng.submit(ticket, req, cancel)
            try:
                out = await asyncio.wait_for(asyncio.wrap_future(fut), config.request_timeout_s)
            except TimeoutError:
                cancel.set()
                raise RequestTimeoutError(
                    f"request did not finish within {config.request_timeout_s} s"
                ) from None
            except ChatEncodingError as exc:
                raise BadRequestError(str(exc)) from exc
        finally:
            ticket.release()
        metrics.prompt_tokens.labels(ticket.model).inc(out.prompt_tokens)
        metrics.generation_tokens.labels(ticket.model).inc(len(out.token_ids))
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        return JSONResponse(_completion_body(rid, created, ticket.model, out, eng))

    async def _stream(
        ticket: Ticket,
        *,
        req: GenerationRequest,
        rid: str,
        created: int,
        body: ChatCompletionRequest,
        endpoint: str,
        start: float,
    ) -> Response:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[int | None] = asyncio.Queue()
        prompt: asyncio.Future[int] = loop.create_future()
        cancel = threading.Event()

        def on_prompt(n: int) -> None:
            loop.call_soon_threadsafe(lambda: prompt.done() or prompt.set_result(n))

        def on_token(tok: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, tok)

        deadline = loop.time() + config.request_timeout_s
        try:
            fut = eng.submit(ticket, req, cancel, on_token, on_prompt)
            fut.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
            wrapped = asyncio.wrap_future(fut)
            # Wait until the prompt is encoded, so encoding errors still get their status code.
            done, _ = await asyncio.wait(
                {prompt, wrapped},
                timeout=config.request_timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if not done:
                cancel.set()
                raise RequestTimeoutError(
                    f"request did not start within {config.request_timeout_s} s"
                )
            if wrapped in done and not prompt.done():
                try:
                    wrapped.result()
                except ChatEncodingError as exc:
                    raise BadRequestError(str(exc)) from exc
        except BaseException:
            ticket.release()
            raise
        eos = set(eng.eos_ids)
        opts: Any = (body.model_extra or {}).get("stream_options")
        include_usage = isinstance(opts, dict) and bool(
            cast(dict[str, Any], opts).get("include_usage")
        )

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": ticket.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        async def events() -> AsyncIterator[str]:
            ids: list[int] = []
            sent = ""
            finish = "stop"
            first = True
            try:
                yield _sse(chunk({"role": "assistant", "content": ""}, None))
                while True:
                    remaining = deadline - loop.time()
                    try:
                        tok = await asyncio.wait_for(queue.get(), max(remaining, 0.001))
                    except TimeoutError:
                        cancel.set()
                        err = RequestTimeoutError(
                            f"request did not finish within {config.request_timeout_s} s"
                        )
                        yield _sse(err.body())
                        yield "data: [DONE]\n\n"
                        return
                    if tok is None:
                        break
                    if first:
                        metrics.ttft.observe(time.perf_counter() - start)
                        first = False
                    if tok in eos:
                        continue
                    ids.append(tok)
                    text = eng.decode(ids)
                    if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more
                        continue
                    if len(text) > len(sent):
                        yield _sse(chunk({"content": text[len(sent) :]}, None))
                        sent = text
                try:
                    out = await asyncio.wrap_future(fut)
                except (ServingError, ChatEncodingError) as exc:
                    err = exc if isinstance(exc, ServingError) else BadRequestError(str(exc))
                    yield _sse(err.body())
                    yield "data: [DONE]\n\n"
                    return
                text = out.text
                if len(text) > len(sent) and text.startswith(sent):
                    yield _sse(chunk({"content": text[len(sent) :]}, None))
                finish = "length" if out.finish_reason == "cancelled" else out.finish_reason
                yield _sse(chunk({}, finish))
                if include_usage:
                    n = len(out.token_ids)
                    usage = {
                        "prompt_tokens": out.prompt_tokens,
                        "completion_tokens": n,
                        "total_tokens": out.prompt_tokens + n,
                    }
                    yield _sse({**chunk({}, None), "choices": [], "usage": usage})
                yield "data: [DONE]\n\n"
                metrics.prompt_tokens.labels(ticket.model).inc(out.prompt_tokens)
                metrics.generation_tokens.labels(ticket.model).inc(len(out.token_ids))
                metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
            finally:
                cancel.set()  # a client that went away stops the generation at the next token
                ticket.release()

        stream = events()
        # If the client leaves before the first chunk, the generator never runs its ``finally``;
        # the finalizer still frees the slot and stops the generation (both are idempotent).
        weakref.finalize(stream, cancel.set)
        weakref.finalize(stream, ticket.release)
        return StreamingResponse(stream, media_type="text/event-stream")

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:  # pyright: ignore[reportUnusedFunction]
        """OpenAI model list: the base model and every ``<base>:<adapter>``."""
        eng.require_ready()
        data = [
            {
                "id": mid,
                "object": "model",
                "created": eng.created,
                "owned_by": "maze-serving",
                "root": eng.base_name,
                "parent": None if mid == eng.base_name else eng.base_name,
            }
            for mid in eng.model_ids()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """OpenAI chat completions (text + ``image_url`` data-URI parts; ``stream`` for SSE)."""
        return await run_chat(body, "/v1/chat/completions")

    @app.post("/invocations")
    async def invocations(body: ChatCompletionRequest) -> Response:  # pyright: ignore[reportUnusedFunction]
        """SageMaker inference: a chat-completions body; ``model`` may be omitted."""
        return await run_chat(body, "/invocations")

    @app.get("/ping")
    async def ping() -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        """SageMaker health check: 200 at once, also while the model loads (see ``status``)."""
        body: dict[str, Any] = {"status": eng.status}
        if eng.status == "failed":
            body["error"] = eng.load_error
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    @app.get("/health")
    async def health() -> JSONResponse:  # pyright: ignore[reportUnusedFunction]
        """vLLM-style readiness: 200 only once the model is loaded."""
        code = 200 if eng.status == "ready" else 503
        return JSONResponse({"status": eng.status}, status_code=code)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoraRequest) -> PlainTextResponse:  # pyright: ignore[reportUnusedFunction]
        """vLLM runtime LoRA loading; ``lora_path`` is a directory or an ``s3://`` prefix."""
        eng.require_ready()
        path = await asyncio.to_thread(resolve_location, body.lora_path, cache)
        await eng.load_adapter(body.lora_name, path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoraRequest) -> PlainTextResponse:  # pyright: ignore[reportUnusedFunction]
        """vLLM runtime LoRA unloading; in-flight requests on the adapter finish first."""
        eng.require_ready()
        eng.unload_adapter(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:  # pyright: ignore[reportUnusedFunction]
        """Prometheus exposition."""
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_Guard, max_body_bytes=max_body_bytes, metrics=metrics)  # pyright: ignore[reportArgumentType]
    return app
