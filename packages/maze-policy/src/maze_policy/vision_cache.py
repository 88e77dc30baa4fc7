"""Visual features computed once per distinct image while the vision tower is frozen.

A multi-turn episode shows the model one new frame per turn, but every forward pass over the
conversation (each turn's ``generate``, the learner's log-prob passes) runs the vision tower
over *every* frame so far, and a GRPO group's episodes share most of their frames. With the
vision tower frozen (LoRA on the language model, evaluation), a frame's features depend only on
its pixels and the tower's weights, so :class:`VisionFeatureCache` keeps them, keyed by a hash
of both, and runs the tower on new frames only.

Each frame's features are computed alone, cached or not, so a result never depends on which
other frames shared the call or on what an earlier call left in the cache: a resumed run
reproduces an uninterrupted one bit for bit. When the tower can learn (gradients enabled and a
vision parameter requires them) the model's own batched path runs and nothing is cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import torch
import xxhash
from torch import nn

_Features = tuple[torch.Tensor, tuple[torch.Tensor, ...]]
"""One frame's merged visual tokens and its per-layer deepstack features (empty for Qwen2-VL)."""


def _bytes(t: torch.Tensor) -> memoryview:
    # Any dtype (bf16 has no numpy type) as its raw bytes.
    return memoryview(t.detach().contiguous().view(-1).view(torch.uint8).numpy())


def _vision_model(model: nn.Module) -> nn.Module | None:
    # The inner Qwen2-VL / Qwen3-VL model: the module holding both the tower and the method
    # its forward calls. Reached through peft and ForConditionalGeneration wrappers alike.
    for module in model.modules():
        if isinstance(getattr(module, "visual", None), nn.Module) and callable(
            getattr(type(module), "get_image_features", None)
        ):
            return module
    return None


class VisionFeatureCache:
    """An LRU of per-frame visual features, installed on one model's ``get_image_features``."""

    def __init__(self, inner: nn.Module, max_frames: int) -> None:
        self.inner = inner
        self.visual = cast(nn.Module, inner.visual)
        self.max_frames = max_frames
        self.original = cast(Callable[..., Any], inner.get_image_features)
        self.entries: OrderedDict[bytes, _Features] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self._weights_key = b""
        self._output_type: Callable[..., Any] = dict
        self._deepstack = False
        self._split_deepstack = False
        self._weights_version: tuple[int, ...] = ()

    def _tower_learns(self) -> bool:
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.visual.parameters())

    def _sharded(self) -> bool:
        # FSDP2 frees the parameters it gathers after each pass; hashing them (through a numpy
        # view of their storage) makes that storage unresizable, so a sharded model runs its
        # own path.
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # torch < 2.6 keeps FSDP2 under its composable API
            from torch.distributed._composable.fsdp import (
                FSDPModule,  # pyright: ignore[reportPrivateImportUsage]
            )

        fsdp = cast(type, FSDPModule)
        return any(isinstance(m, fsdp) for m in self.inner.modules())

    def _weights(self) -> bytes:
        # Any in-place change to the tower (an optimizer step, a loaded state dict) bumps a
        # tensor's version counter; rehash the weights only then.
        version = tuple(p._version for p in self.visual.parameters())  # pyright: ignore[reportPrivateUsage]
        if version != self._weights_version:
            h = xxhash.xxh3_128()
            for p in self.visual.parameters():
                h.update(_bytes(p))
            self._weights_key, self._weights_version = h.digest(), version
            self.entries.clear()
        return self._weights_key

    def __call__(
        self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor | None = None, **kwargs: Any
    ) -> Any:
        if (
            image_grid_thw is None
            or pixel_values.device.type != "cpu"
            or self._tower_learns()
            or self._sharded()
        ):
            return self.original(pixel_values, image_grid_thw, **kwargs)
        weights = self._weights()
        sizes = [int(n) for n in cast(list[int], image_grid_thw.prod(-1).tolist())]
        frames: list[_Features] = []
        offset = 0
        for grid, size in zip(image_grid_thw, sizes, strict=True):
            pv = pixel_values[offset : offset + size]
            offset += size
            h = xxhash.xxh3_128(weights)
            h.update(_bytes(pv))
            h.update(bytes(str(cast(list[int], grid.tolist())), "ascii"))
            key = h.digest()
            got = self.entries.get(key)
            if got is None:
                self.misses += 1
                out = self.original(pv, grid[None], **kwargs)
                self._output_type = type(out)
                self._deepstack = hasattr(out, "deepstack_features")
                layers = cast(list[Any], getattr(out, "deepstack_features", None) or [])
                # Some transformers versions give a layer's features of all frames as one
                # tensor, newer ones split them per frame as pooler_output is; keep that form.
                self._split_deepstack = bool(layers) and isinstance(layers[0], tuple | list)
                deep = tuple(
                    cast(torch.Tensor, layer[0] if self._split_deepstack else layer)
                    for layer in layers
                )
                got = (cast(torch.Tensor, out.pooler_output[0]), deep)
                self.entries[key] = got
                if len(self.entries) > self.max_frames:
                    self.entries.popitem(last=False)
            else:
                self.hits += 1
                self.entries.move_to_end(key)
            frames.append(got)
        return self._joined(frames)

    def _joined(self, frames: list[_Features]) -> Any:
        # The model's own output type, so its forward reads the fields it always reads.
        fields: dict[str, Any] = {"pooler_output": tuple(f[0] for f in frames)}
        if self._deepstack:
            layers = range(len(frames[0][1]))
            fields["deepstack_features"] = [
                tuple(f[1][i] for f in frames)
                if self._split_deepstack
                else torch.cat([f[1][i] for f in frames])
                for i in layers
            ]
        return self._output_type(**fields)

    def clear(self) -> None:
        """Drop every cached frame."""
        self.entries.clear()


def install_vision_cache(model: nn.Module, max_frames: int = 2048) -> VisionFeatureCache | None:
    """Serve ``model``'s visual features from a :class:`VisionFeatureCache`; None if it has no tower.

    Installed on the model instance (the class is untouched); calling it again returns the
    cache already installed.
    """
    inner = _vision_model(model)
    if inner is None:
        return None
    existing = inner.__dict__.get("get_image_features")
    if isinstance(existing, VisionFeatureCache):
        return existing
    cache = VisionFeatureCache(inner, max_frames)
    # An instance attribute shadows the method the model's forward calls (``self.get_...``);
    # object.__setattr__ because nn.Module's own accepts only tensors and modules here.
    object.__setattr__(inner, "get_image_features", cache)
    return cache
