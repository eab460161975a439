"""Decoding from a KV cache from Python: flashc.forward_kvcache (numpy) and
flashc.torch.flash_attn_with_kvcache, contiguous and paged caches, the in-place append,
GQA, ragged cache lengths (0 included), forced split counts, against the float64 reference
of attention_reference.py applied to each sequence's gathered keys; window, softcap and
ALiBi against flashc.forward on the gathered keys (reference backend). Then the errors."""

import numpy as np
import pytest

import flashc

import attention_reference as ref

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None


def _cast(x, dtype):
    return np.asarray(x, np.float32).astype(dtype)


def make_case(rng, dtype, batch, nq, heads_q, heads_kv, dim, lens, nnew, page_size):
    """q, caches (NaN past each length), new k/v, block table (None when contiguous)."""
    need = max(l + nnew for l in lens) + 3
    if page_size:
        max_pages = -(-need // page_size)
        pages = batch * max_pages + 2
        perm = rng.permutation(pages)
        table = perm[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
        shape = (pages, page_size, heads_kv, dim)
    else:
        table = None
        shape = (batch, need, heads_kv, dim)
    k_cache = _cast(rng.standard_normal(shape), dtype)
    v_cache = _cast(rng.standard_normal(shape), dtype)
    for b, length in enumerate(lens):  # slots past the cached tokens must never be read
        for j in range(length, (table.shape[1] * page_size) if page_size else need):
            page, slot = (table[b, j // page_size], j % page_size) if page_size else (b, j)
            k_cache[page, slot] = np.nan
            v_cache[page, slot] = np.nan
    q = _cast(rng.standard_normal((batch, nq, heads_q, dim)), dtype)
    k_new = _cast(rng.standard_normal((batch, max(nnew, 1), heads_kv, dim)), dtype)[:, :nnew]
    v_new = _cast(rng.standard_normal((batch, max(nnew, 1), heads_kv, dim)), dtype)[:, :nnew]
    return q, k_cache, v_cache, k_new, v_new, table


def gather(cache, table, b, length):
    """Keys [0, length) of sequence b as a dense [1, length, heads, dim] array."""
    if table is None:
        return cache[b : b + 1, :length]
    page_size = cache.shape[1]
    rows = [cache[table[b, j // page_size], j % page_size] for j in range(length)]
    return np.stack(rows)[None] if rows else cache[:1, :0]


def expected(q, k_cache, v_cache, table, lens, nnew, causal):
    """float64 out and lse from the caches after the append."""
    outs, lses = [], []
    for b, length in enumerate(lens):
        k = gather(k_cache, table, b, length + nnew)
        v = gather(v_cache, table, b, length + nnew)
        if length + nnew == 0:  # no key: O = 0, LSE = -inf (the oracle needs one key)
            o = np.zeros(q[b : b + 1].shape)
            l = np.full((1, q.shape[2], q.shape[1]), -np.inf)
        else:
            o, l = ref.forward(q[b : b + 1], k, v, causal="bottom_right" if causal else None)
        outs.append(o)
        lses.append(l)
    return np.concatenate(outs), np.concatenate(lses)


DTYPES = [np.float32, np.float16] + ([BF16] if BF16 is not None else [])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("page_size", [0, 16, 64])
@pytest.mark.parametrize("nq,nnew", [(1, 0), (1, 1), (4, 4)])
def test_numpy_against_reference(dtype, page_size, nq, nnew):
    rng = np.random.default_rng(7 + page_size + nq + nnew)
    lens = [17, 0, 1000, 1]
    q, k_cache, v_cache, k_new, v_new, table = make_case(rng, dtype, 4, nq, 8, 1, 64, lens,
                                                          nnew, page_size)
    before_k, before_v = k_cache.copy(), v_cache.copy()
    kw = dict(k=k_new, v=v_new) if nnew else {}
    out, lse = flashc.forward_kvcache(q, k_cache, v_cache, np.array(lens, np.int32),
                                      block_table=table, causal=True, **kw)
    # the append: the new rows in their slots, everything else as before (NaN included)
    want_k, want_v = before_k.copy(), before_v.copy()
    for b, length in enumerate(lens):
        for t in range(nnew):
            j = length + t
            page, slot = (table[b, j // page_size], j % page_size) if page_size else (b, j)
            want_k[page, slot] = k_new[b, t]
            want_v[page, slot] = v_new[b, t]
    assert np.array_equal(k_cache.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(v_cache.view(np.uint8), want_v.view(np.uint8))
    ref_out, ref_lse = expected(q, k_cache, v_cache, table, lens, nnew, True)
    name = np.dtype(dtype).name
    error = ref.relative_error(out, ref_out)
    ref.record("kvcache", name, "out", error, (page_size, nq, nnew))
    assert error <= ref.TOLERANCE[name]
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert ref.relative_error(lse, ref_lse) <= 1e-5
    if nnew == 0:  # sequence 1 has no key at all
        assert np.all(out[1] == 0) and np.all(np.isneginf(lse[1]))


def test_split_counts_agree():
    rng = np.random.default_rng(3)
    lens = [3000, 5]
    q, k_cache, v_cache, _, _, table = make_case(rng, np.float32, 2, 2, 8, 2, 128, lens, 0, 16)
    first = None
    for splits in range(1, 9):
        out, _ = flashc.forward_kvcache(q, k_cache, v_cache, lens, block_table=table,
                                        causal=True, num_splits=splits)
        if first is None:
            first = out
        assert ref.relative_error(out, first) <= 1e-5


@pytest.mark.parametrize("feature", ["window", "softcap", "alibi", "noncausal"])
def test_features_match_forward(feature):
    rng = np.random.default_rng(11)
    lens = [40, 300]
    q, k_cache, v_cache, k_new, v_new, table = make_case(rng, np.float32, 2, 3, 4, 2, 32, lens,
                                                          2, 0)
    kw = dict(causal=feature != "noncausal")
    if feature == "window":
        kw["window_size"] = (20, 0)
    if feature == "softcap":
        kw["softcap"] = 3.0
    if feature == "alibi":
        kw["alibi_slopes"] = rng.uniform(0.05, 0.5, (2, 4)).astype(np.float32)
    out, lse = flashc.forward_kvcache(q, k_cache, v_cache, lens, k=k_new, v=v_new, **kw)
    for b, length in enumerate(lens):
        k = gather(k_cache, None, b, length + 2)
        v = gather(v_cache, None, b, length + 2)
        bkw = dict(kw)
        if feature == "alibi":
            bkw["alibi_slopes"] = kw["alibi_slopes"][b]
        o, l = flashc.forward(q[b : b + 1], np.ascontiguousarray(k), np.ascontiguousarray(v),
                              backend="reference", **bkw)
        assert ref.relative_error(out[b : b + 1], o) <= 1e-5
        assert ref.relative_error(lse[b : b + 1], l) <= 1e-5


def test_errors_name_the_argument():
    rng = np.random.default_rng(5)
    q, k_cache, v_cache, k_new, v_new, table = make_case(rng, np.float32, 2, 1, 4, 2, 16,
                                                          [5, 20], 1, 16)
    before = k_cache.copy()
    with pytest.raises(flashc.FlashcError, match=r"kv.cache_seqlens\[1\]"):
        flashc.forward_kvcache(q, k_cache, v_cache, [5, 10_000], k=k_new, v=v_new,
                               block_table=table)
    bad = table.copy()
    bad[0, 0] = 999
    with pytest.raises(flashc.FlashcError, match=r"kv.block_table\[0\]\[0\]"):
        flashc.forward_kvcache(q, k_cache, v_cache, [5, 20], k=k_new, v=v_new, block_table=bad)
    with pytest.raises(flashc.FlashcError, match="page_size"):
        flashc.forward_kvcache(q, k_cache[:, :12], v_cache[:, :12], [5, 5], block_table=table)
    with pytest.raises(flashc.FlashcError, match="kv.num_splits"):
        flashc.forward_kvcache(q, k_cache, v_cache, [5, 20], block_table=table, num_splits=999)
    read_only = k_cache.copy()
    read_only.flags.writeable = False
    with pytest.raises(flashc.FlashcError, match="read-only"):
        flashc.forward_kvcache(q, read_only, v_cache, [5, 20], k=k_new, v=v_new,
                               block_table=table)
    assert np.array_equal(k_cache.view(np.uint8), before.view(np.uint8))


def test_torch_flash_attn_with_kvcache():
    torch = pytest.importorskip("torch")
    import flashc.torch as ft

    rng = np.random.default_rng(9)
    lens = [100, 0, 33]
    q, k_cache, v_cache, k_new, v_new, table = make_case(rng, np.float32, 3, 2, 8, 2, 64, lens,
                                                         2, 16)
    kc_np, vc_np = k_cache.copy(), v_cache.copy()
    want_out, want_lse = flashc.forward_kvcache(q, kc_np, vc_np, lens, k=k_new, v=v_new,
                                                block_table=table, causal=True)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 5e-3)):
        tq = torch.from_numpy(q).to(dtype)
        tkc, tvc = torch.from_numpy(k_cache).to(dtype), torch.from_numpy(v_cache).to(dtype)
        tk, tv = torch.from_numpy(k_new).to(dtype), torch.from_numpy(v_new).to(dtype)
        out, lse = ft.flash_attn_with_kvcache(
            tq, tkc, tvc, tk, tv, cache_seqlens=torch.tensor(lens, dtype=torch.int32),
            block_table=torch.from_numpy(table), causal=True, return_softmax_lse=True)
        assert out.shape == tq.shape and lse.shape == (3, 8, 2)
        assert ref.relative_error(out.float().numpy(), want_out) <= tol
        if dtype == torch.float32:
            assert np.array_equal(tkc.numpy(), kc_np, equal_nan=True)
    with pytest.raises(flashc.FlashcError, match="rotary_cos"):
        ft.flash_attn_with_kvcache(tq, tkc, tvc, rotary_cos=torch.zeros(1))
    # a whole contiguous cache, no append, cache_seqlens as an int
    tkc = torch.randn(2, 40, 2, 64)
    tvc = torch.randn(2, 40, 2, 64)
    tq = torch.randn(2, 1, 8, 64)
    out = ft.flash_attn_with_kvcache(tq, tkc, tvc, cache_seqlens=40)
    o, _ = flashc.forward(tq.numpy(), tkc.numpy(), tvc.numpy(), backend="reference")
    assert ref.relative_error(out.numpy(), o) <= 1e-5
