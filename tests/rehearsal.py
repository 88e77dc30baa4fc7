"""The cluster topology on one machine: Ray nodes, FSDP ranks on CPU, engines over HTTP.

What stands in for what (``test_cluster_rehearsal.py`` runs it):

- the HyperPod head and a GPU node: two ``ray start --block`` processes; the head declares
  ``maze_engine.lora_sync.HEAD_RESOURCE``, the worker ``WORKER_RESOURCE`` (its "GPUs");
- SkyRL's FSDP policy worker (CUDA only: flash-attn): :class:`PolicyRank`, one Ray actor per
  rank on the worker node, FSDP2 over gloo, calling :class:`maze_engine.lora_sync.ShardedLoraSync`
  with the arguments SkyRL's ``_save_lora_adapters_and_sync`` receives, SkyRL's own
  ``RemoteInferenceClient`` as the engine client;
- vLLM engines: ``maze-serve`` processes (OpenAI chat, ``/skyrl/v1/load_lora_adapter``);
- SkyRL's generator (vLLM token API): :func:`play`, OpenAI chat turns through
  ``RemoteInferenceClient.chat_completion`` with the maze env stepping each reply.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
from raynodes import RAY_ENV, RayNode, free_port, start_node  # the test uses them as rh.*

from maze_engine.lora_sync import HEAD_RESOURCE

WORKER_RESOURCE = "rehearsal_gpu_node"


def start_head(port: int, log: Path, temp_dir: Path) -> RayNode:
    """The head node; ``temp_dir`` keeps its session (and the address file other ``ray.init()``
    calls would find in /tmp/ray) apart from every other Ray on the machine."""
    return start_node(
        [
            "--head",
            f"--temp-dir={temp_dir}",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=1",
            f"--resources={json.dumps({HEAD_RESOURCE: 1})}",
            "--include-dashboard=false",
            "--object-store-memory=150000000",
        ],
        log,
    )


def start_worker(port: int, log: Path) -> RayNode:
    return start_node(
        [
            f"--address=127.0.0.1:{port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            f"--resources={json.dumps({WORKER_RESOURCE: 2})}",
            "--object-store-memory=150000000",
        ],
        log,
    )


def connect(port: int) -> None:
    """Join the cluster as the driver, running this interpreter (as ``init_ray`` does)."""
    import ray
    from ray._private import ray_constants  # pyright: ignore[reportMissingTypeStubs]

    os.environ.update(RAY_ENV)
    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    ray.init(address=f"127.0.0.1:{port}", log_to_driver=False)


def wait_nodes(resource: str, timeout: float = 120.0, *, gone: Sequence[str] = ()) -> str:
    """Until an alive node declares ``resource`` and the ``gone`` nodes are marked dead.

    Ray marks a killed node dead only after its missed health checks; until then it would
    schedule onto it. Returns the alive node's id (bounded).
    """
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = cast(list[dict[str, Any]], ray.nodes())
        alive = [str(n["NodeID"]) for n in nodes if n["Alive"] and n["Resources"].get(resource)]
        fresh = [a for a in alive if a not in gone]
        if fresh and len(fresh) == len(alive):
            return str(fresh[0])
        time.sleep(0.5)
    raise TimeoutError(f"no alive Ray node with {resource!r} after {timeout} s")


def start_engine(model_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).with_name("maze-serve")
    return subprocess.Popen(
        [str(exe), "--model", str(model_dir), "--port", str(port), "--threads", "1"],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def wait_ready(url: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready after {timeout} s")


def served_versions(url: str, lora_name: str) -> list[int | None]:
    """The weight-sync version of each model id serving ``lora_name`` (``/v1/models``)."""
    data = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    return [m.get("weight_sync_version") for m in data if m["id"].rsplit(":", 1)[-1] == lora_name]


# ---------------------------------------------------------------------------- rollouts


async def play(
    client: Any,
    row: Mapping[str, Any],
    lora_name: str,
    *,
    seed: int,
    max_turns: int,
    max_tokens: int,
) -> tuple[list[dict[str, Any]], float]:
    """One episode through the engines; returns the conversation and its reward."""
    from maze_policy.rollout import drop_nulls, make_env

    env = make_env(row)
    prompt, _ = env.init(drop_nulls(row["prompt"]))
    messages = [dict(m) for m in cast(Sequence[Mapping[str, Any]], prompt)]
    reward = 0.0
    for turn in range(max_turns):
        body = {
            "model": lora_name,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "seed": seed * 1000 + turn,
        }
        resp = await client.chat_completion({"json": body})
        text = str(resp["choices"][0]["message"]["content"])
        messages.append({"role": "assistant", "content": text})
        out = cast(Mapping[str, Any], env.step(text))
        reward = float(out["reward"])
        if out["done"]:
            break
        messages.extend(dict(m) for m in out["observations"])
    env.close()
    return messages, reward


# ---------------------------------------------------------------------------- FSDP ranks


class PolicyRank:
    """One FSDP rank of the policy (a Ray actor), standing in for SkyRL's FSDP worker."""

    def __init__(
        self, rank: int, world: int, port: int, model_dir: str, config_overrides: list[str]
    ) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        from maze_engine.config import load_config
        from maze_engine.grpo import resolve_policy_loss
        from maze_engine.lora_sync import ShardedLoraSync, SyncSettings
        from maze_engine.workers import lora_config_from_skyrl
        from maze_policy.lora import load_policy
        from maze_policy.sampling import SamplingParams

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        self.rank, self.world = rank, world
        config = load_config("smoke_5x5", config_overrides)
        t = config.skyrl.trainer
        torch.manual_seed(0)  # every rank starts from the same LoRA init
        self.policy = load_policy(model_dir, lora_config_from_skyrl(t.policy.model.lora), 1)
        model: Any = self.policy.model
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.base_model.model.model.language_model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.algo = t.algorithm
        self.loss_fn = resolve_policy_loss(self.algo)  # once: the registry asks a Ray actor
        self.sampling = SamplingParams(temperature=1.0, max_new_tokens=32)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optim = torch.optim.AdamW(params, lr=float(t.policy.optimizer_config.lr))
        self.sync = ShardedLoraSync(
            SyncSettings(root=str(t.policy.model.lora.lora_sync_path), cell_px=config.mazes.cell_px)
        )

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def train(
        self, conversations: list[list[dict[str, Any]]], advantages: list[float]
    ) -> dict[str, float]:
        """One GRPO update on this rank's share (FSDP averages the gradients)."""
        import torch

        from maze_engine.trainer import grpo_update
        from maze_policy.policy import policy_logprobs

        mine = range(self.rank, len(conversations), self.world)
        trajs = [self.policy.encoder.encode_conversation(conversations[i]) for i in mine]
        batch = self.policy.collate(trajs)
        adv = torch.tensor([advantages[i] for i in mine])[:, None] * batch.loss_mask
        self.policy.model.train()
        with torch.no_grad():
            old = policy_logprobs(self.policy, batch, self.sampling)
        out = grpo_update(
            self.policy,
            self.optim,
            batch,
            advantages=adv,
            old_logprobs=old,
            algo=self.algo,
            sampling=self.sampling,
            max_grad_norm=1.0,
            loss_fn=self.loss_fn,
        )
        self.policy.model.eval()
        return out

    async def sync_weights(
        self, server_urls: list[str], lora_name: str, step: int
    ) -> dict[str, Any] | None:
        """What SkyRL's ``broadcast_to_inference_engines`` does for LoRA, through our sync."""
        import torch.distributed as dist
        from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
            RemoteInferenceClient,
        )

        from maze_engine.lora_sync import peft_adapter_config

        client = RemoteInferenceClient(
            proxy_url=server_urls[0], server_urls=server_urls, data_parallel_size=1
        )
        try:
            report = await self.sync.sync(
                self.policy.model.state_dict(),
                peft_adapter_config(self.policy.model),
                rank=self.rank,
                world_size=self.world,
                client=client,
                lora_name=lora_name,
                barrier=dist.barrier,
                step=step,
            )
        finally:
            await client.aclose()
        return None if report is None else {**report.__dict__, "bound": report.memory_bound_bytes}

    def lora_full(self) -> dict[str, Any]:
        """The gathered LoRA tensors (a collective: every rank calls it)."""
        from torch.distributed.tensor import DTensor

        return {
            k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in self.policy.model.state_dict().items()
            if "lora_" in k
        }

    def optim_full(self) -> dict[str, Any]:
        """The gathered optimizer state, ``{param}.{field}`` (a collective)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        from torch.distributed.tensor import DTensor

        osd: Any = get_optimizer_state_dict(self.policy.model, self.optim)
        return {
            f"{p}.{f}": (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for p, st in osd["state"].items()
            for f, v in st.items()
        }

    def save(self, directory: str, step: int) -> None:
        """The checkpoint's world-size-free LoRA state, as the maze worker's ``save_checkpoint``."""
        import torch.distributed as dist

        from maze_engine.lora_sync import save_lora_state

        save_lora_state(
            directory,
            self.policy.model,
            self.optim,
            rank=self.rank,
            world_size=self.world,
            barrier=dist.barrier,
            tag=f"step-{step}",
        )

    def load(self, directory: str) -> None:
        """Resume from a checkpoint saved at any world size, as the worker's ``load_checkpoint``."""
        from maze_engine.lora_sync import load_lora_state

        load_lora_state(directory, self.policy.model, self.optim)

    def optimizer_steps(self) -> int:
        """AdamW's step count (restored with the optimizer state on resume)."""
        states = [s for s in self.optim.state.values() if "step" in s]
        return int(states[0]["step"]) if states else 0


@contextlib.contextmanager
def prometheus(scrape_port: int | Mapping[str, int], workdir: Path) -> Generator[str]:
    """A real Prometheus on 127.0.0.1 scraping the trainer's endpoint every second.

    ``scrape_port`` may instead map job names to ports, one scrape job each.
    """
    port = free_port()
    jobs = {"trainer": scrape_port} if isinstance(scrape_port, int) else scrape_port
    cfg = workdir / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        + "".join(
            f"  - job_name: {job}\n    static_configs: [{{targets: ['127.0.0.1:{p}']}}]\n"
            for job, p in jobs.items()
        )
    )
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={cfg}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query(prom: str, promql: str, timeout: float = 60.0, at_least: float | None = None) -> float:
    """Poll an instant query until it returns a sample (>= ``at_least``); bounded."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            last = httpx.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=5).json()
            result = last.get("data", {}).get("result", [])
            if result:
                value = float(result[0]["value"][1])
                if at_least is None or value >= at_least:
                    return value
        time.sleep(0.5)
    raise AssertionError(f"{promql}: no sample after {timeout} s (last answer {last})")
