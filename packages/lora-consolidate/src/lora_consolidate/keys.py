"""Map training-time state-dict keys to the names PEFT (and vLLM) expect in an adapter file.

An FSDP2 + peft model's ``state_dict()`` key looks like
``base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight``; PEFT
saves it as ``...q_proj.lora_A.weight`` (adapter name removed). Wrappers may add prefixes
(a trainer's own ``model.`` attribute, FSDP1 / activation-checkpoint / torch.compile wrappers).
"""

from __future__ import annotations

import re

PEFT_PREFIX = "base_model.model."
_WRAPPER_TOKENS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_LORA_PART = r"lora_(?:A|B|embedding_A|embedding_B|magnitude_vector)"
_ADAPTER_RE = re.compile(rf"\.({_LORA_PART})\.([^.]+)(?=\.|$)")
_VISION_RE = re.compile(r"(?:^|\.)visual\.")


def strip_wrappers(key: str) -> str:
    """``key`` without FSDP1 / activation-checkpoint / torch.compile wrapper tokens."""
    for token in _WRAPPER_TOKENS:
        key = key.replace(token, "")
    return key


def adapter_name_of(key: str) -> str | None:
    """The adapter name inside a peft LoRA key, or None if the key is not a LoRA tensor."""
    m = _ADAPTER_RE.search(strip_wrappers(key))
    return m.group(2) if m else None


def peft_key(key: str, adapter_name: str = "default") -> str | None:
    """PEFT's saved name for a training key of ``adapter_name``; None if it is not such a key."""
    key = strip_wrappers(key)
    start = key.find(PEFT_PREFIX)
    if start < 0:
        return None
    key = key[start:]
    m = _ADAPTER_RE.search(key)
    if m is None or m.group(2) != adapter_name:
        return None
    return key[: m.start()] + "." + m.group(1) + key[m.end() :]


def is_vision_key(key: str) -> bool:
    """Whether ``key`` is in the vision tower (has a ``visual.`` path component)."""
    return _VISION_RE.search(key) is not None


def module_path(adapter_key: str) -> str:
    """``base_model.model.X.lora_A.weight`` -> ``X`` (the wrapped module's path in the base)."""
    m = re.search(rf"\.{_LORA_PART}(?:\.|$)", adapter_key)
    path = adapter_key[: m.start()] if m else adapter_key
    return path.removeprefix(PEFT_PREFIX)
