"""OpenAI response bodies for chat and text completions: one JSON body, or a stream of server-sent events.

A job yields text pieces (tokens) and ends with an `Answer` that carries the counts (usage, TTFT, finish
reason). A streamed chat opens with an empty assistant delta and closes with an empty delta carrying the
finish reason, as OpenAI's does; with `stream_options.include_usage` a chunk with `usage` and no choices
follows; `data: [DONE]` ends every stream. The `turborag` field adds the mode, the TTFT and what the route
passes as `extra` (the chunks used).
"""

from __future__ import annotations

import json
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from turborag.core.engine import Answer
from turborag.serve.schemas import SamplingFields
from turborag.serve.state import ServerState, Started, shutting_down, unless_gone
from turborag.serve.worker import ShuttingDown

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no proxy buffering of the stream


def usage(a: Answer) -> dict:
    return {
        "prompt_tokens": a.prompt_tokens,
        "completion_tokens": a.completion_tokens,
        "total_tokens": a.prompt_tokens + a.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": a.cached_tokens},
    }


def sse(obj: dict | str) -> bytes:
    """One server-sent event; a string (`[DONE]`) is sent as it is."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


class Shape:
    """The fields that every body or chunk of one response repeats, and its choices, chat or text."""

    def __init__(self, kind: str, model: str):
        self.chat = kind == "chat"
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model

    def body(self, choices: list, **more) -> dict:
        """The whole (non-streamed) response; `more` adds fields after `choices`."""
        return self._envelope("chat.completion" if self.chat else "text_completion", choices, more)

    def chunk(self, choices: list, **more) -> dict:
        """One streamed chunk; `more` adds fields after `choices`."""
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion", choices, more)

    def _envelope(self, obj: str, choices: list, more: dict) -> dict:
        head = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        return {**head, "choices": choices, **more}

    def choice(self, text: str | None, finish: str | None, delta: bool) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        if delta:
            return self.delta({"content": text}, finish)
        message = {"role": "assistant", "content": text}
        return {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}

    @staticmethod
    def delta(body: dict, finish: str | None) -> dict:
        return {"index": 0, "delta": body, "finish_reason": finish, "logprobs": None}

    def last_choice(self, finish: str | None) -> dict:
        """The closing chunk's choice: no text, the finish reason."""
        return self.delta({}, finish) if self.chat else self.choice("", finish, True)


def turborag_field(extra: dict, a: Answer) -> dict:
    """The response's `turborag` object: the chunks used, the mode, TTFT, and how many chunk caches could
    not be read (evicted, or the store unreachable) and were computed inside the request; `missing_names`
    when the name check declined."""
    out = {**extra, "mode": a.mode, "ttft_s": a.ttft_s, "computed_chunks": a.computed_chunks}
    if a.missing_names:  # the name check declined: the names no passage mentions
        out["missing_names"] = a.missing_names
    return out


async def respond(
    state: ServerState,
    started: Started,
    kind: str,
    req: SamplingFields,
    extra: dict,
    request: Request | None = None,
) -> Response:
    """The response to a started generation job: `kind` is "chat" or "text"; `extra` is read only once the
    answer is done, so a route may fill it from the worker before the first token. With `request`, a
    non-streamed answer whose client leaves is cancelled (a stream already is: Starlette cancels it)."""
    shape = Shape(kind, state.served.model_name)
    if not req.stream:
        return await whole_response(state, started, shape, extra, request)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return StreamingResponse(
        events(state, started, shape, extra, include_usage),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def whole_response(
    state: ServerState, started: Started, shape: Shape, extra: dict, request: Request | None = None
) -> JSONResponse:
    try:
        answer = await unless_gone(request, final_answer(started), started.job)
    except ShuttingDown as e:
        raise shutting_down(e) from None
    finally:
        started.job.cancel()
    state.metrics.observe(answer)
    state.update_queue_depth()
    choices = [shape.choice(answer.text, answer.finish_reason, False)]
    return JSONResponse(shape.body(choices, usage=usage(answer), turborag=turborag_field(extra, answer)))


async def final_answer(started: Started) -> Answer | None:
    """The job's Answer, once every text piece before it has been generated."""
    answer = None
    async for it in started.items():
        if isinstance(it, Answer):
            answer = it
    return answer


async def events(state: ServerState, started: Started, shape: Shape, extra: dict, include_usage: bool):
    """The SSE stream. Its `finally` also runs on client disconnect (the response task is cancelled), and
    cancels the job so that the worker stops generating for nobody."""
    try:
        if shape.chat:
            yield sse(shape.chunk([shape.delta({"role": "assistant", "content": ""}, None)]))
        answer = None
        try:
            async for it in started.items():
                if isinstance(it, Answer):
                    answer = it
                    continue
                yield sse(shape.chunk([shape.choice(it, None, True)]))
        except ShuttingDown as e:  # the headers are sent: the error goes in the stream, as OpenAI's do
            yield sse({"error": shutting_down(e).body()})
            return
        yield sse(
            shape.chunk([shape.last_choice(answer.finish_reason)], turborag=turborag_field(extra, answer))
        )
        if include_usage:
            yield sse(shape.chunk([], usage=usage(answer)))
        yield sse("[DONE]")
        state.metrics.observe(answer)
    finally:
        started.job.cancel()
        state.update_queue_depth()
