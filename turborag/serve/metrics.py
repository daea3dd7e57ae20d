"""Prometheus metrics of one server: requests, time to first token, tokens, queue depth, batch size, decode
tokens/s, cache hits.

Each app has its own registry (not prometheus_client's global one), so several apps in one process (tests,
benchmarks) neither collide on metric names nor mix their counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from turborag.core.engine import Answer, Engine
from turborag.serve.worker import ModelWorker

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "turborag_requests_total", "HTTP requests", ["endpoint", "status"], registry=r
        )
        self.ttft = Histogram(
            "turborag_ttft_seconds", "time to first token", ["mode"], registry=r, buckets=TTFT_BUCKETS
        )
        self.prompt_tokens = Counter("turborag_prompt_tokens_total", "prompt tokens", ["kind"], registry=r)
        self.completion_tokens = Counter("turborag_completion_tokens_total", "generated tokens", registry=r)
        self.queue_depth = Gauge(
            "turborag_queue_depth", "requests waiting for or holding the model", registry=r
        )
        self.batch_size = Gauge(
            "turborag_batch_size", "requests being decoded together (continuous batching)", registry=r
        )
        self.decode_rate = Gauge(
            "turborag_decode_tokens_per_second",
            "tokens decoded per second by the last batched decode step (all running requests)",
            registry=r,
        )
        self.store_hits = Gauge("turborag_store_hits", "chunk caches read from the store", registry=r)
        self.store_misses = Gauge("turborag_store_misses", "chunk caches missing or damaged", registry=r)
        self.prefix_hits = Gauge(
            "turborag_prefix_cache_tokens", "prompt tokens served by prompt caching", registry=r
        )
        self.ram_tier = Gauge(
            "turborag_ram_tier",
            "RAM tier of chunk caches: bytes, entries, hits, misses, evictions",
            ["stat"],
            registry=r,
        )

    def count_request(self, endpoint: str, status: int) -> None:
        """One request, labelled by `endpoint`: a route template such as `/v1/collections/{name}` or the
        one label of unmatched paths (errors.endpoint_label), never a path a client chose, so the number of
        series stays bounded and no made-up name shows in a scrape."""
        self.requests.labels(endpoint, str(status)).inc()

    def observe(self, a: Answer) -> None:
        """A finished answer: its time to first token, and its prompt tokens split into cached/computed."""
        self.ttft.labels(a.mode).observe(a.ttft_s)
        self.prompt_tokens.labels("cached").inc(a.cached_tokens)
        self.prompt_tokens.labels("computed").inc(a.prompt_tokens - a.cached_tokens)
        self.completion_tokens.inc(a.completion_tokens)

    def exposition(self, worker: ModelWorker, engine: Engine) -> str:
        """The text a scrape returns. The gauges read counters kept by the worker and the engine's caches,
        so they are sampled now, at scrape time."""
        self.queue_depth.set(worker.depth)
        self.batch_size.set(worker.running)
        self.decode_rate.set(worker.tokens_per_s if worker.running else 0.0)
        tiers = engine.caches.stats()
        self.store_hits.set(tiers["store"]["hits"])
        self.store_misses.set(tiers["store"]["misses"])
        self.prefix_hits.set(engine.prefix_cache.hits)
        for stat, value in tiers["ram"].items():
            self.ram_tier.labels(stat).set(value)
        return generate_latest(self.registry).decode()
