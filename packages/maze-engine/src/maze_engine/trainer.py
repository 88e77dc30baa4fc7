"""The local GRPO + LoRA engine: Ray rollout workers, one learner, SkyRL's math and layout.

:func:`train` runs four phases:

1. **prepare data**: the ``mazes:`` datasets (:func:`maze_engine.data.export_datasets`);
2. **base model**: ``trainer.policy.model.path`` as is, or the tiny VLM built from a config;
3. **warm start**: a tiny model built here is trained on oracle episodes (``local.warm_start``)
   and cached under ``<export_path>/base_model``;
4. **fit**: GRPO steps. Each takes ``train_batch_size`` prompts, lets the workers play
   ``n_samples_per_prompt`` episodes of each, scores them with the maze env, computes GRPO
   advantages and the policy loss with SkyRL's functions, updates the LoRA weights and
   publishes the adapter through weight-sync, from which the workers load it. Every
   ``ckpt_interval`` steps a SkyRL-layout checkpoint is written atomically.

Runs are deterministic on CPU: sampling seeds derive from ``(trainer.seed, step, shard, turn)``,
thread counts are fixed, and a resumed run continues bit for bit where the checkpoint left off.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from maze_engine.checkpoint import (
    Checkpoint,
    CheckpointManager,
    TrainState,
    read_train_state,
    write_train_state,
)
from maze_engine.config import TINY_MODEL, LocalConfig, MazerlConfig
from maze_engine.data import (
    PromptLoader,
    check_held_out,
    eval_slack,
    export_datasets,
    read_rows,
    validation_rows,
)
from maze_engine.decisions import (
    EVALS_DIR,
    turn_rewards,
    write_decisions_report,
    write_eval_records,
)
from maze_engine.errors import ConfigError
from maze_engine.faults import fault
from maze_engine.grpo import (
    PolicyLossFn,
    clip_settings_changed,
    compute_advantages,
    episode_advantages,
    lr_scheduler,
    policy_loss,
    resolve_policy_loss,
    sequence_advantages,
    step_advantages,
    turn_reward_advantages,
)
from maze_engine.metrics import MetricsSink, mirror_metrics
from maze_engine.workers import (
    RolloutWorker,
    gather,
    lora_config_from_skyrl,
    start_ray_workers,
)
from maze_env.render import Style, write_rendering
from maze_policy.chat import Batch
from maze_policy.contexts import write_context
from maze_policy.lora import load_policy
from maze_policy.policy import Policy, policy_logprobs, policy_logprobs_and_entropy
from maze_policy.rollout import Episode, env_extras, run_episodes
from maze_policy.sampling import SamplingParams
from maze_policy.seeds import derive_seed
from maze_verifier.env import MazeTask
from weight_sync import BackgroundMirror, fs

if TYPE_CHECKING:
    from peft import LoraConfig
    from skyrl.train.config import AlgorithmConfig

    from maze_engine.sft import SFTReport

log = logging.getLogger("maze_engine.trainer")

BASE_MODEL_DIR = "base_model"
"""Under ``trainer.export_path``: the tiny model after its warm start (reused by later runs)."""
RESUMES_FILE = "resumes.json"
"""Under ``trainer.export_path``: how many times this run resumed from a checkpoint."""


@dataclass
class TrainResult:
    """What a finished run reports: solve rates at each stage and where its outputs are."""

    run_dir: Path
    global_step: int
    eval_before: float | None
    eval_after: float | None
    final_adapter: Path
    history: list[dict[str, float]] = field(default_factory=list[dict[str, float]])
    base_solve_rate: float | None = None
    """Solve rate of the tiny model's base (random init or pretrained), when built here."""
    base_label: str | None = None
    """What that base was: ``random init``, a shipped artifact's name or a directory."""
    warm_start_steps: int | None = None
    """Supervised steps of the warm start, when the base model was built here."""
    warm_start_demonstrator: str | None = None
    """Who played the warm start's demonstrations (``oracle``, ``explorer``), when built here."""
    warm_start_route_rehearsal: int = 0
    """Route questions trained beside each warm-start step (``local.warm_start.route_rehearsal``)."""
    reports: dict[str, tuple[float | None, float | None]] = field(
        default_factory=dict[str, tuple[float | None, float | None]]
    )
    """Solve rate on each of ``mazes.report_sets``, before and after GRPO."""


def _adapter_config(lora_cfg: LoraConfig, base: str) -> dict[str, Any]:
    cfg = cast(dict[str, Any], lora_cfg.to_dict())
    for k, v in list(cfg.items()):
        if isinstance(v, set):
            cfg[k] = sorted(cast(set[str], v))
    cfg["base_model_name_or_path"] = base
    return cfg


def init_ray() -> None:
    """Start local Ray, or join the cluster ``RAY_ADDRESS`` names; a no-op if Ray is up.

    Workers run the environment as installed and nothing is shipped: a local Ray starts its
    workers with the interpreter that started it (this one), a cluster with its image's Python
    (which holds the code). No ``py_executable`` is set: a job-wide one would keep Ray from
    handing the actors the workers it prestarts (measured: the actors' start took 3.6x longer).
    """
    import ray

    if ray.is_initialized():
        return
    # Under `uv run`, Ray's uv integration would replace the runtime_env with one that ships
    # the project as a working_dir package and starts every worker with `uv run` in that copy
    # (an environment build per session; under `uv run --no-sync` the workers cannot even
    # import ray). The flag is read at call time; the variable carries it to child drivers.
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    from ray._private import ray_constants  # pyright: ignore[reportMissingTypeStubs]

    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    ray.init(
        num_cpus=None,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )


class Rollouts:
    """Shards episodes over workers (Ray actors, or one in-process worker per shard)."""

    def __init__(
        self,
        model_dir: Path,
        lora_cfg: LoraConfig,
        local: LocalConfig,
        sync_root: Path,
        say: Callable[[str], None] = print,
    ) -> None:
        self.shards = max(1, local.rollout_workers)
        self.ray = local.rollout_workers > 0
        self.context = local.context
        # Absolute paths: Ray workers (on a cluster, say) need not share this working directory.
        model = str(model_dir.resolve()) if model_dir.exists() else str(model_dir)
        args = (model, lora_cfg, local.torch_threads, str(sync_root.resolve()))
        if self.ray:
            init_ray()
            self.workers: list[Any] = start_ray_workers(self.shards, args, local.ray, say=say)
        else:
            self.workers = [RolloutWorker(*args)]

    def load_adapter(self, version: int) -> None:
        """Make every worker load published adapter ``version`` (verified by weight-sync)."""
        if self.ray:
            gather(
                [w.load_adapter.remote(version) for w in self.workers], doing="loading an adapter"
            )
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
        outcomes_only: bool = False,
    ) -> list[Episode]:
        """Play one episode per row on the workers; results come back in input order.

        ``outcomes_only`` returns episodes without their trajectories (see
        :meth:`RolloutWorker.rollout`), for callers that read rewards and replies only.
        """
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
            futures = [
                self.workers[k].rollout.remote(
                    *c, max_turns=max_turns, outcomes_only=outcomes_only, context=self.context
                )
                for k, c in enumerate(calls)
            ]
            return [ep for chunk in gather(futures, doing="playing rollouts") for ep in chunk]
        worker = self.workers[0]
        return [
            ep
            for c in calls
            for ep in worker.rollout(
                *c, max_turns=max_turns, outcomes_only=outcomes_only, context=self.context
            )
        ]

    def close(self) -> None:
        """Stop the Ray actors (no-op in-process)."""
        if self.ray:
            import ray

            for w in self.workers:
                ray.kill(w)


@dataclass(frozen=True)
class Datasets:
    """Phase 1's result: the rows both loops read."""

    train: list[dict[str, Any]]
    validation: list[dict[str, Any]]


def prepare_data(config: MazerlConfig) -> Datasets:
    """Phase 1: export (or reuse) the datasets, read their rows, check the eval is held out."""
    export_datasets(config)
    data = config.skyrl.data
    out = Datasets(read_rows(data.train_data), read_rows(data.val_data))
    check_held_out(config, out.train, out.validation)
    return out


def _eval_sampling(config: MazerlConfig) -> SamplingParams:
    return SamplingParams(
        greedy=True, max_new_tokens=int(config.skyrl.generator.sampling_params.max_generate_length)
    )


def tiny_base_dir(config: MazerlConfig, staging: Path) -> tuple[Path, str]:
    """Where phase 2's tiny model comes from, and what to call it in the report.

    ``local.tiny_base`` is ``random`` (built here from ``local.tiny_model`` and the seed), a
    shipped artifact (e.g. the perception-pretrained ``tiny-qwen3vl-perception``, verified
    against its manifest) or a model directory.
    """
    base = config.local.tiny_base
    if base == "random":
        from maze_policy.model import TinyVLMConfig, build_tiny_vlm

        seed = int(config.skyrl.trainer.seed)
        build_tiny_vlm(
            staging / "random", seed=seed, config=TinyVLMConfig(**config.local.tiny_model)
        )
        return staging / "random", "random init"
    from maze_engine.artifacts import model_dir

    return model_dir(base), base


def build_base_model(
    config: MazerlConfig, staging: Path, data: Datasets, say: Callable[[str], None]
) -> tuple[Policy, float | None, str]:
    """Phase 2 for the tiny model: load its base (``local.tiny_base``), optionally scored.

    With ``eval_before_train`` the base is scored on the validation rows (the main job's first
    figure); otherwise the score is None. Returns the policy, the score and the base's name.
    """
    from maze_policy.model import load_vlm

    src, label = tiny_base_dir(config, staging)
    model, processor = load_vlm(src)
    policy = Policy(model, processor)
    if not config.skyrl.trainer.eval_before_train:
        return policy, None, label
    eps = run_episodes(
        policy,
        data.validation,
        sampling=_eval_sampling(config),
        seed=derive_seed(int(config.skyrl.trainer.seed), "eval"),
        max_turns=config.max_turns,
        context=config.local.context,
    )
    rate = sum(e.solved for e in eps) / len(eps)
    say(f"base model ({label}): solve rate {rate:.2%} on {len(eps)} eval mazes")
    return policy, rate, label


def held_out_hashes(config: MazerlConfig) -> frozenset[str]:
    """Layouts no training stage may show: the eval set's and the report sets'.

    Empty when ``mazes.allow_eval_overlap`` is set. Layouts are ``Maze.layout_hash``: the
    walls, whatever the start and goal.
    """
    if config.mazes.allow_eval_overlap:
        return frozenset()
    from maze_env import get_eval_set

    names = (config.mazes.eval_set, *config.mazes.report_sets)
    return frozenset(m.layout_hash() for n in names for m in get_eval_set(n).mazes)


def first_move_tracker(config: MazerlConfig, policy: Policy) -> Callable[[], dict[str, float]]:
    """The warm start's tracker: greedy first moves on the eval set, per layout class.

    Its prompts state the turn budget the main job's evaluation gives.
    """
    from maze_engine.decisions import first_move_rates

    slack = eval_slack(config.max_turns, config.mazes.eval_set)

    def track() -> dict[str, float]:
        return first_move_rates(
            policy,
            config.mazes.eval_set,
            cell_px=config.mazes.cell_px,
            max_new_tokens=config.local.warm_start.max_new_tokens,
            slack=slack,
        )

    return track


def warm_start(
    config: MazerlConfig, policy: Policy, base: tuple[float | None, str], out: Path
) -> Path:
    """Phase 3: oracle SFT of the tiny model (``local.warm_start``), saved merged at ``out``."""
    from maze_engine.sft import SFTReport, run_sft, save_merged

    ws = config.local.warm_start
    bar: Any = None
    if config.local.progress and ws.steps:
        from tqdm import tqdm

        bar = tqdm(total=ws.steps, desc="warm start", unit="step", dynamic_ncols=True)

    def on_log(row: dict[str, float]) -> None:
        if bar is not None:
            bar.update(int(row["step"]) - bar.n)
            bar.set_postfix(loss=f"{row['loss']:.3f}")

    try:
        report = (
            run_sft(
                policy,
                ws,
                spec=config.mazes.train_preset,
                seed=int(config.skyrl.trainer.seed),
                cell_px=config.mazes.cell_px,
                avoid=held_out_hashes(config),
                log=on_log,
                track=first_move_tracker(config, policy),
                slack=eval_slack(config.max_turns, config.mazes.eval_set),
                context=config.local.context,
            )
            if ws.steps
            else SFTReport(config={"steps": 0})
        )
    finally:
        if bar is not None:
            bar.close()
    report.base_solve_rate, report.base_label = base
    with fs.staged_dir(out) as staged:
        save_merged(policy, staged, report)
    return out


def warm_start_alone(
    config: MazerlConfig,
    out: Path,
    *,
    base: Path | None = None,
    say: Callable[[str], None] = print,
) -> SFTReport:
    """The warm start by itself (``maze-train warm-start``), scored before and after.

    Starts from ``base``, or else from the main job's base (``local.tiny_base``), and scores
    the eval set's first ``local.warm_start.eval_mazes`` mazes at the main job's turn budget,
    so that its figure and the main job's agree for the same model. Saves the model at ``out``.
    """
    from maze_engine.sft import evaluate_policy, run_sft, save_merged
    from maze_env import get_eval_set
    from maze_policy.model import load_vlm

    ws, mazes = config.local.warm_start, config.mazes
    src, label = (base, str(base)) if base is not None else tiny_base_dir(config, out / "_init")
    say(f"base: {label}")
    model, processor = load_vlm(src)
    policy = Policy(model, processor)
    es = get_eval_set(mazes.eval_set)
    slack = eval_slack(config.max_turns, mazes.eval_set)

    def evaluate() -> str:
        res = evaluate_policy(
            policy,
            es.spec.name,
            es.seeds[: ws.eval_mazes],
            cell_px=mazes.cell_px,
            max_new_tokens=ws.max_new_tokens,
            slack=slack,
            context=config.local.context,
        )
        return (
            f"{mazes.eval_set} solve {res.solve_rate:.2%} ({res.solved}/{res.episodes}), "
            f"valid actions {res.valid_action_rate:.2%}, mean turns {res.mean_turns:.1f}"
        )

    say(f"before: {evaluate()}")
    report = run_sft(
        policy,
        ws,
        spec=mazes.train_preset,
        seed=int(config.skyrl.trainer.seed),
        cell_px=mazes.cell_px,
        avoid=held_out_hashes(config),
        log=lambda row: say(str(row)),
        track=first_move_tracker(config, policy),
        slack=slack,
        context=config.local.context,
    )
    say(f"after {report.steps_done} steps / {report.seconds:.0f} s: {evaluate()}")
    save_merged(policy, out, report)
    return report


def base_model_dir(config: MazerlConfig, data: Datasets, say: Callable[[str], None]) -> Path:
    """Phases 2 and 3: the model GRPO starts from.

    A real checkpoint directory is used as is; the tiny VLM is built and warm-started here
    once, then reused from ``<export_path>/base_model``.
    """
    path = str(config.skyrl.trainer.policy.model.path)
    if path != TINY_MODEL:
        return Path(path)
    run_root = Path(config.skyrl.trainer.export_path)
    out = run_root / BASE_MODEL_DIR
    if (out / "config.json").is_file() and (out / "sft_report.json").is_file():
        return out
    staging = run_root / ".base_model.staging"
    shutil.rmtree(staging, ignore_errors=True)
    say(
        f"tiny Qwen3-VL from {config.local.tiny_base}: warm-starting it on "
        f"{config.local.warm_start.steps} oracle steps ({config.mazes.train_preset})"
    )
    policy, rate, label = build_base_model(config, staging, data, say)
    warm_start(config, policy, (rate, label), out)
    shutil.rmtree(staging, ignore_errors=True)
    return out


def grpo_update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    *,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    algo: AlgorithmConfig,
    sampling: SamplingParams,
    max_grad_norm: float,
    ref_logprobs: torch.Tensor | None = None,
    loss_fn: PolicyLossFn | None = None,
) -> dict[str, float]:
    """One optimizer step on one mini-batch.

    SkyRL's policy loss (+ KL) on the policy's log-probs, gradient clipping, step. Returns the
    loss metrics plus ``policy/grad_norm``. ``old_logprobs`` None means the policy has not
    changed since the rollout's log-probs were taken as old (the step's only update): this
    pass's own log-probs, detached, are the old ones, as a separate pass would compute them.
    """
    new, entropy = policy_logprobs_and_entropy(policy, batch, sampling)
    if old_logprobs is None:
        old_logprobs = new.detach()
    # The sampler's recorded log-probs against the learner's for the same weights.
    drift = float(((batch.old_logprobs - old_logprobs).abs() * batch.loss_mask).max())
    out = policy_loss(
        new,
        old_logprobs,
        advantages,
        batch.loss_mask,
        algo,
        ref_logprobs=ref_logprobs,
        entropy=entropy,
        loss_fn=loss_fn,
    )
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()  # pyright: ignore[reportUnknownMemberType]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()  # pyright: ignore[reportUnknownMemberType]
    return {
        **out.metrics,
        "policy/policy_lr": float(optimizer.param_groups[0]["lr"]),
        "policy/grad_norm": float(grad_norm),
        "policy/rollout_train_logprob_abs_diff_max": drift,
    }


def _report_metrics(rates: Mapping[str, float]) -> dict[str, float]:
    """``eval/<set>/pass_at_1`` of each report set's solve rate."""
    return {f"eval/{name}/pass_at_1": rate for name, rate in rates.items()}


def _turn_rewards(
    row: Mapping[str, Any], episode: Episode, off_goal_stop_penalty: float
) -> list[float]:
    """The verifier's per-turn rewards of ``episode``, played on ``row``'s maze and budget."""
    task = MazeTask.from_extras(env_extras(row))
    rewards = turn_rewards(
        task.maze,
        episode.replies,
        task.step_budget,
        off_goal_stop_penalty=off_goal_stop_penalty,
    )
    if len(rewards) != len(episode.sequences):
        raise RuntimeError(
            f"replaying row {episode.row_index} played {len(rewards)} turns, but its episode "
            f"has {len(episode.sequences)}"
        )
    return rewards


class Trainer:
    """Phase 4: the GRPO loop over a prepared dataset and base model."""

    def __init__(
        self,
        config: MazerlConfig,
        data: Datasets,
        model_dir: Path,
        *,
        say: Callable[[str], None] = print,
    ) -> None:
        self.config, self.skyrl, self.say = config, config.skyrl, say
        t = self.skyrl.trainer
        self.run_dir = Path(t.export_path)
        self.seed = int(t.seed)
        self.n = int(self.skyrl.generator.n_samples_per_prompt)
        self.algo = t.algorithm
        self.loss_fn = resolve_policy_loss(self.algo)
        sp = self.skyrl.generator.sampling_params
        self.sampling = SamplingParams(
            temperature=float(sp.temperature),
            top_p=float(sp.top_p),
            max_new_tokens=int(sp.max_generate_length),
        )
        self.eval_sampling = _eval_sampling(config)
        self.max_turns = config.max_turns
        self.step_weight = float(config.local.step_advantage_weight)
        self.step_gamma = float(config.local.step_advantage_gamma)
        self.progress_weight = float(config.local.progress_advantage_weight)
        self.off_goal_stop_penalty = float(config.local.off_goal_stop_penalty)
        self.route_rehearsal = int(config.local.route_rehearsal)
        self.route_stop_share = float(config.local.route_stop_share)
        self.train_rows, self.val_rows = data.train, data.validation
        self.model_dir = model_dir
        self.lora_cfg = lora_config_from_skyrl(t.policy.model.lora)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, "lora-init"))
            self.policy = load_policy(self.model_dir, self.lora_cfg, config.local.torch_threads)
        self.params = [p for p in self.policy.model.parameters() if p.requires_grad]
        oc = t.policy.optimizer_config
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=float(oc.lr),
            betas=(float(oc.adam_betas[0]), float(oc.adam_betas[1])),
            weight_decay=float(oc.weight_decay),
        )
        self.max_grad_norm = float(oc.max_grad_norm)

        self.loader = PromptLoader(len(self.train_rows), int(t.train_batch_size), self.seed)
        self.total_steps = (
            int(t.max_training_steps)
            if t.max_training_steps
            else int(t.epochs) * (len(self.train_rows) // self.loader.batch_size)
        )
        # SkyRL's schedule, counted as SkyRL counts it: one scheduler step per mini-batch update.
        updates_per_step = -(-int(t.train_batch_size) // int(t.policy_mini_batch_size)) * int(
            t.update_epochs_per_batch
        )
        if updates_per_step == 1 and (changed := clip_settings_changed(t.algorithm)):
            # One update a step scores its own old log-probs, so every PPO ratio is 1 and no
            # clip bound is ever reached: a setting that looks active would change nothing.
            log.warning(
                "trainer.algorithm.%s: no effect, each step makes one update (train_batch_size %d "
                "<= policy_mini_batch_size %d, update_epochs_per_batch 1), so the PPO ratio is 1",
                ", ".join(changed),
                int(t.train_batch_size),
                int(t.policy_mini_batch_size),
            )
        self.scheduler = lr_scheduler(
            self.optimizer,
            str(oc.scheduler),
            warmup_steps=int(oc.num_warmup_steps or 0),
            total_steps=self.total_steps * updates_per_step,
        )
        self.ckpts = CheckpointManager(Path(t.ckpt_path), int(t.max_ckpts_to_keep))
        self.sync_root = Path(t.policy.model.lora.lora_sync_path)
        from weight_sync import AdapterStore

        self.store = AdapterStore(self.sync_root)
        self.global_step = 0
        self.eval_before: float | None = None
        self.reports_before: dict[str, float] = {}
        # The report sets get the main eval's rendering and slack.
        slack = eval_slack(config.max_turns, config.mazes.eval_set)
        self.report_rows = {
            name: validation_rows(name, slack=slack, cell_px=config.mazes.cell_px)
            for name in config.mazes.report_sets
        }
        self._last_eval: tuple[int, dict[str, float]] | None = None
        self.history: list[dict[str, float]] = []
        self.last_saved_unixtime: float | None = None
        """Wall time of the newest checkpoint this run wrote or resumed from."""
        self.resumes = 0
        local = config.local
        self.metrics = MetricsSink(
            self.run_dir / "metrics.jsonl",
            self.run_dir / "tensorboard" if local.tensorboard else None,
            local.prometheus_port,
        )
        self.mirror: BackgroundMirror | None = None
        if local.ckpt_s3_uri:
            self.mirror = BackgroundMirror(local.ckpt_s3_uri, log=say)
        self.rollouts = Rollouts(self.model_dir, self.lora_cfg, local, self.sync_root, say)

    # ----- state --------------------------------------------------------------------------
    def lora_state(self) -> dict[str, torch.Tensor]:
        """The trainable (LoRA) parameters, detached copies."""
        return {
            n: p.detach().clone()
            for n, p in self.policy.model.named_parameters()
            if p.requires_grad
        }

    def describe_adapter(self, adapter_dir: Path) -> None:
        """Record beside an adapter of this run how its policy saw the mazes.

        Evaluators and servers of the adapter then render mazes as its training data did and
        answer each turn from what its policy saw in training: without the context record a
        ``route`` adapter is asked in ``full`` and solves nothing.
        """
        write_rendering(adapter_dir, Style(cell_px=self.config.mazes.cell_px))
        write_context(adapter_dir, self.config.local.context)

    def save_checkpoint(self) -> Checkpoint:
        """Write a SkyRL-layout checkpoint of this step (and mirror it to S3 if configured)."""
        state = TrainState(
            lora=self.lora_state(),
            optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(),
            loader=self.loader.state_dict(),
            global_step=self.global_step,
            history=self.history,
            eval_before=self.eval_before,
            reports_before=self.reports_before,
        )
        adapter_config = _adapter_config(self.lora_cfg, str(self.model_dir))
        ckpt = self.ckpts.save(
            self.global_step,
            lambda d: write_train_state(
                d, state, adapter_config=adapter_config, describe_adapter=self.describe_adapter
            ),
        )
        if self.mirror is not None:
            self.mirror.submit(ckpt.path)  # complete and verified on disk: safe to copy
        self.last_saved_unixtime = time.time()
        return ckpt

    def mirror_metrics(self) -> dict[str, float]:
        """The S3 mirror's counts as metrics (none without a mirror); kept out of the history.

        They depend on the network's timing, so they are logged but never checkpointed: a
        resumed run's history stays what an uninterrupted one's is.
        """
        return mirror_metrics(self.mirror)

    def run_metrics(self) -> dict[str, float]:
        """Checkpoint age and resume count as metrics; like the mirror's, kept out of the history.

        ``checkpoint/last_saved_unixtime`` (absent before the first checkpoint) lets a dashboard
        show the age of the newest checkpoint as ``time() - ...``; ``checkpoint/resumes`` counts
        the resumes of this run directory.
        """
        out = {"checkpoint/resumes": float(self.resumes)}
        if self.last_saved_unixtime is not None:
            out["checkpoint/last_saved_unixtime"] = self.last_saved_unixtime
        return out

    def count_resume(self) -> int:
        """Record one more resume of this run directory; returns the count so far."""
        path = self.run_dir / RESUMES_FILE
        recorded = fs.read_json(path)
        done = 0
        if isinstance(recorded, dict):
            done = int(cast(dict[str, int], recorded).get("resumes", 0))
        fs.atomic_write_json(path, {"resumes": done + 1})
        return done + 1

    def load_checkpoint(self, ckpt: Checkpoint) -> None:
        """Restore weights, optimizer, RNGs, data position and history from ``ckpt``."""
        named = dict(self.policy.model.named_parameters())
        trainable = [k for k, p in named.items() if p.requires_grad]
        state = read_train_state(ckpt.path, trainable)
        with torch.no_grad():
            for k, v in state.lora.items():
                named[k].copy_(v)
        self.optimizer.load_state_dict(state.optimizer)
        self.scheduler.load_state_dict(state.scheduler)
        self.loader.load_state_dict(state.loader)
        self.global_step = state.global_step
        self.history = state.history
        self.eval_before = state.eval_before
        self.reports_before = state.reports_before

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
        self.describe_adapter(staging)
        published = self.store.publish(
            staging, step=self.global_step, producer="maze-engine", keep=3
        )
        shutil.rmtree(staging, ignore_errors=True)
        return published.version

    def draw_curves(self) -> None:
        """Redraw ``curves.png`` from ``metrics.jsonl``; a failed drawing never stops training."""
        from maze_engine.plots import write_curves

        title = f"{self.run_dir.resolve().name}: eval on {self.config.mazes.eval_set}"
        try:
            write_curves(self.run_dir, title=title)
        except (OSError, ValueError) as exc:
            log.warning("could not draw %s: %s", self.run_dir / "curves.png", exc)

    # ----- loop ---------------------------------------------------------------------------
    def _greedy_episodes(
        self, rows: list[dict[str, Any]], seed: int, records: Path, max_turns: int | None
    ) -> list[Episode]:
        """One greedy episode per row, recorded under ``records`` for the step.

        The episodes themselves, so what a run changed can be read off its own records.
        """
        eps = self.rollouts.run(
            rows,
            list(range(len(rows))),
            list(range(len(rows))),
            self.eval_sampling,
            seed,
            max_turns=max_turns,
            outcomes_only=True,
        )
        write_eval_records(records / f"step_{self.global_step}.jsonl", rows, eps)
        return eps

    def evaluate(self) -> dict[str, float]:
        """Greedy episodes on the validation rows: ``eval/all/pass_at_1`` is the solve rate."""
        eps = self._greedy_episodes(
            self.val_rows, derive_seed(self.seed, "eval"), self.run_dir / EVALS_DIR, self.max_turns
        )
        solved = [float(e.solved) for e in eps]
        out = {
            "eval/all/pass_at_1": float(np.mean(solved)),
            "eval/all/avg_score": float(np.mean([e.reward for e in eps])),
            "eval/all/avg_turns": float(np.mean([e.turns for e in eps])),
        }
        self._last_eval = (self.global_step, out)
        return out

    def evaluate_reports(self) -> dict[str, float]:
        """Greedy solve rate on each of ``mazes.report_sets``, by set name.

        Each row's own budget ends its episodes (the sets' mazes may be longer than the main
        set's); the episodes are recorded under ``evals/<set>/``.
        """
        out: dict[str, float] = {}
        for name, rows in self.report_rows.items():
            seed = derive_seed(self.seed, "eval", name)
            eps = self._greedy_episodes(rows, seed, self.run_dir / EVALS_DIR / name, None)
            out[name] = float(np.mean([float(e.solved) for e in eps]))
        return out

    def _rehearse_routes(self) -> float:
        """One supervised step on this step's route questions (``local.route_rehearsal``)."""
        from maze_engine.sft import route_rehearsal_batch, sft_loss

        questions = route_rehearsal_batch(
            self.policy,
            self.route_rehearsal,
            spec=self.config.mazes.train_preset,
            seed=derive_seed(self.seed, "grpo-route-rehearsal", self.global_step),
            cell_px=self.config.mazes.cell_px,
            avoid=held_out_hashes(self.config),
            stop_share=self.route_stop_share,
        )
        loss = sft_loss(self.policy, questions)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # pyright: ignore[reportUnknownMemberType]
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.optimizer.step()  # pyright: ignore[reportUnknownMemberType]
        return float(loss.detach())

    def train_step(self) -> dict[str, float]:
        """One GRPO step: rollouts, advantages, policy update(s), adapter publish and sync."""
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
        fault("rollout", self.global_step + 1)

        t0 = time.perf_counter()
        self.policy.model.train()
        rewards = torch.tensor([e.reward for e in episodes])
        group_ids = np.array([e.group for e in episodes])
        # Context ``latest`` plays an episode as one sequence per turn: each episode gets one
        # advantage from its group, shared by all its turns.
        whole = self.rollouts.context == "full"
        if whole:
            full = self.policy.collate([e.trajectory for e in episodes])
            advantages = compute_advantages(rewards, full.loss_mask, group_ids, self.algo)
        else:
            advantages = episode_advantages(rewards, group_ids, self.algo)
        per_turn: list[torch.Tensor] | None = None
        if self.step_weight > 0:
            if any(len(e.states) != e.turns for e in episodes):
                raise ConfigError(
                    "needs each turn's state, and the env's steps name no agent square "
                    "(maze_policy.rollout.state_key): set it to 0 for this env",
                    key="local.step_advantage_weight",
                )
            per_turn = [
                self.step_weight * a
                for a in step_advantages(
                    [e.reward for e in episodes],
                    [e.group for e in episodes],
                    [e.states for e in episodes],
                    gamma=self.step_gamma,
                    norm_by_std=self.algo.grpo_norm_by_std,
                )
            ]
        metrics: dict[str, float] = {}
        if self.progress_weight > 0:
            per_turn_rewards = [
                _turn_rewards(row, e, self.off_goal_stop_penalty)
                for row, e in zip(rows, episodes, strict=True)
            ]
            progress = turn_reward_advantages(
                per_turn_rewards,
                [e.group for e in episodes],
                norm_by_std=self.algo.grpo_norm_by_std,
            )
            per_turn = [
                self.progress_weight * a + (0 if per_turn is None else per_turn[e])
                for e, a in enumerate(progress)
            ]
            played = [r for episode in per_turn_rewards for r in episode]
            metrics["reward/good_turn_rate"] = sum(r > 0 for r in played) / max(1, len(played))
        mb_size = int(self.skyrl.trainer.policy_mini_batch_size) * self.n
        torch.manual_seed(
            derive_seed(self.seed, "update", self.global_step)
        )  # LoRA dropout, if any
        # Old (and reference) log-probs of every mini-batch come from the policy as it was before
        # this step's first update, as in SkyRL; recomputing them per epoch or after an earlier
        # mini-batch's update would pin the PPO ratio at 1.
        epochs = int(self.skyrl.trainer.update_epochs_per_batch)
        # One mini-batch updated once: its old log-probs are the update pass's own (detached),
        # so that pass serves both and a forward pass per step is saved.
        single = epochs == 1 and len(episodes) <= mb_size
        minibatches: list[tuple[Batch, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        for lo in range(0, len(episodes), mb_size):
            chunk = episodes[lo : lo + mb_size]
            batch = self.policy.collate([s for e in chunk for s in e.sequences])
            if whole:
                adv = advantages[lo : lo + mb_size, : batch.input_ids.shape[1]]
            else:
                counts = [len(e.sequences) for e in chunk]
                adv = sequence_advantages(
                    advantages[lo : lo + mb_size],
                    counts,
                    batch.loss_mask,
                    None if per_turn is None else per_turn[lo : lo + mb_size],
                )
            old = None
            with torch.no_grad():
                if not single:
                    old = policy_logprobs(self.policy, batch, self.sampling)
                ref = None
                if self.algo.use_kl_loss:
                    with cast(Any, self.policy.model).disable_adapter():
                        ref = policy_logprobs(self.policy, batch, self.sampling)
            minibatches.append((batch, adv, old, ref))
        drift = 0.0
        for epoch in range(epochs):
            for batch, adv, old, ref in minibatches:
                update = grpo_update(
                    self.policy,
                    self.optimizer,
                    batch,
                    advantages=adv,
                    old_logprobs=old,
                    algo=self.algo,
                    sampling=self.sampling,
                    max_grad_norm=self.max_grad_norm,
                    ref_logprobs=ref,
                    loss_fn=self.loss_fn,
                )
                if epoch == 0:  # later epochs compare against an already updated policy
                    drift = max(drift, update["policy/rollout_train_logprob_abs_diff_max"])
                metrics.update(update)
                self.scheduler.step()
        metrics["policy/rollout_train_logprob_abs_diff_max"] = drift
        if self.route_rehearsal:
            metrics["policy/route_rehearsal_loss"] = self._rehearse_routes()
        self.policy.model.eval()
        t_train = time.perf_counter() - t0

        self.global_step += 1
        fault("update", self.global_step)
        t0 = time.perf_counter()
        version = self.publish_adapter()
        t_publish = time.perf_counter() - t0
        self.rollouts.load_adapter(version)
        t_sync = time.perf_counter() - t0

        solved = np.array([e.solved for e in episodes], dtype=float).reshape(-1, self.n)
        tokens = sum(s.num_generated for e in episodes for s in e.sequences)
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
                # The cluster path's names (lora_sync.SyncStats): one dashboard panel for both.
                "weight_sync/publish_s": t_publish,
                "weight_sync/handover_s": t_sync - t_publish,
                "adapter/version": float(version),
            }
        )
        metrics["timing/step"] = time.perf_counter() - t_step
        return metrics

    def fit(self) -> TrainResult:
        """Resume if a checkpoint verifies, train to the step budget, evaluate, export."""
        t = self.skyrl.trainer
        ckpt = self.ckpts.resolve(str(t.resume_mode), t.resume_path)
        if ckpt is not None:
            self.load_checkpoint(ckpt)
            self.say(f"resumed from {ckpt.path} (global step {ckpt.step})")
            self.resumes = self.count_resume()
            self.last_saved_unixtime = ckpt.path.stat().st_mtime
        elif str(t.resume_mode) == "latest" and self.ckpts.steps():
            self.say("no checkpoint verified; starting from scratch")
        self.rollouts.load_adapter(self.publish_adapter())
        total = self.total_steps
        if t.eval_before_train and self.global_step == 0:
            ev = self.evaluate()
            self.eval_before = ev["eval/all/pass_at_1"]
            self.reports_before = self.evaluate_reports()
            self.metrics.log(0, {**ev, **_report_metrics(self.reports_before)})
            self.draw_curves()
            also = "".join(f", {k} {v:.2%}" for k, v in self.reports_before.items())
            self.say(
                f"eval before training: {self.config.mazes.eval_set} solve rate "
                f"{self.eval_before:.2%}{also}"
            )
        bar: Any = None
        if self.config.local.progress:
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
            self.metrics.log(self.global_step, {**m, **self.mirror_metrics(), **self.run_metrics()})
            if "eval/all/pass_at_1" in m:
                self.draw_curves()
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
            # The last interval eval may already be of this very policy: greedy, so reuse it.
            done = self._last_eval is not None and self._last_eval[0] == self.global_step
            ev = self._last_eval[1] if done and self._last_eval else self.evaluate()
            eval_after = ev["eval/all/pass_at_1"]
            if not done:
                self.metrics.log(self.global_step, ev)
        reports_after = self.evaluate_reports()
        if reports_after:
            self.metrics.log(self.global_step, _report_metrics(reports_after))
        self.draw_curves()
        write_decisions_report(self.run_dir)
        final = self.run_dir / "final_adapter"
        latest = self.store.latest()
        assert latest is not None
        # Swapped in by rename, so a reader never sees a half copy.
        with fs.staged_dir(final) as staging:
            shutil.copytree(latest.path, staging, dirs_exist_ok=True)
        if self.mirror is not None:
            self.mirror.submit(final)
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
            base_solve_rate=report.get("base_solve_rate"),
            base_label=report.get("base_label"),
            warm_start_steps=report.get("steps_done") if report else None,
            warm_start_demonstrator=report.get("config", {}).get("demonstrator"),
            warm_start_route_rehearsal=int(report.get("config", {}).get("route_rehearsal", 0)),
            reports={
                name: (self.reports_before.get(name), reports_after.get(name))
                for name in self.report_rows
            },
        )

    def close(self) -> None:
        """Stop the rollout workers, drain the S3 mirror (bounded), flush the metrics."""
        self.rollouts.close()
        if self.mirror is not None:
            s = self.mirror.close(timeout=self.config.local.ckpt_s3_drain_s)
            self.metrics.log(self.global_step, self.mirror_metrics())
            self.say(
                f"s3 mirror {self.mirror.uri}: {s.uploaded} uploaded, {s.failures} failed "
                f"attempts, {s.pending} not mirrored"
            )
        self.metrics.close()


def train(config: MazerlConfig, *, say: Callable[[str], None] = print) -> TrainResult:
    """Run the local engine's four phases and return what the run reports."""
    torch.set_num_threads(config.local.torch_threads)
    Path(config.skyrl.trainer.export_path).mkdir(parents=True, exist_ok=True)
    data = prepare_data(config)  # first: a model built here is scored on the eval rows
    model_dir = base_model_dir(config, data, say)
    trainer = Trainer(config, data, model_dir, say=say)
    try:
        return trainer.fit()
    finally:
        trainer.close()
