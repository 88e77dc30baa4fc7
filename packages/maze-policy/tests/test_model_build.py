from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import torch
from transformers import Qwen3VLForConditionalGeneration

from maze_env.prompts import SYSTEM_PROMPT
from maze_policy.errors import ModelLoadError
from maze_policy.model import (
    SPECIAL_TOKENS,
    TinyVLMConfig,
    build_tiny_vlm,
    count_parameters,
    load_vlm,
    sinusoid_2d,
    train_tokenizer,
)


def test_build_save_reload_is_a_real_checkpoint_dir(tiny_vlm_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"):
        assert (tiny_vlm_dir / name).is_file(), name
    model, processor = load_vlm(tiny_vlm_dir)
    assert isinstance(model, Qwen3VLForConditionalGeneration)
    assert not model.training
    assert 200_000 <= count_parameters(model) <= 2_000_000
    tok = processor.tokenizer  # pyright: ignore[reportAttributeAccessIssue]
    ip = processor.image_processor  # pyright: ignore[reportAttributeAccessIssue]
    assert (ip.patch_size, ip.merge_size) == (16, 2)
    cfg: Any = model.config
    for token, attr in (
        ("<|image_pad|>", "image_token_id"),
        ("<|vision_start|>", "vision_start_token_id"),
        ("<|vision_end|>", "vision_end_token_id"),
    ):
        assert tok.convert_tokens_to_ids(token) == getattr(cfg, attr)
    assert len(tok) <= cfg.text_config.vocab_size


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path, tiny_vlm_dir: Path) -> None:
    tok = train_tokenizer()
    a, _ = load_vlm(tiny_vlm_dir)
    b, _ = load_vlm(build_tiny_vlm(tmp_path / "b", seed=0, tokenizer=tok))
    c, _ = load_vlm(build_tiny_vlm(tmp_path / "c", seed=1, tokenizer=tok))
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_vision_positions_start_as_a_2d_sinusoid(tmp_path: Path, tiny_vlm_dir: Path) -> None:
    cfg = TinyVLMConfig()
    model: Any = load_vlm(tiny_vlm_dir)[0]
    pos = cast(torch.Tensor, model.model.visual.pos_embed.weight).detach()
    expected = sinusoid_2d(cfg.vision_position_embeddings, cfg.vision_hidden)
    assert torch.equal(pos, expected * cfg.vision_position_init_scale)
    # Row r, column c: the first half of the channels depends on r only, the second on c only.
    grid = expected.reshape(16, 16, -1)
    half = cfg.vision_hidden // 2
    assert torch.equal(grid[3, 0, :half], grid[3, 9, :half])
    assert torch.equal(grid[0, 5, half:], grid[11, 5, half:])
    assert not torch.equal(grid[3, 0, :half], grid[4, 0, :half])
    # Amplitude 0 keeps transformers' own N(0, 0.02) init.
    plain = build_tiny_vlm(
        tmp_path / "plain", seed=0, config=TinyVLMConfig(vision_position_init_scale=0.0)
    )
    plain_model: Any = load_vlm(plain)[0]
    w = cast(torch.Tensor, plain_model.model.visual.pos_embed.weight).detach()
    assert 0.01 < float(w.std()) < 0.03
    with pytest.raises(ValueError, match="vision_position_init_scale"):
        TinyVLMConfig(vision_position_init_scale=-1.0)


def test_tokenizer_round_trips_prompts_and_keeps_special_tokens_whole() -> None:
    tok = train_tokenizer()
    ids = tok(SYSTEM_PROMPT, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == SYSTEM_PROMPT
    assert len(ids) < len(SYSTEM_PROMPT) / 4  # the prompt's phrases are merged tokens
    for special in SPECIAL_TOKENS:
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1
    odd = "ünïcode <b>x</b> 123"
    assert tok.decode(tok(odd, add_special_tokens=False)["input_ids"]) == odd  # byte-level: no UNK


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_vlm(tmp_path)
    with pytest.raises(ValueError, match="head_dim"):
        TinyVLMConfig(hidden=60, heads=4, head_dim=15)
