"""The HTTP server driven over loopback with the official `openai` client, on a tiny model and store."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers import one_page_pdf, write_corpus
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.serve import served_for
from turborag.core.prompt import ABSTAIN
from turborag.serve import create_app
from turborag.serve.worker import ModelWorker, QueueFull

KEY = "sk-test"


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    home = tmp_path_factory.mktemp("home")
    mp = pytest.MonkeyPatch()
    mp.setenv("TURBORAG_HOME", str(home))
    docs = write_corpus(home / "docs")
    store = home / "store"
    r = CliRunner().invoke(
        app, ["ingest", str(docs), "--store", str(store), "--model", tiny_model_dir, "--chunk-tokens", "64"]
    )
    assert r.exit_code == 0, r.output
    backend = served_for(store, None, "cpu", 8)
    the_app = create_app(backend, api_key=KEY, max_queue=64, max_body_bytes=200_000)
    with ServedApp(the_app) as srv:
        srv.backend = backend
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
        yield srv
    mp.undo()


def test_chat_turbo_and_full_usage(served):
    c = served.client
    model = served.backend.model_name
    turbo = c.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Who rings the bell?"}], max_tokens=4
    )
    full = c.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Who rings the bell?"}],
        max_tokens=4,
        extra_body={"turborag": {"mode": "full"}},
    )
    for r in (turbo, full):
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
        assert 1 <= r.usage.completion_tokens <= 4
    assert turbo.usage.prompt_tokens_details.cached_tokens > 0
    assert full.usage.prompt_tokens_details.cached_tokens == 0
    assert turbo.usage.prompt_tokens == full.usage.prompt_tokens
    chunks = turbo.model_extra["turborag"]["chunks"]
    assert len(chunks) == 5 and any(c["name"] == "harbour.md" for c in chunks)  # top-k 5 by default


def test_chat_stream_with_usage(served):
    stream = served.client.chat.completions.create(
        model="turborag",
        messages=[{"role": "user", "content": "What is the steam engine called?"}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"turborag": {"top_k": 2}},
    )
    parts, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert usage is not None and usage.prompt_tokens_details.cached_tokens > 0
    assert finish in ("stop", "length")
    assert usage.completion_tokens >= 1


def test_contexts_extension_and_completions_prompt_caching(served):
    c = served.client
    r = c.chat.completions.create(
        model="turborag",
        messages=[{"role": "user", "content": "Who founded it?"}],
        max_tokens=3,
        extra_body={"turborag": {"contexts": ["Ada founded Velt."]}},
    )
    assert r.model_extra["turborag"]["chunks"] == [] and r.usage.prompt_tokens_details.cached_tokens > 0
    system = "You are an agent with tools: search, open, calc. Think step by step. " * 6
    first = c.completions.create(model="turborag", prompt=system + "Step 1", max_tokens=2)
    second = c.completions.create(model="turborag", prompt=system + "Step 2", max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 64
    # chat without retrieval takes the same prompt-cached path
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "go"}]
    a = c.chat.completions.create(
        model="turborag", messages=msgs, max_tokens=2, extra_body={"turborag": {"retrieve": False}}
    )
    b = c.chat.completions.create(
        model="turborag", messages=msgs, max_tokens=2, extra_body={"turborag": {"retrieve": False}}
    )
    assert b.usage.prompt_tokens_details.cached_tokens > a.usage.prompt_tokens_details.cached_tokens


def test_name_check_declines_and_lists_the_missing_names(served, monkeypatch):
    body = {"turborag": {"contexts": ["Veltrano Dynamics was founded by Ada."]}}
    # as the default model records it; the tiny model does not (the served engine is the fixture's)
    monkeypatch.setattr(served.backend.engine, "name_check", True)
    for question, missing in (("Who founded Veltreno Dynamics?", ["Veltreno Dynamics"]),
                              ("Who founded Veltrano Dynamics?", None)):  # fmt: skip
        r = served.client.chat.completions.create(
            model="turborag",
            messages=[{"role": "user", "content": question}],
            max_tokens=40,
            extra_body=body,
        )
        assert r.model_extra["turborag"].get("missing_names") == missing
        assert (r.choices[0].message.content == ABSTAIN) is (missing is not None)


def test_documents_added_and_removed_change_retrieval(served):
    h = {"Authorization": f"Bearer {KEY}"}
    fact = "The zorblat festival of Quintara is held on the ninth moon and honours glass-blowers."
    with httpx.Client(base_url=served.url, headers=h, timeout=60) as http:
        r = http.post("/v1/documents", json={"name": "../../etc/zorblat.txt", "text": fact})
        assert r.status_code == 201, r.text
        doc = r.json()
        assert doc["name"] == "zorblat.txt" and doc["chunks"] >= 1  # no path escapes the uploads folder
        assert any(d["id"] == doc["id"] for d in http.get("/v1/documents").json()["data"])

        def chunks():
            body = {
                "model": "turborag",
                "messages": [{"role": "user", "content": "When is the zorblat festival?"}],
                "max_tokens": 1,
                "turborag": {"top_k": 1},
            }
            return http.post("/v1/chat/completions", json=body).json()["turborag"]["chunks"]

        assert any(c["document"] == doc["id"] for c in chunks())
        files = {
            "file": ("notes.md", b"# Notes\n\nThe quiblet bird nests only in copper towers.", "text/markdown")
        }
        up = http.post("/v1/documents", files=files)
        assert up.status_code == 201 and up.json()["name"] == "notes.md"
        assert http.delete(f"/v1/documents/{doc['id']}").status_code == 200
        assert not any(c["document"] == doc["id"] for c in chunks())
        assert http.delete(f"/v1/documents/{doc['id']}").status_code == 404
        assert http.delete("/v1/documents/..%2F..").status_code in (400, 404)


def test_an_upload_that_cannot_be_read_says_why(served):
    """A PDF whose page stream decompresses past the parser's bound: a 400 naming that, not "empty"."""
    h = {"Authorization": f"Bearer {KEY}"}
    pdf = one_page_pdf(["The harbour opens at dawn."], padding=80_000_000)  # 78 KB on the wire
    with httpx.Client(base_url=served.url, headers=h, timeout=60) as http:
        r = http.post("/v1/documents", files={"file": ("big.pdf", pdf, "application/pdf")})
    assert r.status_code == 400, r.text
    assert "big.pdf: PDF over the parser's limits" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body,status,code",
    [
        (b"{not json", 400, "invalid_json"),
        (json.dumps({"model": "turborag", "messages": "hi"}).encode(), 400, "invalid_value"),
        (
            json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode(),
            404,
            "model_not_found",
        ),
        (
            json.dumps(
                {"model": "turborag", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}
            ).encode(),
            400,
            "invalid_value",
        ),
        (
            json.dumps(
                {
                    "model": "turborag",
                    "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 4,
                    "min_tokens": 5,
                }
            ).encode(),
            400,
            "invalid_value",
        ),
        (
            json.dumps(
                {
                    "model": "turborag",
                    "messages": [{"role": "user", "content": "x"}],
                    "turborag": {"top_k": 1000},
                }
            ).encode(),
            400,
            "invalid_value",
        ),
        (
            json.dumps(
                {"model": "turborag", "messages": [{"role": "user", "content": "x" * 300_000}]}
            ).encode(),
            413,
            "body_too_large",
        ),
        (  # passages within the server's max_prompt_tokens but over the model's context window
            json.dumps(
                {
                    "model": "turborag",
                    "messages": [{"role": "user", "content": "Why?"}],
                    "max_tokens": 8,
                    "turborag": {"contexts": ["q " * 2500]},
                }
            ).encode(),
            400,
            "context_length_exceeded",
        ),
    ],
)
def test_bad_requests_get_openai_errors(served, body, status, code):
    r = httpx.post(
        served.url + "/v1/chat/completions",
        content=body,
        timeout=60,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and "Traceback" not in r.text
    if code == "context_length_exceeded":
        assert "4096" in err["message"]


def test_a_request_that_cannot_fit_is_refused_before_the_queue(served, monkeypatch):
    """A prompt that with its answer cannot fit the model's window (4096 here) is a 400 at once: the worker
    is never asked to queue it, so it never waits behind other requests to be refused."""

    def no_queue(*args, **kwargs):
        raise AssertionError("a request that cannot fit was queued")

    monkeypatch.setattr(served.app.state.worker, "submit", no_queue)
    long_text = "q " * 2500  # within max_prompt_tokens, over the window with the instruction and answer
    cases = [
        (
            "/v1/chat/completions",
            chat_body("Why?", max_tokens=8, turborag={"contexts": [long_text]}),
            "turborag.contexts",
        ),
        ("/v1/chat/completions", chat_body("Who rings the bell?", max_tokens=4096), "messages"),  # retrieval
        (
            "/v1/chat/completions",
            chat_body(long_text, max_tokens=2000, turborag={"retrieve": False}),
            "messages",
        ),
        ("/v1/completions", {"model": "turborag", "prompt": long_text, "max_tokens": 2000}, "prompt"),
    ]
    for path, body, param in cases:
        r = httpx.post(served.url + path, json=body, timeout=60, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == param, err
        assert "context window of 4096" in err["message"], err


def chat_body(question: str, **fields) -> dict:
    return {"model": "turborag", "messages": [{"role": "user", "content": question}], **fields}


def test_auth_health_metrics(served):
    r = httpx.get(served.url + "/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(served.url + "/v1/models").status_code == 401
    assert httpx.get(served.url + "/health").json()["status"] == "ok"
    m = httpx.get(served.url + "/metrics").text
    for name in (
        "turborag_requests_total",
        "turborag_ttft_seconds_bucket",
        "turborag_prompt_tokens_total",
        "turborag_queue_depth",
        "turborag_store_hits",
    ):
        assert name in m


def test_disconnect_stops_generation(served):
    worker = served.app.state.worker
    before = worker.cancelled
    body = {
        "model": "turborag",
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "max_tokens": 3000,
        "stream": True,
        "turborag": {"contexts": ["A short passage."]},
    }
    with httpx.Client(timeout=60) as http:
        with http.stream(
            "POST", served.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        ) as r:
            for i, _line in enumerate(r.iter_lines()):
                if i > 6:
                    break  # leave mid-stream
    deadline = time.time() + 30
    while (worker.cancelled == before or worker.depth) and time.time() < deadline:
        time.sleep(0.05)
    assert worker.cancelled > before and worker.depth == 0


def test_32_concurrent_streams_all_answered(served):
    def one(i: int) -> int:
        stream = served.client.chat.completions.create(
            model="turborag",
            messages=[{"role": "user", "content": f"Question {i}: who rings the bell?"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = None
        for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert len(results) == 32 and all(n >= 1 for n in results)
    assert served.app.state.worker.depth == 0


def test_queue_full_is_503_with_retry_after(served, monkeypatch):
    def full(_run):
        raise QueueFull

    monkeypatch.setattr(served.app.state.worker, "submit", full)
    r = httpx.post(
        served.url + "/v1/completions",
        json={"model": "turborag", "prompt": "x"},
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


def test_worker_queue_is_bounded():
    import asyncio

    gate = threading.Event()

    async def main():
        w = ModelWorker(max_queue=1)
        w.submit(lambda: iter([gate.wait(10)]))  # occupies the worker
        await asyncio.sleep(0.2)
        w.submit(lambda: iter([1]))  # waits in the queue
        with pytest.raises(QueueFull):
            w.submit(lambda: iter([2]))
        gate.set()

    asyncio.run(main())


def test_bench_serve_small(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path))
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "serve",
            "--model",
            tiny_model_dir,
            "--clients",
            "4",
            "--rounds",
            "1",
            "--steps",
            "3",
            "--system-tokens",
            "200",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (
        out["load"]["requests"] == 4 and out["load"]["errors"] == 0 and out["load"]["queue_depth_after"] == 0
    )
    # the mixed load (default: a quarter in full mode): one of the 4 requests is a full prefill
    for mixed in (out["mixed"], out["mixed_max_batch_1"]):
        assert mixed["requests"] == 4 and mixed["errors"] == 0 and mixed["full_share"] == 0.25
        assert mixed["full_ttft_p50_s"] is not None and mixed["turbo_ttft_p50_s"] is not None
        assert mixed["longest_prefill_tokens"] > 0 and mixed["longest_iteration_s"] > 0
    assert out["load"]["full_ttft_p50_s"] is None  # turbo only
    assert out["ratios"]["mixed_turbo_ttft_p99_vs_turbo_only"] > 0
    rows = out["agent"]["rows"]
    reuse = [x["cached_tokens"] for x in rows if x["reuse"]]
    assert reuse[0] == 0 and all(c >= 192 for c in reuse[1:])  # the system prompt's blocks are reused
    assert all(x["cached_tokens"] == 0 for x in rows if not x["reuse"])


def test_bench_serve_fixed_answer_length(tiny_model_dir, tmp_path, monkeypatch):
    """--min-tokens = --max-tokens: every answer of both loads is exactly that long (min_tokens reaches the
    engine through the request), so tokens/s compares the same work at both batch widths; the batched
    decode runs on quantized decode weights too."""
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path))
    args = ["bench", "serve", "--model", tiny_model_dir, "--clients", "3", "--rounds", "1", "--steps", "2"]
    args += ["--system-tokens", "100", "--max-tokens", "6", "--min-tokens", "6", "--sweep", "", "--json"]
    r = CliRunner().invoke(app, [*args, "--decode-weights", "int4"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["decode_weights"] == "int4"
    for load in (out["load"], out["load_max_batch_1"]):
        assert load["errors"] == 0 and load["min_tokens"] == 6
        assert round(load["tokens_per_s"] * load["seconds"]) == 3 * 6
    assert "sweep" not in out  # --sweep '' runs none
    bad = CliRunner().invoke(
        app, ["bench", "serve", "--model", tiny_model_dir, "--max-tokens", "4", "--min-tokens", "5"]
    )
    assert bad.exit_code == 2 and "more than --max-tokens" in bad.output
    bad = CliRunner().invoke(app, ["bench", "serve", "--model", tiny_model_dir, "--decode-weights", "int3"])
    assert bad.exit_code == 2 and "use float, int8 or int4" in bad.output
