"""Checking a mazerl config file against typed dataclasses, key by key.

The same checker reads SkyRL's config dataclasses (``skyrl.train.config.SkyRLTrainConfig``) and
this project's own sections, so every bad key or value is one :class:`ConfigError` that names
the key, the allowed values where there is a fixed set, and the file or override it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal, cast

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from maze_engine.errors import ConfigError, show_value

LR_SCHEDULERS = (
    "constant",
    "constant_with_warmup",
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "inverse_sqrt",
)
"""``optimizer_config.scheduler`` values SkyRL can build: its ``get_scheduler`` call passes no
scheduler kwargs and steps without a metric, which rules out transformers' other types."""

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
    "trainer.policy.optimizer_config.scheduler": LR_SCHEDULERS,
    "trainer.critic.optimizer_config.scheduler": LR_SCHEDULERS,
    "generator.inference_engine.backend": ("vllm",),
    "generator.inference_engine.distributed_executor_backend": ("mp", "ray"),
    "generator.chat_template.source": ("name", "file"),
}
# Filled from SkyRL's registries (custom entries can be registered, so the list is read live).
_REGISTRY_CHOICES = {
    "trainer.algorithm.advantage_estimator": "AdvantageEstimatorRegistry",
    "trainer.algorithm.policy_loss_type": "PolicyLossRegistry",
}


def _a(name: str) -> str:
    return f"an {name}" if name[:1] in "aeiou" else f"a {name}"


def _expand_dotted(node: object, where: str) -> object:
    """Nested dicts from a YAML that may also use dotted keys (``trainer.epochs: 3``)."""
    if isinstance(node, list):
        return [_expand_dotted(v, f"{where}[{i}]") for i, v in enumerate(cast(list[object], node))]
    if not isinstance(node, dict):
        return node
    out: dict[str, object] = {}
    for raw_key, raw_value in cast(dict[object, object], node).items():
        if not isinstance(raw_key, str) or not raw_key:
            raise ConfigError(f"keys must be non-empty strings, got {raw_key!r}", key=where or None)
        full = f"{where}.{raw_key}" if where else raw_key
        value = _expand_dotted(raw_value, full)
        *parents, leaf = raw_key.split(".")
        cur = out
        for part in parents:
            nxt = cur.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError("set both as a value and as a section", key=full)
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


def override_keys(overrides: Sequence[str]) -> list[str]:
    """The dotted keys of ``key=value`` overrides; a malformed one is a :class:`ConfigError`."""
    keys: list[str] = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(f"override {item!r} is not key=value")
        if key[:1] in {"+", "~"}:
            raise ConfigError(
                f"override {item!r}: adding ('+') or deleting ('~') keys is not supported; "
                "every key must exist in SkyRL's config or in the 'mazes.' / 'local.' sections"
            )
        if not _OVERRIDE_KEY.fullmatch(key):
            raise ConfigError(f"override {item!r}: {key!r} is not a dotted key")
        keys.append(key)
    return keys


def load_tree(path: Path, overrides: Sequence[str]) -> tuple[dict[str, object], list[str]]:
    """YAML + overrides, merged and resolved (``${...}`` interpolations, ``oc.env``)."""
    source = str(path)
    try:
        raw: object = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read config: {e}", source=source) from e
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a mapping of config sections", source=source)
    base = cast(dict[str, Any], _expand_dotted(cast(object, raw), ""))
    keys = override_keys(overrides)
    try:
        merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.from_dotlist(list(overrides)))
        tree = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or None
        raise ConfigError(f"{type(e).__name__}: {e.msg or e}", key=key, source=source) from e  # pyright: ignore[reportUnknownMemberType]
    return cast(dict[str, object], tree), keys


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
        errors: list[ConfigError] = []
        for arm in arms:
            try:
                _check_value(arm, value, key)
            except ConfigError as e:
                errors.append(e)
            else:
                return
        if len(arms) == 1:
            raise errors[0]
        raise ConfigError(f"{show_value(value)} is not {_a(_type_name(tp))}", key=key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{show_value(value)} is not allowed", key=key, allowed=args)
        return
    if value is None:
        raise ConfigError(f"must be {_a(_type_name(tp))}, not null", key=key)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(
                f"must be a section (mapping of {tp.__name__} keys), got {show_value(value)}",
                key=key,
            )
        check_section(tp, cast(dict[str, object], value), f"{key}.")
        return
    if isinstance(tp, type) and issubclass(tp, Enum):
        allowed = tuple(m.value for m in tp)
        if value not in allowed:
            raise ConfigError(f"{show_value(value)} is not allowed", key=key, allowed=allowed)
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
        raise ConfigError(f"{show_value(value)} is not {_a(_type_name(tp))}", key=key)


def check_section(datacls: type, data: Mapping[str, object], prefix: str) -> None:
    """Check every key and value of ``data`` against the fields and types of ``datacls``."""
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
                hint += (
                    " (dataset settings go under 'mazes:', local-engine settings under 'local:')"
                )
            owner = (
                "SkyRL's config" if datacls.__module__.startswith("skyrl") else "mazerl's config"
            )
            raise ConfigError(f"unknown key, not in {owner}; {hint}", key=full)
        _check_value(hints[key], value, full)
        allowed = _CHOICES.get(full) or (_registry_choices(full) if value is not None else None)
        if allowed is not None and value not in allowed:
            raise ConfigError(f"{show_value(value)} is not allowed", key=full, allowed=allowed)


def check_vlm(tree: Mapping[str, object]) -> None:
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
            raise ConfigError(
                f"{show_value(value)} does not work with generator.vision_language_generator=true",
                key=key,
                allowed=(needed,),
            )


def flatten(datacls: type, data: Mapping[str, object], prefix: str = "") -> dict[str, object]:
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
            out.update(flatten(nested, cast(dict[str, object], value), f"{prefix}{key}."))
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


def blame(message: str, keys: Sequence[str], overridden: Sequence[str]) -> str | None:
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


def source_of(key: str | None, overridden: Sequence[str], file: str) -> str:
    """Where ``key``'s value came from: the override that set it, else the file."""
    if key is not None:
        for o in overridden:
            if key == o or key.startswith(f"{o}.") or o.startswith(f"{key}."):
                return f"override {o}=..."
    return file


def build_section[T](datacls: type[T], data: Mapping[str, object]) -> T:
    """An instance of ``datacls`` from checked data; nested dataclass fields are built too."""
    hints = typing.get_type_hints(datacls)
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        arms = [a for a in typing.get_args(hints[key]) if a is not type(None)] or [hints[key]]
        nested = next(
            (a for a in arms if isinstance(a, type) and dataclasses.is_dataclass(a)), None
        )
        if nested is not None and isinstance(value, dict):
            kwargs[key] = build_section(nested, cast(Mapping[str, object], value))
        else:
            kwargs[key] = value
    return datacls(**kwargs)
