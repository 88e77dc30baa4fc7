r"""Request bodies of the OpenAI / vLLM / SageMaker routes (pydantic, so /openapi.json is exact).

Every body refuses text that is not valid Unicode: JSON's ``\ud800`` escape (and raw UTF-8
surrogate bytes) decode to a lone surrogate, which no tokenizer, path or UTF-8 response can
hold; the whole body, extra fields and keys included, is checked before any field is
validated, so the 400 names the field instead of a later step failing with a 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError


def _lone_surrogate(text: str) -> str | None:
    """Which lone surrogate ``text`` holds and where (``None`` for valid Unicode)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}"
    return None


def invalid_unicode(value: object, path: str = "body") -> str | None:
    """Where ``value`` (parsed JSON) holds text that is not valid Unicode, if anywhere.

    Args:
        value: A parsed JSON value (dicts, lists, strings, numbers).
        path: The dotted location of ``value`` in the body.

    Returns:
        ``None`` when every string and key is valid, else a message naming the first bad one,
        e.g. ``"body.messages.0.content: not valid Unicode (lone surrogate U+D800 at
        character 3)"``.
    """
    if isinstance(value, str):
        bad = _lone_surrogate(value)
        return None if bad is None else f"{path}: not valid Unicode ({bad})"
    if isinstance(value, Mapping):
        for key, item in cast(Mapping[object, object], value).items():
            if isinstance(key, str) and (bad := _lone_surrogate(key)) is not None:
                return f"{path}: a key is not valid Unicode ({bad})"
            if (bad := invalid_unicode(item, f"{path}.{key}")) is not None:
                return bad
    elif isinstance(value, list):
        for i, item in enumerate(cast(list[object], value)):
            if (bad := invalid_unicode(item, f"{path}.{i}")) is not None:
                return bad
    return None


class RequestBody(BaseModel):
    """Base of every request body: refuses text that is not valid Unicode (see the module doc)."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if (bad := invalid_unicode(data)) is not None:
            raise PydanticCustomError("invalid_unicode", "{detail}", {"detail": bad})
        return data


class ImageURL(BaseModel):
    """An image as a base64 data URI (``data:image/...;base64,``); ``detail`` is ignored."""

    url: str
    detail: str | None = None


class TextPart(BaseModel):
    """A text content part."""

    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    """An image content part."""

    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class ChatMessage(BaseModel):
    """One chat turn: plain text, or a list of text and image parts."""

    role: Literal["system", "user", "assistant"]
    content: str | list[ContentPart]


class ChatCompletionRequest(RequestBody):
    """OpenAI chat completions; unknown OpenAI fields are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="'<base>' or '<base>:<adapter>'")
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1, le=128)
    stream: bool | None = False
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    logprobs: bool | None = False
    # vLLM sampling extras
    min_tokens: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = False

    def as_messages(self) -> list[dict[str, Any]]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


class LoadLoraRequest(RequestBody):
    """Body of ``/v1/load_lora_adapter``: a new name and the adapter's directory or s3:// prefix."""

    lora_name: str = Field(min_length=1, max_length=200)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraRequest(RequestBody):
    """Body of ``/v1/unload_lora_adapter``: the name of a loaded adapter."""

    lora_name: str = Field(min_length=1, max_length=200)
