"""The serving engine: one model instance, LoRA adapters by name, one generation worker.

Everything that touches the model (encoding images, ``set_adapter`` + ``generate``, loading and
deleting adapters) runs on a single worker thread, so an adapter switch can never interleave
with a generation. A request *pins* the adapter it resolved on admission (a reference count):
hot reload loads each new weight-sync version under a new name (``v<N>``), swaps the ``latest``
alias atomically, and deletes the old version only when no admitted request still holds it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
import random
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from PIL import Image
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from maze_policy.chat import Trajectory
from maze_policy.errors import ChatEncodingError, ModelLoadError
from maze_policy.model import load_vlm
from maze_policy.policy import Policy
from maze_policy.sampling import SamplingParams
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
    """Where ``s3://`` downloads go (default: a fresh temp dir)."""
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


class _Cancel(StoppingCriteria):
    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(  # pyright: ignore[reportIncompatibleMethodOverride]
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> Any:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


class _TokenSink(BaseStreamer):
    """Hands each newly generated token id to ``on_token`` (the first ``put`` is the prompt)."""

    def __init__(self, on_token: Callable[[int], None]) -> None:
        self.on_token = on_token
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        toks = cast(list[int], cast(torch.Tensor, value).reshape(-1).tolist())
        for tok in toks:
            self.on_token(int(tok))

    def end(self) -> None:
        return None


@dataclass(slots=True)
class _Adapter:
    name: str
    path: str
    version: int | None = None
    refs: int = 0
    retired: bool = False


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
        self._before_load = before_load
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maze-serve-gen")
        self._lock = threading.Lock()
        self._adapters: dict[str, _Adapter] = {}
        self._aliases: dict[str, str] = {}
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
        self.created = int(time.time())

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start loading in the background; returns at once (``/ping`` answers meanwhile)."""
        t = threading.Thread(target=self._load_all, name="maze-serve-load", daemon=True)
        t.start()
        self._threads.append(t)

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _load_all(self) -> None:
        try:
            if self._before_load is not None:
                self._before_load()
            # Downloads happen here, in the background, so /ping answers while they run.
            cache = self.config.cache_dir or tempfile.mkdtemp(prefix="maze-serve-")
            model_path = resolve_location(self.config.model_path, cache)
            self._worker.submit(self._load_base, model_path).result()
            for name, path in self.config.adapters.items():
                local = resolve_location(path, cache)
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

        p = Path(path)
        if not (p / "adapter_config.json").is_file():
            raise ModelNotFoundError(f"no LoRA adapter at {path!r} (adapter_config.json missing)")
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
            self._adapters[name] = _Adapter(name, str(p), version)
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
            or name == LATEST_ALIAS
            or (name.startswith("v") and name[1:].isdigit())
        ):
            raise BadRequestError(
                f"invalid lora_name {name!r}: must be non-empty, without ':', and not 'latest' or 'v<N>' (reserved for hot reload)"
            )
        with self._lock:
            if name in self._adapters and not self._adapters[name].retired:
                raise BadRequestError(f"LoRA adapter {name!r} is already loaded")
        fut = self._worker.submit(self._load_adapter_sync, name, path, None)
        await asyncio.wrap_future(fut)

    def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name`` (vLLM's ``/v1/unload_lora_adapter``).

        New requests for it get a 404 at once; in-flight ones finish first.
        """
        with self._lock:
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
                    continue
                with self._lock:
                    old = self._aliases.get(LATEST_ALIAS)
                    self._aliases[LATEST_ALIAS] = name
                    self.active_version = pv.version
                    if old is not None and old in self._adapters:
                        self._adapters[old].retired = True
                    self._retire_idle()
                self.metrics.active_adapter_version.set(pv.version)
                log.info("hot reload: serving weight-sync version %d as %s", pv.version, name)

    # ------------------------------------------------------------------ requests

    def require_ready(self) -> None:
        if self.status == "loading":
            raise NotReadyError("model is still loading", retry_after=2)
        if self.status == "failed":
            raise NotReadyError(f"model failed to load: {self.load_error}")

    def model_ids(self) -> list[str]:
        with self._lock:
            names = [a.name for a in self._adapters.values() if not a.retired]
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

    def _generate_sync(
        self,
        adapter: str | None,
        req: GenerationRequest,
        cancel: threading.Event,
        on_token: Callable[[int], None] | None,
        on_prompt: Callable[[int], None] | None,
    ) -> GenerationOutput:
        policy = self._policy
        assert policy is not None
        if cancel.is_set():  # timed out while queued
            return GenerationOutput([], "", None, 0, "cancelled")
        traj: Trajectory = policy.encoder.encode_conversation(req.messages)
        prompt_len = len(traj)
        if on_prompt is not None:
            on_prompt(prompt_len)
        max_new = req.params.max_new_tokens
        if prompt_len + max_new > self.config.max_model_len:
            raise BadRequestError(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_new}) exceeds the model's "
                f"context of {self.config.max_model_len} tokens"
            )
        kwargs: dict[str, Any] = {
            **policy.encoder.model_inputs(traj),
            "max_new_tokens": max_new,
            "min_new_tokens": min(req.min_new_tokens, max_new) or None,
            "do_sample": not req.params.greedy,
            "eos_token_id": policy.eos_ids,
            "pad_token_id": policy.encoder.pad_token_id,
            "suppress_tokens": policy.suppress_ids,
            "output_logits": req.logprobs,
            "return_dict_in_generate": True,
            "stopping_criteria": StoppingCriteriaList([_Cancel(cancel)]),
        }
        if on_token is not None:
            kwargs["streamer"] = _TokenSink(on_token)
        if req.params.greedy:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(temperature=req.params.temperature, top_p=req.params.top_p, top_k=0)
        ctx: AbstractContextManager[Any] = nullcontext()
        if self._peft is not None:
            if adapter is None:
                ctx = self._peft.disable_adapter()
            else:
                self._peft.set_adapter(adapter)
        model: Any = self._peft if self._peft is not None else self._base_model
        with ctx, torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(req.seed)
            out = model.generate(**kwargs)
        prompt_width = int(kwargs["input_ids"].shape[1])
        seq = cast(list[int], cast(torch.Tensor, out.sequences)[0, prompt_width:].tolist())
        ids: list[int] = []
        eos = set(policy.eos_ids)
        finish = "length"
        for tok in seq:
            if tok in eos:
                finish = "stop"
                break
            ids.append(int(tok))
        if cancel.is_set():
            finish = "cancelled"
        lps: list[float] | None = None
        if req.logprobs:
            t = req.params.logprob_temperature
            suppress = torch.tensor(policy.suppress_ids, dtype=torch.long)
            lps = []
            for step, tok in enumerate(ids):
                x = cast(torch.Tensor, out.logits[step])[0].float() / t
                x = x.index_fill(-1, suppress, float("-inf"))
                lps.append(float(torch.log_softmax(x, -1)[tok]))
        text = cast(str, policy.processor.tokenizer.decode(ids, skip_special_tokens=True))
        return GenerationOutput(ids, text, lps, prompt_len, finish)

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
        return self._worker.submit(
            self._generate_sync, ticket.adapter, req, cancel, on_token, on_prompt
        )


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
