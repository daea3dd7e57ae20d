"""Request bodies of the HTTP API, and the limits that bound what one request may ask of the model.

The routes validate these models themselves (`errors.parse_body`) rather than through FastAPI's body
parameters, so they do not appear in the OpenAPI schema and every validation error gets OpenAI's shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from turborag.core.generate import SamplingParams

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TOKENS_LIMIT = 4096
MAX_TOP_K = 64
COLLECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # as the catalog's collection names

CollectionName = Field("default", pattern=COLLECTION_PATTERN)


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text; OpenAI clients may send content as a list of typed parts, of which only the
        text parts mean anything to a text model."""
        if isinstance(self.content, list):  # [{"type": "text", "text": ...}, ...]
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class TurboOptions(BaseModel):
    """The `turborag` extension field of a chat request: how to retrieve, and the cache mode to answer in."""

    mode: Literal[
        "auto", "full", "turbo", "turbo-composite", "turbo-epic", "turbo-blend", "turbo-ape", "turbo-ape-epic"
    ] = "auto"
    top_k: int = Field(5, ge=1, le=MAX_TOP_K)
    contexts: list[str] | None = None
    retrieve: bool = True
    collection: str = (
        CollectionName  # the collection retrieved from (the request's key must be allowed to read it)
    )


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields shared by chat and completion requests."""

    model: str
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    min_tokens: int = Field(0, ge=0, le=MAX_TOKENS_LIMIT)  # vLLM's extension: no end before this many tokens
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _min_below_max(self):
        limit = self.max_completion_tokens or self.max_tokens
        if limit is not None and self.min_tokens > limit:
            raise ValueError(f"min_tokens ({self.min_tokens}) is more than max_tokens ({limit})")
        return self

    def params(self, default_max: int, newline_stop: bool = False) -> SamplingParams:
        """Sampling parameters for the engine; `max_completion_tokens` (OpenAI's newer name) wins over
        `max_tokens`, and the server's default applies when a client sends neither."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        max_new = self.max_completion_tokens or self.max_tokens or default_max
        return SamplingParams(
            max_new_tokens=max_new,
            min_tokens=min(self.min_tokens, max_new),  # an explicit max below it is refused (validator)
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=stop,
            stop_at_newline=newline_stop,
        )


class ChatRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    turborag: TurboOptions = Field(default_factory=TurboOptions)


class CompletionRequest(SamplingFields):
    prompt: str


class DocumentRequest(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1)
    collection: str | None = Field(None, pattern=COLLECTION_PATTERN)


class CollectionRequest(BaseModel):
    name: str = Field(pattern=COLLECTION_PATTERN)
