"""The server over a store whose caches live in Redis, when Redis goes away: an upload (which must write
caches) is a 503 `store_unavailable` with Retry-After, a question is still answered (the chunk caches it
cannot read are computed, and the response says so), and once Redis is back uploads work again."""

from __future__ import annotations

import httpx
from helpers import QUESTIONS, write_corpus
from redis_servers import RedisServer, require_redis
from typer.testing import CliRunner

from turborag.bench.serve import ServedApp
from turborag.cli import app
from turborag.cli.serve import served_for
from turborag.serve import create_app

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _ask(http: httpx.Client) -> httpx.Response:
    body = {
        "model": "turborag",
        "messages": [{"role": "user", "content": QUESTIONS[0][0]}],
        "max_tokens": 2,
        "turborag": {"mode": "turbo", "top_k": 2},
    }
    return http.post("/v1/chat/completions", json=body)


def test_redis_down_upload_is_503_and_questions_are_still_answered(tmp_path, tiny_model_dir, monkeypatch):
    require_redis()
    monkeypatch.setenv("TURBORAG_HOME", str(tmp_path / "home"))
    server = RedisServer(tmp_path / "redis").start()
    try:
        store = tmp_path / "store"
        args = [
            "ingest",
            str(write_corpus(tmp_path / "docs")),
            "--store",
            str(store),
            "--model",
            tiny_model_dir,
        ]
        r = CliRunner().invoke(app, [*args, "--chunk-tokens", "64", "--store-url", server.url])
        assert r.exit_code == 0, r.output
        backend = served_for(store, None, "cpu", 8)
        with (
            ServedApp(create_app(backend, api_key=KEY)) as srv,
            httpx.Client(base_url=srv.url, headers=AUTH, timeout=120) as http,
        ):
            before = _ask(http)
            assert before.status_code == 200, before.text
            assert before.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0

            server.stop()
            up = http.post("/v1/documents", json={"name": "new.txt", "text": "The quiblet nests in towers."})
            assert up.status_code == 503, up.text
            assert up.headers["Retry-After"] == "5"
            err = up.json()["error"]
            assert err["code"] == "store_unavailable" and err["type"] == "server_error"
            assert "Traceback" not in up.text and str(tmp_path) not in up.text

            assert before.json()["turborag"]["computed_chunks"] == 0
            during = _ask(http)  # caches unreadable: computed inside the request instead
            assert during.status_code == 200, during.text
            assert during.json()["turborag"]["computed_chunks"] == 2
            assert (
                during.json()["choices"][0]["message"]["content"]
                == before.json()["choices"][0]["message"]["content"]
            )

            server.start()  # back (empty): uploads work again
            again = http.post(
                "/v1/documents", json={"name": "new.txt", "text": "The quiblet nests in towers."}
            )
            assert again.status_code == 201, again.text
    finally:
        server.stop()
