"""The local GRPO + LoRA trainer: Ray rollout workers, one learner, SkyRL's math and layout.

One step: take ``train_batch_size`` prompts, let the workers play ``n_samples_per_prompt``
episodes of each (every sample of a group is the same maze), score them with the maze env,
compute GRPO advantages and the policy loss with SkyRL's functions, update the LoRA weights,
and publish the new adapter through weight-sync, from which the workers load it. Every
``ckpt_interval`` steps a SkyRL-layout checkpoint is written atomically, its adapter
consolidated with lora-consolidate and published.

Runs are deterministic on CPU: sampling seeds derive from ``(trainer.seed, step, shard, turn)``,
thread counts are fixed, and a resumed run continues bit for bit where the checkpoint left off.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from maze_engine.chat import Batch
from maze_engine.checkpoint import Checkpoint, CheckpointManager, rank_file
from maze_engine.config import LocalConfig
from maze_engine.data import PromptLoader, read_rows
from maze_engine.grpo import compute_advantages, policy_loss
from maze_engine.metrics import MetricsSink
from maze_engine.policy import Policy, SamplingParams, policy_logprobs, policy_logprobs_and_entropy
from maze_engine.rollout import Episode, derive_seed, run_episodes
from maze_engine.workers import RolloutWorker, load_policy, lora_config_from_skyrl

log = logging.getLogger("maze_engine.trainer")

FAULT_ENV = "MAZE_ENGINE_FAULT"
"""Chaos testing: ``PHASE@STEP`` (phase ``rollout``, ``update`` or ``checkpoint``) makes the
trainer SIGKILL itself at that point of that global step, as a lost node would end it."""


def _fault(phase: str, step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if spec and spec == f"{phase}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)


TINY_MODEL = "tiny-qwen3vl"
"""``trainer.policy.model.path`` value that builds (once) and warm-starts the tiny VLM."""


@dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    eval_before: float | None
    eval_after: float | None
    final_adapter: Path
    history: list[dict[str, float]] = field(default_factory=list[dict[str, float]])
    random_init: float | None = None
    """Solve rate of the randomly initialised model, when the base model was built here."""
    warm_start_steps: int | None = None
    """Oracle (SFT) steps of the warm start, when the base model was built here."""


def _adapter_config(lora_cfg: Any, base: str) -> dict[str, Any]:
    cfg = cast(dict[str, Any], lora_cfg.to_dict())
    for k, v in list(cfg.items()):
        if isinstance(v, set):
            cfg[k] = sorted(cast(set[str], v))
    cfg["base_model_name_or_path"] = base
    return cfg


class Rollouts:
    """Shards episodes over workers (Ray actors, or one in-process worker per shard)."""

    def __init__(self, model_dir: Path, lora_cfg: Any, local: LocalConfig, sync_root: Path) -> None:
        self.shards = max(1, local.rollout_workers)
        self.ray = local.rollout_workers > 0
        # Absolute paths: Ray workers may run in another directory (under `uv run`, Ray ships
        # the project as a working_dir package and starts workers inside it).
        model = str(model_dir.resolve()) if model_dir.exists() else str(model_dir)
        args = (model, lora_cfg, local.torch_threads, str(sync_root.resolve()))
        if self.ray:
            import ray

            if not ray.is_initialized():
                # RAY_ADDRESS (an existing cluster) is honoured by ray.init itself.
                # WARNING: under `uv run` Ray logs one INFO line per ignored file it packages.
                ray.init(
                    num_cpus=None,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                )
            actor = ray.remote(num_cpus=1)(RolloutWorker)
            self.workers: list[Any] = [actor.remote(*args) for _ in range(self.shards)]
        else:
            self.workers = [RolloutWorker(*args)]

    def load_adapter(self, version: int) -> None:
        if self.ray:
            import ray

            ray.get([w.load_adapter.remote(version) for w in self.workers])
        else:
            self.workers[0].load_adapter(version)

    def run(
        self,
        rows: Sequence[Mapping[str, Any]],
        indices: Sequence[int],
        groups: Sequence[int],
        sampling: SamplingParams,
        seed: int,
        *,
        max_turns: int | None = None,
    ) -> list[Episode]:
        # Whole groups stay on one shard; the shard split depends only on the config.
        n = len(rows)
        bounds = [round(i * n / self.shards) for i in range(self.shards + 1)]
        parts = [
            (bounds[i], bounds[i + 1]) for i in range(self.shards) if bounds[i] < bounds[i + 1]
        ]
        calls = [
            (list(rows[a:b]), list(indices[a:b]), list(groups[a:b]), sampling, derive_seed(seed, k))
            for k, (a, b) in enumerate(parts)
        ]
        if self.ray:
            import ray

            futures = [
                self.workers[k].rollout.remote(*c, max_turns=max_turns) for k, c in enumerate(calls)
            ]
            return [ep for chunk in ray.get(futures) for ep in chunk]
        return [ep for c in calls for ep in self.workers[0].rollout(*c, max_turns=max_turns)]

    def close(self) -> None:
        if self.ray:
            import ray

            for w in self.workers:
                ray.kill(w)


def ensure_base_model(
    path: str,
    local: LocalConfig,
    run_root: Path,
    seed: int,
    say: Callable[[str], None],
    *,
    eval_rows: Sequence[Mapping[str, Any]] | None = None,
    eval_max_new_tokens: int = 24,
    eval_max_turns: int | None = None,
) -> Path:
    """The model to train: a real checkpoint directory as is, or the tiny VLM built and
    warm-started here (cached under ``run_root/base_model``).

    With ``eval_rows``, the randomly initialised model is scored on them (greedy, through the
    env) before the warm start, and the solve rate is kept in ``sft_report.json`` as
    ``random_init_solve_rate``: the main job's first figure.
    """
    if path != TINY_MODEL:
        return Path(path)
    out = run_root / "base_model"
    if (out / "config.json").is_file() and (out / "sft_report.json").is_file():
        return out
    from maze_engine.model import TinyVLMConfig, build_tiny_vlm, load_vlm
    from maze_engine.sft import SFTConfig, SFTReport, run_sft, save_merged

    staging = run_root / ".base_model.staging"
    shutil.rmtree(staging, ignore_errors=True)
    say(
        f"building the tiny Qwen3-VL and warm-starting it on {local.sft_steps} oracle steps ({local.train_preset})"
    )
    build_tiny_vlm(staging / "random", seed=seed, config=TinyVLMConfig(**local.tiny_model))
    model, processor = load_vlm(staging / "random")
    policy = Policy(model, processor)
    random_init: float | None = None
    if eval_rows:
        eps = run_episodes(
            policy,
            eval_rows,
            sampling=SamplingParams(greedy=True, max_new_tokens=eval_max_new_tokens),
            seed=derive_seed(seed, "eval"),
            max_turns=eval_max_turns,
        )
        random_init = sum(e.solved for e in eps) / len(eps)
        say(f"randomly initialised model: solve rate {random_init:.2%} on {len(eps)} eval mazes")
    bar: Any = None
    if local.progress and local.sft_steps:
        from tqdm import tqdm

        bar = tqdm(total=local.sft_steps, desc="warm start", unit="step", dynamic_ncols=True)

    def on_log(row: dict[str, float]) -> None:
        if bar is not None:
            bar.update(int(row["step"]) - bar.n)
            bar.set_postfix(loss=f"{row['loss']:.3f}")

    try:
        report = (
            run_sft(
                policy,
                SFTConfig(
                    spec=local.train_preset,
                    steps=local.sft_steps,
                    seed=seed,
                    cell_px=local.cell_px,
                ),
                log=on_log,
            )
            if local.sft_steps
            else SFTReport(config={"steps": 0})
        )
    finally:
        if bar is not None:
            bar.close()
    report.random_init_solve_rate = random_init
    save_merged(policy, staging / "sft", report)
    shutil.rmtree(out, ignore_errors=True)
    (staging / "sft").rename(out)
    shutil.rmtree(staging, ignore_errors=True)
    return out


def export_data(cfg: Any, local: LocalConfig, data_dir: Path) -> tuple[list[str], list[str]]:
    """The local engine's datasets: ``data.train_data``/``val_data`` as they are when they exist,
    otherwise exported there from the ``local:`` settings.

    Files this function exported carry a manifest of those settings beside them (as
    :func:`maze_engine.skyrl_cluster.prepare_datasets` writes on the cluster). When the settings
    no longer match, e.g. ``local.train_preset`` changed for an existing run directory, that is
    an error naming the key: training would otherwise go on, silently, on the old mazes, and
    re-exporting would break the resumed run's dataloader position.
    """
    from maze_engine.config import LocalConfigError
    from maze_engine.skyrl_cluster import DATA_MANIFEST, read_json, write_json
    from maze_env import __version__ as maze_env_version

    train, val = [str(p) for p in cfg.data.train_data], [str(p) for p in cfg.data.val_data]
    settings: dict[str, object] = {
        "format": 1,
        "maze_env": maze_env_version,
        "train_size": local.train_size,
        "train_preset": local.train_preset,
        "eval_set": local.eval_set,
        "slack": local.slack,
        "cell_px": local.cell_px,
        "reward_spec": local.reward_spec,
    }
    manifest = data_dir / DATA_MANIFEST
    if all(Path(p).is_file() for p in train + val):
        recorded = read_json(manifest)
        if not isinstance(recorded, dict) or recorded == settings:
            return train, val  # the user's own files (no manifest), or ours, unchanged
        old = cast(dict[str, object], recorded)
        key = next((k for k in settings if old.get(k) != settings[k]), None)
        if key is None:  # a manifest with keys this version does not write
            what, was = "the data settings differ and", repr(old)
        else:
            what = f"{f'local.{key}' if hasattr(local, key) else key} is {settings[key]!r} but"
            was = repr(old.get(key))
        raise LocalConfigError(
            f"{what} the datasets in {data_dir} were exported with {was}; start a new run "
            f"(MAZERL_RUN=... or trainer.export_path=...) or remove {data_dir}"
        )
    from maze_env import MazeSpec, get_eval_set
    from maze_env.export import build_rows, train_seeds, write_rows
    from maze_env.render import Style

    style = Style(cell_px=local.cell_px)
    spec = MazeSpec.parse(local.train_preset)
    es = get_eval_set(local.eval_set)
    try:
        seeds = train_seeds(local.train_size, spec=spec, avoid=es.mazes)
    except ValueError as exc:
        log.warning("%s; training mazes will overlap %s", exc, es.name)
        seeds = train_seeds(local.train_size, spec=spec)
    rows = build_rows(spec, seeds, split="train", slack=local.slack, style=style)
    for row in rows:
        row["reward_spec"] = {**row["reward_spec"], "spec": local.reward_spec}
    val_rows = build_rows(es.spec, es.seeds, split="validation", slack=local.slack, style=style)
    data_dir.mkdir(parents=True, exist_ok=True)
    out = (
        [str(write_rows(rows, data_dir / "train.parquet"))],
        [str(write_rows(val_rows, data_dir / "validation.parquet"))],
    )
    write_json(manifest, settings)
    return out


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    *,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor,
    algo: Any,
    sampling: SamplingParams,
    max_grad_norm: float,
    ref_logprobs: torch.Tensor | None = None,
) -> dict[str, float]:
    """One optimizer step on one mini-batch: SkyRL's policy loss (+ KL) on the policy's
    log-probs, gradient clipping, step. Returns the loss metrics plus ``policy/grad_norm``."""
    new, entropy = policy_logprobs_and_entropy(policy, batch, sampling)
    out = policy_loss(
        new,
        old_logprobs,
        advantages,
        batch.loss_mask,
        algo,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()  # pyright: ignore[reportUnknownMemberType]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()  # pyright: ignore[reportUnknownMemberType]
    return {**out.metrics, "policy/grad_norm": float(grad_norm)}


class Trainer:
    def __init__(self, cfg: Any, local: LocalConfig, *, say: Callable[[str], None] = print) -> None:
        self.cfg, self.local, self.say = cfg, local, say
        t = cfg.trainer
        self.run_dir = Path(t.export_path)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.seed = int(t.seed)
        self.n = int(cfg.generator.n_samples_per_prompt)
        self.algo = t.algorithm
        sp = cfg.generator.sampling_params
        self.sampling = SamplingParams(
            temperature=float(sp.temperature),
            top_p=float(sp.top_p),
            max_new_tokens=int(sp.max_generate_length),
        )
        self.eval_sampling = SamplingParams(greedy=True, max_new_tokens=int(sp.max_generate_length))
        # SkyRL's generator ends an episode after generator.max_turns turns; so does this engine,
        # on top of each maze's own budget (local.slack). Too few turns for the eval set is an error.
        from maze_engine.skyrl_cluster import eval_slack

        self.max_turns = int(cfg.generator.max_turns)
        eval_slack(self.max_turns, local.eval_set)  # raises SkyRLConfigError naming the key
        torch.set_num_threads(local.torch_threads)

        # Datasets first: the warm start of a model built here is scored on the eval rows.
        train_files, val_files = export_data(cfg, local, self.run_dir / "data")
        self.train_rows = read_rows(train_files)
        self.val_rows = read_rows(val_files)
        base_path = str(t.policy.model.path)
        self.model_dir = ensure_base_model(
            base_path,
            local,
            self.run_dir,
            self.seed,
            say,
            eval_rows=self.val_rows if t.eval_before_train else None,
            eval_max_new_tokens=int(sp.max_generate_length),
            eval_max_turns=self.max_turns,
        )
        self.lora_cfg = lora_config_from_skyrl(t.policy.model.lora)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "lora-init"))
            self.policy = load_policy(self.model_dir, self.lora_cfg, local.torch_threads)
        self.params = [p for p in self.policy.model.parameters() if p.requires_grad]
        oc = t.policy.optimizer_config
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=float(oc.lr),
            betas=tuple(oc.adam_betas),
            weight_decay=float(oc.weight_decay),
        )
        warmup = int(getattr(oc, "num_warmup_steps", 0) or 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
        )
        self.max_grad_norm = float(oc.max_grad_norm)

        self.loader = PromptLoader(len(self.train_rows), int(t.train_batch_size), self.seed)
        self.ckpts = CheckpointManager(Path(t.ckpt_path), int(t.max_ckpts_to_keep))
        self.sync_root = Path(t.policy.model.lora.lora_sync_path)
        from weight_sync import AdapterStore

        self.store = AdapterStore(self.sync_root)
        self.global_step = 0
        self.eval_before: float | None = None
        self.history: list[dict[str, float]] = []
        self.metrics = MetricsSink(
            self.run_dir / "metrics.jsonl",
            self.run_dir / "tensorboard" if local.tensorboard else None,
            local.prometheus_port,
        )
        self.rollouts = Rollouts(self.model_dir, self.lora_cfg, local, self.sync_root)

    # ----- state --------------------------------------------------------------------------
    def lora_state(self) -> dict[str, torch.Tensor]:
        return {
            n: p.detach().clone()
            for n, p in self.policy.model.named_parameters()
            if p.requires_grad
        }

    def _write_checkpoint(self, d: Path) -> None:
        (d / "policy").mkdir()
        torch.save(self.lora_state(), d / rank_file("model"))
        torch.save(
            {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
            d / rank_file("optim"),
        )
        torch.save(
            {
                "torch_rng": torch.get_rng_state(),
                "numpy_rng": np.random.get_state(),
                "python_rng": random.getstate(),
            },
            d / rank_file("extra_state"),
        )
        _fault("checkpoint", self.global_step)
        torch.save(self.loader.state_dict(), d / "data.pt")
        torch.save(
            {
                "global_step": self.global_step,
                "history": self.history,
                "eval_before": self.eval_before,
            },
            d / "trainer_state.pt",
        )
        (d / "policy" / "fsdp_config.json").write_text(
            json.dumps({"world_size": 1, "strategy": "local"})
        )
        from lora_consolidate import consolidate

        consolidate(
            d / "policy",
            d / "policy" / "lora_adapter",
            adapter_config=_adapter_config(self.lora_cfg, str(self.model_dir)),
        )

    def save_checkpoint(self) -> Checkpoint:
        ckpt = self.ckpts.save(self.global_step, self._write_checkpoint)
        if self.local.ckpt_s3_uri:
            from maze_engine.s3_mirror import mirror_checkpoint

            mirror_checkpoint(ckpt.path, self.local.ckpt_s3_uri)
        return ckpt

    def load_checkpoint(self, ckpt: Checkpoint) -> None:
        state = torch.load(ckpt.path / rank_file("model"), weights_only=True)
        named = dict(self.policy.model.named_parameters())
        missing = [k for k in named if named[k].requires_grad and k not in state]
        if missing:
            raise RuntimeError(
                f"{ckpt.path}: checkpoint lacks LoRA parameters such as {missing[0]}"
            )
        with torch.no_grad():
            for k, v in state.items():
                named[k].copy_(v)
        opt = torch.load(ckpt.path / rank_file("optim"), weights_only=False)
        self.optimizer.load_state_dict(opt["optimizer"])
        self.scheduler.load_state_dict(opt["scheduler"])
        extra = torch.load(ckpt.path / rank_file("extra_state"), weights_only=False)
        torch.set_rng_state(extra["torch_rng"])
        np.random.set_state(extra["numpy_rng"])
        random.setstate(extra["python_rng"])
        self.loader.load_state_dict(torch.load(ckpt.path / "data.pt", weights_only=False))
        ts = torch.load(ckpt.path / "trainer_state.pt", weights_only=False)
        self.global_step = int(ts["global_step"])
        self.history = list(ts["history"])
        self.eval_before = ts.get("eval_before")

    def publish_adapter(self) -> int:
        """Write the current adapter in PEFT layout and publish it; workers load that version."""
        from safetensors.torch import save_file  # pyright: ignore[reportUnknownVariableType]

        staging = self.run_dir / ".adapter_out"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        from peft import get_peft_model_state_dict  # pyright: ignore[reportUnknownVariableType]

        state = cast(
            dict[str, torch.Tensor], get_peft_model_state_dict(cast(Any, self.policy.model))
        )
        weights = {k: v.contiguous() for k, v in state.items()}
        save_file(weights, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
        (staging / "adapter_config.json").write_text(
            json.dumps(
                _adapter_config(self.lora_cfg, str(self.model_dir)), indent=2, sort_keys=True
            )
        )
        published = self.store.publish(
            staging, step=self.global_step, producer="maze-engine", keep=3
        )
        shutil.rmtree(staging, ignore_errors=True)
        return published.version

    # ----- loop ---------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        rows = self.val_rows
        eps = self.rollouts.run(
            rows,
            list(range(len(rows))),
            list(range(len(rows))),
            self.eval_sampling,
            derive_seed(self.seed, "eval"),
            max_turns=self.max_turns,
        )
        solved = [float(e.solved) for e in eps]
        return {
            "eval/all/pass_at_1": float(np.mean(solved)),
            "eval/all/avg_score": float(np.mean([e.reward for e in eps])),
            "eval/all/avg_turns": float(np.mean([e.turns for e in eps])),
        }

    def train_step(self) -> dict[str, float]:
        t_step = time.perf_counter()
        batch_idx = self.loader.next_batch()
        rows = [self.train_rows[i] for i in batch_idx for _ in range(self.n)]
        indices = [i for i in batch_idx for _ in range(self.n)]
        groups = [g for g in range(len(batch_idx)) for _ in range(self.n)]
        t0 = time.perf_counter()
        episodes = self.rollouts.run(
            rows,
            indices,
            groups,
            self.sampling,
            derive_seed(self.seed, "step", self.global_step),
            max_turns=self.max_turns,
        )
        t_generate = time.perf_counter() - t0
        _fault("rollout", self.global_step + 1)

        t0 = time.perf_counter()
        self.policy.model.train()
        rewards = torch.tensor([e.reward for e in episodes])
        full = self.policy.collate([e.trajectory for e in episodes])
        advantages = compute_advantages(
            rewards, full.loss_mask, np.array([e.group for e in episodes]), self.algo
        )
        mb_size = int(self.cfg.trainer.policy_mini_batch_size) * self.n
        metrics: dict[str, float] = {}
        torch.manual_seed(
            derive_seed(self.seed, "update", self.global_step)
        )  # LoRA dropout, if any
        # Old (and reference) log-probs of every mini-batch come from the policy as it was before
        # this step's first update, as in SkyRL; recomputing them per epoch or after an earlier
        # mini-batch's update would pin the PPO ratio at 1.
        minibatches: list[tuple[Batch, torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        for lo in range(0, len(episodes), mb_size):
            batch = self.policy.collate([e.trajectory for e in episodes[lo : lo + mb_size]])
            adv = advantages[lo : lo + mb_size, : batch.input_ids.shape[1]]
            with torch.no_grad():
                old = policy_logprobs(self.policy, batch, self.sampling)
                ref = None
                if self.algo.use_kl_loss:
                    with cast(Any, self.policy.model).disable_adapter():
                        ref = policy_logprobs(self.policy, batch, self.sampling)
            diff = (batch.old_logprobs - old).abs() * batch.loss_mask
            metrics["policy/rollout_train_logprob_abs_diff_max"] = max(
                metrics.get("policy/rollout_train_logprob_abs_diff_max", 0.0), float(diff.max())
            )
            minibatches.append((batch, adv, old, ref))
        for _epoch in range(int(self.cfg.trainer.update_epochs_per_batch)):
            for batch, adv, old, ref in minibatches:
                metrics.update(
                    grpo_update(
                        self.policy,
                        self.optimizer,
                        batch,
                        advantages=adv,
                        old_logprobs=old,
                        algo=self.algo,
                        sampling=self.sampling,
                        max_grad_norm=self.max_grad_norm,
                        ref_logprobs=ref,
                    )
                )
                self.scheduler.step()
        self.policy.model.eval()
        t_train = time.perf_counter() - t0

        self.global_step += 1
        _fault("update", self.global_step)
        t0 = time.perf_counter()
        version = self.publish_adapter()
        self.rollouts.load_adapter(version)
        t_sync = time.perf_counter() - t0

        solved = np.array([e.solved for e in episodes], dtype=float).reshape(-1, self.n)
        tokens = sum(e.trajectory.num_generated for e in episodes)
        turns = sum(e.turns for e in episodes)
        metrics.update(
            {
                "reward/avg_raw_reward": float(rewards.mean()),
                "reward/avg_pass_at_1": float(solved.mean()),
                f"reward/avg_pass_at_{self.n}": float(solved.max(axis=1).mean()),
                "rollout/turns_per_second": turns / t_generate,
                "rollout/tokens_per_second": tokens / t_generate,
                "rollout/avg_turns": turns / len(episodes),
                "timing/generate": t_generate,
                "timing/policy_train": t_train,
                "timing/sync_weights": t_sync,
                "adapter/version": float(version),
            }
        )
        metrics["timing/step"] = time.perf_counter() - t_step
        return metrics

    def fit(self) -> TrainResult:
        t = self.cfg.trainer
        ckpt = self.ckpts.resolve(str(t.resume_mode), t.resume_path)
        if ckpt is not None:
            self.load_checkpoint(ckpt)
            self.say(f"resumed from {ckpt.path} (global step {ckpt.step})")
        elif str(t.resume_mode) == "latest" and self.ckpts.steps():
            self.say("no checkpoint verified; starting from scratch")
        self.rollouts.load_adapter(self.publish_adapter())
        total = (
            int(t.max_training_steps)
            if t.max_training_steps
            else int(t.epochs) * (len(self.train_rows) // self.loader.batch_size)
        )
        if t.eval_before_train and self.global_step == 0:
            ev = self.evaluate()
            self.eval_before = ev["eval/all/pass_at_1"]
            self.metrics.log(0, ev)
            self.say(
                f"eval before training: {self.local.eval_set} solve rate {self.eval_before:.2%}"
            )
        bar: Any = None
        if self.local.progress:
            from tqdm import tqdm

            bar = tqdm(
                total=total, initial=self.global_step, desc="grpo", unit="step", dynamic_ncols=True
            )
        while self.global_step < total:
            m = self.train_step()
            if (
                t.eval_interval
                and t.eval_interval > 0
                and self.global_step % int(t.eval_interval) == 0
            ):
                m.update(self.evaluate())
            if (
                t.ckpt_interval
                and t.ckpt_interval > 0
                and self.global_step % int(t.ckpt_interval) == 0
            ):
                t0 = time.perf_counter()
                self.history.append({"global_step": float(self.global_step), **m})
                self.save_checkpoint()
                m["timing/save_checkpoint"] = time.perf_counter() - t0
            else:
                self.history.append({"global_step": float(self.global_step), **m})
            self.metrics.log(self.global_step, m)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(
                    reward=f"{m['reward/avg_raw_reward']:.2f}",
                    solved=f"{m['reward/avg_pass_at_1']:.0%}",
                    step_s=f"{m['timing/step']:.1f}",
                )
        if bar is not None:
            bar.close()
        eval_after = None
        if t.eval_before_train or (t.eval_interval and t.eval_interval > 0):
            ev = self.evaluate()
            eval_after = ev["eval/all/pass_at_1"]
            self.metrics.log(self.global_step, ev)
        final = self.run_dir / "final_adapter"
        latest = self.store.latest()
        assert latest is not None
        # Copy beside the target and swap in by rename, so a reader never sees a half copy.
        staging = self.run_dir / ".final_adapter.staging"
        retired = self.run_dir / ".final_adapter.old"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(retired, ignore_errors=True)
        shutil.copytree(latest.path, staging)
        if final.exists():
            final.rename(retired)
        staging.rename(final)
        shutil.rmtree(retired, ignore_errors=True)
        report_file = self.model_dir / "sft_report.json"
        report: dict[str, Any] = (
            json.loads(report_file.read_text()) if report_file.is_file() else {}
        )
        return TrainResult(
            self.run_dir,
            self.global_step,
            self.eval_before,
            eval_after,
            final,
            self.history,
            random_init=report.get("random_init_solve_rate"),
            warm_start_steps=report.get("steps_done") if report else None,
        )

    def close(self) -> None:
        self.rollouts.close()
        self.metrics.close()


def train(cfg: Any, local: LocalConfig, *, say: Callable[[str], None] = print) -> TrainResult:
    trainer = Trainer(cfg, local, say=say)
    try:
        return trainer.fit()
    finally:
        trainer.close()
