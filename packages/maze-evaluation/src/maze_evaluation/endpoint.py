"""Backend for any OpenAI-compatible chat endpoint (our server, vLLM, Ray Serve LLM).

Each turn sends the whole conversation so far (system, user turns with ``image_url`` data URIs,
assistant replies), as OpenAI clients do, or, for a policy trained in another ``context``
(``latest``, ``recent``, ``route``), the part of it that policy answers from. Requests are bounded by a
semaphore, time out, and are retried with exponential backoff on 429, 5xx and connection errors,
honouring Retry-After.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import httpx

from maze_evaluation.episodes import Job, Played
from maze_evaluation.errors import EndpointError
from maze_evaluation.records import Identity
from maze_policy.sampling import SamplingParams

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


def chat_url(endpoint: str) -> str:
    """``http://host:port``, ``.../v1`` or the full ``.../v1/chat/completions`` URL."""
    base = endpoint.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + "/v1/chat/completions"


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff


class EndpointBackend:
    """Plays episodes through an OpenAI-compatible chat endpoint, ``concurrency`` at a time."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        concurrency: int = 8,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        api_key: str | None = None,
        adapter: str | None = None,
        version: int | None = None,
        context: str = "full",
    ) -> None:
        from maze_policy.contexts import check_context

        check_context(context)
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if retries < 0 or timeout <= 0:
            raise ValueError(f"need retries >= 0 and timeout > 0, got {retries}, {timeout}")
        self.url = chat_url(endpoint)
        self.model = model
        self.context = context
        self.concurrency = concurrency
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._identity = Identity("endpoint", f"{self.url}#{model}", adapter, version, context)
        self.requests = 0
        self.retried = 0

    @property
    def identity(self) -> Identity:
        return self._identity

    def play(
        self, jobs: Sequence[Job], sampling: SamplingParams, on_done: Callable[[Played], None]
    ) -> None:
        if jobs:
            asyncio.run(self._play_all(jobs, sampling, on_done))

    async def _play_all(
        self, jobs: Sequence[Job], sampling: SamplingParams, on_done: Callable[[Played], None]
    ) -> None:
        sem = asyncio.Semaphore(self.concurrency)
        limits = httpx.Limits(max_connections=self.concurrency)
        async with httpx.AsyncClient(
            timeout=self.timeout, limits=limits, headers=self.headers
        ) as client:
            tasks = [asyncio.create_task(self._episode(client, sem, job, sampling)) for job in jobs]
            try:
                for fut in asyncio.as_completed(tasks):
                    on_done(await fut)
            finally:
                # First failure ends the run: finished episodes are already written, the rest
                # are played again by --resume.
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _episode(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, job: Job, sampling: SamplingParams
    ) -> Played:
        # maze_policy.rollout imports torch (its chat and policy modules): load it on first use,
        # so importing this backend stays light.
        from maze_policy.rollout import in_context, make_env

        t0 = time.monotonic()
        env = make_env(job.row)
        prompt, _ = env.init(list(job.row["prompt"]))
        messages: list[dict[str, Any]] = list(prompt)
        replies: list[str] = []
        reward = 0.0
        while True:
            sent = in_context(messages, self.context)
            text = await self.chat(client, sem, sent, sampling, job.seed)
            replies.append(text)
            out = cast(Mapping[str, Any], env.step(text))
            if out["done"]:
                reward = float(out["reward"])
                break
            messages.append({"role": "assistant", "content": text})
            messages.extend(cast(Sequence[dict[str, Any]], out["observations"]))
        env.close()
        return Played(job, replies, reward, time.monotonic() - t0)

    def request_body(
        self, messages: Sequence[Mapping[str, Any]], sampling: SamplingParams, seed: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "max_tokens": sampling.max_new_tokens,
        }
        if sampling.greedy:
            body["temperature"] = 0.0
        else:
            body.update(temperature=sampling.temperature, top_p=sampling.top_p, seed=seed)
        return body

    async def chat(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        messages: Sequence[Mapping[str, Any]],
        sampling: SamplingParams,
        seed: int,
    ) -> str:
        """One completion, retried; raises :class:`EndpointError` with the last cause."""
        body = self.request_body(messages, sampling, seed)
        last = ""
        for attempt in range(self.retries + 1):
            wait: float | None = None
            async with sem:
                self.requests += 1
                try:
                    resp = await client.post(self.url, json=body)
                except httpx.TransportError as exc:  # connection errors and timeouts
                    last = f"{type(exc).__name__}: {exc}"
                else:
                    if resp.status_code == 200:
                        return self._content(resp)
                    last = f"HTTP {resp.status_code}: {resp.text[:300]}"
                    if resp.status_code not in RETRY_STATUSES:
                        raise EndpointError(
                            f"{self.url} (model {self.model!r}) refused the request: {last}"
                        )
                    wait = _retry_after(resp)
            if attempt == self.retries:
                break
            self.retried += 1
            delay = (
                self.backoff * 2**attempt * (0.5 + random.random() / 2) if wait is None else wait
            )
            await asyncio.sleep(min(delay, self.max_backoff))
        raise EndpointError(
            f"{self.url} (model {self.model!r}) failed after {self.retries + 1} attempts; last error: {last}"
        )

    def _content(self, resp: httpx.Response) -> str:
        try:
            data = resp.json()
            content = data["choices"][0]["message"].get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise EndpointError(
                f"{self.url}: response is not an OpenAI chat completion ({exc!r}): {resp.text[:300]}"
            ) from exc
        # A null content (e.g. only a refusal or tool call) is an empty reply: an invalid turn.
        return content if isinstance(content, str) else ""
