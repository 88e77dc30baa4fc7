"""Rollout workers: the same class runs in-process or as a Ray actor.

A worker owns a copy of the base model and the current LoRA adapter. Adapters arrive through
weight-sync exactly as vLLM engines on the cluster get them: the learner publishes a version to
the shared ``lora_sync_path`` and the worker loads that verified version from disk.

As Ray actors (:func:`start_ray_workers`) they run on the nodes that offer
``local.ray.worker_resources``; :func:`gather` collects their results and turns a worker lost
with its node, or killed by Ray's memory monitor, into one
:class:`~maze_engine.errors.RolloutWorkerError`, raised as soon as Ray fails its call. Workers
that no node can take fail the run after ``local.ray.start_timeout_s`` instead of leaving it
pending forever; a worker lost while starting (placed on a node that had just died) is replaced.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from maze_engine.errors import AdapterLoadError, RolloutWorkerError
from maze_policy.chat import Trajectory
from maze_policy.lora import load_policy, lora_config
from maze_policy.rollout import Episode, run_episodes
from maze_policy.sampling import SamplingParams

if TYPE_CHECKING:
    from peft import LoraConfig
    from skyrl.train.config import SkyRLLoraConfig

    from maze_engine.config import LocalRayConfig


def lora_config_from_skyrl(lora: SkyRLLoraConfig) -> LoraConfig:
    """The peft ``LoraConfig`` that SkyRL's ``trainer.policy.model.lora`` keys describe."""
    return lora_config(
        rank=lora.rank,
        alpha=lora.alpha,
        dropout=lora.dropout,
        target_modules=lora.target_modules,
        exclude_modules=lora.exclude_modules,
    )


class RolloutWorker:
    """Plays rollouts with its own base model plus the adapter version it last loaded."""

    def __init__(self, model_dir: str, lora_cfg: LoraConfig, threads: int, sync_root: str) -> None:
        self.policy = load_policy(model_dir, lora_cfg, threads)
        self.sync_root = sync_root
        self.version: int | None = None

    def node_id(self) -> str:
        """The Ray node this worker runs on (answers once the model is loaded)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def load_adapter(self, version: int) -> int:
        """Load a published, verified adapter version; returns the version now active."""
        if version == self.version:
            return version
        from peft import set_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]
        from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

        from weight_sync import AdapterStore

        store = AdapterStore(Path(self.sync_root))
        published = store.get(version)  # verifies every file against the manifest
        weights = load_file(str(published.path / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(cast(Any, self.policy.model), weights)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise AdapterLoadError(
                f"adapter v{version} has keys this model lacks: {unexpected[:3]}"
            )
        self.version = version
        return version

    def rollout(
        self,
        rows: Sequence[Mapping[str, Any]],
        row_indices: Sequence[int],
        groups: Sequence[int],
        sampling: SamplingParams,
        seed: int,
        *,
        max_turns: int | None = None,
        outcomes_only: bool = False,
        context: str = "full",
    ) -> list[Episode]:
        """Play the rows in ``context``; ``outcomes_only`` drops the tokens (evaluation reads outcomes).

        What goes back to the learner is only what it reads: the PIL frames are dropped (the
        update uses the pixel values), and with ``outcomes_only`` the tokens and pixel values
        too, which for an eval of 64 mazes are about a GB of float32 patches.
        """
        episodes = run_episodes(
            self.policy,
            rows,
            sampling=sampling,
            seed=seed,
            row_indices=row_indices,
            groups=groups,
            max_turns=max_turns,
            context=context,
        )
        for ep in episodes:
            if outcomes_only:
                ep.trajectory = Trajectory()
                ep.turn_trajectories = []
            else:
                for seq in ep.sequences:
                    seq.images = []
        return episodes


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def gather(futures: Sequence[Any], *, doing: str, timeout: float | None = None) -> list[Any]:
    """The results of calls on Ray rollout workers, in order.

    Ray fails a call on a worker whose process or node died, and ``ray.get`` raises as soon as
    one call of the list has failed, whatever the others are doing: the run stops at once.

    Args:
        futures: Object refs of calls on rollout worker actors.
        doing: What the calls do, for the error message (``playing rollouts``, ``starting``).
        timeout: Seconds to wait for all of them; None waits as long as the workers live.

    Raises:
        RolloutWorkerError: A worker died (with its node, say, or killed by Ray's memory
            monitor), or ``timeout`` ran out.
    """
    import ray
    from ray.exceptions import (
        GetTimeoutError,
        NodeDiedError,
        ObjectLostError,
        OutOfMemoryError,
        RayActorError,
        WorkerCrashedError,
    )

    try:
        return list(ray.get(list(futures), timeout=timeout))
    except GetTimeoutError:
        ready, _ = cast(
            tuple[list[Any], list[Any]],
            ray.wait(list(futures), num_returns=len(futures), timeout=0),
        )
        raise RolloutWorkerError(
            f"{len(futures) - len(ready)} of {len(futures)} calls ({doing}) unfinished after "
            f"{timeout:g} s"
        ) from None
    except OutOfMemoryError as exc:
        # Not a RayActorError: without its own branch a node short of memory ended the run with
        # Ray's traceback instead of the resumable error every other lost worker gives.
        raise RolloutWorkerError(
            f"Ray's memory monitor killed a rollout worker while {doing} "
            f"({_first_line(exc).rstrip('.')}); give each node fewer workers "
            "(local.rollout_workers) or more memory"
        ) from exc
    except (RayActorError, ObjectLostError, NodeDiedError, WorkerCrashedError) as exc:
        raise RolloutWorkerError(
            f"a rollout worker was lost while {doing} (its Ray node may have died): "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from exc


START_REPLACEMENTS = 3
"""How many times one rollout worker that died while starting (its process or node lost, not
its model failing to load) is replaced before the run fails."""


def start_ray_workers(
    count: int,
    args: tuple[Any, ...],
    settings: LocalRayConfig,
    *,
    say: Callable[[str], None] = print,
) -> list[Any]:
    """``count`` :class:`RolloutWorker` Ray actors, each on a node with the resources asked for.

    Each takes one CPU plus ``settings.worker_resources``. Returns once every worker has loaded
    its model, so a cluster where no node offers those resources fails here within
    ``settings.start_timeout_s``, naming them, instead of leaving the run pending forever.

    A node that was lost a moment ago still takes placements until the head marks it dead (it
    misses health checks first): a job retried at once after a node loss, as KubeRay's RayJob
    retries, can have its workers placed there. A worker that dies while starting for such a
    reason is replaced (:data:`START_REPLACEMENTS` times at most, within the timeout) and the
    replacement goes where Ray places it then; one whose model failed to load is not.

    Args:
        count: Workers to start.
        args: :class:`RolloutWorker`'s arguments.
        settings: ``local.ray``.
        say: Where a replacement is reported.

    Raises:
        RolloutWorkerError: The workers did not all start in time, one failed to load its
            model, or one died starting more than :data:`START_REPLACEMENTS` times.
    """
    import ray
    from ray.exceptions import RayActorError

    resources = dict(settings.worker_resources)
    actor = ray.remote(RolloutWorker).options(num_cpus=1, resources=resources or None)
    timeout = settings.start_timeout_s
    deadline = None if timeout is None else time.monotonic() + timeout
    workers: list[Any] = [actor.remote(*args) for _ in range(count)]
    pending = {w.node_id.remote(): i for i, w in enumerate(workers)}
    replaced = [0] * count
    try:
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = cast(
                tuple[list[Any], list[Any]],
                ray.wait(list(pending), num_returns=1, timeout=left),
            )
            if not ready:
                raise RolloutWorkerError(
                    f"{len(pending)} of {count} calls (starting) unfinished after {timeout:g} s"
                )
            i = pending.pop(ready[0])
            try:
                gather(ready, doing="starting")
            except RolloutWorkerError as exc:
                cause = exc.__cause__
                load_failed = isinstance(cause, RayActorError) and cause.actor_init_failed
                if load_failed or replaced[i] == START_REPLACEMENTS:
                    raise
                replaced[i] += 1
                say(f"{exc}; starting a replacement ({replaced[i]} of {START_REPLACEMENTS})")
                ray.kill(workers[i])
                workers[i] = actor.remote(*args)
                pending[workers[i].node_id.remote()] = i
    except RolloutWorkerError as exc:
        for w in workers:
            ray.kill(w)
        offered = cast(dict[str, float], ray.cluster_resources())
        need = {"CPU": float(count), **{k: v * count for k, v in resources.items()}}
        have = {k: offered.get(k, 0.0) for k in need}
        raise RolloutWorkerError(
            f"rollout workers did not start ({count} asked for): {exc}; they need {need}, the "
            f"alive Ray nodes offer {have} in all (local.ray.worker_resources, "
            "local.ray.start_timeout_s)"
        ) from exc
    return workers
