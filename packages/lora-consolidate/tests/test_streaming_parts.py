"""The building blocks on their own: the streaming safetensors writer, DTensor shard boxes, key
mapping, page release and the atomic staging directory."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]
from torch.distributed.tensor import Replicate, Shard

from lora_consolidate import _pages
from lora_consolidate._atomic import staged_directory
from lora_consolidate._safetensors_stream import TensorSpec, write_streaming
from lora_consolidate.keys import is_vision_key, module_path, peft_key
from lora_consolidate.sources import RankFileCheckpoint, shard_box


def test_streaming_writer_round_trips_through_safetensors(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "a.bf16": torch.randn(5, 3, generator=gen).to(torch.bfloat16),
        "b.f32": torch.randn(7, generator=gen),
        "c.scalar": torch.tensor(3.5, dtype=torch.float64),
        "d.empty": torch.empty(0, 4, dtype=torch.float16),
        "e.int": torch.arange(6, dtype=torch.int64).reshape(2, 3).t(),  # non-contiguous
        "f.bool": torch.tensor([True, False, True]),
    }
    specs = [TensorSpec(k, tuple(v.shape), v.dtype) for k, v in tensors.items()]
    calls: list[str] = []

    def produce(spec: TensorSpec) -> torch.Tensor:
        calls.append(spec.name)
        return tensors[spec.name]

    path = tmp_path / "x.safetensors"
    written = write_streaming(path, specs, produce, metadata={"format": "pt"})
    assert calls == list(tensors)  # one call per tensor, in order
    assert written == sum(s.nbytes for s in specs)
    loaded = load_file(path)
    for key, value in tensors.items():
        assert loaded[key].dtype == value.dtype
        assert torch.equal(loaded[key], value), key
    handle: Any = safe_open(str(path), "pt")
    with handle as f:
        assert f.metadata() == {"format": "pt"}


def test_streaming_writer_rejects_wrong_tensor(tmp_path: Path) -> None:
    spec = TensorSpec("w", (2, 2), torch.float32)
    with pytest.raises(ValueError, match="header announced"):
        write_streaming(tmp_path / "x.safetensors", [spec], lambda s: torch.zeros(3))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 40), world=st.integers(1, 9), m=st.integers(1, 3))
def test_shard_box_matches_dtensor_chunking(n: int, world: int, m: int) -> None:
    # DTensor Shard(0) uses torch.chunk; trailing ranks get empty shards.
    chunks = list(torch.arange(n).chunk(world)) if n else []
    expected: list[list[int]] = [c.tolist() for c in chunks]
    expected += [[]] * (world - len(chunks))
    for rank in range(world):
        (offsets, sizes), primary = shard_box(
            (n, m), (world,), (rank,), (Shard(0),), where=Path("x"), key="k"
        )
        assert primary
        assert sizes[1] == m
        assert list(range(offsets[0], offsets[0] + sizes[0])) == expected[rank]


def test_shard_box_two_dim_mesh() -> None:
    # HSDP-style (Replicate, Shard(0)) over a 2x3 mesh: replicas beyond the first are secondary.
    boxes = {
        (i, j): shard_box(
            (10, 4), (2, 3), (i, j), (Replicate(), Shard(0)), where=Path("x"), key="k"
        )
        for i in range(2)
        for j in range(3)
    }
    primaries = [box for (box, primary) in boxes.values() if primary]
    assert sum(math.prod(size) for _, size in primaries) == 40
    assert [b[0][0] for b in primaries] == [0, 4, 8]


def test_key_mapping() -> None:
    key = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.default.weight"
    want = "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"
    assert peft_key(key) == want
    # A trainer's own prefix and FSDP1/activation-checkpoint wrappers are dropped.
    wrapped = "model._fsdp_wrapped_module." + key.replace(
        "layers.0.", "layers.0._checkpoint_wrapped_module."
    )
    assert peft_key(wrapped) == want
    assert peft_key(key, adapter_name="other") is None
    assert peft_key("base_model.model.lm_head.weight") is None
    assert module_path(want) == "model.language_model.layers.0.self_attn.q_proj"
    assert is_vision_key("base_model.model.model.visual.blocks.0.attn.qkv.lora_A.weight")
    assert not is_vision_key(want)


def test_page_release_keeps_data(tmp_path: Path) -> None:
    from lora_consolidate.reshard import make_dtensor, make_mesh

    full = torch.randn(4096, 64)
    mesh = make_mesh("cpu", 1, 0)
    torch.save({"w": make_dtensor(full.clone(), mesh, Shard(0), (4096, 64))},
               tmp_path / "model_world_size_1_rank_0.pt")  # fmt: skip
    with RankFileCheckpoint(tmp_path, loader="torch") as ckpt:
        first = ckpt.read("w")
        local = ckpt.stored(0, "w").local
        assert local is not None
        _pages.release(local, _pages.file_mappings(ckpt.files[0]))
        again = ckpt.read("w")  # pages dropped above are re-read from the file
    assert torch.equal(first, full)
    assert torch.equal(again, full)
    # Memory that is not a mapping of the file is never touched.
    anon = torch.ones(1 << 16)
    _pages.release(anon, _pages.file_mappings(tmp_path / "model_world_size_1_rank_0.pt"))
    assert bool((anon == 1).all())


def test_staged_directory_is_all_or_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def fail() -> None:
        with staged_directory(out) as staging:
            (staging / "half.bin").write_bytes(b"x")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert list(tmp_path.iterdir()) == []
    with staged_directory(out) as staging:
        (staging / "done.bin").write_bytes(b"x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (out / "done.bin").read_bytes() == b"x"
