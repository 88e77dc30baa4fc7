"""Structural checks of a PEFT adapter's files, cheap enough to run before every publish."""

from __future__ import annotations

import json
import struct
from typing import Any, cast

from weight_sync.errors import InvalidAdapterError

CONFIG_NAME = "adapter_config.json"
WEIGHT_NAMES = ("adapter_model.safetensors", "adapter_model.bin")
_MAX_HEADER = 100 << 20


def check_config(data: bytes, where: str) -> None:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidAdapterError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidAdapterError(f"{where}: expected a JSON object")


def safetensors_size(head: bytes, where: str) -> tuple[int, int]:
    """Parse a safetensors header from the file's first bytes.

    Returns ``(header_len, expected_file_size)``; ``head`` must hold at least 8 bytes, and
    ``8 + header_len`` bytes for the full check (callers read exactly that).
    """
    if len(head) < 8:
        raise InvalidAdapterError(f"{where}: too short to be safetensors ({len(head)} bytes)")
    (n,) = struct.unpack("<Q", head[:8])
    if n == 0 or n > _MAX_HEADER:
        raise InvalidAdapterError(f"{where}: implausible safetensors header length {n}")
    if len(head) < 8 + n:
        return n, -1
    try:
        doc = json.loads(head[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidAdapterError(f"{where}: safetensors header is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidAdapterError(f"{where}: safetensors header is not an object")
    end = 0
    for key, info in cast(dict[str, Any], doc).items():
        if key == "__metadata__":
            continue
        offsets = cast(dict[str, Any], info).get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(cast(list[Any], offsets)) != 2
            or not all(isinstance(o, int) for o in cast(list[Any], offsets))
        ):
            raise InvalidAdapterError(f"{where}: tensor {key!r} has no valid data_offsets")
        begin, stop = cast(list[int], offsets)
        if not 0 <= begin <= stop:
            raise InvalidAdapterError(f"{where}: tensor {key!r} has bad offsets {offsets}")
        end = max(end, stop)
    return n, 8 + n + end
