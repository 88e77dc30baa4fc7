"""LoRA sync on the cluster: shards from every FSDP rank, one publish on the CPU head node.

One sync of step N, and which process writes what where (``root`` is SkyRL's
``trainer.policy.model.lora.lora_sync_path`` on the shared filesystem)::

    every FSDP rank   root/shards/v<V>/model_world_size_W_rank_R.{safetensors,index.json}
                      its own local shards only: nothing is gathered (the full-gather OOM);
                      V is the next weight-sync version, which every rank reads alike
    rank 0            after a barrier, runs :func:`consolidate_shards` on the head node
                      (:func:`on_head`) and waits for it
    head-node task    verifies the shards' checksums, consolidates with lora-consolidate
                      (bounded memory), publishes root/adapters/versions/<V> with weight-sync
                      (written aside, fsynced, renamed, manifest last), GCs old versions that no
                      lease pins, removes the shards
    rank 0            :meth:`EngineHandover.load` - every engine loads root/adapters/versions/<V>
                      under the policy's LoRA name (vLLM's runtime LoRA API), then the version is
                      leased for the engines and the previous lease released

Engines read only published version directories, which never change after the rename, so none
can read a torn adapter; a version that fails to consolidate or publish is never handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import struct
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from maze_engine.errors import AdapterRefusedError, EngineSyncError, HeadNodeMissingError

HEAD_RESOURCE = "mazerl_head"
"""Custom Ray resource the CPU head node declares (``ray start --head --resources``); the
consolidation task asks for a sliver of it, so it runs there and nowhere else."""
ADAPTERS_DIR = "adapters"
SHARDS_DIR = "shards"
FIXED_WORK_BYTES = 2 << 20
"""Head-task memory that does not grow with the adapter: lora-consolidate's 1 MiB write ring,
weight-sync's copy buffer, the shard index (1.1-1.3 MiB measured for a 76 KiB adapter)."""
ENGINES_READER = "engines"
"""The lease holder name for the version the inference engines serve."""
ENGINE_LEASE_TTL_S = 24 * 3600.0
"""Long enough to outlive any gap between syncs; released at the next hand-over."""


@dataclass(frozen=True)
class SyncLayout:
    """Where one run's sync files live under ``root`` (SkyRL's ``lora_sync_path``)."""

    root: Path

    @property
    def store_root(self) -> Path:
        return self.root / ADAPTERS_DIR

    def shard_dir(self, version: int) -> Path:
        return self.root / SHARDS_DIR / f"v{version:09d}"

    def staging_dir(self, version: int) -> Path:
        return self.root / SHARDS_DIR / f".adapter-v{version:09d}"

    @property
    def status_file(self) -> Path:
        """Rank 0's :class:`SyncStats` after each sync, read by the trainer's metrics."""
        return self.root / "sync_status.json"


@dataclass(frozen=True)
class PublishReport:
    """What one head-node consolidation wrote, and what it cost."""

    path: str
    """The published version's directory, or the export directory."""
    digest: str
    tensors: int
    bytes_written: int
    seconds: float
    work_peak_bytes: int
    """Resident memory the consolidation added on the head node (VmHWM over VmRSS at start)."""
    largest_tensor_bytes: int
    version: int | None = None
    """The weight-sync version published; None for an export."""
    node_id: str = ""

    @property
    def memory_bound_bytes(self) -> int:
        """lora-consolidate's bound: three times the largest tensor, plus fixed buffers."""
        return 3 * self.largest_tensor_bytes + FIXED_WORK_BYTES


def _status_kib(name: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak_kib() -> int:
    """Trim the heap, reset the RSS high-water mark (Linux), return the RSS in KiB."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # resets VmHWM to the current VmRSS
    except OSError:
        return 0
    return _status_kib("VmRSS")


def consolidate_shards(
    shards: str,
    out: str,
    world_size: int,
    *,
    adapter_config: Mapping[str, Any],
    cell_px: int | None = None,
    store_root: str | None = None,
    version: int | None = None,
    step: int | None = None,
    keep: int = 3,
) -> PublishReport:
    """Head node: merge the ranks' shards into a PEFT adapter; publish it if ``store_root``.

    With ``store_root`` the adapter is built in ``out`` (a staging directory) and published as
    weight-sync ``version``; without, ``out`` is the adapter's final directory (an export; it
    appears atomically). The shards are removed once the adapter is safe.

    Raises:
        lora_consolidate.ShardError: A rank's shard files are missing, corrupt (checksums are
            verified) or disagree; nothing is published and the shards stay for inspection.
    """
    # Everything imported before the high-water mark is reset: the peak is the work's alone.
    from lora_consolidate import consolidate
    from lora_consolidate.shards import verify_rank_shards
    from maze_env.render import Style, write_rendering
    from weight_sync import AdapterStore

    baseline = _reset_peak_kib()
    started = time.perf_counter()
    verify_rank_shards(shards, world_size)  # consolidation trusts the bytes; check them first
    # No merged index: consolidation checks and merges the parts itself, and the shards are
    # removed once the adapter is safe, so no later reader would use one.
    target = Path(out)
    if store_root is not None:
        shutil.rmtree(target, ignore_errors=True)  # a staging dir a killed task left
    result = consolidate(shards, target, adapter_config=adapter_config, world_size=world_size)
    if cell_px is not None:
        write_rendering(target, Style(cell_px=cell_px))
    largest = _largest_tensor_bytes(target / "adapter_model.safetensors")
    path, published_version = str(target), None
    if store_root is not None:
        published = AdapterStore(store_root).publish(
            target, version=version, step=step, producer="maze-engine/head", keep=keep
        )
        path, published_version = str(published.path), published.version
        shutil.rmtree(target, ignore_errors=True)
    seconds = time.perf_counter() - started
    peak_kib = max(0, _status_kib("VmHWM") - baseline) if baseline else 0
    shutil.rmtree(shards, ignore_errors=True)
    return PublishReport(
        path=path,
        digest=result.digest,
        tensors=result.tensors,
        bytes_written=result.bytes_written,
        seconds=seconds,
        work_peak_bytes=peak_kib * 1024,
        largest_tensor_bytes=largest,
        version=published_version,
        node_id=_ray_node_id(),
    )


def _ray_node_id() -> str:
    """The Ray node this runs on ("" outside Ray): reports say where consolidation ran."""
    if "ray" not in sys.modules:
        return ""
    import ray

    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""


def _largest_tensor_bytes(path: Path) -> int:
    """The largest tensor's size in a safetensors file, from its JSON header alone."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(length))
    spans = [e["data_offsets"] for k, e in header.items() if k != "__metadata__"]
    return max((int(b) - int(a) for a, b in spans), default=0)


def require_head_node(resource: str = HEAD_RESOURCE) -> None:
    """Raise :class:`HeadNodeMissingError` unless a live Ray node declares ``resource``.

    Ray would keep a task asking for a resource no node has pending forever.
    """
    import ray

    if not ray.cluster_resources().get(resource):
        raise HeadNodeMissingError(
            f"no Ray node declares the custom resource {resource!r}: start the CPU head node "
            f"with `ray start --head --resources '{{\"{resource}\": 1}}'` (the RayCluster head "
            "group's rayStartParams) so LoRA consolidation runs there"
        )


def on_head(
    shards: str,
    out: str,
    world_size: int,
    *,
    resource: str = HEAD_RESOURCE,
    retries: int = 2,
    **kwargs: Any,
) -> PublishReport:
    """Run :func:`consolidate_shards` as a Ray task pinned to the head node; wait for it.

    A task lost with its node is retried by Ray (``retries``); a corrupt shard is not (it would
    fail the same way) and comes back as the task's own error.
    """
    import ray
    from ray.exceptions import RayTaskError

    require_head_node(resource)
    task: Any = cast(Any, ray.remote)(consolidate_shards).options(
        num_cpus=1, resources={resource: 0.001}, max_retries=retries, retry_exceptions=False
    )
    try:
        return cast(PublishReport, ray.get(task.remote(shards, out, world_size, **kwargs)))
    except RayTaskError as exc:
        cause: BaseException = exc.cause if isinstance(exc.cause, Exception) else exc
        raise cause from None


class LoraLoader(Protocol):
    """What :class:`EngineHandover` needs of an engine client.

    SkyRL's ``RemoteInferenceClient.load_lora_adapter`` is one: it fans out to every server.
    """

    def load_lora_adapter(self, lora_name: str, lora_path: str | None = None) -> Awaitable[Any]: ...


@dataclass
class SyncStats:
    """Counters for the trainer's metrics (``weight_sync/*``)."""

    published: int = 0
    handovers: int = 0
    failures: dict[str, int] = field(default_factory=dict[str, int])
    last_publish_s: float = 0.0
    last_handover_s: float = 0.0
    last_version: int = 0
    last_work_peak_bytes: int = 0

    def failed(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def metrics(self) -> dict[str, float]:
        out = {
            "weight_sync/published": float(self.published),
            "weight_sync/handovers": float(self.handovers),
            "weight_sync/publish_s": self.last_publish_s,
            "weight_sync/handover_s": self.last_handover_s,
            "weight_sync/head_work_peak_mib": self.last_work_peak_bytes / 2**20,
            "weight_sync/failures": float(sum(self.failures.values())),
            "adapter/version": float(self.last_version),
        }
        out.update({f"weight_sync/failures_{k}": float(v) for k, v in self.failures.items()})
        return out


def _http_status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None) or getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


class EngineHandover:
    """Rank 0: make every engine serve a published version, under one LoRA name.

    Unreachable engines are retried with backoff, then :class:`EngineSyncError`; an engine that
    answers 4xx refuses the version (:class:`AdapterRefusedError`, not retried). Either way the
    engines that did load it serve a complete, verified version, and the lease on the version
    they served before is kept until a hand-over succeeds.
    """

    def __init__(
        self,
        client: LoraLoader,
        layout: SyncLayout,
        lora_name: str,
        *,
        retries: int = 3,
        backoff_s: float = 0.5,
        stats: SyncStats | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.layout = layout
        self.lora_name = lora_name
        self.retries = retries
        self.backoff_s = backoff_s
        self.stats = stats or SyncStats()
        self._sleep = sleep
        self._lease: Any = None

    async def load(self, version: int) -> None:
        from weight_sync import AdapterStore

        store = AdapterStore(self.layout.store_root)
        published = store.get(version)  # verified against its manifest before any engine reads
        lease = store.pin(version, ENGINES_READER, ttl=ENGINE_LEASE_TTL_S)
        started = time.perf_counter()
        try:
            await self._load_with_retries(str(published.path), version)
        except BaseException:
            lease.release()
            raise
        if self._lease is not None:
            self._lease.release()
        self._lease = lease
        self.stats.handovers += 1
        self.stats.last_handover_s = time.perf_counter() - started
        self.stats.last_version = version

    async def _load_with_retries(self, path: str, version: int) -> None:
        attempt = 0
        while True:
            try:
                await self.client.load_lora_adapter(self.lora_name, path)
                return
            except Exception as exc:
                status = _http_status(exc)
                if status is not None and 400 <= status < 500:
                    self.stats.failed("refused")
                    raise AdapterRefusedError(
                        f"an engine refused adapter version {version} ({path}): HTTP {status}: "
                        f"{str(exc).strip()[:300]}"
                    ) from None
                self.stats.failed("unreachable")
                if attempt >= self.retries:
                    raise EngineSyncError(
                        f"could not hand adapter version {version} to the engines after "
                        f"{attempt + 1} attempts: {type(exc).__name__}: {str(exc).strip()[:300]}"
                    ) from None
                await self._sleep(self.backoff_s * 2**attempt)
                attempt += 1

    def take_lease(self) -> Any:
        lease, self._lease = self._lease, None
        return lease

    def adopt_lease(self, lease: Any) -> None:
        self._lease = lease

    def close(self) -> None:
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def peft_adapter_config(peft_model: Any, adapter: str = "default") -> dict[str, Any]:
    """``adapter_config.json`` content of a peft model's adapter (as PEFT saves it)."""
    return json.loads(json.dumps(peft_model.peft_config[adapter].to_dict(), default=list))


@dataclass(frozen=True)
class SyncSettings:
    """How the cluster policy syncs its LoRA adapter (from the config's ``cluster:`` section)."""

    root: str
    """SkyRL's ``lora_sync_path``, on the shared filesystem."""
    head_resource: str = HEAD_RESOURCE
    keep: int = 3
    cell_px: int | None = None
    retries: int = 3


class ShardedLoraSync:
    """Per FSDP rank: one LoRA sync (or export) through shards and the head node.

    ``barrier`` is the process group's barrier; every rank calls :meth:`sync` with its own
    state dict (DTensor shards), only rank 0 talks to Ray and the engines.
    """

    def __init__(self, settings: SyncSettings) -> None:
        self.settings = settings
        self.layout = SyncLayout(Path(settings.root))
        self.stats = SyncStats()
        self._handover: EngineHandover | None = None

    def _next_version(self) -> int:
        from weight_sync import AdapterStore

        latest = AdapterStore(self.layout.store_root).latest_version()
        return 1 if latest is None else latest + 1

    async def sync(
        self,
        state: Mapping[str, Any],
        adapter_config: Mapping[str, Any],
        *,
        rank: int,
        world_size: int,
        client: LoraLoader,
        lora_name: str,
        barrier: Callable[[], object],
        step: int | None = None,
    ) -> PublishReport | None:
        """Write this rank's shards; rank 0 publishes on the head and hands the version over."""
        from lora_consolidate.shards import write_rank_shards

        version = self._next_version()  # nothing publishes between here and the barrier
        shards = self.layout.shard_dir(version)
        write_rank_shards(state, shards, rank, world_size, lora_only=True, tag=f"v{version}")
        barrier()
        report: PublishReport | None = None
        failure: BaseException | None = None
        if rank == 0:
            self.attach(client, lora_name)
            try:
                report = await self._publish_and_hand_over(
                    shards, version, world_size, adapter_config, step
                )
            except BaseException as exc:
                failure = exc
            self._write_status()
        barrier()
        if failure is not None:
            raise failure
        return report

    async def _publish_and_hand_over(
        self,
        shards: Path,
        version: int,
        world_size: int,
        adapter_config: Mapping[str, Any],
        step: int | None,
    ) -> PublishReport:
        s = self.settings
        started = time.perf_counter()
        try:
            report = await asyncio.to_thread(
                on_head,
                str(shards),
                str(self.layout.staging_dir(version)),
                world_size,
                resource=s.head_resource,
                adapter_config=dict(adapter_config),
                cell_px=s.cell_px,
                store_root=str(self.layout.store_root),
                version=version,
                step=step,
                keep=s.keep,
            )
        except Exception:
            self.stats.failed("publish")
            raise
        self.stats.published += 1
        self.stats.last_publish_s = time.perf_counter() - started
        self.stats.last_work_peak_bytes = report.work_peak_bytes
        assert self._handover is not None
        await self._handover.load(version)
        return report

    def attach(self, client: LoraLoader, lora_name: str) -> None:
        """Rank 0: the engine client and LoRA name hand-overs use (SkyRL passes both each sync)."""
        h = self._handover
        if h is None or h.client is not client or h.lora_name != lora_name:
            lease = None if self._handover is None else self._handover.take_lease()
            self._handover = EngineHandover(
                client,
                self.layout,
                lora_name,
                retries=self.settings.retries,
                stats=self.stats,
            )
            self._handover.adopt_lease(lease)

    def export(
        self,
        state: Mapping[str, Any],
        adapter_config: Mapping[str, Any],
        out_dir: str,
        *,
        rank: int,
        world_size: int,
        barrier: Callable[[], object],
    ) -> PublishReport | None:
        """Write the adapter to ``out_dir`` (``hf_save_interval``) through the same shards path."""
        from lora_consolidate.shards import write_rank_shards

        out = Path(out_dir)
        shards = out.parent / f".{out.name}.shards"
        write_rank_shards(state, shards, rank, world_size, lora_only=True, tag=out.name)
        barrier()
        report: PublishReport | None = None
        failure: BaseException | None = None
        if rank == 0:
            try:
                report = on_head(
                    str(shards),
                    str(out),
                    world_size,
                    resource=self.settings.head_resource,
                    adapter_config=dict(adapter_config),
                    cell_px=self.settings.cell_px,
                )
            except BaseException as exc:
                failure = exc
        barrier()
        if failure is not None:
            raise failure
        return report

    def _write_status(self) -> None:
        from weight_sync.fs import atomic_write_json

        with contextlib.suppress(OSError):  # metrics must never stop a sync
            atomic_write_json(self.layout.status_file, self.stats.metrics())

    def close(self) -> None:
        if self._handover is not None:
            self._handover.close()


LORA_STATE_DIR = "lora_shards"
"""Beside SkyRL's world-size-keyed rank files in a checkpoint's ``policy/`` folder: the LoRA
weights and their optimizer state in lora-consolidate's shard format, readable at any world
size."""


def save_lora_state(
    ckpt_dir: str | os.PathLike[str],
    model: Any,
    optimizer: Any,
    *,
    rank: int,
    world_size: int,
    barrier: Callable[[], object],
    tag: str | None = None,
) -> Path:
    """Every rank: write its LoRA weights and optimizer state; rank 0 merges the index."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from lora_consolidate.shards import finalize_rank_shards, write_rank_shards

    out = Path(ckpt_dir) / LORA_STATE_DIR
    osd = None if optimizer is None else get_optimizer_state_dict(model, optimizer)
    write_rank_shards(model.state_dict(), out, rank, world_size, optimizer=osd, tag=tag)
    barrier()
    if rank == 0:
        finalize_rank_shards(out, world_size)
    barrier()
    return out


def has_lora_state(ckpt_dir: str | os.PathLike[str]) -> bool:
    """Whether the checkpoint folder holds :func:`save_lora_state`'s shards."""
    from lora_consolidate.shards import has_shards

    return has_shards(Path(ckpt_dir) / LORA_STATE_DIR)


def load_lora_state(ckpt_dir: str | os.PathLike[str], model: Any, optimizer: Any) -> None:
    """Every rank: restore LoRA weights (and optimizer state) saved at any world size.

    Raises:
        lora_consolidate.ShardError: The checkpoint's shards are missing or inconsistent.
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from lora_consolidate.shards import load_rank_shards

    src = Path(ckpt_dir) / LORA_STATE_DIR
    template = None if optimizer is None else get_optimizer_state_dict(model, optimizer)
    model_sd, optim_sd = load_rank_shards(src, model.state_dict(), optimizer=template)
    model.load_state_dict(model_sd, strict=False)
    if optimizer is not None and optim_sd is not None:
        # Parameters that never had a gradient hold no optimizer state to restore.
        set_optimizer_state_dict(model, optimizer, optim_sd, options=StateDictOptions(strict=False))


def read_sync_status(root: str | os.PathLike[str]) -> dict[str, float]:
    """The last :class:`SyncStats` rank 0 wrote under ``root``; empty if none yet."""
    try:
        data = json.loads(SyncLayout(Path(root)).status_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}
