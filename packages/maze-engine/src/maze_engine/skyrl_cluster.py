"""The SkyRL cluster path: ``maze-train --engine skyrl`` on a Ray cluster with GPUs.

SkyRL's own trainer does the work (FSDP policy, colocated vLLM engines, LoRA synced through
``trainer.policy.model.lora.lora_sync_path`` on the shared filesystem); this module supplies what
the maze task adds around it:

* :func:`load_config`: one YAML file + ``key=value`` overrides, checked key by key against
  SkyRL's config dataclasses (``skyrl.train.config.SkyRLTrainConfig``) and then by SkyRL's own
  ``validate_cfg``. The file's ``local:`` section belongs to the local engine and is split off
  before SkyRL sees the rest, so one file drives both engines.
* :func:`prepare_datasets`: the train / validation parquet files (maze-env's exporter) on the
  shared filesystem, with a step budget that matches ``generator.max_turns``.
* :func:`main` (``python -m maze_engine.skyrl_cluster``): registers the maze env inside the Ray
  task that runs SkyRL's ``BasePPOExp``, as SkyRL's examples do for custom envs.
* :func:`build_submit_command`: the ``ray job submit`` command for HyperPod
  (``sagemaker_ray://<raycluster>/<namespace>``) or any Ray dashboard address.

Training needs ``skyrl[fsdp]`` (vLLM, flash-attn) and GPUs, i.e. the GPU container image. SkyRL
is imported lazily: importing it costs ~10-20 s of CPU, and callers that only build a submit
command should not pay for it twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib.util
import json
import os
import re
import sys
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

if TYPE_CHECKING:
    from skyrl.train.config import SkyRLTrainConfig

__all__ = [
    "CONFIG_DIR",
    "ENV_CLASS",
    "EXIT_CONFIG_ERROR",
    "EXIT_NEEDS_GPU_IMAGE",
    "LOCAL_KEY",
    "REFERENCE_CONFIG",
    "TINY_LOCAL_CONFIG",
    "GpuImageRequiredError",
    "MazeDatasets",
    "SkyRLConfigError",
    "build_submit_command",
    "eval_slack",
    "load_config",
    "main",
    "prepare_datasets",
    "register_maze_env",
    "require_gpu_stack",
    "resolve_config_path",
    "run_training",
    "shipped_configs",
]

CONFIG_DIR = Path(__file__).with_name("configs")
"""Shipped YAML configs (package data)."""
REFERENCE_CONFIG = "maze_grpo_qwen3vl8b"
"""The reference HyperPod run: Qwen3-VL-8B, LoRA r32, 3 nodes x 2 GPUs."""
TINY_LOCAL_CONFIG = "tiny_local"
"""The local engine's default: a tiny random Qwen3-VL on CPU."""
LOCAL_KEY = "local"
"""Top-level section for local-engine settings; never handed to SkyRL."""
ENV_CLASS = "maze"
DATA_MANIFEST = "mazerl_datasets.json"
"""Written next to the exported datasets: the settings they were built with."""
FORWARDED_ENV_VARS = ("MAZERL_RUN", "MAZERL_SFT_CHECKPOINT")
"""Variables the shipped configs read (``${oc.env:...}``); forwarded to the Ray job if set."""
GPU_MODULES = ("vllm",)
"""Importable only where ``skyrl[fsdp]`` is installed (the GPU container image)."""
EXIT_CONFIG_ERROR = 2
EXIT_NEEDS_GPU_IMAGE = 3

# String fields whose allowed values SkyRL documents and checks late (or not at all); checked here
# so the error names the key before any GPU is touched. Literal/Enum fields are read off the types.
_CHOICES: dict[str, tuple[object, ...]] = {
    "trainer.strategy": ("fsdp", "megatron"),
    "trainer.resume_mode": ("latest", "none", "from_path", None),
    "trainer.logger": ("wandb", "mlflow", "swanlab", "tensorboard", "console"),
    "trainer.sequence_parallel_backend": ("ulysses",),
    "trainer.algorithm.loss_reduction": (
        "token_mean",
        "token_mean_legacy",
        "sequence_mean",
        "seq_mean_token_sum_norm",
        "prompt_mean",
    ),
    "trainer.algorithm.kl_estimator_type": ("k1", "k2", "k3", "abs"),
    "trainer.policy.model.lora.sync_mode": ("disk", "memory"),
    "generator.inference_engine.backend": ("vllm",),
    "generator.inference_engine.distributed_executor_backend": ("mp", "ray"),
    "generator.chat_template.source": ("name", "file"),
}
# Filled from SkyRL's registries (custom entries can be registered, so the list is read live).
_REGISTRY_CHOICES = {
    "trainer.algorithm.advantage_estimator": "AdvantageEstimatorRegistry",
    "trainer.algorithm.policy_loss_type": "PolicyLossRegistry",
}


class SkyRLConfigError(ValueError):
    """A config file, override or value SkyRL cannot run; names the key and the allowed values."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        allowed: Sequence[object] | None = None,
        source: str | None = None,
    ) -> None:
        self.detail = message
        self.key = key
        self.allowed = tuple(allowed) if allowed is not None else None
        self.source = source
        text = f"{key}: {message}" if key else message
        if self.allowed is not None:
            text += f"; allowed values: {', '.join(_show(a) for a in self.allowed)}"
        if source:
            text += f" (in {source})"
        super().__init__(text)


class GpuImageRequiredError(RuntimeError):
    """SkyRL training was started where ``skyrl[fsdp]`` (vLLM, flash-attn) is not installed."""


def _show(value: object) -> str:
    """A value as it would be written in the YAML file or an override."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _a(name: str) -> str:
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


# ---------------------------------------------------------------------------------------------
# Config files
# ---------------------------------------------------------------------------------------------


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
    raise SkyRLConfigError(
        f"config file {os.fspath(config)!r} not found; give a path or a shipped config name",
        allowed=shipped_configs(),
    )


def _expand_dotted(node: object, where: str) -> object:
    """Nested dicts from a YAML that may also use dotted keys (``trainer.epochs: 3``)."""
    if isinstance(node, list):
        return [_expand_dotted(v, f"{where}[{i}]") for i, v in enumerate(cast(list[object], node))]
    if not isinstance(node, dict):
        return node
    out: dict[str, object] = {}
    for raw_key, raw_value in cast(dict[object, object], node).items():
        if not isinstance(raw_key, str) or not raw_key:
            raise SkyRLConfigError(
                f"keys must be non-empty strings, got {raw_key!r}", key=where or None
            )
        full = f"{where}.{raw_key}" if where else raw_key
        value = _expand_dotted(raw_value, full)
        *parents, leaf = raw_key.split(".")
        cur = out
        for part in parents:
            nxt = cur.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise SkyRLConfigError("set both as a value and as a section", key=full)
            cur = cast(dict[str, object], nxt)
        if leaf in cur and isinstance(cur[leaf], dict) and isinstance(value, dict):
            cur[leaf] = _merge_dicts(
                cast(dict[str, object], cur[leaf]), cast(dict[str, object], value)
            )
        else:
            cur[leaf] = value
    return out


def _merge_dicts(a: dict[str, object], b: dict[str, object]) -> dict[str, object]:
    out = dict(a)
    for k, v in b.items():
        if k in out and isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = _merge_dicts(cast(dict[str, object], out[k]), cast(dict[str, object], v))
        else:
            out[k] = v
    return out


_OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")


def _override_keys(overrides: Sequence[str]) -> list[str]:
    keys: list[str] = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        key = key.strip()
        if not sep:
            raise SkyRLConfigError(f"override {item!r} is not key=value")
        if key[:1] in {"+", "~"}:
            raise SkyRLConfigError(
                f"override {item!r}: adding ('+') or deleting ('~') keys is not supported; "
                "every key must exist in SkyRL's config or sit under 'local.'"
            )
        if not _OVERRIDE_KEY.fullmatch(key):
            raise SkyRLConfigError(f"override {item!r}: {key!r} is not a dotted key")
        keys.append(key)
    return keys


def _load_tree(path: Path, overrides: Sequence[str]) -> tuple[dict[str, object], list[str]]:
    """YAML + overrides, merged and resolved (``${...}`` interpolations, ``oc.env``)."""
    source = str(path)
    try:
        raw: object = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as e:
        raise SkyRLConfigError(f"cannot read config: {e}", source=source) from e
    if not isinstance(raw, dict):
        raise SkyRLConfigError("the top level must be a mapping of config sections", source=source)
    base = cast(dict[str, Any], _expand_dotted(cast(object, raw), ""))
    keys = _override_keys(overrides)
    try:
        merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.from_dotlist(list(overrides)))
        tree = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or None
        raise SkyRLConfigError(f"{type(e).__name__}: {e.msg or e}", key=key, source=source) from e  # pyright: ignore[reportUnknownMemberType]
    return cast(dict[str, object], tree), keys


# ---------------------------------------------------------------------------------------------
# Checking values against SkyRL's dataclasses
# ---------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    origin: object = typing.get_origin(tp)
    args: tuple[Any, ...] = typing.get_args(tp)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict or tp is dict:
        return "mapping"
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    if isinstance(tp, type):
        return "mapping" if dataclasses.is_dataclass(tp) else cast(type, tp).__name__
    return str(tp).replace("typing.", "")


def _registry_choices(key: str) -> tuple[object, ...] | None:
    name = _REGISTRY_CHOICES.get(key)
    if name is None:
        return None
    from skyrl.backends.skyrl_train.utils import ppo_utils

    registry = getattr(ppo_utils, name)
    registry.repopulate_registry()
    return tuple(sorted(registry.list_available()))


def _check_value(tp: Any, value: object, key: str) -> None:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any or tp is object:
        return
    if origin is typing.Annotated:
        _check_value(args[0], value, key)
        return
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return
        arms = [a for a in args if a is not type(None)]
        errors: list[SkyRLConfigError] = []
        for arm in arms:
            try:
                _check_value(arm, value, key)
            except SkyRLConfigError as e:
                errors.append(e)
            else:
                return
        if len(arms) == 1:
            raise errors[0]
        raise SkyRLConfigError(f"{_show(value)} is not {_a(_type_name(tp))}", key=key)
    if origin is Literal:
        if value not in args:
            raise SkyRLConfigError(f"{_show(value)} is not allowed", key=key, allowed=args)
        return
    if value is None:
        raise SkyRLConfigError(f"must be {_a(_type_name(tp))}, not null", key=key)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SkyRLConfigError(
                f"must be a section (mapping of {tp.__name__} keys), got {_show(value)}", key=key
            )
        _check_section(tp, cast(dict[str, object], value), f"{key}.")
        return
    if isinstance(tp, type) and issubclass(tp, Enum):
        allowed = tuple(m.value for m in tp)
        if value not in allowed:
            raise SkyRLConfigError(f"{_show(value)} is not allowed", key=key, allowed=allowed)
        return
    ok: bool
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif tp is list or origin is list:
        ok = isinstance(value, list)
        if ok and args:
            for i, item in enumerate(cast(list[object], value)):
                _check_value(args[0], item, f"{key}[{i}]")
    elif tp is dict or origin is dict:
        ok = isinstance(value, dict)
    else:
        ok = True  # a type SkyRL passes through untouched
    if not ok:
        raise SkyRLConfigError(f"{_show(value)} is not {_a(_type_name(tp))}", key=key)


def _check_section(datacls: type, data: Mapping[str, object], prefix: str) -> None:
    hints = typing.get_type_hints(datacls)
    names = [f.name for f in dataclasses.fields(cast(Any, datacls))]
    section = prefix[:-1] or "the top level"
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
            if close:
                hint = f"did you mean {', '.join(repr(prefix + c) for c in close)}?"
            else:
                hint = f"keys allowed under {section}: {', '.join(sorted(names))}"
            if not prefix:
                hint += f" (engine-specific settings go under '{LOCAL_KEY}:')"
            raise SkyRLConfigError(f"unknown key, not in SkyRL's config; {hint}", key=full)
        _check_value(hints[key], value, full)
        allowed = _CHOICES.get(full) or (_registry_choices(full) if value is not None else None)
        if allowed is not None and value not in allowed:
            raise SkyRLConfigError(f"{_show(value)} is not allowed", key=full, allowed=allowed)


def _check_vlm(tree: Mapping[str, object]) -> None:
    """What SkyRL 0.4's VLM generator needs, checked before a GPU is held (it checks at start)."""
    gen = cast(dict[str, Any], tree.get("generator") or {})
    trainer = cast(dict[str, Any], tree.get("trainer") or {})
    if not gen.get("vision_language_generator", False):
        return
    wrong = [
        ("generator.batched", gen.get("batched", False), False),
        ("generator.step_wise_trajectories", gen.get("step_wise_trajectories", False), False),
        (
            "generator.use_conversation_multi_turn",
            gen.get("use_conversation_multi_turn", True),
            True,
        ),
        (
            "trainer.remove_microbatch_padding",
            trainer.get("remove_microbatch_padding", True),
            False,
        ),
    ]
    for key, value, needed in wrong:
        if value != needed:
            raise SkyRLConfigError(
                f"{_show(value)} does not work with generator.vision_language_generator=true",
                key=key,
                allowed=(needed,),
            )


def _flatten(datacls: type, data: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Dotted keys down to the leaves of SkyRL's dataclasses; dict-typed fields stay whole."""
    hints = typing.get_type_hints(datacls)
    out: dict[str, object] = {}
    for key, value in data.items():
        tp = hints[key]
        arms = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        nested = next(
            (a for a in arms if isinstance(a, type) and dataclasses.is_dataclass(a)), None
        )
        if nested is not None and isinstance(value, dict) and value:
            out.update(_flatten(nested, cast(dict[str, object], value), f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# SkyRL messages that name a quantity, not a key: the keys that set it.
_MESSAGE_KEYS: dict[str, tuple[str, ...]] = {
    "num_rollout_gpus": (
        "generator.inference_engine.num_engines",
        "generator.inference_engine.tensor_parallel_size",
        "trainer.placement.policy_num_nodes",
        "trainer.placement.policy_num_gpus_per_node",
    ),
    "WANDB_API_KEY": ("trainer.logger",),
}


def _blame(message: str, keys: Sequence[str], overridden: Sequence[str]) -> str | None:
    """The config key a SkyRL error message is about, preferring keys the user overrode."""

    def pick(candidates: list[str]) -> str | None:
        hit = [k for k in candidates if any(k == o or k.startswith(f"{o}.") for o in overridden)]
        return (hit or candidates or [None])[0]

    full = [k for k in sorted(keys, key=len, reverse=True) if k in message]
    if full:
        return pick(full)
    for needle, related in _MESSAGE_KEYS.items():
        if needle in message:
            return pick(list(related))
    leaves = [
        k for k in keys if re.search(rf"(?<![\w.]){re.escape(k.rsplit('.', 1)[-1])}(?!\w)", message)
    ]
    return pick(leaves)


def load_config(
    path: str | os.PathLike[str],
    overrides: Sequence[str] = (),
    *,
    validate: bool = True,
) -> tuple[SkyRLTrainConfig, dict[str, Any]]:
    """Build SkyRL's config from ``path`` (a file or shipped name) and ``key=value`` overrides.

    Returns the ``SkyRLTrainConfig`` and the ``local:`` section as a plain dict (empty if absent).
    Overrides use the same dotted keys, ``local.*`` included, and see ``${...}`` interpolations
    (``trainer.run_name=x`` moves every path built from it). With ``validate`` SkyRL's own
    ``validate_cfg`` runs too, as its entrypoint would. Every failure is a
    :class:`SkyRLConfigError` naming the key (and the allowed values where there is a fixed set).
    """
    file = resolve_config_path(path)
    tree, override_keys = _load_tree(file, overrides)
    source = str(file)

    local = tree.pop(LOCAL_KEY, None)
    if local is None:
        local = {}
    if not isinstance(local, dict):
        raise SkyRLConfigError(
            f"must be a mapping, got {_show(local)}", key=LOCAL_KEY, source=source
        )

    from skyrl.train.config import SkyRLTrainConfig

    try:
        _check_section(SkyRLTrainConfig, tree, "")
        _check_vlm(tree)
    except SkyRLConfigError as e:
        raise SkyRLConfigError(
            e.detail,
            key=e.key,
            allowed=e.allowed,
            source=_source_of(e.key, override_keys, source),
        ) from None

    flat = _flatten(SkyRLTrainConfig, tree)
    try:
        cfg = SkyRLTrainConfig.from_cli_overrides(flat)
    except (ValueError, TypeError, AssertionError) as e:
        key = _blame(str(e), list(flat), override_keys)
        raise SkyRLConfigError(
            f"SkyRL rejected the config: {e}",
            key=key,
            source=_source_of(key, override_keys, source),
        ) from e
    if validate:
        from skyrl.train.utils import validate_cfg

        try:
            validate_cfg(cfg)
        except (ValueError, TypeError, AssertionError, NotImplementedError) as e:
            key = _blame(str(e), list(flat), override_keys)
            raise SkyRLConfigError(
                f"SkyRL's validate_cfg rejected the config: {e}",
                key=key,
                source=_source_of(key, override_keys, source),
            ) from e
    return cfg, cast(dict[str, Any], local)


def _source_of(key: str | None, override_keys: Sequence[str], file: str) -> str:
    if key is not None:
        for o in override_keys:
            if key == o or key.startswith(f"{o}.") or o.startswith(f"{key}."):
                return f"override {o}=..."
    return file


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MazeDatasets:
    """Files :func:`prepare_datasets` wrote (or found up to date) and how they were built."""

    train: Path
    validation: Path
    manifest: Path
    slack: int
    """Turns beyond ``optimal moves + stop`` in every row's ``step_budget``."""
    max_step_budget: int
    """The validation set's longest budget: ``generator.max_turns`` by construction."""
    reused: bool


def eval_slack(max_turns: int, eval_set: str = "easy-64") -> int:
    """Slack that makes the eval set's longest maze take exactly ``max_turns`` turns.

    Raises :class:`SkyRLConfigError` on ``generator.max_turns`` when some maze of the set cannot
    be finished in that many turns (VisGym's 15 leaves the 16-move easy mazes unsolvable).
    """
    from maze_env import EvalSetError, get_eval_set

    try:
        es = get_eval_set(eval_set)
    except EvalSetError as e:
        raise SkyRLConfigError(str(e), key="eval_set") from e
    worst = max(m.optimal_moves for m in es.mazes)
    slack = max_turns - (worst + 1)
    if slack < 0:
        raise SkyRLConfigError(
            f"{max_turns} turns cannot finish every maze of {eval_set!r}: the longest needs "
            f"{worst} moves + stop, so at least {worst + 1}",
            key="generator.max_turns",
        )
    return slack


def _tag_rows(path: Path, reward_spec: str, slack: int) -> None:
    """Name the reward spec (and slack) on every row: SkyRL hands the env ``getattr(
    skyrl_gym_cfg, "maze", {})``, always empty for an env it does not know, so per-row extras are
    how settings reach :class:`maze_verifier.env.MazeEnv`."""
    import pyarrow.parquet as pq

    from maze_env.export import write_rows

    rows = cast(list[dict[str, Any]], pq.read_table(path).to_pylist())  # pyright: ignore[reportUnknownMemberType]
    for row in rows:
        row["reward_spec"] = {**row["reward_spec"], "spec": reward_spec}
        row["env_config"] = {"slack": slack}
    write_rows(rows, path)


def prepare_datasets(
    cfg: SkyRLTrainConfig,
    shared_dir: str | os.PathLike[str],
    *,
    train_size: int = 256,
    train_preset: str = "easy",
    eval_set: str = "easy-64",
    train_reward_spec: str = "visgym_sft",
    overwrite: bool = False,
) -> MazeDatasets:
    """Export ``train.parquet`` / ``validation.parquet`` into ``shared_dir`` and point
    ``cfg.data`` at them.

    The validation split is ``eval_set`` scored with the ``task`` reward (1 solved, else 0), so
    SkyRL's ``eval/all/pass_at_1`` is the solve rate; training rows use ``train_reward_spec``
    (default VisGym's SFT recipe, 0.8 task + 0.2 format). Every row's step budget is
    ``optimal moves + 1 + slack`` with the slack from :func:`eval_slack`. Files built with the
    same settings are reused (a manifest records them), so a resumed run trains on the same data.
    """
    from maze_env import __version__ as maze_env_version
    from maze_env.export import export_datasets
    from maze_verifier import RewardSpecError, get_spec

    slack = eval_slack(cfg.generator.max_turns, eval_set)
    if train_size < cfg.trainer.train_batch_size:
        raise SkyRLConfigError(
            f"{cfg.trainer.train_batch_size} is more than the {train_size} training mazes",
            key="trainer.train_batch_size",
        )
    try:
        get_spec(train_reward_spec)
    except RewardSpecError as e:
        raise SkyRLConfigError(str(e), key="train_reward_spec") from e

    out = Path(shared_dir)
    train, validation, manifest = (
        out / "train.parquet",
        out / "validation.parquet",
        out / DATA_MANIFEST,
    )
    settings: dict[str, object] = {
        "format": 1,
        "maze_env": maze_env_version,
        "train_size": train_size,
        "train_preset": train_preset,
        "eval_set": eval_set,
        "slack": slack,
        "train_reward_spec": train_reward_spec,
        "eval_reward_spec": "task",
    }
    reused = (
        not overwrite
        and train.is_file()
        and validation.is_file()
        and read_json(manifest) == settings
    )
    if not reused:
        try:
            export_datasets(
                out, train_size=train_size, train_spec=train_preset, eval_set=eval_set, slack=slack
            )
        except ValueError as e:  # MazeSpecError and friends
            raise SkyRLConfigError(str(e), key="train_preset") from e
        _tag_rows(train, train_reward_spec, slack)
        _tag_rows(validation, "task", slack)
        write_json(manifest, settings)

    cfg.data.train_data = [str(train)]
    cfg.data.val_data = [str(validation)]
    return MazeDatasets(
        train=train,
        validation=validation,
        manifest=manifest,
        slack=slack,
        max_step_budget=cfg.generator.max_turns,
        reused=reused,
    )


def read_json(path: Path) -> object:
    """A JSON file's content, or None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: object) -> None:
    """Write ``data`` as JSON atomically (temp file in the same directory, then rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------------------------------------
# Training on the cluster
# ---------------------------------------------------------------------------------------------


def register_maze_env(env_class: str = ENV_CLASS) -> str:
    """Register maze-verifier's :class:`~maze_verifier.env.MazeEnv` with skyrl-gym (idempotent)."""
    from maze_verifier import register_env

    return register_env(env_class)


def require_gpu_stack() -> None:
    """Raise :class:`GpuImageRequiredError` unless ``skyrl[fsdp]``'s GPU packages are importable."""
    missing = [m for m in GPU_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise GpuImageRequiredError(
            f"SkyRL training needs skyrl[fsdp] (vLLM, flash-attn, CUDA torch) and GPUs; "
            f"not installed here: {', '.join(missing)}. Run it in the mazerl GPU container image "
            "on the Ray cluster (submit with `ray job submit`, see build_submit_command). Here, "
            "--dry-run validates the config, and `maze-train --engine local` trains on CPU."
        )


def _train_in_ray_task(cfg: SkyRLTrainConfig) -> None:
    """Body of the Ray task: runs where SkyRL's generator creates envs, so register there."""
    register_maze_env(cfg.environment.env_class)
    # SkyRL's tensorboard logger reads this; keep the logs with the run on the shared FS.
    os.environ.setdefault("TENSORBOARD_DIR", str(Path(cfg.trainer.export_path) / "tensorboard"))
    from skyrl.train.entrypoints.main_base import BasePPOExp

    BasePPOExp(cfg).run()


def run_training(cfg: SkyRLTrainConfig) -> None:
    """SkyRL's training main with the maze env: ``initialize_ray`` (joins the job's cluster, sets
    SkyRL's runtime env and registries), then ``BasePPOExp`` in a Ray task (CPU 1, as SkyRL's
    ``skyrl_entrypoint``) that registers the env first. Blocks until training ends."""
    require_gpu_stack()
    import ray
    from skyrl.train.utils.utils import initialize_ray

    initialize_ray(cfg)
    task = ray.remote(num_cpus=1)(_train_in_ray_task)
    ray.get(task.remote(cfg))  # pyright: ignore[reportUnknownMemberType]


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m maze_engine.skyrl_cluster",
        description="Train on visual mazes with SkyRL on a Ray cluster (GPU container image). "
        "Positional key=value arguments override SkyRL config keys.",
    )
    p.add_argument(
        "--config",
        default=REFERENCE_CONFIG,
        help=f"YAML path or shipped name ({', '.join(shipped_configs())}); default %(default)s",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="where to export datasets; default: the directory of data.train_data[0]",
    )
    p.add_argument("--train-size", type=int, default=256, help="training mazes (default 256)")
    p.add_argument("--train-preset", default="easy", help="maze spec of training mazes")
    p.add_argument("--eval-set", default="easy-64", help="validation set (default easy-64)")
    p.add_argument(
        "--train-reward-spec",
        default="visgym_sft",
        help="maze-verifier reward spec for training rows (eval uses 'task')",
    )
    p.add_argument("--overwrite-data", action="store_true", help="re-export even if up to date")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print the resolved SkyRL config; needs no GPU, writes nothing",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m maze_engine.skyrl_cluster [options] [key=value ...]``; returns the exit code."""
    parser = _arg_parser()
    args, overrides = parser.parse_known_args(argv)
    stray = [o for o in overrides if o.startswith("-")]
    if stray:
        parser.error(f"unrecognized options: {' '.join(stray)}")
    prog = parser.prog
    try:
        if not args.dry_run:
            require_gpu_stack()  # before the slow SkyRL import: fail in a second, not in twenty
        cfg, _local = load_config(args.config, overrides)
        data_dir = args.data_dir or Path(cfg.data.train_data[0]).parent
        if args.dry_run:
            from skyrl.train.config import get_config_as_yaml_str

            slack = eval_slack(cfg.generator.max_turns, args.eval_set)
            print(get_config_as_yaml_str(cfg))
            print(f"# datasets: {data_dir} (eval {args.eval_set}, slack {slack})")
            return 0
        prepare_datasets(
            cfg,
            data_dir,
            train_size=args.train_size,
            train_preset=args.train_preset,
            eval_set=args.eval_set,
            train_reward_spec=args.train_reward_spec,
            overwrite=args.overwrite_data,
        )
        run_training(cfg)
    except SkyRLConfigError as e:
        print(f"{prog}: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except GpuImageRequiredError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_NEEDS_GPU_IMAGE
    return 0


# ---------------------------------------------------------------------------------------------
# Job submission
# ---------------------------------------------------------------------------------------------

_K8S_NAME = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_ADDRESS = re.compile(
    rf"sagemaker_ray://{_K8S_NAME}/{_K8S_NAME}"  # HyperPod: <raycluster>/<namespace>
    r"|https?://[^\s/:]+(?::\d{1,5})?/?"  # a Ray dashboard
    r"|[^\s/:]+:\d{1,5}"  # host:port, which `ray job submit` reads as http://
)


def build_submit_command(
    cfg_path: str | os.PathLike[str],
    overrides: Sequence[str],
    address: str,
    *,
    entrypoint_args: Sequence[str] = (),
    env_vars: Mapping[str, str] | None = None,
    no_wait: bool = False,
    validate: bool = True,
    python: str = "python",
) -> list[str]:
    """The ``ray job submit`` argv that runs :func:`main` on the cluster.

    ``address`` is ``sagemaker_ray://<raycluster>/<namespace>`` (needs the
    ``toolkit-for-ray-on-sagemaker-ai`` package where the command runs), a dashboard URL
    (``http://head:8265``) or ``host:port``. ``cfg_path`` is a shipped config name (always
    present in the image) or an absolute path the head pod can read, e.g. on ``/shared``. With
    ``validate`` the config and overrides are checked here first, so a typo fails before
    submission. ``env_vars`` and the shipped configs' variables (``MAZERL_RUN``,
    ``MAZERL_SFT_CHECKPOINT``, when set here) go into the job's runtime env, with
    ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` so SkyRL's own ``ray.init(runtime_env=...)`` in the job
    merges instead of failing on a shared variable. Join with ``shlex.join`` to print it.
    """
    if not _ADDRESS.fullmatch(address):
        raise SkyRLConfigError(
            f"{address!r} is not a Ray job address: use sagemaker_ray://<raycluster>/<namespace> "
            "(lowercase Kubernetes names), http(s)://<host>[:port] or <host>:<port>",
            key="address",
        )
    _override_keys(overrides)
    raw = Path(cfg_path)
    shipped = CONFIG_DIR / (raw.name if raw.suffix else f"{raw.name}.yaml")
    if len(raw.parts) == 1 and shipped.is_file():
        config_arg = shipped.stem
    elif raw.is_absolute():
        config_arg = str(raw)
    else:
        raise SkyRLConfigError(
            f"{os.fspath(cfg_path)!r}: give a shipped config name or an absolute path the cluster "
            "can read (e.g. under /shared)",
            key="config",
            allowed=shipped_configs(),
        )
    if validate and (config_arg == shipped.stem or raw.is_file()):
        load_config(config_arg if config_arg == shipped.stem else raw, overrides, validate=False)
    forwarded = {k: os.environ[k] for k in FORWARDED_ENV_VARS if os.environ.get(k)}
    # SkyRL's initialize_ray calls ray.init(runtime_env=...) inside the job; Ray refuses to merge
    # that with the job's runtime env when both set the same variable, unless told to let the
    # driver's (SkyRL's) values win.
    runtime_env = {
        "env_vars": {**forwarded, **dict(env_vars or {}), "RAY_OVERRIDE_JOB_RUNTIME_ENV": "1"}
    }
    return [
        "ray",
        "job",
        "submit",
        "--address",
        address,
        "--runtime-env-json",
        json.dumps(runtime_env, sort_keys=True),
        *(["--no-wait"] if no_wait else []),
        "--",
        python,
        "-m",
        "maze_engine.skyrl_cluster",
        "--config",
        config_arg,
        *entrypoint_args,
        *overrides,
    ]


if __name__ == "__main__":
    # Run the importable module's main, not __main__'s copy: the Ray task function must pickle
    # by reference (maze_engine.skyrl_cluster._train_in_ray_task) for workers to import it.
    from maze_engine.skyrl_cluster import main as _module_main

    sys.exit(_module_main())
