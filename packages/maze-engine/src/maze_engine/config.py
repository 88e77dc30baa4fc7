"""One config file for both engines, loaded into one typed object.

A mazerl config file has three kinds of section:

* SkyRL's own keys (``data``, ``trainer``, ``generator``, ``environment``, ...), checked
  against ``skyrl.train.config.SkyRLTrainConfig`` and SkyRL's ``validate_cfg``;
* ``mazes:`` (:class:`MazeDataConfig`): which mazes the datasets hold and how they are drawn,
  read by both engines' dataset exporter;
* ``local:`` (:class:`LocalConfig`): the local CPU engine's own settings, never handed to SkyRL.

:func:`load_config` checks all three with the same checker (:mod:`maze_engine.schema`) and
returns a :class:`MazerlConfig`; every failure is one :class:`~maze_engine.errors.ConfigError`
naming the key.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from maze_engine.errors import ConfigError, show_value
from maze_engine.schema import (
    blame,
    build_section,
    check_section,
    check_vlm,
    flatten,
    load_tree,
    source_of,
)
from maze_env.render import VISGYM_CELL_PX

if TYPE_CHECKING:
    from skyrl.train.config import SkyRLTrainConfig

CONFIG_DIR = Path(__file__).with_name("configs")
"""Shipped YAML configs (package data)."""
REFERENCE_CONFIG = "maze_grpo_qwen3vl8b"
"""The reference HyperPod run: Qwen3-VL-8B, LoRA r32, 3 nodes x 2 GPUs."""
TINY_LOCAL_CONFIG = "tiny_local"
"""The local engine's default, the main job: a tiny Qwen3-VL on CPU, scored on held-out mazes."""
SMOKE_CONFIG = "smoke_5x5"
"""A minutes-long local run on 5x5 mazes from a random-init tiny model, for tests and smoke
runs; its eval set repeats its training layouts (5x5 has only 16)."""
MAZES_KEY = "mazes"
LOCAL_KEY = "local"
CLUSTER_KEY = "cluster"
TINY_MODEL = "tiny-qwen3vl"
"""``trainer.policy.model.path`` value that builds (once) and warm-starts the tiny VLM."""


@dataclass(frozen=True)
class MazeDataConfig:
    """The ``mazes:`` section: what the train and validation datasets hold (both engines)."""

    train_preset: str = "easy"
    """Maze spec of the training mazes (``easy``, ``hard``, ``ROWSxCOLS[:generator]``)."""
    train_size: int = 256
    eval_set: str = "easy-64"
    """Fixed eval set (maze-env ``EVAL_SETS``): the validation split, scored with ``task``."""
    cell_px: int = VISGYM_CELL_PX
    """Pixels per grid square; 32 puts one square in one Qwen3-VL visual token."""
    reward_spec: str = "visgym_sft"
    """maze-verifier reward spec of the training rows (validation rows always use ``task``)."""
    allow_eval_overlap: bool = False
    """Allow training mazes that repeat eval layouts when the spec has too few to avoid them."""
    report_sets: list[str] = field(default_factory=list[str])
    """More fixed eval sets the local engine scores (greedy) before and after GRPO, beside
    ``eval_set``: e.g. ``easy-64``, the reference result's set."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first ``mazes.*`` key with a bad value."""
        from maze_env import MazeSpec, MazeSpecError
        from maze_verifier import SPECS

        _at_least(self, MAZES_KEY, train_size=1, cell_px=4)
        _eval_set(self.eval_set, f"{MAZES_KEY}.eval_set")
        for name in self.report_sets:
            _eval_set(name, f"{MAZES_KEY}.report_sets")
        try:
            MazeSpec.parse(self.train_preset)
        except MazeSpecError as exc:
            raise ConfigError(str(exc), key=f"{MAZES_KEY}.train_preset") from exc
        if self.reward_spec not in SPECS:
            raise ConfigError(
                f"{show_value(self.reward_spec)} is not a reward spec",
                key=f"{MAZES_KEY}.reward_spec",
                allowed=tuple(sorted(SPECS)),
            )


DEMONSTRATORS = ("oracle", "explorer")
"""Who plays the warm start's episodes: ``oracle`` takes a shortest route; ``explorer`` reads
every wall but plans nothing (maze-env's ``ExplorerAgent``), a partial solver."""
REPLY_FORMATS = ("visgym", "action")
"""How demonstrated replies read: ``visgym`` is VisGym's SFT format (observation, justification,
action); ``action`` the action tag alone, a fifth of the tokens to sample per turn."""


@dataclass(frozen=True)
class WarmStartConfig:
    """``local.warm_start``: supervised steps on oracle episodes before GRPO (tiny model only)."""

    steps: int = 600
    batch_size: int = 4
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    max_seconds: float | None = None
    """Stop early after this much training time; None trains every step."""
    eval_every: int = 0
    """Greedy evaluation every this many steps (``maze-train warm-start``); 0 = never."""
    eval_mazes: int = 32
    track_every: int = 200
    """Greedy first moves on the eval set every this many steps and at the end, per layout
    class (the route choice the loss hides); 0 = never."""
    max_new_tokens: int = 32
    decision_weight: float = 1.0
    """Loss weight of each decision token (the justification and the action word) relative to
    the reply's other tokens; 1 is the plain mean."""
    freeze_patch_embed: bool = True
    """Keep the vision patch projection fixed: its weight gradient is a CPU step's costliest op."""
    demonstrator: str = "oracle"
    """Who plays the demonstrations: ``oracle`` (shortest routes) or ``explorer`` (reads every
    wall, picks forks at random: a partial solver that leaves GRPO the route choice)."""
    reply: str = "visgym"
    """How the demonstrated replies read: ``visgym`` (VisGym's SFT format) or ``action`` (the
    action tag alone)."""
    route_rehearsal: int = 0
    """Route-question examples (the route base's pretraining task,
    :func:`maze_engine.perception.route_example`) trained beside each step's demonstrations, on
    fresh training-size mazes: the warm start then carries the base's route skill over to the
    task's prompt instead of overwriting it. 0 = none."""
    route_stop_share: float = 0.0
    """The share of those route questions asked with the agent on the goal and answered
    ``stop``; the rest show it elsewhere and answer a move. Without them the stop is learned only
    on the task's goal corners. 0 = none."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad ``local.warm_start.*`` key."""
        where = f"{LOCAL_KEY}.warm_start"
        for key, value, allowed in (
            ("demonstrator", self.demonstrator, DEMONSTRATORS),
            ("reply", self.reply, REPLY_FORMATS),
        ):
            if value not in allowed:
                raise ConfigError(
                    f"{show_value(value)} is not known", key=f"{where}.{key}", allowed=allowed
                )
        _at_least(self, where, steps=0, batch_size=1, warmup_steps=0, eval_every=0, eval_mazes=1)
        _at_least(self, where, track_every=0, route_rehearsal=0)
        _at_least(self, where, max_new_tokens=1)
        _share(self.route_stop_share, f"{where}.route_stop_share")
        if self.lr <= 0:
            raise ConfigError(f"must be > 0, got {show_value(self.lr)}", key=f"{where}.lr")
        if not self.decision_weight >= 1.0 or math.isinf(self.decision_weight):
            raise ConfigError(
                f"must be a finite number >= 1, got {show_value(self.decision_weight)}",
                key=f"{where}.decision_weight",
            )
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ConfigError(
                f"must be > 0 or null, got {show_value(self.max_seconds)}",
                key=f"{where}.max_seconds",
            )


@dataclass(frozen=True)
class PerceptionConfig:
    """``local.perception``: the pretraining stage that teaches a tiny model to read mazes.

    Dense descriptions of rendered mazes: a transcription of every square, and (``route_share``
    of the examples) the way from the agent to the goal. Used by ``maze-train pretrain``,
    which makes the shipped base artifact; its fields are recorded in the artifact's recipe.
    """

    steps: int = 4000
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 50
    specs: list[str] = field(default_factory=lambda: ["5x5", "7x7", "7x7", "9x9"])
    """Maze specs, drawn uniformly per example (repeat one to weight it)."""
    random_agent: float = 0.5
    """Share of examples whose agent stands on a random open square instead of the start."""
    cell_px: int = 32
    seed: int = 0
    freeze_patch_embed: bool = True
    eval_every: int = 200
    """Reading checks (teacher-forced, held-out mazes) every this many steps and at the end; 0 = never."""
    eval_mazes: int = 16
    max_seconds: float | None = None
    init: str = "random"
    """Where the model starts: ``random`` (built from ``local.tiny_model`` and ``seed``), a
    shipped artifact or a model directory (a later stage on an earlier one)."""
    route_share: float = 0.0
    """Share of examples that ask the way to the goal (the first move of a shortest route from
    the agent, one word) instead of a transcription."""
    route_specs: list[str] = field(default_factory=lambda: ["7x7"])
    """Maze specs of the route examples, drawn uniformly (repeat one to weight it)."""
    route_frames: int = 1
    """Most frames one route example asks the way on, one after the other (each example draws
    1..route_frames; the agent walks at random between them)."""
    route_stop_share: float = 0.0
    """The share of route examples whose last frame shows the agent on the goal (in place of
    where its walk ended), answered ``stop``; the rest never show it there, so a base pretrained
    without them has never seen the frame an episode must stop on. 0 = none."""
    snapshot_every: int = 0
    """Also save the model every this many steps to ``<out>.snapshots/step_<N>`` (not an
    artifact: for looking at a long run midway); 0 = never."""
    route_eval_set: str = "small-64"
    """Fixed eval set whose routes the checks score: every square of each maze's shortest route
    (held out: pretraining never draws its layouts)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad ``local.perception.*`` key."""
        from maze_env import MazeSpec, MazeSpecError

        where = f"{LOCAL_KEY}.perception"
        _at_least(self, where, steps=1, batch_size=1, warmup_steps=0, eval_every=0, eval_mazes=1)
        _at_least(self, where, cell_px=4, route_frames=1, snapshot_every=0)
        if self.lr <= 0:
            raise ConfigError(f"must be > 0, got {show_value(self.lr)}", key=f"{where}.lr")
        _share(self.random_agent, f"{where}.random_agent")
        _share(self.route_share, f"{where}.route_share")
        _share(self.route_stop_share, f"{where}.route_stop_share")
        for key, specs in (("specs", self.specs), ("route_specs", self.route_specs)):
            if not specs:
                raise ConfigError("must name at least one maze spec", key=f"{where}.{key}")
            for spec in specs:
                try:
                    MazeSpec.parse(spec)
                except MazeSpecError as exc:
                    raise ConfigError(str(exc), key=f"{where}.{key}") from exc
        _eval_set(self.route_eval_set, f"{where}.route_eval_set")


_RAY_RESOURCE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Ray's own resources: rollout workers take one CPU each, so these cannot be custom ones.
_RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


@dataclass(frozen=True)
class LocalRayConfig:
    """``local.ray``: where the local engine's Ray rollout workers run, and how long to wait."""

    worker_resources: dict[str, float] = field(default_factory=dict[str, float])
    """Custom Ray resources each rollout worker asks for besides its CPU (e.g.
    ``{mazerl_rollout: 1}``), so the workers run only on nodes that declare them."""
    start_timeout_s: float | None = 600.0
    """How long to wait for the workers to be placed and load their model before the run fails
    naming the resources no node offers; null waits forever (e.g. for an autoscaler)."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad ``local.ray.*`` key."""
        where = f"{LOCAL_KEY}.ray"
        for name, amount in self.worker_resources.items():
            key = f"{where}.worker_resources.{name}"
            if not _RAY_RESOURCE.fullmatch(name) or name in _RAY_BUILTIN_RESOURCES:
                raise ConfigError(
                    "must be a custom Ray resource name (letters, digits, _; not "
                    f"{', '.join(_RAY_BUILTIN_RESOURCES)})",
                    key=key,
                )
            # The schema checks only that this is a mapping; YAML can give any value.
            value = cast(object, amount)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"must be a number > 0, got {show_value(amount)}", key=key)
        if self.start_timeout_s is not None and self.start_timeout_s <= 0:
            raise ConfigError(
                f"must be > 0 seconds or null, got {show_value(self.start_timeout_s)}",
                key=f"{where}.start_timeout_s",
            )


@dataclass(frozen=True)
class LocalConfig:
    """The ``local:`` section: settings of the local CPU engine only."""

    rollout_workers: int = 2
    """Ray actors generating rollouts; 0 runs rollouts in the learner's process (no Ray)."""
    torch_threads: int = 1
    """Threads per process (learner and each worker). Fixed so runs repeat bit for bit."""
    ray: LocalRayConfig = field(default_factory=LocalRayConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    perception: PerceptionConfig = field(default_factory=PerceptionConfig)
    context: str = "full"
    """What the policy answers each turn from, in rollouts, the warm start's demonstrations and
    every evaluation alike: ``full`` (the whole conversation, VisGym's multi-turn format),
    ``latest`` (the system prompt and the latest user turn: the current frame and feedback),
    ``recent`` (``latest`` with the policy's previous reply before it, so the feedback on a bump
    says which move bumped) or ``route`` (the latest frame alone, asked the route base's
    pretraining question). The cluster path's SkyRL generator keeps the whole conversation,
    so it is ``full`` there."""
    step_advantage_weight: float = 0.0
    """With a per-turn context (``latest``, ``recent``, ``route``): how much of GiGPO's step-level
    advantage each turn adds to its episode's GRPO advantage (0 = episode advantages only; GiGPO
    uses 1). Turns of a group answered from the same state (``Episode.states``: the square, and the
    feedback on the last move) are compared by their discounted returns
    (``maze_engine.grpo.step_advantages``)."""
    step_advantage_gamma: float = 0.95
    """The discount of those returns: reaching the goal in fewer turns from a state is worth
    more."""
    progress_advantage_weight: float = 0.0
    """With a per-turn context (``latest``, ``recent``, ``route``): how much of a dense,
    verifier-given turn reward each turn adds to its episode's GRPO advantage (0 = episode
    advantages only). A turn earns 1 when its move takes the agent one square closer to the goal
    or it stops on the goal, else 0 (``maze_engine.decisions.good_turns``); each turn is scored
    against all its group's turns (``maze_engine.grpo.turn_reward_advantages``)."""
    off_goal_stop_penalty: float = 0.0
    """With ``progress_advantage_weight``: a stop away from the goal earns minus this as its turn
    reward instead of 0 (``maze_engine.decisions.turn_rewards``), so the stop that throws an
    episode away scores below a bump that only wastes a turn. 0 = scored as a bump."""
    route_rehearsal: int = 0
    """Route-question examples (as ``warm_start.route_rehearsal``, on fresh training-size mazes
    outside every held-out layout) trained after each GRPO step's update, one supervised step
    on the LoRA weights with the GRPO optimizer, as InstructGPT's PPO-ptx mixes pretraining
    gradients into RL: GRPO on a few training layouts otherwise wears away the base's reading
    of new ones. Each step's questions are drawn from its global step, so a resumed run repeats
    them. 0 = none (SkyRL's GRPO; the cluster path has no such step)."""
    route_stop_share: float = 0.0
    """The share of those questions asked with the agent on the goal and answered ``stop`` (as
    ``warm_start.route_stop_share``)."""
    tiny_base: str = "random"
    """Where the tiny model starts: ``random`` (built from ``tiny_model``), a shipped artifact
    (``maze_engine.artifacts``, e.g. the perception-pretrained base) or a model directory."""
    tiny_model: dict[str, Any] = field(default_factory=dict[str, Any])
    """Overrides of ``maze_policy.model.TinyVLMConfig`` for the model built here."""
    prometheus_port: int | None = None
    """Serve metrics on 127.0.0.1:PORT (0 picks a free port); None disables."""
    tensorboard: bool = True
    progress: bool = True
    ckpt_s3_uri: str | None = None
    """Mirror each checkpoint and the final adapter to ``s3://bucket/prefix`` (boto3; honours
    AWS_ENDPOINT_URL). Uploads run beside training; failures are logged, counted and retried."""
    ckpt_s3_drain_s: float = 120.0
    """At the end of a run, how long to wait for mirror uploads still queued or retrying."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first ``local.*`` key with a bad value."""
        _at_least(self, LOCAL_KEY, rollout_workers=0, torch_threads=1, route_rehearsal=0)
        from maze_policy.contexts import CONTEXTS

        if self.context not in CONTEXTS:
            raise ConfigError(
                f"{show_value(self.context)} is not known",
                key=f"{LOCAL_KEY}.context",
                allowed=CONTEXTS,
            )
        # Both per-turn terms advantage turns played as their own sequences.
        for name, weight in (
            ("step_advantage_weight", self.step_advantage_weight),
            ("progress_advantage_weight", self.progress_advantage_weight),
        ):
            if weight < 0:
                raise ConfigError(
                    f"must be >= 0, got {show_value(weight)}", key=f"{LOCAL_KEY}.{name}"
                )
            if weight > 0 and self.context == "full":
                raise ConfigError(
                    "per-turn advantages need turns played as their own sequences: "
                    f"set {LOCAL_KEY}.context=latest, recent, route or route-recent",
                    key=f"{LOCAL_KEY}.{name}",
                )
        if self.off_goal_stop_penalty < 0:
            raise ConfigError(
                f"must be >= 0, got {show_value(self.off_goal_stop_penalty)}",
                key=f"{LOCAL_KEY}.off_goal_stop_penalty",
            )
        if self.off_goal_stop_penalty > 0 and self.progress_advantage_weight == 0:
            # The penalty is a turn reward; with no turn-reward term it would be silently unused.
            raise ConfigError(
                "is a turn reward: set local.progress_advantage_weight > 0 to use it",
                key=f"{LOCAL_KEY}.off_goal_stop_penalty",
            )
        if not 0 < self.step_advantage_gamma <= 1:
            raise ConfigError(
                f"must be in (0, 1], got {show_value(self.step_advantage_gamma)}",
                key=f"{LOCAL_KEY}.step_advantage_gamma",
            )
        _share(self.route_stop_share, f"{LOCAL_KEY}.route_stop_share")
        if self.prometheus_port is not None and not 0 <= self.prometheus_port <= 65535:
            raise ConfigError(
                "must be a port number (0 = any free port) or null",
                key=f"{LOCAL_KEY}.prometheus_port",
            )
        self.ray.validate()
        self.warm_start.validate()
        self.perception.validate()
        if self.ckpt_s3_uri is not None:
            from weight_sync import MirrorError, parse_s3_uri

            try:
                parse_s3_uri(self.ckpt_s3_uri)
            except MirrorError as exc:
                raise ConfigError(str(exc), key=f"{LOCAL_KEY}.ckpt_s3_uri") from None
        if self.ckpt_s3_drain_s < 0:
            raise ConfigError("must be >= 0 seconds", key=f"{LOCAL_KEY}.ckpt_s3_drain_s")
        if self.tiny_model:
            from maze_policy.model import TinyVLMConfig

            check_section(TinyVLMConfig, self.tiny_model, f"{LOCAL_KEY}.tiny_model.")


@dataclass(frozen=True)
class ClusterConfig:
    """The ``cluster:`` section: this project's pieces in the SkyRL cluster run.

    The LoRA adapter syncs through ``trainer.policy.model.lora.lora_sync_path`` as weight-sync
    versions consolidated on the CPU head node (``maze_engine.lora_sync``).
    """

    head_resource: str = "mazerl_head"
    """Custom Ray resource only the CPU head node declares; LoRA consolidation runs there."""
    keep_versions: int = 3
    """Published adapter versions kept on the shared filesystem (leased ones are never removed)."""
    handover_retries: int = 3
    """Attempts to reach an engine that does not answer, with backoff, before the step fails."""
    s3_uri: str | None = None
    """Mirror checkpoints and served adapters to ``s3://bucket/prefix`` after each checkpoint."""
    prometheus_port: int | None = 9400
    """Port of the trainer's Prometheus endpoint (on the pod running SkyRL's trainer); None
    disables it."""

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first ``cluster.*`` key with a bad value."""
        _at_least(self, CLUSTER_KEY, keep_versions=1, handover_retries=0)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.head_resource):
            raise ConfigError(
                "must be a Ray resource name (letters, digits, _)",
                key=f"{CLUSTER_KEY}.head_resource",
            )
        if self.prometheus_port is not None and not 0 <= self.prometheus_port <= 65535:
            raise ConfigError("must be a port number or null", key=f"{CLUSTER_KEY}.prometheus_port")
        if self.s3_uri is not None:
            from weight_sync import MirrorError, parse_s3_uri

            try:
                parse_s3_uri(self.s3_uri)
            except MirrorError as exc:
                raise ConfigError(str(exc), key=f"{CLUSTER_KEY}.s3_uri") from None


@dataclass(frozen=True)
class MazerlConfig:
    """A loaded config file: SkyRL's config plus this project's sections."""

    skyrl: SkyRLTrainConfig
    mazes: MazeDataConfig
    local: LocalConfig
    source: Path
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """The YAML file it was read from."""

    @property
    def data_dir(self) -> Path:
        """Where the datasets live: the directory of ``data.train_data[0]``."""
        return Path(self.skyrl.data.train_data[0]).parent

    @property
    def max_turns(self) -> int:
        """``generator.max_turns``: both engines end an episode after this many turns."""
        return int(self.skyrl.generator.max_turns)


def _eval_set(name: str, key: str) -> None:
    from maze_env import EVAL_SETS

    if name not in EVAL_SETS:
        raise ConfigError(
            f"{show_value(name)} is not a fixed eval set", key=key, allowed=tuple(EVAL_SETS)
        )


def _at_least(section: object, where: str, **lows: int) -> None:
    for key, lo in lows.items():
        value = getattr(section, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ConfigError(
                f"must be an int >= {lo}, got {show_value(value)}", key=f"{where}.{key}"
            )


def _share(value: object, key: str) -> None:
    # bool is an int to Python, and NaN compares false both ways: neither is a share.
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"must be a number within 0..1, got {show_value(value)}", key=key)


def shipped_configs() -> list[str]:
    """Names of the configs shipped with the package (``--config`` accepts them bare)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def resolve_config_path(config: str | os.PathLike[str]) -> Path:
    """An existing file, or a shipped config by name (``maze_grpo_qwen3vl8b[.yaml]``)."""
    path = Path(config)
    if path.is_file():
        return path
    if len(path.parts) == 1:
        shipped = CONFIG_DIR / (
            path.name if path.suffix in {".yaml", ".yml"} else f"{path.name}.yaml"
        )
        if shipped.is_file():
            return shipped
    raise ConfigError(
        f"config file {os.fspath(config)!r} not found; give a path or a shipped config name",
        allowed=shipped_configs(),
    )


def _own_section[T](
    tree: dict[str, object], key: str, datacls: type[T], overridden: list[str], source: str
) -> T:
    raw = tree.pop(key, None)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"must be a mapping, got {show_value(raw)}", key=key, source=source)
    data = cast(dict[str, object], raw)
    try:
        check_section(datacls, data, f"{key}.")
        section = build_section(datacls, data)
        cast(Any, section).validate()
    except ConfigError as e:
        raise ConfigError(
            e.detail, key=e.key, allowed=e.allowed, source=source_of(e.key, overridden, source)
        ) from None
    return section


def load_config(
    path: str | os.PathLike[str],
    overrides: list[str] | tuple[str, ...] = (),
    *,
    validate: bool = True,
) -> MazerlConfig:
    """Load a config file (a path or a shipped name) with ``key=value`` overrides.

    Overrides use the same dotted keys in every section (``mazes.train_size=64``,
    ``local.rollout_workers=0``) and see ``${...}`` interpolations, so ``trainer.run_name=x``
    moves every path built from it. With ``validate`` SkyRL's own ``validate_cfg`` runs too, as
    its entrypoint would.

    Args:
        path: A YAML file or the name of a shipped config.
        overrides: ``key=value`` strings, applied in order.
        validate: Also run SkyRL's ``validate_cfg``.

    Returns:
        The typed config.

    Raises:
        ConfigError: The first bad key or value, named, with where it was set.
    """
    file = resolve_config_path(path)
    tree, overridden = load_tree(file, list(overrides))
    source = str(file)
    mazes = _own_section(tree, MAZES_KEY, MazeDataConfig, overridden, source)
    local = _own_section(tree, LOCAL_KEY, LocalConfig, overridden, source)
    cluster = _own_section(tree, CLUSTER_KEY, ClusterConfig, overridden, source)

    from skyrl.train.config import SkyRLTrainConfig

    try:
        check_section(SkyRLTrainConfig, tree, "")
        check_vlm(tree)
    except ConfigError as e:
        raise ConfigError(
            e.detail, key=e.key, allowed=e.allowed, source=source_of(e.key, overridden, source)
        ) from None
    flat = flatten(SkyRLTrainConfig, tree)
    try:
        cfg = SkyRLTrainConfig.from_cli_overrides(flat)
    except (ValueError, TypeError, AssertionError) as e:
        key = blame(str(e), list(flat), overridden)
        raise ConfigError(
            f"SkyRL rejected the config: {e}", key=key, source=source_of(key, overridden, source)
        ) from e
    if validate:
        from skyrl.train.utils import validate_cfg

        try:
            validate_cfg(cfg)
        except (ValueError, TypeError, AssertionError, NotImplementedError) as e:
            key = blame(str(e), list(flat), overridden)
            raise ConfigError(
                f"SkyRL's validate_cfg rejected the config: {e}",
                key=key,
                source=source_of(key, overridden, source),
            ) from e
    config = MazerlConfig(skyrl=cfg, mazes=mazes, local=local, source=file, cluster=cluster)
    from maze_engine.data import eval_slack

    try:
        eval_slack(config.max_turns, mazes.eval_set)  # every eval maze must be finishable
    except ConfigError as e:
        raise ConfigError(
            e.detail, key=e.key, allowed=e.allowed, source=source_of(e.key, overridden, source)
        ) from None
    return config
