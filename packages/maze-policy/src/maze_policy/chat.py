"""Encode multi-turn maze conversations (OpenAI messages with data-URI images) into model inputs.

A :class:`Trajectory` grows turn by turn: :meth:`ChatEncoder.start` renders the system + first
user turn with the chat template and generation prompt; :meth:`ChatEncoder.add_assistant`
appends the model's *sampled token ids* verbatim (never re-tokenized text, so the ids the loss
sees are the ids that were sampled) with ``loss_mask`` 1; :meth:`ChatEncoder.add_user` appends
the template's rendering of the next user turn (feedback + image) plus the generation prompt,
with ``loss_mask`` 0. Only new text is tokenized per turn and only new images are processed.

The chat template is used through prefix differences, so any template with Qwen's layout
(the tiny model's, Qwen3-VL-Instruct's) works; one that rewrites earlier turns is refused.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from PIL import Image

from maze_policy.contexts import is_image_part
from maze_policy.errors import ChatEncodingError

Message = Mapping[str, Any]


@dataclass
class Trajectory:
    """One tokenized multi-turn episode.

    ``loss_mask[i]`` is 1 exactly on tokens the policy generated (including its end-of-turn
    token) and 0 on prompt, observation and template tokens; ``logprobs[i]`` is the sampling-time
    log-probability of token ``i`` (0.0 where the mask is 0). ``pixel_values`` and
    ``image_grid_thw`` hold one entry per image, in the order the images appear.
    """

    input_ids: list[int] = field(default_factory=list[int])
    loss_mask: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])
    images: list[Image.Image] = field(default_factory=list[Image.Image])
    pixel_values: list[torch.Tensor] = field(default_factory=list[torch.Tensor])
    image_grid_thw: list[torch.Tensor] = field(default_factory=list[torch.Tensor])

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_generated(self) -> int:
        return sum(self.loss_mask)

    def generated_spans(self) -> list[tuple[int, int]]:
        """``[start, end)`` of every run of assistant-generated tokens."""
        spans: list[tuple[int, int]] = []
        start = -1
        for i, m in enumerate([*self.loss_mask, 0]):
            if m and start < 0:
                start = i
            elif not m and start >= 0:
                spans.append((start, i))
                start = -1
        return spans

    def _extend(
        self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None
    ) -> None:
        self.input_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([mask] * len(ids))
        self.logprobs.extend([0.0] * len(ids) if logprobs is None else [float(x) for x in logprobs])


@dataclass
class Batch:
    """Right-padded model inputs for several trajectories (see :func:`collate`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mm_token_type_ids: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None

    def model_inputs(self) -> dict[str, torch.Tensor]:
        out = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "mm_token_type_ids": self.mm_token_type_ids,
        }
        if self.pixel_values is not None and self.image_grid_thw is not None:
            out["pixel_values"] = self.pixel_values
            out["image_grid_thw"] = self.image_grid_thw
        return out


def decode_data_uri(uri: str) -> Image.Image:
    """An RGB PIL image from a ``data:image/...;base64,...`` URI."""
    if not isinstance(uri, str) or not uri.startswith("data:"):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise ChatEncodingError(f"image url must be a base64 data URI, got {str(uri)[:40]!r}")
    header, sep, payload = uri.partition(",")
    if not sep or ";base64" not in header:
        raise ChatEncodingError(f"image data URI is not base64-encoded: {header[:40]!r}")
    try:
        raw = base64.b64decode(payload, validate=True)
        img = Image.open(io.BytesIO(raw))
        img.load()
    except (binascii.Error, ValueError, OSError) as exc:
        raise ChatEncodingError(f"cannot decode image data URI ({header}): {exc}") from exc
    return img.convert("RGB")


def message_images(message: Message) -> list[Image.Image]:
    """The images of one OpenAI-style message, in order (``image_url`` data URIs or PIL ``image``)."""
    content = message.get("content")
    if isinstance(content, str) or content is None:
        return []
    if not isinstance(content, Sequence):
        raise ChatEncodingError(
            f"message content must be a string or a list, got {type(content).__name__}"
        )
    out: list[Image.Image] = []
    for part in cast(Sequence[Any], content):
        if not isinstance(part, Mapping):
            raise ChatEncodingError(f"content part must be a mapping, got {type(part).__name__}")
        p = cast(Mapping[str, Any], part)
        if not is_image_part(p):
            continue
        if "image_url" in p:
            url: Any = p["image_url"]
            if isinstance(url, Mapping):
                url = cast(Mapping[str, Any], url).get("url")
            out.append(decode_data_uri(cast(str, url)))
        else:
            img = p.get("image", p.get("url"))
            if isinstance(img, Image.Image):
                # An env's inline frame is RGB already: hand it over as is, no copy.
                out.append(img if img.mode == "RGB" else img.convert("RGB"))
            elif isinstance(img, str):
                out.append(decode_data_uri(img))
            else:
                raise ChatEncodingError(
                    f"image part holds {type(img).__name__}, not a PIL image or data URI"
                )
    return out


def _copy_message(message: Message) -> dict[str, Any]:
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [
            dict(cast(Mapping[str, Any], p)) if isinstance(p, Mapping) else p
            for p in cast(list[Any], content)
        ]
    return out


class ChatEncoder:
    """Tokenizes conversations with a Qwen-VL processor; see the module docstring."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.tokenizer: Any = processor.tokenizer
        if not getattr(processor, "chat_template", None) and not getattr(
            self.tokenizer, "chat_template", None
        ):
            raise ChatEncodingError("processor has no chat template")
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids("<|image_pad|>"))
        self.video_token_id = int(self.tokenizer.convert_tokens_to_ids("<|video_pad|>"))
        self.pad_token_id = int(self.tokenizer.pad_token_id)
        self.eos_token_id = int(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        # Probe the template once: what it writes after an assistant's content (``<|im_end|>\n``)
        # and the context that a new user turn is rendered after.
        marker = "\u2402MAZE\u2402"
        self._ctx: list[dict[str, Any]] = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": marker},
        ]
        with_gen = self._render(self._ctx[:2], add_generation_prompt=True)
        self._ctx_text = self._render(self._ctx, add_generation_prompt=False)
        if not self._ctx_text.startswith(with_gen) or marker not in self._ctx_text:
            raise ChatEncodingError(
                "chat template does not render an assistant turn as generation prompt + content"
            )
        self._assistant_suffix = self._ctx_text[self._ctx_text.index(marker) + len(marker) :]
        self._suffix_ids: list[int] = self._tokenize_text(self._assistant_suffix)

    def _render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        # The processor normalises image parts *in place*; render copies so callers' messages
        # (owned by the env, reused by evaluators) stay as they were.
        copies = [_copy_message(m) for m in messages]
        text = self.processor.apply_chat_template(
            copies, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return cast(str, text)

    def _tokenize_text(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _encode(self, text: str, images: list[Image.Image]) -> tuple[list[int], Any]:
        if images:
            out = self.processor(text=[text], images=images, return_tensors="pt")
            ids = out["input_ids"][0].tolist()
            return ids, out
        return self._tokenize_text(text), None

    def _append(self, traj: Trajectory, text: str, images: list[Image.Image]) -> None:
        ids, out = self._encode(text, images)
        n_pads = sum(1 for i in ids if i == self.image_token_id)
        if out is not None:
            grid = cast(torch.Tensor, out["image_grid_thw"])
            merge = int(self.processor.image_processor.merge_size)
            expected = int((grid.prod(-1) // (merge * merge)).sum())
            if n_pads != expected:
                raise ChatEncodingError(
                    f"{n_pads} image tokens in the text but the images need {expected}: "
                    "every image part must be rendered as one <|image_pad|>"
                )
            pv = cast(torch.Tensor, out["pixel_values"])
            offset = 0
            for g in grid:
                n = int(g.prod())
                traj.pixel_values.append(pv[offset : offset + n])
                traj.image_grid_thw.append(g.clone())
                offset += n
            traj.images.extend(images)
        elif n_pads:
            raise ChatEncodingError(
                f"text holds {n_pads} <|image_pad|> tokens but the turn has no image"
            )
        traj._extend(ids, 0)  # pyright: ignore[reportPrivateUsage]

    def start(self, messages: Sequence[Message]) -> Trajectory:
        """Encode the opening turns (system + user) followed by the generation prompt."""
        if not messages:
            raise ChatEncodingError("conversation is empty")
        for i, m in enumerate(messages):
            if m.get("role") not in ("system", "user", "assistant"):
                raise ChatEncodingError(f"message {i} has role {m.get('role')!r}")
        if messages[-1].get("role") != "user":
            raise ChatEncodingError("the opening messages must end with a user turn")
        images = [img for m in messages for img in message_images(m)]
        traj = Trajectory()
        self._append(traj, self._render(messages, add_generation_prompt=True), images)
        return traj

    def add_assistant(
        self,
        traj: Trajectory,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
    ) -> None:
        r"""Append sampled ids (mask 1), then the template's end of the turn not yet generated (mask 0).

        If the reply ends with ``<|im_end|>`` only the rest of the suffix (``\n``) is added;
        a reply cut off by ``max_new_tokens`` also gets a closing ``<|im_end|>`` with mask 0.
        """
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ChatEncodingError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
        bad = {self.image_token_id, self.video_token_id}
        if any(int(t) in bad for t in token_ids):
            raise ChatEncodingError("assistant tokens contain an image/video placeholder token")
        traj._extend(token_ids, 1, logprobs)  # pyright: ignore[reportPrivateUsage]
        suffix = self._suffix_ids
        if token_ids and suffix and int(token_ids[-1]) == suffix[0]:
            suffix = suffix[1:]
        traj._extend(suffix, 0)  # pyright: ignore[reportPrivateUsage]

    def add_assistant_text(self, traj: Trajectory, text: str) -> None:
        """Append a written assistant reply (e.g. an oracle demonstration) plus ``<|im_end|>``."""
        self.add_assistant(traj, [*self._tokenize_text(text), self.eos_token_id])

    def add_user(self, traj: Trajectory, message: Message) -> None:
        """Append a user turn (feedback text + image) and the next generation prompt (mask 0)."""
        if message.get("role") != "user":
            raise ChatEncodingError(f"expected a user message, got role {message.get('role')!r}")
        full = self._render([*self._ctx, message], add_generation_prompt=True)
        if not full.startswith(self._ctx_text):
            raise ChatEncodingError(
                "chat template rewrites earlier turns; cannot encode incrementally"
            )
        self._append(traj, full[len(self._ctx_text) :], message_images(message))

    def encode_conversation(self, messages: Sequence[Message]) -> Trajectory:
        """Encode a whole conversation; assistant turns are tokenized from their text."""
        first_asst = next(
            (i for i, m in enumerate(messages) if m.get("role") == "assistant"), len(messages)
        )
        traj = self.start(messages[:first_asst])
        for m in messages[first_asst:]:
            if m.get("role") == "assistant":
                content = m.get("content")
                if not isinstance(content, str):
                    raise ChatEncodingError("assistant content must be a string")
                self.add_assistant_text(traj, content)
            else:
                self.add_user(traj, m)
        return traj

    def model_inputs(self, traj: Trajectory) -> dict[str, torch.Tensor]:
        """Batch-of-one inputs for ``model(**inputs)`` / ``model.generate(**inputs)``."""
        return collate(
            [traj], pad_token_id=self.pad_token_id, image_token_id=self.image_token_id
        ).model_inputs()


def collate(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    image_token_id: int,
    video_token_id: int | None = None,
    padding_side: str = "right",
) -> Batch:
    """Pad trajectories into one :class:`Batch`; images are concatenated in batch order."""
    if not trajectories:
        raise ChatEncodingError("cannot collate an empty list of trajectories")
    if padding_side not in ("left", "right"):
        raise ChatEncodingError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    width = max(len(t) for t in trajectories)
    n = len(trajectories)
    ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    old = torch.zeros((n, width), dtype=torch.float32)
    for row, t in enumerate(trajectories):
        if len(t.loss_mask) != len(t) or len(t.logprobs) != len(t):
            raise ChatEncodingError(f"trajectory {row} has inconsistent lengths")
        sl = slice(0, len(t)) if padding_side == "right" else slice(width - len(t), width)
        ids[row, sl] = torch.tensor(t.input_ids, dtype=torch.long)
        attn[row, sl] = 1
        mask[row, sl] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old[row, sl] = torch.tensor(t.logprobs, dtype=torch.float32)
    mm = (ids == image_token_id).long() * attn
    if video_token_id is not None:
        mm = mm + 2 * (ids == video_token_id).long() * attn
    pv = [p for t in trajectories for p in t.pixel_values]
    grids = [g for t in trajectories for g in t.image_grid_thw]
    return Batch(
        input_ids=ids,
        attention_mask=attn,
        mm_token_type_ids=mm,
        loss_mask=mask,
        old_logprobs=old,
        pixel_values=torch.cat(pv) if pv else None,
        image_grid_thw=torch.stack(grids) if grids else None,
    )
