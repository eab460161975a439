"""bench_varlen_gpu.py - flashc's variable-length (packed, cu_seqlens) prefill on CUDA against the
same tokens run as fixed-length batches, beside FlexAttention and padded SDPA, in one run.

The target: a varlen call within 5% of the time of the same tokens run as a padding-free
fixed-length batch (ratio = varlen time / fixed time <= 1.05, forward and backward).

Cases: packed batches q [1, total, Hq, D] and k, v [1, total, Hkv, D] in bf16 (fp16 with
--dtype), the sequence lengths of one of the fixed-seed sets of LENGTH_SETS (1..8k tokens each,
16k or 32k in all; ragged-16k also has sequences of length 0, first and last, and of length 1);
hidden 2048: d64 x 32 query heads and d128 x 16, each with as many kv heads and with 8:1 GQA;
causal (bottom-right, within each sequence) and not. Per case:

  varlen   flashc_forward / flashc_backward once over the packed batch, through the C library
           (ctypes over libflashc.so): cu_seqlens_q = cu_seqlens_k = the prefix sums of the
           lengths (int32, device memory), num_seqs, max_seqlen_q = max_seqlen_k = the longest.
  fixed    the reference of the target, the same tokens as fixed-length flashc calls: for each
           distinct length L > 0, one call on a contiguous [n_L, L, H, D] batch holding the n_L
           sequences of length L (gathered outside the timing; no padding, no cu_seqlens).
           Its time is the SUM over the distinct lengths of each call's median time, each call
           timed alone exactly as the varlen call is (do_bench: L2 flushed before every run), so
           it is the kernel time flashc needs when the caller groups equal lengths.
  graph    the fixed calls back to back, replayed from one CUDA graph (what a caller who groups
           lengths gets, without host gaps between launches): shown, not part of the ratio.
  flex     torch FlexAttention (compiled) over the packed batch with a document mask (a
           BlockMask from create_block_mask; causal within each document).
  padded   torch SDPA, SDPBackend.FLASH_ATTENTION, on the batch padded to [num_seqs, longest]:
           what padding costs. Timing only: that backend takes no mask, so pad keys are seen.

FLOPs, one count for every column so that ratios are fair: forward = sum over sequences of
4 * Hq * D * (visible (q, k) pairs), the pairs being L^2 without causal and exactly L (L + 1) / 2
with it (not bench_gpu.py's N^2 / 2); backward x2.5. TFLOP/s = those FLOPs / time, so a peer
that computes padding is charged for it. Times are medians after warm-up (CUDA events).

Before timing, the varlen O, dQ, dK, dV (and those of the fixed calls) are compared per
sequence with a float32 SDPA reference computed per group of equal lengths, and the varlen LSE
with the fixed calls' LSE; a failure is printed loudly, marked in the table, and makes the exit
status 1. A peer that fails is reported and the run goes on.

Writes a markdown table (date, GPU, commit) into bench/results/varlen-*.md and prints it.

    python3 bench/bench_varlen_gpu.py --lib build/libflashc.so [--quick] [--dtype bf16|fp16|both]
    python3 bench/bench_varlen_gpu.py --self-check      (the pure-Python parts: no GPU, no torch)
"""
import argparse
import ctypes
import datetime
import math
import os
import random
import statistics
import subprocess
import sys

# The length sets, the FLOP count and the grouping need no torch, so that --self-check (and an
# import for the same functions) works on a machine without it.
try:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_gpu
except ImportError as _e:
    torch = F = bench_gpu = None
    _IMPORT_ERROR = _e

TARGET = 1.05
HIDDEN = 2048
MAX_LEN = 8192

# ---- the sequence lengths ----------------------------------------------------------------------

# name: how the lengths are drawn. "fixed": the lengths themselves; else drawn with random.Random
# (seed) from dist until the total, the last one cut to land on it exactly; "forced" lengths
# are added first, and "empty_ends" puts a length-0 sequence first and last (cu_seqlens then
# repeats its first and its last offset, the edge cases of a kernel's sequence lookup).
LENGTH_SETS = {
    "equal-16k": {"total": 16384, "fixed": [2048] * 8},
    "uniform-16k": {"total": 16384, "seed": 1, "dist": ("uniform", 1, MAX_LEN)},
    "lognormal-32k": {"total": 32768, "seed": 2, "dist": ("lognormal", 1024, 1.0, 1, MAX_LEN)},
    "ragged-16k": {"total": 16384, "seed": 3, "dist": ("lognormal", 256, 1.2, 2, MAX_LEN),
                   "forced": [0, 0, 0, 1, 1, 1, 1], "empty_ends": True},
}
QUICK_SETS = ["uniform-16k", "ragged-16k"]


def make_lengths(name):
    """The sequence lengths of LENGTH_SETS[name], in packing order; the same on every run."""
    spec = LENGTH_SETS[name]
    total = spec["total"]
    if "fixed" in spec:
        out = list(spec["fixed"])
        assert sum(out) == total
        return out
    rng = random.Random(spec["seed"])
    out = list(spec.get("forced", []))
    s = sum(out)
    dist = spec["dist"]
    while s < total:
        if dist[0] == "uniform":
            n = rng.randint(dist[1], dist[2])
        else:
            _, median, sigma, lo, hi = dist
            n = min(max(int(round(rng.lognormvariate(math.log(median), sigma))), lo), hi)
        n = min(n, total - s)
        out.append(n)
        s += n
    rng.shuffle(out)
    if spec.get("empty_ends"):
        out.remove(0)
        out.remove(0)
        out = [0] + out + [0]
    return out


def cu_seqlens(lengths):
    """The num_seqs + 1 prefix sums flashc takes as cu_seqlens_q / cu_seqlens_k."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def visible_pairs(lq, lk, causal):
    """(query, key) pairs that are not masked in one sequence; causal is bottom-right (query i
    sees key j <= i + lk - lq), flashc's and FlashAttention's convention."""
    if lq <= 0 or lk <= 0:
        return 0
    if not causal:
        return lq * lk
    # row i sees max(0, i + off + 1) keys, never more than lk: the sum of first..lk
    first = max(lk - lq, 0) + 1
    return (lk - first + 1) * (first + lk) // 2


def fwd_flops(lengths, heads_q, head_dim, causal):
    return 4.0 * heads_q * head_dim * sum(visible_pairs(n, n, causal) for n in lengths)


def group_by_length(lengths):
    """[(L, [sequence indices of length L])] for each distinct L > 0, by increasing L: the
    fixed-length calls that compute the same tokens without padding."""
    groups = {}
    for i, n in enumerate(lengths):
        if n > 0:
            groups.setdefault(n, []).append(i)
    return sorted(groups.items())


def group_rows(cu, seqs):
    """The packed rows of the sequences seqs, in order: sequence by sequence, row by row, so a
    [len(seqs) * L] gather viewed as [len(seqs), L] is the fixed-length batch."""
    rows = []
    for s in seqs:
        rows.extend(range(cu[s], cu[s + 1]))
    return rows


def make_cases(dtypes, sets, dims, quick):
    """(dtype, set, D, Hq, Hkv) blocks, each run causal and not. Quick: d64 with MHA, d128 with
    MHA and GQA 8:1."""
    cases = []
    for dt in dtypes:
        for name in sets:
            for D in dims:
                hq = HIDDEN // D
                ratios = (1, 8) if not quick or D == 128 else (1,)
                for r in ratios:
                    cases.append({"dtype": dt, "set": name, "D": D, "Hq": hq, "Hkv": hq // r})
    return cases


def describe_lengths(lengths):
    nz = sorted(n for n in lengths if n > 0)
    return (f"{len(lengths)} sequences, {sum(lengths)} tokens, {len(group_by_length(lengths))} "
            f"distinct lengths, min {min(lengths)} / median {statistics.median(lengths):g} / "
            f"max {max(lengths)}; {len(lengths) - len(nz)} of length 0, "
            f"{sum(1 for n in nz if n == 1)} of length 1")


def self_check():
    """The pure-Python parts against brute force; raises AssertionError on a mismatch."""
    for lq in range(0, 9):
        for lk in range(0, 9):
            for causal in (False, True):
                brute = sum(1 for i in range(lq) for j in range(lk) if not causal or j <= i + lk - lq)
                assert visible_pairs(lq, lk, causal) == brute, (lq, lk, causal)
    assert visible_pairs(8192, 8192, True) == 8192 * 8193 // 2
    assert cu_seqlens([]) == [0] and cu_seqlens([0, 3, 0, 2]) == [0, 0, 3, 3, 5]
    for name, spec in LENGTH_SETS.items():
        lengths = make_lengths(name)
        assert lengths == make_lengths(name), name  # deterministic
        assert sum(lengths) == spec["total"], name
        assert all(0 <= n <= MAX_LEN for n in lengths), name
        assert len(lengths) <= 65535, name  # the CUDA grid limit on num_seqs
        cu = cu_seqlens(lengths)
        assert cu[0] == 0 and cu[-1] == spec["total"] and len(cu) == len(lengths) + 1
        assert all(b >= a for a, b in zip(cu, cu[1:])), name
        groups = group_by_length(lengths)
        seqs = sorted(s for _, ss in groups for s in ss)
        assert seqs == [i for i, n in enumerate(lengths) if n > 0], name
        rows = []
        for L, ss in groups:
            assert all(lengths[s] == L for s in ss)
            r = group_rows(cu, ss)
            assert len(r) == L * len(ss)
            # row j of sequence ss[b] sits at [b * L + j] of the gathered batch
            for b, s in enumerate(ss):
                assert r[b * L:(b + 1) * L] == list(range(cu[s], cu[s] + L))
            rows += r
        assert sorted(rows) == list(range(spec["total"])), name  # a partition of the tokens
        for causal in (False, True):
            for D in (64, 128):
                H = HIDDEN // D
                total = sum(fwd_flops([L] * len(ss), H, D, causal) for L, ss in groups)
                assert total == fwd_flops(lengths, H, D, causal), name
        print(f"{name:14s} {describe_lengths(lengths)}")
    rag = make_lengths("ragged-16k")
    assert rag[0] == 0 and rag[-1] == 0 and rag.count(0) == 3 and rag.count(1) == 4
    cu = cu_seqlens(rag)
    assert cu[0] == cu[1] == 0 and cu[-2] == cu[-1]
    assert make_lengths("equal-16k") == [2048] * 8
    full = make_cases(["bf16"], list(LENGTH_SETS), [64, 128], False)
    assert len(full) == 16 and {(c["Hq"], c["Hkv"]) for c in full} == {(32, 32), (32, 4), (16, 16), (16, 2)}
    quick = make_cases(["bf16"], QUICK_SETS, [64, 128], True)
    assert {(c["D"], c["Hkv"]) for c in quick} == {(64, 32), (128, 16), (128, 2)}
    print("self-check: 1 passed, 0 failed")


# ---- the GPU part ------------------------------------------------------------------------------

if bench_gpu is not None:

    class VarlenParams(bench_gpu.Params):
        """flashc_params up to its 0.2 fields. bench_gpu's Params stops at workspace_size, and a
        struct_size that short leaves num_seqs 0, which flashc refuses for a varlen batch."""
        _fields_ = [("num_seqs", ctypes.c_int32), ("alibi_slopes_batch_stride", ctypes.c_int64)]

    class VarlenCall(bench_gpu.FlashcCall):
        """A prepared varlen forward and backward (bench_gpu.FlashcCall's calls, with the varlen
        params set before the workspace query, whose size depends on them)."""

        def __init__(self, fc, q, k, v, do, cu, causal):
            self.fc = fc
            self.keep = (q, k, v, do)  # the descriptors below are raw pointers into these
            _, T, H, _ = q.shape
            self.o = torch.empty_like(q)
            self.lse = torch.empty(1, H, T, device=q.device, dtype=torch.float32)
            self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            # self-attention prefill: one array serves as cu_seqlens_q and cu_seqlens_k
            self.cu = torch.tensor(cu, dtype=torch.int32, device=q.device)
            lengths = [b - a for a, b in zip(cu, cu[1:])]
            self.p = VarlenParams()
            fc.lib.flashc_params_init_sized(ctypes.byref(self.p), ctypes.sizeof(VarlenParams))
            self.p.causal = 1 if causal else 0
            self.p.cu_seqlens_q = self.p.cu_seqlens_k = self.cu.data_ptr()
            self.p.num_seqs = len(lengths)
            # the CUDA backend cannot read device offsets to find the longest sequence: 0 here
            # would size its grid by the whole packed length
            self.p.max_seqlen_q = self.p.max_seqlen_k = max(lengths)
            self.bind(q, k, v, do)


def tol_for(dtype):
    # float32-reference error of a bf16 / fp16 attention with fp32 accumulation is a few 1e-3;
    # these bounds catch a wrong sequence (error of the order of its values), not rounding
    return 4e-2 if dtype == "bf16" else 1e-2


def seq_error(a, ref, seq_id, num_seqs):
    """max over sequences of ||a_s - ref_s|| / max(||ref_s||, sqrt(L_s) * rms token norm of
    ref). The floor keeps a sequence whose reference is ~0 (dK of a length-1 sequence is 0)
    from turning rounding into a huge relative error, and still catches a wrong one."""
    a = a.float().reshape(ref.shape[0], -1)
    ref = ref.float().reshape(ref.shape[0], -1)
    z = torch.zeros(num_seqs, device=ref.device, dtype=torch.float32)
    d2 = z.clone().index_add_(0, seq_id, ((a - ref) ** 2).sum(1))
    r2 = z.clone().index_add_(0, seq_id, (ref ** 2).sum(1))
    n = z.clone().index_add_(0, seq_id, torch.ones(ref.shape[0], device=ref.device))
    rms2 = (ref ** 2).sum() / ref.shape[0]
    rel = d2.sqrt() / torch.maximum(r2, n * rms2).sqrt().clamp_min(1e-30)
    rel = rel[n > 0]
    if not torch.isfinite(a).all():
        return float("nan")
    return rel.max().item()


def reference(q, k, v, do, groups, causal):
    """O, dQ, dK, dV in packed order ([total, heads, D], float32) from SDPA in float32, one call
    per group of equal lengths (Lq = Lk, so SDPA's top-left causal is flashc's bottom-right);
    GQA through repeat_interleave, whose backward sums dK, dV over the query heads."""
    T, Hq, D = q.shape[1:]
    Hkv = k.shape[2]
    o_r = torch.empty(T, Hq, D, device=q.device)
    dq_r = torch.empty(T, Hq, D, device=q.device)
    dk_r = torch.empty(T, Hkv, D, device=q.device)
    dv_r = torch.empty(T, Hkv, D, device=q.device)
    for L, n, rows in groups:
        def g(x):
            return x[0, rows].float().view(n, L, x.shape[2], D).transpose(1, 2).contiguous()
        qg, kg, vg = (g(x).requires_grad_(True) for x in (q, k, v))
        ke, ve = kg, vg
        if Hq != Hkv:
            ke, ve = kg.repeat_interleave(Hq // Hkv, dim=1), vg.repeat_interleave(Hq // Hkv, dim=1)
        o = F.scaled_dot_product_attention(qg, ke, ve, is_causal=causal)
        o.backward(g(do))
        for dst, src in ((o_r, o.detach()), (dq_r, qg.grad), (dk_r, kg.grad), (dv_r, vg.grad)):
            dst[rows] = src.transpose(1, 2).reshape(n * L, src.shape[1], D)
        del qg, kg, vg, ke, ve, o
    return o_r, dq_r, dk_r, dv_r


def packed(calls, groups, T, what):
    """The fixed calls' outputs (o, dq, dk, dv) scattered back into packed order."""
    first = getattr(calls[0], what)
    out = torch.empty(T, first.shape[2], first.shape[3], device=first.device, dtype=first.dtype)
    for c, (L, n, rows) in zip(calls, groups):
        out[rows] = getattr(c, what).reshape(n * L, first.shape[2], first.shape[3])
    return out


def packed_lse(calls, groups, T):
    H = calls[0].lse.shape[1]
    out = torch.empty(H, T, device=calls[0].lse.device)
    for c, (L, n, rows) in zip(calls, groups):
        out[:, rows] = c.lse.permute(1, 0, 2).reshape(H, n * L)
    return out


def graph_ms_of(calls, what):
    """Median time of the calls back to back, replayed from one CUDA graph; None if it cannot be
    captured."""
    from bench_decode_gpu import graph_ms  # the capture-and-replay timer of the decode benchmark
    saved = [c.p.stream for c in calls]

    def run():
        s = torch.cuda.current_stream().cuda_stream  # the capture stream while capturing
        for c in calls:
            c.p.stream = s
            getattr(c, what)()
    try:
        return graph_ms(run, calls=4)
    finally:
        for c, s in zip(calls, saved):
            c.p.stream = s


_FLEX = {}


def flex_setup():
    if "fn" not in _FLEX:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        import torch._dynamo
        cfg = torch._dynamo.config
        # one compile per shape and mask; past the default limit dynamo would fall back to
        # eager flex, which materializes every score and runs out of memory at 32k tokens
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 512))
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
        _FLEX["mask"] = create_block_mask
    return _FLEX["fn"], _FLEX["mask"]


def document_mask(doc, causal):
    def same_doc(b, h, qi, ki):
        return doc[qi] == doc[ki]

    def same_doc_causal(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (qi >= ki)
    return same_doc_causal if causal else same_doc


def time_flex(q, k, v, do, doc, causal, timing):
    fn, create_block_mask = flex_setup()
    T = q.shape[1]
    bm = create_block_mask(document_mask(doc, causal), None, None, T, T, device=q.device)
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    kw = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
    f = lambda: fn(qt, kt, vt, block_mask=bm, **kw)  # noqa: E731
    out = f()
    fwd = bench_gpu.bench_ms(f, *timing)
    bwd = bench_gpu.bench_ms(bench_gpu.peer_backward(out, (qt, kt, vt), dot), *timing)
    return fwd, bwd, out.detach().transpose(1, 2)


def time_padded(q, k, v, do, seq_id, pos, num_seqs, longest, causal, timing):
    """SDPA FLASH_ATTENTION on [num_seqs, longest] copies, sequence b's tokens first in row b."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def pad(x):
        p = x.new_zeros(num_seqs * longest, x.shape[2], x.shape[3])
        p[seq_id * longest + pos] = x[0]
        return p.view(num_seqs, longest, x.shape[2], x.shape[3]).transpose(1, 2)
    qt, kt, vt = (pad(x).detach().requires_grad_(True) for x in (q, k, v))
    dot = pad(do)
    kw = {"enable_gqa": True} if k.shape[2] != q.shape[2] else {}
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        f = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **kw)  # noqa: E731
        out = f()
        fwd = bench_gpu.bench_ms(f, *timing)
        bwd = bench_gpu.bench_ms(bench_gpu.peer_backward(out, (qt, kt, vt), dot), *timing)
    return fwd, bwd


def first_line(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:100]


def run_case(fc, case, causal, data, args, timing):
    """One row: correctness, then the timings of flashc varlen, flashc fixed and the peers."""
    q, k, v, do = data["qkvd"]
    lengths, cu, groups = data["lengths"], data["cu"], data["groups"]
    T, Hq, D = q.shape[1:]
    Hkv = k.shape[2]
    ns = len(lengths)
    fl = fwd_flops(lengths, Hq, D, causal)
    r = dict(case, causal=causal, seqs=ns, groups=len(groups), flops=fl, fails=[])
    tol = tol_for(case["dtype"])

    vc = VarlenCall(fc, q, k, v, do, cu, causal)
    calls = []
    for L, n, rows in groups:
        def g(x):
            return x[0, rows].view(n, L, x.shape[2], D).contiguous()
        batch = tuple(g(x) for x in (q, k, v, do))
        c = bench_gpu.FlashcCall(fc, *batch, causal)
        c.keep = batch  # FlashcCall holds raw pointers only: the gathered batch must outlive it
        calls.append(c)
    vc.forward()
    vc.backward()
    for c in calls:
        c.forward()
        c.backward()
    torch.cuda.synchronize()

    # correctness before any timing
    refs = reference(q, k, v, do, groups, causal)
    sid = data["seq_id"]
    got_v = [vc.o[0], vc.dq[0], vc.dk[0], vc.dv[0]]
    got_f = [packed(calls, groups, T, w) for w in ("o", "dq", "dk", "dv")]
    names = ("O", "dQ", "dK", "dV")
    ev = {nm: seq_error(a, b, sid, ns) for nm, a, b in zip(names, got_v, refs)}
    ef = {nm: seq_error(a, b, sid, ns) for nm, a, b in zip(names, got_f, refs)}
    lse_diff = (vc.lse[0] - packed_lse(calls, groups, T)).abs().max().item()
    r["err_varlen"], r["err_fixed"], r["lse_diff"] = max(ev.values()), max(ef.values()), lse_diff
    for what, errs in (("varlen", ev), ("fixed", ef)):
        bad = [f"{nm} {e:.2e}" for nm, e in errs.items() if not e <= tol]
        if bad:
            r["fails"].append(f"{what} vs float32 SDPA: " + ", ".join(bad) + f" (tolerance {tol:g})")
    if not lse_diff <= 1e-2:
        r["fails"].append(f"varlen LSE vs fixed LSE: max |diff| {lse_diff:.2e} (tolerance 1e-2)")
    for msg in r["fails"]:
        banner = "!" * 100
        text = (f"{banner}\nCORRECTNESS FAILURE {case['dtype']} {case['set']} d{D} {Hq}/{Hkv} "
                f"{'causal' if causal else 'full'}: {msg}\n{banner}")
        print(text, flush=True)
        print(text, file=sys.stderr, flush=True)
    o_ref = refs[0]
    del refs, got_f

    # flashc
    r["varlen"] = (bench_gpu.bench_ms(vc.forward, *timing), bench_gpu.bench_ms(vc.backward, *timing))
    r["fixed"] = (sum(bench_gpu.bench_ms(c.forward, *timing) for c in calls),
                  sum(bench_gpu.bench_ms(c.backward, *timing) for c in calls))
    r["ratio"] = tuple(r["varlen"][i] / r["fixed"][i] for i in range(2))
    try:
        r["graph"] = (graph_ms_of(calls, "forward"), graph_ms_of(calls, "backward"))
    except Exception as e:  # noqa: BLE001 - a supplementary column
        print("  graph timing failed:", first_line(e), flush=True)
        torch.cuda.synchronize()
    del calls, vc
    torch.cuda.empty_cache()

    # peers
    # quick: one compile (flex compiles per shape and mask), on the case that matters most
    use_flex = not args.no_flex and (not args.quick or (D == 128 and Hq == Hkv and causal
                                                         and case["set"] == "ragged-16k"))
    if use_flex:
        try:
            fwd, bwd, out = time_flex(q, k, v, do, data["doc"], causal, timing)
            r["flex"] = (fwd, bwd)
            r["err_flex"] = seq_error(out[0], o_ref, sid, ns)
            del out
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            print("  flex failed:", first_line(e), flush=True)
            r["flex_error"] = first_line(e)
        torch.cuda.empty_cache()
    if not args.no_padded:
        try:
            r["padded"] = time_padded(q, k, v, do, sid, data["pos"], ns, max(lengths), causal, timing)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            print("  padded SDPA failed:", first_line(e), flush=True)
            r["padded_error"] = first_line(e)
        torch.cuda.empty_cache()
    return r


def tflops(flops, ms):
    return None if ms is None else flops / ms / 1e9


def fmt(x, spec=".0f"):
    return "" if x is None else format(x, spec)


def print_row(r):
    if "varlen" not in r:
        return
    fl = r["flops"]
    tf = lambda key, i, m=1.0: fmt(tflops(m * fl, r[key][i]) if key in r else None, "5.0f") or "   - "  # noqa: E731
    print(f"{r['dtype']} {r['set']:13s} d{r['D']:<3d} {r['Hq']:2d}/{r['Hkv']:<2d} "
          f"{'causal' if r['causal'] else 'full  '}  "
          f"varlen {r['varlen'][0]:7.3f}/{r['varlen'][1]:7.3f} ms  fixed {r['fixed'][0]:7.3f}/{r['fixed'][1]:7.3f} ms  "
          f"ratio {r['ratio'][0]:.3f}/{r['ratio'][1]:.3f}  TFLOP/s varlen {tf('varlen', 0)}/{tf('varlen', 1, 2.5)} "
          f"flex {tf('flex', 0)}/{tf('flex', 1, 2.5)} padded {tf('padded', 0)}/{tf('padded', 1, 2.5)}  "
          f"err {r['err_varlen']:.1e}/{r['err_fixed']:.1e}"
          + (f" flex {r['err_flex']:.1e}" if "err_flex" in r else "") + ("  FAIL" if r["fails"] else ""), flush=True)


def target_mark(r):
    if "error" in r:
        return "ERROR"
    if r["fails"]:
        return "FAIL"
    return "ok" if max(r["ratio"]) <= TARGET else "miss"


def write_results(rows, sets, args, gpu, ceiling, description):
    os.makedirs(args.out, exist_ok=True)
    date = datetime.date.today().isoformat()
    tag = f"varlen-{date}-{gpu.replace(' ', '_')}-{args.commit}"
    lines = [f"# flashc CUDA variable-length prefill benchmark, {date}", "",
             f"GPU: {gpu}; flashc commit {args.commit}; {description}; torch {torch.__version__}.",
             f"cuBLAS bf16 GEMM (8192^3, same run): {ceiling:.0f} TFLOP/s.", "",
             "Target: varlen within 5% of the same tokens as a padding-free fixed-length batch, "
             "ratio = varlen ms / fixed ms <= 1.05 forward and backward.", "",
             "- **varlen**: one flashc call over the packed batch [1, total, H, D] (cu_seqlens, int32 on "
             "the device; max_seqlen = the longest sequence).",
             "- **fixed**: for each distinct length L > 0, one fixed-length flashc call of batch "
             "n_L (the sequences of length L, no padding); the time is the sum of the calls' "
             "medians, each call timed alone like the varlen call (L2 flushed before every run).",
             "- **graph**: the same fixed calls back to back, replayed from one CUDA graph (not in the ratio).",
             "- **flex**: FlexAttention (compiled), document mask over the packed batch.",
             "- **padded**: SDPA FLASH_ATTENTION on the batch padded to [num_seqs, longest] (timing only).",
             "",
             "TFLOP/s from one FLOP count for every column: forward sum over sequences of "
             "4 Hq D x (visible (q, k) pairs: L^2, or L (L + 1) / 2 causal), backward x2.5; a "
             "peer that computes padding is charged for it. Medians after warm-up (CUDA events). "
             "err: max over sequences and over O, dQ, dK, dV of the relative error against float32 "
             "SDPA (varlen / fixed).", "",
             "Length sets (fixed seeds):", ""]
    for name in sets:
        lines.append(f"- {name}: {describe_lengths(make_lengths(name))}; lengths {make_lengths(name)}")
    lines += ["", "| dtype | lengths | seqs | groups | d | heads q/kv | causal | varlen fwd ms | fixed fwd ms "
              "| ratio fwd | varlen bwd ms | fixed bwd ms | ratio bwd | varlen fwd TFLOP/s | varlen bwd TFLOP/s "
              "| graph fwd ms | graph bwd ms | flex fwd TFLOP/s | flex bwd TFLOP/s | padded fwd TFLOP/s "
              "| padded bwd TFLOP/s | err varlen | err fixed | target |",
              "|" + "---|" * 24]
    notes = []
    for r in rows:
        cells = [r["dtype"], r["set"], str(r.get("seqs", "")), str(r.get("groups", "")), str(r["D"]),
                 f"{r['Hq']}/{r['Hkv']}", "yes" if r["causal"] else "no"]
        if "varlen" in r:
            fl = r["flops"]
            g = r.get("graph", (None, None))
            fx = r.get("flex", (None, None))
            pd = r.get("padded", (None, None))
            cells += [f"{r['varlen'][0]:.3f}", f"{r['fixed'][0]:.3f}", f"{r['ratio'][0]:.3f}",
                      f"{r['varlen'][1]:.3f}", f"{r['fixed'][1]:.3f}", f"{r['ratio'][1]:.3f}",
                      fmt(tflops(fl, r["varlen"][0])), fmt(tflops(2.5 * fl, r["varlen"][1])),
                      fmt(g[0], ".3f"), fmt(g[1], ".3f"),
                      fmt(tflops(fl, fx[0])), fmt(tflops(2.5 * fl, fx[1])),
                      fmt(tflops(fl, pd[0])), fmt(tflops(2.5 * fl, pd[1])),
                      f"{r['err_varlen']:.1e}", f"{r['err_fixed']:.1e}"]
        else:
            cells += [""] * 16
        cells.append(target_mark(r))
        lines.append("| " + " | ".join(cells) + " |")
        where = f"{r['dtype']} {r['set']} d{r['D']} {r['Hq']}/{r['Hkv']} {'causal' if r['causal'] else 'full'}"
        for msg in r.get("fails", []):
            notes.append(f"- CORRECTNESS FAILURE, {where}: {msg}")
        for key, label in (("error", "flashc error"), ("flex_error", "flex failed"),
                           ("padded_error", "padded SDPA failed")):
            if key in r:
                notes.append(f"- {label}, {where}: {r[key]}")
    timed = [r for r in rows if "ratio" in r]
    if timed:
        f_r = [r["ratio"][0] for r in timed]
        b_r = [r["ratio"][1] for r in timed]
        ok = sum(1 for r in timed if target_mark(r) == "ok")
        lines += ["", f"Ratio varlen / fixed: forward median {statistics.median(f_r):.3f}, worst "
                      f"{max(f_r):.3f}; backward median {statistics.median(b_r):.3f}, worst {max(b_r):.3f}. "
                      f"{ok} of {len(rows)} rows meet the target (both ratios <= {TARGET:.2f}, correct)."]
    if notes:
        lines += [""] + notes
    md = os.path.join(args.out, tag + ".md")
    with open(md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote", md)


def default_commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def make_data(case, device="cuda"):
    """The packed q, k, v, dO of a case and the index tensors that map it to sequences, to the
    fixed-length groups and to the padded batch."""
    dt = torch.bfloat16 if case["dtype"] == "bf16" else torch.float16
    lengths = make_lengths(case["set"])
    cu = cu_seqlens(lengths)
    T, D = cu[-1], case["D"]
    seq_id = torch.tensor([s for s, n in enumerate(lengths) for _ in range(n)], device=device)
    return {
        "lengths": lengths, "cu": cu, "seq_id": seq_id,
        "pos": torch.tensor([j for n in lengths for j in range(n)], device=device),
        "doc": seq_id.to(torch.int32),
        "groups": [(L, len(ss), torch.tensor(group_rows(cu, ss), device=device))
                   for L, ss in group_by_length(lengths)],
        "qkvd": (torch.randn(1, T, case["Hq"], D, device=device, dtype=dt),
                 torch.randn(1, T, case["Hkv"], D, device=device, dtype=dt),
                 torch.randn(1, T, case["Hkv"], D, device=device, dtype=dt),
                 torch.randn(1, T, case["Hq"], D, device=device, dtype=dt)),
    }


def main():
    ap = argparse.ArgumentParser(description="flashc varlen prefill vs the same tokens as fixed-length batches")
    ap.add_argument("--lib", default="build/libflashc.so", help="libflashc.so built with the CUDA backend")
    ap.add_argument("--commit", default=None, help="commit for the table and file name (default: git HEAD)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--quick", action="store_true",
                    help=f"sets {','.join(QUICK_SETS)}, d64 MHA and d128 MHA + GQA, flex on one case")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "both"], default="bf16")
    ap.add_argument("--sets", default=None, help=f"comma list of {','.join(LENGTH_SETS)}")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--no-flex", action="store_true", help="skip the FlexAttention peer (it compiles per shape)")
    ap.add_argument("--no-padded", action="store_true", help="skip the padded SDPA peer")
    ap.add_argument("--self-check", action="store_true", help="check the pure-Python parts and exit")
    args = ap.parse_args()
    if args.self_check:
        self_check()
        return 0
    if bench_gpu is None:
        sys.exit(f"bench_varlen_gpu.py needs torch (and triton) for the GPU run: {_IMPORT_ERROR}")
    if args.commit is None:
        args.commit = default_commit()
    sets = args.sets.split(",") if args.sets else (QUICK_SETS if args.quick else list(LENGTH_SETS))
    for s in sets:
        if s not in LENGTH_SETS:
            sys.exit(f"unknown length set {s!r} (known: {', '.join(LENGTH_SETS)})")
    dtypes = ["bf16", "fp16"] if args.dtype == "both" else [args.dtype]
    dims = [int(x) for x in args.dims.split(",")]
    timing = (10, 30) if args.quick else (25, 80)  # do_bench warm-up and repetition, ms

    torch.manual_seed(0)
    fc = bench_gpu.Flashc(args.lib)
    gpu = torch.cuda.get_device_name()
    print(fc.describe(), flush=True)
    ceiling = bench_gpu.gemm_tflops()
    print(f"cuBLAS bf16 GEMM 8192^3: {ceiling:.0f} TFLOP/s", flush=True)
    for s in sets:
        print(f"{s}: {describe_lengths(make_lengths(s))}", flush=True)

    rows = []
    for case in make_cases(dtypes, sets, dims, args.quick):
        data = make_data(case)
        D = case["D"]
        for causal in (False, True):
            try:
                r = run_case(fc, case, causal, data, args, timing)
            except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
                msg = first_line(e)
                print(f"{'!' * 100}\nERROR {case['dtype']} {case['set']} d{D} {case['Hq']}/{case['Hkv']} "
                      f"{'causal' if causal else 'full'}: {msg}\n{'!' * 100}", flush=True)
                r = dict(case, causal=causal, fails=[], error=msg)
                try:
                    torch.cuda.synchronize()
                except RuntimeError:  # a sticky device error: the next cases report it too
                    pass
            rows.append(r)
            print_row(r)
            torch.cuda.empty_cache()
        del data
        torch.cuda.empty_cache()
    write_results(rows, sets, args, gpu, ceiling, fc.describe())
    return 1 if any(r.get("fails") or "error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
