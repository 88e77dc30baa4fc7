"""The serving engine: one model instance, LoRA adapters by name, one generation worker.

Everything that touches the model (encoding images, ``set_adapter`` + ``generate``, loading and
deleting adapters) runs on a single worker thread, so an adapter switch can never interleave
with a generation. A request *pins* the adapter it resolved on admission (a reference count):
hot reload loads each new weight-sync version under a new name (``v<N>``), swaps the ``latest``
alias atomically, and deletes the old version only when no admitted request still holds it.

Requests are batched dynamically: each worker turn takes the queued requests (up to
``batch_max_size``), encodes each on its own (a bad image or an over-long prompt fails only
that request), and generates those on the same adapter in one ``generate`` call that keeps each
request's sampling parameters, seed and limits (:mod:`maze_serving.batching`). Under
concurrent load a turn keeps taking (and encoding) requests for up to ``batch_wait_ms`` until
it holds as many as were admitted at once since the previous turn, so clients answered together
are generated together again instead of in alternating halves; a request that arrives alone
starts at once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import io
import logging
import random
import shutil
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from PIL import Image

from maze_policy.chat import Trajectory
from maze_policy.contexts import PER_TURN_CONTEXTS, check_context
from maze_policy.errors import ChatEncodingError, ModelLoadError
from maze_policy.model import load_vlm
from maze_policy.policy import Policy
from maze_policy.sampling import SamplingParams
from maze_serving.batching import Row, RowResult, generate_rows
from maze_serving.errors import (
    BadRequestError,
    ModelNotFoundError,
    NotReadyError,
    OverloadedError,
    PayloadTooLargeError,
    ServingError,
)
from maze_serving.metrics import ServingMetrics
from maze_serving.sources import resolve_location

log = logging.getLogger(__name__)

LATEST_ALIAS = "latest"
"""Adapter name under which the newest hot-reloaded weight-sync version is served."""

LOADING_RETRY_AFTER_S = 2
"""``Retry-After`` seconds of the 503 answers while the model loads."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Where the model comes from and the limits the engine enforces."""

    model_path: str
    """A Hugging Face Qwen2-VL / Qwen3-VL directory, or an ``s3://`` prefix holding one."""
    served_model_name: str | None = None
    """Base model id in requests and ``/v1/models``; default: the directory name."""
    adapters: Mapping[str, str] = field(default_factory=dict[str, str])
    """Adapters to load at startup, ``{name: directory or s3:// prefix}``."""
    cache_dir: str | None = None
    """Where ``s3://`` downloads go (default: a temp dir made at the first download and removed
    when the engine closes)."""
    default_adapter: str | None = None
    """Adapter used when a request names no model (``/invocations``); default: the base."""
    watch_dir: str | None = None
    """A weight-sync store root to follow; each new verified version is served as ``latest``."""
    watch_poll_s: float = 0.5
    max_pending: int = 8
    """Admitted requests (running + queued) before 429."""
    request_timeout_s: float = 60.0
    max_new_tokens_limit: int = 2048
    default_max_tokens: int = 256
    max_model_len: int = 8192
    max_image_bytes: int = 8 * 1024 * 1024
    max_image_pixels: int = 4096 * 4096
    max_images: int = 16
    threads: int | None = None
    """torch intra-op threads for the worker (None: torch's default)."""
    batch_max_size: int = 8
    """Most requests generated together in one batch; 1 turns batching off."""
    batch_wait_ms: float = 100.0
    """Under concurrent load, how long a batch waits for more requests to join (see the module
    docstring); a request arriving alone never waits."""
    context: str = "full"
    """What each request is answered from, as the served policy was trained (maze-train's
    ``local.context``): ``full`` answers the conversation as sent; ``latest``, ``recent`` and
    ``route`` answer the part of it the policy saw in training (``maze_policy.rollout.in_context``), so
    OpenAI clients that send the whole conversation get the policy's trained behaviour."""

    def __post_init__(self) -> None:
        check_context(self.context)
        if self.batch_max_size < 1:
            raise ValueError(f"batch_max_size must be >= 1, got {self.batch_max_size}")
        if self.batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms}")

    @property
    def base_name(self) -> str:
        return self.served_model_name or Path(self.model_path.rstrip("/")).name


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One chat generation: messages, sampling, seed, minimum length, whether to return logprobs."""

    messages: Sequence[Mapping[str, Any]]
    params: SamplingParams
    seed: int
    min_new_tokens: int = 0
    logprobs: bool = False


@dataclass(slots=True)
class GenerationOutput:
    """What one generation produced.

    ``finish_reason`` is ``"stop"``, ``"length"`` or ``"cancelled"`` (the client went away or the
    request timed out).
    """

    token_ids: list[int]
    text: str
    logprobs: list[float] | None
    prompt_tokens: int
    finish_reason: str


@dataclass(eq=False, slots=True)
class _Pending:
    """A submitted request waiting for (or in) a batch; ``future`` gets its output or error."""

    adapter: str | None
    req: GenerationRequest
    cancel: threading.Event
    on_token: Callable[[int], None] | None
    on_prompt: Callable[[int], None] | None
    future: Future[GenerationOutput]
    traj: Trajectory | None = None


def _verify_published(path: str) -> int | None:
    """Verify a weight-sync version directory against its manifest; None if ``path`` is not one."""
    from weight_sync import AdapterStore, WeightSyncError
    from weight_sync.manifest import MANIFEST_NAME, parse_version_dir

    p = Path(path)
    version = parse_version_dir(p.name)
    if version is None or not (p / MANIFEST_NAME).is_file():
        return None
    try:
        AdapterStore(p.parent.parent).verify(version, use_cache=False)
    except WeightSyncError as exc:
        raise BadRequestError(f"refusing adapter {path!r}: {exc}") from exc
    return version


@dataclass(slots=True)
class _Adapter:
    name: str
    path: str
    version: int | None = None
    refs: int = 0
    retired: bool = False
    cell_px: int | None = None
    """Square size of the mazes it was trained on (its ``maze_rendering.json``), if recorded."""


def check_images(messages: Sequence[Mapping[str, Any]], config: EngineConfig) -> None:
    """Enforce image count, encoded size and pixel limits before any image is decoded fully.

    Raises :class:`PayloadTooLargeError` (413) over a limit and :class:`BadRequestError` (400)
    for data that is not a readable base64 image.
    """
    n = 0
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for part in cast(list[Any], content):
            if not isinstance(part, Mapping) or "image_url" not in part:
                continue
            url: Any = cast(Mapping[str, Any], part)["image_url"]
            if isinstance(url, Mapping):
                url = cast(Mapping[str, Any], url).get("url")
            n += 1
            if n > config.max_images:
                raise PayloadTooLargeError(f"more than {config.max_images} images in one request")
            if not isinstance(url, str) or not url.startswith("data:"):
                raise BadRequestError(
                    "image_url must be a base64 data URI (data:image/...;base64,)"
                )
            header, _, payload = url.partition(",")
            if ";base64" not in header:
                raise BadRequestError(f"image data URI is not base64-encoded: {header[:40]!r}")
            if len(payload) * 3 // 4 > config.max_image_bytes:
                raise PayloadTooLargeError(
                    f"image {n} is {len(payload) * 3 // 4} bytes, over the {config.max_image_bytes} byte limit"
                )
            try:
                raw = base64.b64decode(payload, validate=True)
                with Image.open(io.BytesIO(raw)) as img:  # reads the header only
                    w, h = img.size
            except (binascii.Error, ValueError, OSError, Image.DecompressionBombError) as exc:
                raise BadRequestError(f"image {n}: cannot decode base64 image data: {exc}") from exc
            if w * h > config.max_image_pixels:
                raise PayloadTooLargeError(
                    f"image {n} is {w}x{h} pixels, over the {config.max_image_pixels} pixel limit"
                )


class ServingEngine:
    """Loads the model in the background and serves generations; see the module docstring."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        metrics: ServingMetrics | None = None,
        before_load: Callable[[], object] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or ServingMetrics()
        self.base_name = config.base_name
        self.metrics.count_model(self.base_name)
        self._before_load = before_load
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maze-serve-gen")
        self._lock = threading.Lock()
        self._adapters: dict[str, _Adapter] = {}
        self._aliases: dict[str, str] = {}
        self._reloads = 0
        self._inflight = 0
        self._policy: Policy | None = None
        self._peft: Any = None
        self._base_model: Any = None
        self.status = "loading"
        self.load_error: str | None = None
        self.active_version: int | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._queue: deque[_Pending] = deque()
        self._queued = threading.Condition()
        # Read at scrape time: the queue changes in several places, the length is always right.
        self.metrics.requests_waiting.set_function(lambda: len(self._queue))
        self._peak_inflight = 0
        self.created = int(time.time())
        self._temp_cache: str | None = None
        self._temp_cache_lock = threading.Lock()

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start loading in the background; returns at once (``/ping`` answers meanwhile)."""
        t = threading.Thread(target=self._load_all, name="maze-serve-load", daemon=True)
        t.start()
        self._threads.append(t)

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def download_dir(self) -> str:
        """Where ``s3://`` downloads go: ``config.cache_dir``, else the engine's own temp dir.

        The temp dir is made on first use, so a server that downloads nothing leaves nothing
        behind, and :meth:`close` removes it.
        """
        if self.config.cache_dir is not None:
            return self.config.cache_dir
        with self._temp_cache_lock:
            if self._temp_cache is None:
                self._temp_cache = tempfile.mkdtemp(prefix="maze-serve-")
            return self._temp_cache

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._worker.shutdown(wait=False, cancel_futures=True)
        with self._queued:
            left = list(self._queue)
            self._queue.clear()
        for item in left:
            if item.future.set_running_or_notify_cancel():
                item.future.set_exception(NotReadyError("the server is shutting down"))
        with self._temp_cache_lock:
            if self._temp_cache is not None:  # downloads were loaded into memory: not needed now
                shutil.rmtree(self._temp_cache, ignore_errors=True)
                self._temp_cache = None

    def _resolve(self, location: str) -> str:
        """A local path for ``location`` (a directory, or an ``s3://`` prefix downloaded here)."""
        if location.startswith("s3://"):
            return resolve_location(location, self.download_dir())
        return location

    def _load_all(self) -> None:
        try:
            if self._before_load is not None:
                self._before_load()
            # Downloads happen here, in the background, so /ping answers while they run.
            model_path = self._resolve(self.config.model_path)
            self._worker.submit(self._load_base, model_path).result()
            for name, path in self.config.adapters.items():
                local = self._resolve(path)
                self._worker.submit(self._load_adapter_sync, name, local, None).result()
            self.status = "ready"
        except (ServingError, ModelLoadError, OSError, ValueError, RuntimeError) as exc:
            self.status = "failed"
            self.load_error = str(exc)
            log.error("model load failed: %s", exc)
            return
        finally:
            self._ready.set()
        if self.config.watch_dir is not None:
            t = threading.Thread(target=self._follow, name="maze-serve-reload", daemon=True)
            t.start()
            self._threads.append(t)

    def _load_base(self, model_path: str) -> None:
        if self.config.threads is not None:
            torch.set_num_threads(self.config.threads)
        model, processor = load_vlm(model_path)
        self._base_model = model
        self._policy = Policy(model, processor)

    # ------------------------------------------------------------------ adapters

    def _load_adapter_sync(self, name: str, path: str, version: int | None) -> None:
        """Worker thread only: add ``path`` to the shared peft model as ``name``."""
        from peft import PeftModel

        from maze_env.errors import RenderingError
        from maze_env.render import read_rendering
        from maze_policy.contexts import read_context
        from maze_policy.errors import ContextRecordError

        p = Path(path)
        if not (p / "adapter_config.json").is_file():
            raise ModelNotFoundError(f"no LoRA adapter at {path!r} (adapter_config.json missing)")
        try:
            rendering = read_rendering(p)
            trained_in = read_context(p)
        except (RenderingError, ContextRecordError) as exc:
            raise BadRequestError(f"cannot load LoRA adapter {name!r}: {exc}") from exc
        if trained_in is not None and trained_in != self.config.context:
            # Served anyway (a deliberate comparison is legitimate), but never silently.
            log.warning(
                "adapter %s was trained in context %r; this server answers in %r (--context)",
                name,
                trained_in,
                self.config.context,
            )
        try:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(
                    self._base_model, str(p), adapter_name=name, is_trainable=False
                )
                self._peft.eval()
                assert self._policy is not None
                self._policy.model = self._peft
            else:
                self._peft.load_adapter(str(p), adapter_name=name, is_trainable=False)
        except (ValueError, KeyError, RuntimeError, OSError, TypeError) as exc:
            raise BadRequestError(
                f"cannot load LoRA adapter {name!r} from {path!r}: {exc}"
            ) from exc
        with self._lock:
            self._adapters[name] = _Adapter(
                name, str(p), version, cell_px=None if rendering is None else rendering.cell_px
            )
        self.metrics.adapters_loaded.set(len(self._adapters))

    def _delete_adapter_sync(self, name: str) -> None:
        if self._peft is None or name not in self._peft.peft_config:
            return
        with warnings.catch_warnings():
            # peft warns when the deleted adapter was the active one; the next request sets its own.
            warnings.simplefilter("ignore", UserWarning)
            self._peft.delete_adapter(name)
        log.info("unloaded adapter %s", name)

    def _retire_idle(self) -> None:
        """Queue deletion of retired adapters no admitted request holds (caller holds the lock)."""
        for a in list(self._adapters.values()):
            if a.retired and a.refs == 0:
                del self._adapters[a.name]
                self._worker.submit(self._delete_adapter_sync, a.name)
        self.metrics.adapters_loaded.set(len(self._adapters))

    async def load_adapter(self, name: str, path: str) -> None:
        """Load an adapter directory under a new name (vLLM's ``/v1/load_lora_adapter``)."""
        self.require_ready()
        if (
            not name
            or ":" in name
            or "@" in name
            or name == LATEST_ALIAS
            or (name.startswith("v") and name[1:].isdigit())
        ):
            raise BadRequestError(
                f"invalid lora_name {name!r}: must be non-empty, without ':' or '@', and not 'latest' or 'v<N>' (reserved for hot reload)"
            )
        with self._lock:
            if name in self._aliases or (
                name in self._adapters and not self._adapters[name].retired
            ):
                raise BadRequestError(f"LoRA adapter {name!r} is already loaded")
        fut = self._worker.submit(self._load_adapter_sync, name, path, None)
        await asyncio.wrap_future(fut)
        self.metrics.count_model(f"{self.base_name}:{name}")

    async def reload_adapter(self, name: str, path: str) -> int | None:
        """Load ``path`` as ``name``, replacing an adapter of that name in place.

        SkyRL's ``/skyrl/v1/load_lora_adapter`` contract: the trainer loads each new adapter
        under the policy's one LoRA name. A weight-sync version directory
        (``.../versions/v<N>``) is verified against its manifest first, so a torn or altered
        version is refused; returns its version, or None for a plain adapter directory.
        Requests already running on the old adapter finish on it.
        """
        self.require_ready()
        if not name or ":" in name or "@" in name or name == LATEST_ALIAS:
            raise BadRequestError(
                f"invalid lora_name {name!r}: must be non-empty, without ':' or '@', and not 'latest'"
            )
        version = await asyncio.to_thread(_verify_published, path)
        with self._lock:
            self._reloads += 1
            internal = f"{name}@{self._reloads}"
        fut = self._worker.submit(self._load_adapter_sync, internal, path, version)
        await asyncio.wrap_future(fut)
        with self._lock:
            old = self._aliases.get(name, name if name in self._adapters else None)
            self._aliases[name] = internal
            if old is not None and old in self._adapters:
                self._adapters[old].retired = True
            self._retire_idle()
        self.metrics.count_model(f"{self.base_name}:{name}")
        if version is not None:
            self.metrics.active_adapter_version.set(version)
        log.info("reloaded adapter %s from %s (version %s)", name, path, version)
        return version

    def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name`` (vLLM's ``/v1/unload_lora_adapter``).

        New requests for it get a 404 at once; in-flight ones finish first.
        """
        with self._lock:
            if name != LATEST_ALIAS and name in self._aliases:  # loaded in place (SkyRL's load)
                target = self._aliases.pop(name)
                if target in self._adapters:
                    self._adapters[target].retired = True
                self._retire_idle()
                return
            a = self._adapters.get(name)
            if a is None or a.retired or a.version is not None:
                raise ModelNotFoundError(f"no loaded LoRA adapter named {name!r}")
            a.retired = True
            self._retire_idle()

    def _follow(self) -> None:
        from weight_sync import AdapterStore, Subscriber, WeightSyncError

        assert self.config.watch_dir is not None
        try:
            store = AdapterStore(self.config.watch_dir)
        except WeightSyncError as exc:
            log.error("cannot follow %s: %s", self.config.watch_dir, exc)
            return
        with Subscriber(store, poll_interval=self.config.watch_poll_s) as sub:
            for pv in sub.iter_versions(stop=self._stop):
                name = f"v{pv.version}"
                try:
                    self._worker.submit(
                        self._load_adapter_sync, name, str(pv.path), pv.version
                    ).result()
                except (ServingError, RuntimeError) as exc:
                    log.error("hot reload of version %d failed: %s", pv.version, exc)
                    self.metrics.adapter_reload_failures.labels("watch").inc()
                    continue
                with self._lock:
                    old = self._aliases.get(LATEST_ALIAS)
                    self._aliases[LATEST_ALIAS] = name
                    self.active_version = pv.version
                    if old is not None and old in self._adapters:
                        self._adapters[old].retired = True
                    self._retire_idle()
                self.metrics.active_adapter_version.set(pv.version)
                self.metrics.count_model(f"{self.base_name}:{LATEST_ALIAS}")
                self.metrics.adapter_reloads.labels("watch").inc()
                log.info("hot reload: serving weight-sync version %d as %s", pv.version, name)

    # ------------------------------------------------------------------ requests

    def require_ready(self) -> None:
        if self.status == "loading":
            raise NotReadyError("model is still loading", retry_after=LOADING_RETRY_AFTER_S)
        if self.status == "failed":
            raise NotReadyError(f"model failed to load: {self.load_error}")

    def cell_px(self, model_id: str) -> int | None:
        """The recorded maze square size of ``model_id``'s adapter (aliases resolved), if any."""
        prefix = f"{self.base_name}:"
        if not model_id.startswith(prefix):
            return None
        with self._lock:
            name = model_id[len(prefix) :]
            a = self._adapters.get(self._aliases.get(name, name))
            return None if a is None else a.cell_px

    def adapter_version(self, model_id: str) -> int | None:
        """The weight-sync version ``model_id``'s adapter was loaded from (aliases resolved)."""
        name = model_id.removeprefix(f"{self.base_name}:")
        with self._lock:
            a = self._adapters.get(self._aliases.get(name, name))
            return None if a is None or model_id == self.base_name else a.version

    def model_ids(self) -> list[str]:
        with self._lock:
            # ``name@N`` adapters are in-place reloads, reachable only through their alias.
            names = [a.name for a in self._adapters.values() if not a.retired and "@" not in a.name]
            names += [alias for alias, target in self._aliases.items() if target in self._adapters]
        return [self.base_name, *(f"{self.base_name}:{n}" for n in sorted(names))]

    def admit(self, model: str | None) -> Ticket:
        """Resolve ``model`` and reserve a slot; raises 404 / 429 / 503. Release the ticket."""
        self.require_ready()
        if model is None or model == "":
            model = self.base_name
            if self.config.default_adapter is not None:
                model = f"{self.base_name}:{self.config.default_adapter}"
        with self._lock:
            adapter: str | None
            if model == self.base_name:
                adapter = None
            else:
                name = model.removeprefix(f"{self.base_name}:")
                name = self._aliases.get(name, name)
                a = self._adapters.get(name)
                if a is None or (a.retired and name not in self._aliases.values()):
                    raise ModelNotFoundError(
                        f"the model {model!r} does not exist; see GET /v1/models"
                    )
                adapter = name
            if self._inflight >= self.config.max_pending:
                raise OverloadedError(
                    f"server is at its limit of {self.config.max_pending} concurrent requests",
                    retry_after=1,
                )
            self._inflight += 1
            self._peak_inflight = max(self._peak_inflight, self._inflight)
            if adapter is not None:
                self._adapters[adapter].refs += 1
        self.metrics.requests_running.set(self._inflight)
        return Ticket(self, model, adapter)

    def _release(self, adapter: str | None) -> None:
        with self._lock:
            self._inflight -= 1
            if adapter is not None and adapter in self._adapters:
                self._adapters[adapter].refs -= 1
            self._retire_idle()
        self.metrics.requests_running.set(self._inflight)

    def _take(self, want: int, deadline: float) -> list[_Pending] | None:
        """Worker thread: up to ``want`` queued requests, waiting until ``deadline`` for one.

        ``None`` when none came; requests whose client already gave up (a cancelled future) are
        dropped from the list.
        """
        with self._queued:
            while not self._queue and (left := deadline - time.monotonic()) > 0:
                self._queued.wait(left)
            if not self._queue:
                return None
            taken = [self._queue.popleft() for _ in range(min(want, len(self._queue)))]
        return [item for item in taken if item.future.set_running_or_notify_cancel()]

    def _prepare(self, item: _Pending, policy: Policy) -> bool:
        """Encode one request; on any problem fail only its future and return False."""
        try:
            if item.cancel.is_set():  # timed out while queued
                item.future.set_result(GenerationOutput([], "", None, 0, "cancelled"))
                return False
            # A per-turn policy was trained on each turn rendered whole (``encoder.start``), the
            # previous reply of ``recent`` included; other conversations are encoded turn by turn.
            encode = (
                policy.encoder.start
                if self.config.context in PER_TURN_CONTEXTS
                else policy.encoder.encode_conversation
            )
            try:
                traj = encode(item.req.messages)
            except ChatEncodingError as exc:
                raise BadRequestError(str(exc)) from exc
            except ValueError as exc:  # the image processor's refusals (e.g. aspect ratio)
                raise BadRequestError(f"cannot encode the conversation: {exc}") from exc
            max_new = item.req.params.max_new_tokens
            if len(traj) + max_new > self.config.max_model_len:
                raise BadRequestError(
                    f"prompt ({len(traj)} tokens) + max_tokens ({max_new}) exceeds the model's "
                    f"context of {self.config.max_model_len} tokens"
                )
            if item.on_prompt is not None:  # a stream starts only for a request that fits
                item.on_prompt(len(traj))
        except Exception as exc:  # one request's failure must not fail its batch
            item.future.set_exception(exc)
            return False
        item.traj = traj
        return True

    def _generate_batch(self, adapter: str | None, items: list[_Pending], policy: Policy) -> None:
        """Worker thread: one ``generate`` call for ``items`` (all on ``adapter``)."""
        rows = [
            Row(
                traj=cast(Trajectory, item.traj),
                params=item.req.params,
                seed=item.req.seed,
                min_new_tokens=min(item.req.min_new_tokens, item.req.params.max_new_tokens),
                logprobs=item.req.logprobs,
                cancel=item.cancel,
                on_token=item.on_token,
                # Answered as soon as its row is done, not when the batch's longest one is.
                on_finish=functools.partial(self._finish, item),
            )
            for item in items
        ]
        model: Any = self._peft if self._peft is not None else self._base_model
        try:
            ctx: AbstractContextManager[Any] = nullcontext()
            if self._peft is not None:
                if adapter is None:
                    ctx = self._peft.disable_adapter()
                else:
                    self._peft.set_adapter(adapter)
            with ctx:
                results = generate_rows(policy, model, rows)
        except Exception as exc:  # the shared call failed: its unanswered requests get the error
            for item in items:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        self.metrics.batch_size.observe(len(items))
        for item, res in zip(items, results, strict=True):
            if res is not None:
                self._finish(item, res)

    def _finish(self, item: _Pending, res: RowResult) -> None:
        text = self.decode(res.token_ids)
        prompt_len = len(cast(Trajectory, item.traj))
        item.future.set_result(
            GenerationOutput(res.token_ids, text, res.logprobs, prompt_len, res.finish_reason)
        )

    def _run_batch(self) -> None:
        """Worker thread: gather and encode a batch (see the module docstring), then generate."""
        limit = self.config.batch_max_size
        with self._queued:
            if not self._queue:
                return  # an earlier turn took this request
            # As many requests as were admitted at once since the last turn: under a steady
            # load those clients come back together; a lone client (peak 1) never waits.
            target = min(limit, self._peak_inflight)
        policy = self._policy
        assert policy is not None
        deadline = time.monotonic() + self.config.batch_wait_ms / 1000
        taken = 0
        ready: list[_Pending] = []
        # Each request is encoded as soon as it is taken, so waiting for the rest is not idle.
        while taken < limit:
            items = self._take(limit - taken, deadline if taken < target else 0.0)
            if items is None:
                break
            taken += len(items)
            ready += [item for item in items if self._prepare(item, policy)]
        with self._lock:
            self._peak_inflight = self._inflight
        groups: dict[str | None, list[_Pending]] = {}
        for item in ready:
            groups.setdefault(item.adapter, []).append(item)
        for adapter, group in groups.items():
            self._generate_batch(adapter, group, policy)

    @property
    def eos_ids(self) -> list[int]:
        assert self._policy is not None
        return self._policy.eos_ids

    def decode(self, ids: Sequence[int]) -> str:
        assert self._policy is not None
        return cast(
            str, self._policy.processor.tokenizer.decode(list(ids), skip_special_tokens=True)
        )

    def submit(
        self,
        ticket: Ticket,
        req: GenerationRequest,
        cancel: threading.Event,
        on_token: Callable[[int], None] | None = None,
        on_prompt: Callable[[int], None] | None = None,
    ) -> Future[GenerationOutput]:
        """Queue one generation; it joins the next batch on its adapter.

        Args:
            ticket: The admitted request (its adapter is pinned).
            req: What to generate.
            cancel: Set to stop the generation at its next token (or before it starts).
            on_token: Called on the worker thread with each new token id (streaming).
            on_prompt: Called on the worker thread with the prompt length once encoded.

        Returns:
            The output; or the error of this request alone (400 for a prompt that cannot be
            encoded or does not fit the context).
        """
        fut: Future[GenerationOutput] = Future()
        with self._queued:
            self._queue.append(_Pending(ticket.adapter, req, cancel, on_token, on_prompt, fut))
            self._queued.notify()
        self._worker.submit(self._run_batch)
        return fut


class Ticket:
    """An admitted request: holds a concurrency slot and pins its adapter until released."""

    def __init__(self, engine: ServingEngine, model: str, adapter: str | None) -> None:
        self.engine = engine
        self.model = model
        self.adapter = adapter
        self._released = False
        self._once = threading.Lock()

    def release(self) -> None:
        """Idempotent and thread-safe (a stream's ``finally`` and its finalizer may both call)."""
        with self._once:
            if self._released:
                return
            self._released = True
        self.engine._release(self.adapter)  # pyright: ignore[reportPrivateUsage]


def sampling_from_request(
    *,
    temperature: float | None,
    top_p: float | None,
    max_tokens: int | None,
    seed: int | None,
    config: EngineConfig,
) -> tuple[SamplingParams, int]:
    """OpenAI sampling fields -> engine parameters; temperature 0 means greedy."""
    max_new = max_tokens if max_tokens is not None else config.default_max_tokens
    if max_new > config.max_new_tokens_limit:
        raise BadRequestError(
            f"max_tokens {max_new} is over this server's limit of {config.max_new_tokens_limit}"
        )
    temp = 1.0 if temperature is None else temperature
    try:
        params = SamplingParams(
            temperature=temp if temp > 0 else 1.0,
            top_p=1.0 if top_p is None else top_p,
            max_new_tokens=max_new,
            greedy=temp == 0,
        )
    except ValueError as exc:
        raise BadRequestError(str(exc)) from exc
    return params, seed if seed is not None else random.getrandbits(63)


__all__ = [
    "LATEST_ALIAS",
    "ChatEncodingError",
    "EngineConfig",
    "GenerationOutput",
    "GenerationRequest",
    "ServingEngine",
    "Ticket",
    "check_images",
    "sampling_from_request",
]
