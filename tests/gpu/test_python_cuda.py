"""flashc.torch on CUDA tensors: forward and gradients against torch's SDPA in float64 (and
torch's own bf16/fp16 SDPA error beside flashc's, reported), both causal conventions, GQA
and MQA, views, the current stream, CUDA graphs, torch.compile, and the errors; decoding
with flash_attn_with_kvcache from contiguous and paged CUDA caches against float64.

Run on a machine with a GPU, after building libflashc with the CUDA backend:
    python3 -m pytest tests/gpu/test_python_cuda.py -q -s
The library is looked up as FLASHC_LIBRARY, else build-gpu/ or build/ of the repository.
"""

import math
import os
import sys

import pytest

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.environ.get("FLASHC_TEST_INSTALLED") != "1":
    sys.path.insert(0, os.path.join(_REPO_ROOT, "python"))
    _gpu_build = os.path.join(os.environ.get("FLASHC_BUILD_DIR", os.path.join(_REPO_ROOT, "build-gpu")),
                              "libflashc.so")
    if "FLASHC_LIBRARY" not in os.environ and os.path.exists(_gpu_build):
        os.environ["FLASHC_LIBRARY"] = _gpu_build

torch = pytest.importorskip("torch")

import flashc  # noqa: E402
import flashc.torch as ft  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or "cuda" not in flashc.backends(),
    reason="needs a CUDA device and libflashc built with the CUDA backend")

TOLERANCE = {torch.float16: 5e-4, torch.bfloat16: 5e-3}
DTYPES = [torch.float16, torch.bfloat16]
DEVICE = "cuda"


def relative_error(x, reference):
    x, reference = x.detach().double(), reference.detach().double()
    norm = reference.norm()
    if norm <= 1e-9 * math.sqrt(reference.numel()):
        return ((x - reference).norm() / math.sqrt(reference.numel())).item()
    return ((x - reference).norm() / norm).item()


def sdpa_inputs(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, seed=0):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)

    def make(*shape):
        return torch.randn(*shape, generator=generator, device=DEVICE).to(dtype)

    q = make(batch, heads_q, seqlen_q, head_dim).requires_grad_()
    k = make(batch, heads_kv, seqlen_k, head_dim).requires_grad_()
    v = make(batch, heads_kv, seqlen_k, head_dim).requires_grad_()
    dout = make(batch, heads_q, seqlen_q, head_dim)
    return q, k, v, dout


def torch_sdpa(q, k, v, dout, dtype=None, **kwargs):
    """torch SDPA on the same inputs, in `dtype` (float64: the reference): out and grads."""
    inputs = [x.detach().to(dtype or x.dtype).requires_grad_() for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(*inputs, **kwargs)
    grads = torch.autograd.grad(out, inputs, dout.to(out.dtype))
    return out, grads


REPORT = []


@pytest.fixture(scope="module", autouse=True)
def print_report(pytestconfig):
    yield
    if not REPORT:
        return
    lines = ["", "flashc CUDA vs float64, relative error (torch SDPA at the same dtype in "
             "parentheses)"] + ["  " + line for line in REPORT]
    # Printed with output capture suspended: what a test prints is otherwise not shown.
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n".join(lines))


def check_against_float64(case, dtype, results, reference, torch_results):
    """Asserts flashc's relative error against float64 is within the bound, or within 1.25x
    what torch's own kernels get on the same case, whichever is larger."""
    figures = []
    for name, x, x_ref, x_torch in zip(("out", "dq", "dk", "dv"), results, reference, torch_results):
        assert x.dtype == dtype and x.shape == x_ref.shape, name
        assert torch.isfinite(x).all(), name
        error = relative_error(x, x_ref)
        torch_error = relative_error(x_torch, x_ref)
        figures.append("%s %.1e (%.1e)" % (name, error, torch_error))
        bound = max(TOLERANCE[dtype], 1.25 * torch_error)
        assert error <= bound, "%s %s: %.3e > %.1e" % (case, name, error, bound)
    REPORT.append("%-40s %-9s %s" % (case, str(dtype).replace("torch.", ""), "  ".join(figures)))


# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim)
SHAPES = [
    (2, 8, 8, 128, 128, 64),
    (1, 8, 2, 256, 512, 128),     # GQA, fewer queries than keys
    (2, 4, 1, 333, 129, 96),      # MQA, odd lengths, more queries than keys
    (1, 2, 2, 1, 257, 256),       # one query (decoding), the largest head_dim
    (1, 4, 4, 1024, 1024, 32),
]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d_hq%d_hkv%d_sq%d_sk%d_d%d" % s)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_sdpa_against_float64(dtype, shape, is_causal):
    q, k, v, dout = sdpa_inputs(*shape, dtype)
    gqa = shape[1] != shape[2]
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=gqa)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    out64, grads64 = torch_sdpa(q, k, v, dout, torch.float64, is_causal=is_causal, enable_gqa=gqa)
    out_t, grads_t = torch_sdpa(q, k, v, dout, is_causal=is_causal, enable_gqa=gqa)
    case = "sdpa b%d_hq%d_hkv%d_sq%d_sk%d_d%d %s" % (shape + ("causal" if is_causal else "full",))
    check_against_float64(case, dtype, (out,) + grads, (out64,) + grads64, (out_t,) + grads_t)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_flash_attn_func_bottom_right_against_float64(dtype):
    q, k, v, dout = sdpa_inputs(2, 8, 2, 200, 456, 128, dtype, seed=1)
    bshd = [x.transpose(1, 2) for x in (q, k, v)]
    out = ft.flash_attn_func(*bshd, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout.transpose(1, 2))
    i = torch.arange(200, device=DEVICE)[:, None]
    j = torch.arange(456, device=DEVICE)[None, :]
    mask = j <= i + 456 - 200
    out64, grads64 = torch_sdpa(q, k, v, dout, torch.float64, attn_mask=mask, enable_gqa=True)
    out_t, grads_t = torch_sdpa(q, k, v, dout, attn_mask=mask, enable_gqa=True)
    check_against_float64("flash_attn_func bottom-right gqa", dtype,
                          (out.transpose(1, 2),) + grads, (out64,) + grads64, (out_t,) + grads_t)


def test_views_and_misaligned_tensors():
    # A packed [b, s, 3, h, d] projection, split into SDPA-layout views: read in place.
    packed = torch.randn(2, 300, 3, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
    expected, _ = torch_sdpa(q, k, v, torch.zeros_like(q), torch.float64, is_causal=True)
    assert relative_error(out, expected) <= 5e-3
    # An offset of one element breaks the kernels' 16-byte alignment: copied, still right.
    flat = torch.randn(1 + 2 * 64 * 4 * 64, device=DEVICE, dtype=torch.float16)
    odd = flat[1:].view(2, 64, 4, 64)
    assert odd.data_ptr() % 16 != 0
    out = ft.flash_attn_func(odd, odd, odd)
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(odd.transpose(1, 2).double(),) * 3).transpose(1, 2)
    assert relative_error(out, expected) <= 5e-4


def test_runs_on_the_current_stream():
    q, k, v, dout = sdpa_inputs(1, 8, 8, 512, 512, 64, torch.float16, seed=2)
    expected = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # The copy lands only after a long sleep on this stream; a kernel launched on any
        # other stream would read the copy's destination before it is written.
        torch.cuda._sleep(200_000_000)
        q_late = q.detach().clone().requires_grad_()
        out = ft.scaled_dot_product_attention(q_late, k, v, is_causal=True)
        (grad_q,) = torch.autograd.grad(out, (q_late,), dout)
    side.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    (grad_expected,) = torch.autograd.grad(expected, (q,), dout)
    torch.testing.assert_close(grad_q, grad_expected, rtol=1e-3, atol=1e-3)


def capture(step):
    """step() captured in a CUDA graph after two warm-up calls on a side stream (backend
    set-up and the allocator stay outside the capture): the graph and step's captured
    outputs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    return graph, captured


def test_cuda_graph_capture_of_forward_and_backward():
    q, k, v, dout = sdpa_inputs(2, 8, 2, 256, 256, 64, torch.bfloat16, seed=3)

    def step():
        out = ft.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    graph, captured = capture(step)
    # New inputs, written in place into the captured tensors, then a replay.
    with torch.no_grad():
        for x in (q, k, v, dout):
            x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("out", "dq", "dk", "dv"), captured, step()):
        # The backward may sum in another order run to run (atomics): not bitwise.
        assert relative_error(got, want) <= 1e-3, name


def decode_reference(q, k_cache, v_cache, table, lens, causal):
    """float64 attention of each sequence's query rows over its cached keys [0, lens[b])
    (gathered through the block table when paged), causal bottom-right; out, lse."""
    batch, nq, heads_q, dim = q.shape
    heads_kv = k_cache.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((batch, heads_q, nq), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(batch):
        length = int(lens[b])
        if table is None:
            keys, values = k_cache[b, :length], v_cache[b, :length]
        else:
            page = k_cache.shape[1]
            rows = torch.arange(length, device=q.device)
            pages = table[b].long()[rows // page]
            keys, values = k_cache[pages, rows % page], v_cache[pages, rows % page]
        if length == 0:
            continue
        group = heads_q // heads_kv
        k64 = keys.double().repeat_interleave(group, dim=1).transpose(0, 1)    # [Hq, L, D]
        v64 = values.double().repeat_interleave(group, dim=1).transpose(0, 1)
        q64 = q[b].double().transpose(0, 1)                                    # [Hq, nq, D]
        scores = q64 @ k64.transpose(1, 2) / math.sqrt(dim)                    # [Hq, nq, L]
        if causal:
            rows_i = torch.arange(nq, device=q.device)[:, None] + (length - nq)
            scores = scores.masked_fill(torch.arange(length, device=q.device)[None, :] > rows_i,
                                        -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)                              # [Hq, nq]
        seen = torch.isfinite(row_lse)
        probs = torch.where(seen[..., None], torch.exp(scores - row_lse[..., None]),
                            torch.zeros_like(scores))
        out[b] = (probs @ v64).transpose(0, 1)
        lse[b] = row_lse
    return out, lse


@pytest.mark.parametrize("page", [0, 16, 256], ids=["contiguous", "page16", "page256"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_flash_attn_with_kvcache_against_float64(dtype, page):
    """Decoding from CUDA caches: GQA 8:1, ragged lengths (0 included), an in-place append of
    new keys, causal, the split-KV path forced and chosen, against float64."""
    generator = torch.Generator(device=DEVICE).manual_seed(11)
    batch, nq, heads_q, heads_kv, dim = 4, 2, 16, 2, 128
    lens = [0, 5, 1000, 4097]
    need = max(lens) + nq + 3
    if page:
        max_pages = -(-need // page)
        table = torch.randperm(batch * max_pages + 3, device=DEVICE,
                               generator=generator)[: batch * max_pages]
        table = table.to(torch.int32).view(batch, max_pages)
        shape = (batch * max_pages + 3, page, heads_kv, dim)
    else:
        table, shape = None, (batch, need, heads_kv, dim)
    k_cache = torch.randn(shape, device=DEVICE, generator=generator).to(dtype)
    v_cache = torch.randn(shape, device=DEVICE, generator=generator).to(dtype)
    # every slot at or past a sequence's cached length is NaN: the append must fill it before
    # it is read, and what lies past the appended keys must never be read
    capacity = table.shape[1] * page if page else need
    positions = torch.arange(capacity, device=DEVICE)
    for b, length in enumerate(lens):
        unused = positions[length:]
        where = (b, unused) if table is None else (table[b].long()[unused // page], unused % page)
        k_cache[where] = math.nan
        v_cache[where] = math.nan
    if page:  # the pool's pages no table row names
        named = torch.zeros(shape[0], dtype=torch.bool, device=DEVICE)
        named[table.long().flatten()] = True
        k_cache[~named] = math.nan
        v_cache[~named] = math.nan
    q = torch.randn(batch, nq, heads_q, dim, device=DEVICE, generator=generator).to(dtype)
    k_new = torch.randn(batch, nq, heads_kv, dim, device=DEVICE, generator=generator).to(dtype)
    v_new = torch.randn(batch, nq, heads_kv, dim, device=DEVICE, generator=generator).to(dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    for splits in (0, 5):
        kc, vc = k_cache.clone(), v_cache.clone()
        out, lse = ft.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=seqlens,
                                              block_table=table, causal=True,
                                              num_splits=splits, return_softmax_lse=True)
        # the append: the new rows are in the caches, at cache_seqlens[b] onwards
        for b in range(batch):
            for t in range(nq):
                j = lens[b] + t
                where = (b, j) if table is None else (int(table[b, j // page]), j % page)
                assert torch.equal(kc[where], k_new[b, t]) and torch.equal(vc[where], v_new[b, t])
        total = [length + nq for length in lens]
        want, want_lse = decode_reference(q, kc, vc, table, total, causal=True)
        assert torch.isfinite(out).all() and out.dtype == dtype
        error = relative_error(out, want)
        assert error <= TOLERANCE[dtype] * 1.5, "splits %d: out %.2e" % (splits, error)
        assert (lse.double() - want_lse).abs().max().item() <= 2e-3, "splits %d: lse" % splits
        REPORT.append("%-40s %-9s out %.1e" % ("kvcache page %d splits %d" % (page, splits),
                                                str(dtype).replace("torch.", ""), error))


def test_flash_attn_with_kvcache_graph_and_stream():
    """A decode step captured in a CUDA graph, replayed on new queries, equals the eager
    call; and an eager call on a side stream waits for that stream's earlier work."""
    generator = torch.Generator(device=DEVICE).manual_seed(12)
    k_cache = torch.randn(2, 8192, 4, 128, device=DEVICE, generator=generator).bfloat16()
    v_cache = torch.randn(2, 8192, 4, 128, device=DEVICE, generator=generator).bfloat16()
    q = torch.randn(2, 1, 32, 128, device=DEVICE, generator=generator).bfloat16()
    seqlens = torch.tensor([8000, 333], dtype=torch.int32, device=DEVICE)

    def step():
        return ft.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens)

    graph, captured = capture(step)
    with torch.no_grad():
        q.copy_(torch.randn_like(q))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, step(), rtol=0, atol=0)

    expected = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        q_late = q.clone()
        out = ft.flash_attn_with_kvcache(q_late, k_cache, v_cache, cache_seqlens=seqlens)
    side.synchronize()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["default", "cudagraphs"])
def test_torch_compile(mode):
    torch._dynamo.reset()

    def block(q, k, v):
        out = ft.scaled_dot_product_attention(q * 0.5, k, v, is_causal=True, enable_gqa=True)
        return out.float().square().mean()

    compiled = torch.compile(block, fullgraph=True, mode=mode)
    q, k, v, _ = sdpa_inputs(2, 8, 4, 128, 128, 64, torch.float16, seed=4)
    for _ in range(3):  # reduce-overhead records its graph on a later call
        torch.compiler.cudagraph_mark_step_begin()
        loss = compiled(q, k, v)
        grads = torch.autograd.grad(loss, (q, k, v))
    loss_eager = block(q, k, v)
    grads_eager = torch.autograd.grad(loss_eager, (q, k, v))
    torch.testing.assert_close(loss, loss_eager, rtol=1e-3, atol=1e-5)
    for a, b in zip(grads, grads_eager):
        assert relative_error(a, b) <= 1e-3


def test_deterministic_backward_is_bitwise_repeatable():
    q, k, v, dout = sdpa_inputs(2, 8, 2, 384, 384, 128, torch.bfloat16, seed=5)
    bshd = [x.transpose(1, 2) for x in (q, k, v)]
    runs = []
    for _ in range(2):
        out = ft.flash_attn_func(*bshd, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout.transpose(1, 2)))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_autocast():
    q, k, v, _ = sdpa_inputs(1, 4, 4, 64, 64, 64, torch.float32, seed=6)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = ft.scaled_dot_product_attention(q, k, v, is_causal=True)
        expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.dtype == expected.dtype == torch.bfloat16
    assert relative_error(out, expected) <= 1e-2


def expect_error(status, fragment, function, *args, **kwargs):
    with pytest.raises(flashc.FlashcError) as info:
        function(*args, **kwargs)
    assert info.value.status == status, repr(info.value)
    assert fragment in info.value.message, info.value.message


def test_errors():
    Status = flashc.Status
    q, k, v, _ = sdpa_inputs(1, 2, 2, 16, 16, 64, torch.float16)
    expect_error(Status.ERROR_UNSUPPORTED, "float32", ft.scaled_dot_product_attention,
                 q.float(), k.float(), v.float())
    q20 = torch.randn(1, 2, 16, 20, device=DEVICE, dtype=torch.float16)
    expect_error(Status.ERROR_INVALID_HEAD_DIM, "head_dim", ft.scaled_dot_product_attention,
                 q20, q20, q20)
    expect_error(Status.ERROR_INVALID_POINTER, "cpu", ft.scaled_dot_product_attention,
                 q, k.detach().cpu(), v)
    expect_error(Status.ERROR_INVALID_POINTER, "cannot read", ft.scaled_dot_product_attention,
                 q, k, v, backend="cpu")
    import numpy as np
    array = np.zeros((1, 8, 2, 64), np.float16)
    expect_error(Status.ERROR_INVALID_POINTER, "host memory", flashc.forward, array, array, array,
                 backend="cuda")
