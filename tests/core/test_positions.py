"""Position invariants 1-3 (docs/ARCHITECTURE.md) on tiny random models of several architectures (fp32)."""

from __future__ import annotations

import pytest
import torch

from turborag.core import hf_compat, kv
from turborag.core.arch import layer_inv_freq
from turborag.core.prompt import PromptLayout

QUESTION = "Who founded Veltrano?"
PASSAGES = [
    "Veltrano Dynamics was founded in 1911 by Ismena Throll in the city of Quorvik.",
    "The river Sallow runs through Brem, a town known for its blue bridges.",
    "Cobalt Orchard is a band from Tarsk whose first album came out in 1987.",
]


def _inv_freq(model):
    return torch.stack(layer_inv_freq(model))  # (L, D/2)


def _span(model, ids: list[int], start: int, prefix: kv.ChunkKV | None = None) -> kv.ChunkKV:
    """K/V of `ids` computed at positions [start, start + n), behind `prefix` if given."""
    cache = kv.to_cache([prefix]) if prefix is not None else hf_compat.new_cache()
    t = torch.tensor([ids])
    with torch.no_grad():
        hf_compat.forward(model, t, torch.arange(start, start + len(ids))[None], cache, logits_to_keep=1)
    skip = prefix.tokens if prefix is not None else 0
    return kv._stack(hf_compat.cache_layers(cache), skip, skip + len(ids))


def _full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_compat.forward(
            model, torch.tensor([ids]), torch.arange(len(ids))[None], hf_compat.new_cache()
        )[0]


def _turbo_logits(model, layout, question, passages, positions="reordered"):
    prompt = layout.build(question, passages)
    prefix = kv.prefill_prefix(model, prompt.prefix)
    chunks = kv.precompute_chunks(model, prefix, prompt.chunks, batch_size=2)
    cache, next_pos = kv.assemble(prefix, chunks, _inv_freq(model), positions)
    suffix = torch.tensor([prompt.suffix])
    with torch.no_grad():
        logits = hf_compat.forward(
            model, suffix, torch.arange(next_pos, next_pos + suffix.shape[1])[None], cache
        )
    return prompt, logits[0]


def test_one_chunk_turbo_equals_full(tiny_lm):
    """Invariant 1: with one chunk, turbo logits equal full-prefill logits (the whole suffix)."""
    layout = PromptLayout(tiny_lm.tokenizer)
    for passage in PASSAGES:  # each long enough to cross Gemma's 16-token sliding window
        prompt, turbo = _turbo_logits(tiny_lm.model, layout, QUESTION, [passage])
        full = _full_logits(tiny_lm.model, prompt.ids)[-len(prompt.suffix) :]
        assert (turbo - full).abs().max().item() < 1e-4


@pytest.mark.parametrize("delta", [1, 7, 300, 2000])
def test_rotate_equals_compute_at_offset(tiny_lm, delta):
    """Invariant 2: a chunk computed at offset 0 and rotated by d equals it computed at offset d."""
    ids = PromptLayout(tiny_lm.tokenizer).chunk_ids(PASSAGES[0])
    at0 = _span(tiny_lm.model, ids, 0)
    atd = _span(tiny_lm.model, ids, delta)
    rotated = kv.rotate_keys(at0.k, delta, _inv_freq(tiny_lm.model))
    assert (rotated - atd.k).abs().max().item() < 1e-4
    assert (at0.v - atd.v).abs().max().item() < 1e-4
    # and rotating is not a no-op: the check above would be vacuous otherwise
    assert (at0.k - atd.k).abs().max().item() > 1e-3


def _block_mask(lengths: list[int], prefix_len: int, suffix_len: int) -> torch.Tensor:
    """(T, T) bool: causal; a chunk token sees the prefix and its own chunk; the suffix sees everything."""
    block = [0] * prefix_len  # 0 = prefix, i+1 = chunk i, -1 = suffix
    for i, n in enumerate(lengths):
        block += [i + 1] * n
    block += [-1] * suffix_len
    b = torch.tensor(block)
    q, k = b[:, None], b[None, :]
    visible = (k == 0) | (q == k) | (q == -1)
    return visible & torch.ones(len(block), len(block), dtype=torch.bool).tril()


def test_composite_equals_block_diagonal_forward(tiny_lm):
    """Invariant 3: turbo-composite assembly equals one forward with a block mask and composite ids.

    Gemma's sliding window is indexed by sequence position in a single forward but by the chunk's own
    offset in precompute; a window longer than the prompt makes both the same (invariant 1 covers the
    window itself).
    """
    model = tiny_lm.model
    if hasattr(model.config, "sliding_window") and model.config.sliding_window:
        model.config.sliding_window = 4096
    layout = PromptLayout(tiny_lm.tokenizer)
    prompt, turbo = _turbo_logits(model, layout, QUESTION, PASSAGES, positions="composite")
    p, lengths, s = len(prompt.prefix), [len(c) for c in prompt.chunks], len(prompt.suffix)
    shifts, q0 = kv.layout(lengths, p, "composite")
    pos = list(range(p)) + [p + j for n in lengths for j in range(n)] + list(range(q0, q0 + s))
    mask = _block_mask(lengths, p, s)[None, None]  # (1, 1, T, T)
    if hasattr(model.config, "layer_types") and "sliding_attention" in model.config.layer_types:
        mask = {"full_attention": mask, "sliding_attention": mask}
    with torch.no_grad():
        one = hf_compat.forward(
            model, torch.tensor([prompt.ids]), torch.tensor([pos]), hf_compat.new_cache(), attention_mask=mask
        )
    assert (turbo - one[0, -s:]).abs().max().item() < 1e-4


def test_composite_reuses_offsets_and_reordered_is_contiguous():
    shifts, q0 = kv.layout([4, 2, 5], prefix_len=3, positions="composite")
    assert shifts == [0, 0, 0] and q0 == 3 + 5
    shifts, q0 = kv.layout([4, 2, 5], prefix_len=3, positions="reordered")
    assert shifts == [0, 4, 6] and q0 == 3 + 11
    with pytest.raises(ValueError):
        kv.layout([1], 0, "sideways")


def test_multi_chunk_turbo_differs_from_full_but_reordered_close(tiny_lm):
    """Several chunks: turbo is an approximation (chunks never see each other), so logits differ from full.

    Guards against a test setup where turbo silently falls back to full prefill.
    """
    layout = PromptLayout(tiny_lm.tokenizer)
    prompt, turbo = _turbo_logits(tiny_lm.model, layout, QUESTION, PASSAGES)
    full = _full_logits(tiny_lm.model, prompt.ids)[-len(prompt.suffix) :]
    assert (turbo - full).abs().max().item() > 1e-4


@pytest.mark.parametrize("positions", ["reordered", "composite"])
def test_buffered_serving_assembly_equals_plain(gemma_lm, positions):
    """assemble_into (serving: fp16 chunks cast and rotated into preallocated buffers) gives the same cache
    as the differentiable assemble, and the buffered cache decodes like a plain one."""
    model = gemma_lm.model
    layout = PromptLayout(gemma_lm.tokenizer)
    prompt = layout.build(QUESTION, PASSAGES)
    prefix = kv.prefill_prefix(model, prompt.prefix)
    chunks = [kv.ChunkKV(c.k.half(), c.v.half()) for c in kv.precompute_chunks(model, prefix, prompt.chunks)]
    inv = _inv_freq(model)
    plain, pos_a = kv.assemble(prefix, [c.to("cpu", torch.float32) for c in chunks], inv, positions)
    buf, pos_b = kv.assemble_into(
        prefix, chunks, inv, positions, torch.device("cpu"), torch.float32, reserve=4
    )
    assert pos_a == pos_b
    for (ka, va), (kb, vb) in zip(hf_compat.cache_layers(plain), hf_compat.cache_layers(buf)):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    outs = []
    for cache in (plain, buf):  # grows past the 4 reserved slots: the buffer must reallocate correctly
        with torch.no_grad():
            x = torch.tensor([prompt.suffix])
            outs.append(hf_compat.forward(model, x, torch.arange(pos_a, pos_a + x.shape[1])[None], cache))
            for step in range(3):
                p = pos_a + x.shape[1] + step
                outs.append(hf_compat.forward(model, torch.tensor([[5 + step]]), torch.tensor([[p]]), cache))
    half = len(outs) // 2
    for a, b in zip(outs[:half], outs[half:]):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "src,dst",
    [(torch.float32, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)],
)
def test_rotate_into_a_buffer_equals_rotate_keys(src, dst):
    """Serving assembly rotates a stored chunk's keys straight into the cache buffer (kv.rotate_into), in
    the compute dtype: the same keys as the training path's rotate_keys on the keys cast first."""
    torch.manual_seed(0)
    k = torch.randn(1, 2, 7, 16).to(src)  # (L, H, T, D)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))[None]  # (L, D/2)
    want = kv.rotate_keys(k.to(dst), 1234, inv_freq)[0]  # (H, T, D)
    cos, sin = kv.rotation(1234, inv_freq, dst)
    out = torch.full((2, 9, 16), float("nan"), dtype=dst)[:, 1:8]  # a view inside a larger buffer
    kv.rotate_into(out, k[0], cos[0, 0], sin[0, 0])
    tol = 1e-6 if dst == torch.float32 else 2e-2
    assert (out.float() - want.float()).abs().max().item() < tol
