"""Request bodies of the OpenAI / vLLM / SageMaker routes (pydantic, so /openapi.json is exact)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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


class ChatCompletionRequest(BaseModel):
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


class LoadLoraRequest(BaseModel):
    """Body of ``/v1/load_lora_adapter``: a new name and the adapter's directory or s3:// prefix."""

    lora_name: str = Field(min_length=1, max_length=200)
    lora_path: str = Field(min_length=1, max_length=4096)


class UnloadLoraRequest(BaseModel):
    """Body of ``/v1/unload_lora_adapter``: the name of a loaded adapter."""

    lora_name: str = Field(min_length=1, max_length=200)
