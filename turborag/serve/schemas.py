"""Request bodies of the HTTP API, and the limits that bound what one request may ask of the model.

The routes validate these models themselves (`errors.parse_body`) rather than through FastAPI's body
parameters, so they do not appear in the OpenAPI schema and every validation error gets OpenAI's shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from turborag.core.generate import SamplingParams
from turborag.core.modes import MODES

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TOKENS_LIMIT = 4096
MAX_TOP_K = 64
COLLECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # as the catalog's collection names

CollectionName = Field("default", pattern=COLLECTION_PATTERN)


def unencodable(value: Any, where: str = "") -> str | None:
    """Where in a parsed JSON value a string cannot be encoded as UTF-8 (a lone surrogate such as the JSON
    string "\\ud800", which `json.loads` accepts), or None if there is no such string."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "body"
        return None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        inner = f"{where}.{key}" if where else str(key)
        if (found := unencodable(key, where or "body")) or (found := unencodable(item, inner)):
            return found
    return None


class RequestBody(BaseModel):
    """A whole request body. Its strings must be valid Unicode: the tokenizer and the store encode them as
    UTF-8, and a lone surrogate found there would be a 500 instead of the client's 400."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        if (where := unencodable(data)) is not None:
            raise ValueError(
                f"{where}: not valid Unicode (a lone surrogate such as \\ud800); send UTF-8 text"
            )
        return data


def text_parts(content: Any) -> Any:
    """Content as a list of parts must be text parts, `{"type": "text", "text": "..."}`; other types (images,
    audio) are refused rather than dropped, since a text model answering without them would mislead."""
    if not isinstance(content, list):
        return content
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise ValueError(f"content part {i} must be an object like {{'type': 'text', 'text': '...'}}")
        if part.get("type") != "text":
            raise ValueError(
                f"content part {i} has type {str(part.get('type'))[:40]!r}; only 'text' is supported"
            )
        if not isinstance(part.get("text"), str):
            raise ValueError(f"content part {i} needs 'text' as a string")
    return content


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, content: Any) -> Any:
        return text_parts(content)

    def text(self) -> str:
        """The message's text; OpenAI clients may send content as a list of text parts (checked above)."""
        if isinstance(self.content, list):  # [{"type": "text", "text": ...}, ...]
            return "".join(p["text"] for p in self.content)
        return self.content or ""


class TurboOptions(BaseModel):
    """The `turborag` extension field of a chat request: how to retrieve, and the cache mode to answer in."""

    mode: Literal[MODES] = "auto"  # type: ignore[valid-type]  (the table of core/modes.py)
    top_k: int = Field(5, ge=1, le=MAX_TOP_K)
    contexts: list[str] | None = None
    retrieve: bool = True
    collection: str = (
        CollectionName  # the collection retrieved from (the request's key must be allowed to read it)
    )


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(RequestBody):
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
    # OpenAI parameters this server cannot honour: refused (400) rather than ignored, so that a client never
    # reads one choice as n, or an answer as a tool call. Their neutral values (n=1, false, null, []) pass.
    n: int | None = 1
    best_of: int | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    echo: bool = False

    @field_validator("n", "best_of")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError("must be 1: one choice per request (send several requests instead)")
        return value

    @field_validator("logprobs", "top_logprobs", "tools", "functions", "echo")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value:  # null, false, 0 and [] ask for nothing
            raise ValueError(
                "not supported by this server (it answers from passages: no log-probabilities, "
                "no tool calls, no echo)"
            )
        return value

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


class DocumentRequest(RequestBody):
    name: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1)
    collection: str | None = Field(None, pattern=COLLECTION_PATTERN)


class CollectionRequest(RequestBody):
    name: str = Field(pattern=COLLECTION_PATTERN)
