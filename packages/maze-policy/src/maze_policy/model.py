"""Build a tiny Qwen3-VL from a config, and load any Qwen2-VL / Qwen3-VL checkpoint directory.

The tiny model is the CPU stand-in for ``Qwen/Qwen3-VL-8B-Instruct``: same architecture class,
same special tokens and chat-template conventions, same image processor (patch 16, merge 2, so
one visual token covers 32x32 px = one grid square of a token-aligned maze image). It is saved
with ``save_pretrained`` piece by piece, so :func:`load_vlm` reads it through exactly the code
path a real checkpoint takes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoImageProcessor,
    AutoModelForImageTextToText,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
    Qwen2VLImageProcessorPil,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from maze_policy.errors import ChatEncodingError, ModelLoadError, TokenizerError

# Qwen2/Qwen3 special tokens, in Qwen's order. Training puts them at ids 0..13 of the tiny vocab.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
END_OF_TURN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

# Same conventions as Qwen3-VL-Instruct's template (written here, not copied): an optional system
# turn, then ``<|im_start|>role\n...<|im_end|>\n`` per message; list content renders text parts
# verbatim and every image part (``image``, ``image_url`` or a dict holding either key) as
# ``<|vision_start|><|image_pad|><|vision_end|>``; the processor expands the pad per image.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

TOKEN_PX = 32
"""Pixels per visual token: patch 16 merged 2x2."""


@dataclass(frozen=True, slots=True)
class TinyVLMConfig:
    """Sizes of the tiny Qwen3-VL. Defaults: ~0.4M parameters, a forward of a 7x7 maze turn in ms."""

    vocab_size: int = 1024
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 192
    vision_hidden: int = 64
    vision_depth: int = 2
    vision_heads: int = 4
    vision_intermediate: int = 128
    # A 16x16 learned grid, interpolated to each image's patch grid (Qwen3-VL does the same).
    vision_position_embeddings: int = 256
    min_tokens: int = 4
    """Fewest visual tokens per image (32x32 px each) before the processor upsamples it."""
    max_tokens: int = 1024
    """Most visual tokens per image; a 31x31 maze at 32 px/square still fits unresized."""
    rope_theta: float = 1_000_000.0
    """Large, like Qwen3-VL's 5e6: more near-static rotary pairs for long-range content lookups."""
    vision_position_init_scale: float = 1.0
    """Vision position embeddings start as a 2D sinusoid of this amplitude instead of the default
    N(0, 0.02), whose tiny values barely tell a visual token *where* it is, so learning to locate
    the agent stalls."""

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(
                f"vocab_size must be >= 300 (256 bytes + specials), got {self.vocab_size}"
            )
        if self.hidden != self.heads * self.head_dim:
            raise ValueError(
                f"hidden ({self.hidden}) must equal heads x head_dim ({self.heads} x {self.head_dim})"
            )
        if self.head_dim % 4 or self.head_dim < 8:
            raise ValueError(f"head_dim must be a multiple of 4 and >= 8, got {self.head_dim}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.vision_hidden % self.vision_heads:
            raise ValueError("vision_hidden must be a multiple of vision_heads")
        if math.isqrt(self.vision_position_embeddings) ** 2 != self.vision_position_embeddings:
            raise ValueError("vision_position_embeddings must be a perfect square")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError("need 1 <= min_tokens <= max_tokens")
        if not 0 <= self.vision_position_init_scale <= 10:
            raise ValueError(
                f"vision_position_init_scale must be within 0..10, got {self.vision_position_init_scale}"
            )

    @property
    def mrope_section(self) -> list[int]:
        # Sums to head_dim / 2 (t, h, w), as Qwen3-VL's [24, 20, 20] does for head_dim 128.
        half = self.head_dim // 2
        hw = half // 4
        return [half - 2 * hw, hw, hw]


def _qwen3vl_config(cfg: TinyVLMConfig) -> Qwen3VLConfig:
    ids = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    text = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": 8192,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "mrope_section": cfg.mrope_section,
            "mrope_interleaved": True,
        },
        "pad_token_id": ids[PAD_TOKEN],
        "bos_token_id": None,
        "eos_token_id": ids[END_OF_TURN],
    }
    vision = {
        "depth": cfg.vision_depth,
        "hidden_size": cfg.vision_hidden,
        "intermediate_size": cfg.vision_intermediate,
        "num_heads": cfg.vision_heads,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": cfg.hidden,
        "num_position_embeddings": cfg.vision_position_embeddings,
        # Deepstack feeds the first vision block's features into the first LM layer.
        "deepstack_visual_indexes": [0],
    }
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids[VIDEO_TOKEN],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
    )


def tokenizer_corpus(max_side: int = 15) -> Iterator[str]:
    """Every text the maze prompts, feedback and oracle replies produce, for BPE training."""
    from maze_env import Direction
    from maze_env.actions import parse_action
    from maze_env.game import (
        FEEDBACK_BUDGET,
        FEEDBACK_MOVED,
        FEEDBACK_STOP_ELSEWHERE,
        FEEDBACK_STOP_GOAL,
        FEEDBACK_WALL,
    )
    from maze_env.prompts import SYSTEM_PROMPT, oracle_reply

    for _ in range(200):  # weight: the system prompt and chat roles open every episode
        yield SYSTEM_PROMPT
        yield "system\nuser\nassistant\n"
    for side in range(5, max_side + 1, 2):
        for budget in range(1, 4 * side):
            yield (
                f"Here is a {side}x{side} maze. You have {budget} turns, including the final "
                "stop. What is your first action?"
            )
    feedbacks = [FEEDBACK_MOVED, FEEDBACK_WALL, FEEDBACK_STOP_GOAL, FEEDBACK_STOP_ELSEWHERE]
    for junk in ("", "hello", "<action>jump</action>", "('move', 7)", "x" * 10):
        failure = parse_action(junk)
        if not isinstance(failure, type(parse_action("up"))):
            feedbacks.append(
                f"Invalid action: {getattr(failure, 'reason', '')}. Nothing was executed."
            )
    for fb in feedbacks:
        for left in range(0, 4 * max_side):
            yield f"{fb} Turns left: {left}. What is your next action?"
            yield f"{fb} {FEEDBACK_BUDGET} Turns left: {left}."
    words = [d.word for d in Direction] + ["stop"]
    for r in range(1, max_side - 1):
        for c in range(1, max_side - 1):
            for word in words:
                yield oracle_reply((r, c), (max_side - 1 - r, max_side - 1 - c), word)
    for d in Direction:
        yield f"('move', {int(d)}) <action>{d.word}</action> move {d.word}"
    yield "('stop', 'stop') <action>stop</action>"


def train_tokenizer(vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE on the maze corpus, with Qwen's special tokens and a Qwen chat template.

    Byte-level, like Qwen's own: any text encodes, so model replies never hit an unknown token.
    """
    tok = Tokenizer(models.BPE())
    # Tags, numbers and punctuation stand alone; words may merge across spaces, so the fixed
    # prompt phrases become a few tokens and sequences stay short (fast CPU training).
    tok.pre_tokenizer = pre_tokenizers.Sequence(  # pyright: ignore[reportAttributeAccessIssue]
        [
            pre_tokenizers.Split(Regex(r"</?[a-z]{1,16}>|\d+|[.,!?:;()'\"=\n]"), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()  # pyright: ignore[reportAttributeAccessIssue]
    trainer = trainers.BpeTrainer(  # pyright: ignore[reportCallIssue]
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so frequent phrases win merges over rare coordinate strings.
    corpus = list(tokenizer_corpus())
    tok.train_from_iterator(corpus * 3, trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise TokenizerError(f"tokenizer has {tok.get_vocab_size()} tokens, over {vocab_size}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=END_OF_TURN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (END_OF_TURN, PAD_TOKEN)],
        model_max_length=32768,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_image_processor(cfg: TinyVLMConfig | None = None) -> Qwen2VLImageProcessorPil:
    """Qwen3-VL's image processor settings (patch 16, merge 2, mean/std 0.5) with a small pixel budget."""
    cfg = cfg or TinyVLMConfig()
    per_token = TOKEN_PX * TOKEN_PX
    return Qwen2VLImageProcessorPil(
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        min_pixels=cfg.min_tokens * per_token,
        max_pixels=cfg.max_tokens * per_token,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def sinusoid_2d(positions: int, dim: int) -> torch.Tensor:
    """``[positions, dim]`` 2-D sin/cos embeddings of a square grid.

    Half the channels encode the row, half the column, as sin/cos pairs with periods from ~6 to
    ~60 cells (smooth under the bilinear interpolation Qwen3-VL applies to fit each image's
    patch grid).
    """
    side = math.isqrt(positions)
    quarter = dim // 4
    freqs = 10.0 ** (-torch.arange(quarter, dtype=torch.float32) / max(1, quarter))
    angles = torch.arange(side, dtype=torch.float32)[:, None] * freqs[None]
    enc = torch.cat([angles.sin(), angles.cos()], dim=-1)  # [side, 2 * quarter]
    rows = enc[:, None, :].expand(side, side, -1)
    cols = enc[None, :, :].expand(side, side, -1)
    out = torch.zeros(side, side, dim)
    out[..., : 4 * quarter] = torch.cat([rows, cols], dim=-1)
    return out.reshape(positions, dim)


def build_tiny_vlm(
    out_dir: str | Path,
    *,
    seed: int = 0,
    config: TinyVLMConfig | None = None,
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> Path:
    """Create a random-init tiny Qwen3-VL with tokenizer and image processor in ``out_dir``.

    Deterministic for a given ``seed`` and config. ``tokenizer`` reuses an already trained one
    (training takes ~1 s). Returns ``out_dir``.
    """
    cfg = config or TinyVLMConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer or train_tokenizer(cfg.vocab_size)
    hf_cfg = _qwen3vl_config(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(hf_cfg)
    if cfg.vision_position_init_scale > 0:
        with torch.no_grad():
            model.model.visual.pos_embed.weight.copy_(
                sinusoid_2d(cfg.vision_position_embeddings, cfg.vision_hidden)
                * cfg.vision_position_init_scale
            )
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids(END_OF_TURN), tok.convert_tokens_to_ids(PAD_TOKEN)],
        pad_token_id=tok.convert_tokens_to_ids(PAD_TOKEN),
        do_sample=False,
    )
    model.save_pretrained(out)  # pyright: ignore[reportUnknownMemberType]
    tok.save_pretrained(out)  # pyright: ignore[reportUnknownMemberType]
    tiny_image_processor(cfg).save_pretrained(out)  # pyright: ignore[reportUnknownMemberType]
    (out / "tiny_vlm.json").write_text(json.dumps({"seed": seed, **asdict(cfg)}, indent=1))
    return out


class _NoVideoProcessor:
    """Stand-in for the video processor, which needs torchvision; maze episodes have no video."""

    merge_size = 2
    temporal_patch_size = 2

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ChatEncodingError("video inputs are not supported (no torchvision video processor)")


def _dir_chat_template(path: str) -> str | None:
    # Processor-level template files, as Qwen's hub repos ship them beside the tokenizer's.
    jinja, js = Path(path) / "chat_template.jinja", Path(path) / "chat_template.json"
    if jinja.is_file():
        return jinja.read_text()
    if js.is_file():
        template = json.loads(js.read_text()).get("chat_template")
        return template if isinstance(template, str) else None
    return None


def _build_processor(path: str, image_processor: Any, tokenizer: Any) -> ProcessorMixin:
    from transformers import AutoConfig, Qwen2VLProcessor, Qwen3VLProcessor

    hf_config: Any = AutoConfig.from_pretrained(path)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    model_type = str(getattr(hf_config, "model_type", ""))  # pyright: ignore[reportUnknownArgumentType]
    cls: Any = Qwen2VLProcessor if model_type.startswith("qwen2") else Qwen3VLProcessor
    # ProcessorMixin.__init__ type-checks every sub-processor, and the video processor cannot be
    # built without torchvision; build the processor without it and attach a stand-in.
    proc: Any = cls.__new__(cls)
    original: Any = ProcessorMixin.check_argument_for_proper_class  # pyright: ignore[reportUnknownVariableType]

    def _lenient(self: ProcessorMixin, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor":
            return None
        return original(self, argument_name, argument)

    ProcessorMixin.check_argument_for_proper_class = _lenient  # pyright: ignore[reportAttributeAccessIssue]
    try:
        cls.__init__(
            proc,
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=_NoVideoProcessor(),
            chat_template=tokenizer.chat_template or _dir_chat_template(path),
        )
    finally:
        ProcessorMixin.check_argument_for_proper_class = original
    return cast(ProcessorMixin, proc)


def _load_image_processor(path: str) -> Any:
    try:
        return AutoImageProcessor.from_pretrained(path)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    except ImportError:
        # Without torchvision the Auto class refuses even to pick a class; every Qwen2-VL /
        # Qwen3-VL checkpoint uses the Qwen2-VL image processor, whose PIL backend needs none.
        pil: Any = Qwen2VLImageProcessorPil.from_pretrained(path)  # pyright: ignore[reportUnknownMemberType]
        return pil


def load_processor(path_or_id: str | Path) -> ProcessorMixin:
    """The Qwen2-VL / Qwen3-VL processor for a checkpoint directory (or hub id in the local cache).

    Uses ``AutoProcessor`` when it works (a torchvision install gives the real video processor);
    otherwise builds the same processor from the tokenizer and the PIL image processor.
    """
    path = str(path_or_id)
    try:
        from transformers import AutoProcessor

        return cast(ProcessorMixin, AutoProcessor.from_pretrained(path))  # pyright: ignore[reportUnknownMemberType]
    except (ImportError, ValueError, TypeError, AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and not Path(path).exists():
            raise ModelLoadError(f"no processor files at {path!r}: {exc}") from exc
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(path)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        image_processor = _load_image_processor(path)
    except (OSError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"cannot load tokenizer/image processor from {path!r}: {exc}") from exc
    return _build_processor(path, image_processor, tokenizer)


def load_vlm(
    path_or_id: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """Load any Qwen2-VL / Qwen3-VL checkpoint (tiny, Qwen3-VL-8B, the VisGym SFT one) for training.

    Returns ``(model, processor)``; the model is in eval mode on ``device``.
    """
    path = str(path_or_id)
    if Path(path).exists() and not (Path(path) / "config.json").is_file():
        raise ModelLoadError(f"{path}: no config.json; not a Hugging Face model directory")
    try:
        model = cast(
            PreTrainedModel,
            AutoModelForImageTextToText.from_pretrained(path, dtype=dtype),  # pyright: ignore[reportUnknownMemberType]
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot load model from {path!r}: {exc}") from exc
    model.to(device)  # pyright: ignore[reportArgumentType, reportUnknownMemberType]
    model.eval()
    return model, load_processor(path)


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameter elements in ``model``, trainable or not."""
    return sum(p.numel() for p in model.parameters())
