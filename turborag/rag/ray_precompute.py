"""Precompute on a Ray cluster: `turborag ingest PATHS --ray [local|auto|ADDRESS]` (extra `turborag[ray]`).

The driver does what it always does (find files, parse, chunk, diff against the catalog: rag/ingest.py) and
hands the chunks that need work to Ray Data instead of its own model. `map_batches` runs `CacheActor`, a
callable class, so each actor loads the model once and keeps it: one actor per worker (`concurrency`), one
GPU each on CUDA. An actor computes the caches of its batch behind the shared prefix, writes them straight
into the shared KV store (Redis / Redis Cluster, or a `file://` store on a path every worker sees), embeds
the texts, and returns keys, byte counts and vectors. The driver commits the catalog from those, exactly
as after a local precompute.

Why a crash loses nothing: a cache is written whole under a content-addressed key, and an actor skips keys
already stored (Engine.precompute), so a batch that Ray retries after its actor died, or a rerun of a killed
ingest, computes only what is missing; the catalog names a chunk only once the driver has its cache and
vector. Actors that die are restarted and their batch retried by Ray (`max_restarts`, `max_task_retries`).

Every actor checks that it loaded the model the store is bound to (the same fingerprint) and that it derives
the driver's cache keys, so a worker with other weights or library versions fails loudly instead of storing
caches nobody will find.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

FAIL_ONCE_ENV = "TURBORAG_RAY_FAIL_ONCE"  # tests: a file path; the first actor to see it missing dies
BATCH_DELAY_ENV = "TURBORAG_RAY_BATCH_DELAY"  # tests: seconds an actor waits after each batch it stored


@dataclass(frozen=True)
class WorkerSpec:
    """What an actor needs to rebuild the driver's engine: the model, and where the caches go."""

    model: str
    device: str
    dtype: str  # compute dtype name, e.g. "bfloat16"
    template: str
    store_url: str  # redis://..., redis+cluster://..., or a store folder (file store)
    cache_format: str  # of the store (store/codec.py)
    fingerprint: str  # the driver's model fingerprint: an actor with another model refuses to run
    max_disk_bytes: int | None = None
    batch_size: int = 4  # chunks per forward inside an actor
    collection: str | None = None  # the caches' collection, in a store that keys them per collection


class CacheActor:
    """A Ray Data callable class: one model per actor, kept across batches."""

    def __init__(self, spec: WorkerSpec):
        from turborag.core.engine import Engine
        from turborag.core.model import load_model, resolve_device, resolve_dtype
        from turborag.core.options import EngineOptions
        from turborag.rag.embed import Embedder
        from turborag.store.kv_store import KVStore
        from turborag.store.urls import open_backend

        lm = load_model(spec.model, spec.device, resolve_dtype(spec.dtype, resolve_device(spec.device)))
        if lm.fingerprint != spec.fingerprint:
            raise RuntimeError(
                f"worker loaded {spec.model} with fingerprint {lm.fingerprint[:12]}, the store is bound to "
                f"{spec.fingerprint[:12]}: the workers need the same model files and library versions"
            )
        store = KVStore(open_backend(spec.store_url, max_disk_bytes=spec.max_disk_bytes), spec.cache_format)
        options = EngineOptions(
            template=spec.template,
            batch_size=spec.batch_size,
            isolate_collections=spec.collection is not None,
        )
        self.engine = Engine(lm, store, options)
        self.collection = spec.collection
        self.embedder = Embedder()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        _maybe_fail_once()
        keys, texts = [str(k) for k in batch["key"]], [str(t) for t in batch["text"]]
        derived = [self.engine.key(self.engine.layout.chunk_ids(t), self.collection) for t in texts]
        if derived != keys:
            raise RuntimeError("a worker derived other cache keys than the driver (different tokenizer?)")
        missing = [k not in self.engine.store for k in keys]
        todo = [t for t, m in zip(texts, missing) if m]
        self.engine.precompute(todo, collection=self.collection)  # skips what another try stored
        time.sleep(float(os.environ.get(BATCH_DELAY_ENV) or 0))  # tests: room to kill the driver mid-run
        return {
            "key": np.array(keys),
            "computed": np.array(missing),
            "bytes": np.array([self.engine.store.size(k) or 0 for k in keys], dtype=np.int64),
            "vector": self.embedder.encode(texts),  # (n, 384) float32
        }


def _maybe_fail_once() -> None:
    """Fault injection for tests: die (like a killed worker) the first time, leaving a marker file."""
    flag = os.environ.get(FAIL_ONCE_ENV)
    if flag and not os.path.exists(flag):
        with open(flag, "w") as f:
            f.write("died once\n")
        os._exit(1)


@dataclass
class RayResult:
    bytes: dict[str, int]  # cache key -> stored bytes
    vectors: dict[str, np.ndarray]  # chunk text -> (384,) float32
    computed: int  # caches computed by the workers (the rest were already stored)
    computed_tokens: int


def connect(address: str, workers: int) -> None:
    """Join the cluster at `address` ("auto": the one this machine belongs to), or start a local one
    ("local", as many CPUs as workers) for a single machine."""
    import ray

    if ray.is_initialized():
        return
    env = {
        "env_vars": {
            k: v for k, v in os.environ.items() if k in (FAIL_ONCE_ENV, BATCH_DELAY_ENV, "TURBORAG_HOME")
        }
    }
    if address == "local":
        ray.init(num_cpus=max(1, workers), include_dashboard=False, runtime_env=env, log_to_driver=False)
    else:
        ray.init(address=address, runtime_env=env, log_to_driver=False)


def precompute_on_ray(
    items: list[tuple[str, str, int]],  # (cache key, chunk text, tokens)
    spec: WorkerSpec,
    address: str = "local",
    workers: int = 1,
    batch_size: int = 16,
) -> RayResult:
    """Caches and embeddings of `items` computed by `workers` actors; returns what the driver commits."""
    import ray

    connect(address, workers)
    unique = {k: (t, n) for k, t, n in items}
    ds = ray.data.from_items([{"key": k, "text": t} for k, (t, _) in unique.items()])
    on_gpu = spec.device.startswith("cuda")
    out = ds.map_batches(
        CacheActor,
        fn_constructor_kwargs={"spec": spec},
        batch_size=batch_size,
        concurrency=workers,
        num_gpus=1 if on_gpu else 0,
        num_cpus=0 if on_gpu else 1,
        max_restarts=-1,  # an actor that dies is restarted ...
        max_task_retries=-1,  # ... and its batch retried
    )
    sizes: dict[str, int] = {}
    vectors: dict[str, np.ndarray] = {}
    computed = computed_tokens = 0
    for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
        rows = zip(batch["key"], batch["computed"], batch["bytes"], batch["vector"])
        for key, was_computed, size, vec in rows:
            key = str(key)
            sizes[key] = int(size)
            vectors[unique[key][0]] = np.asarray(vec, dtype=np.float32)
            if was_computed:
                computed += 1
                computed_tokens += unique[key][1]
    missing = [k for k in unique if k not in sizes]
    if missing:
        raise RuntimeError(f"the Ray run returned no result for {len(missing)} chunks")
    return RayResult(sizes, vectors, computed, computed_tokens)
