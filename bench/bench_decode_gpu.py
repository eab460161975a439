"""bench_decode_gpu.py - flashc's CUDA KV-cache decode (flashc_forward_kvcache) as achieved
memory bandwidth, against the device's own copy rate measured in the same run.

The case is the memory-bound one of serving: GQA 8:1 (32 query heads, 4 kv heads), d128,
bf16, one new query per sequence, every sequence at the full cache length; batch 1..64,
cache 1k..128k, contiguous caches and paged ones (page 256, pages in a shuffled order).
Achieved bandwidth = bytes that must move (K and V of every cached key, plus q and out) /
time; the copy rate is a device-to-device copy of a 2 GiB buffer (read + write bytes / time),
and beside each row a copy that moves the call's own bytes shows what one operation of that
size reaches (at batch 1 and short caches a copy, too, falls short of the 2 GiB rate).
Beside flashc, where they serve the case: torch SDPA (its own backend choice; the cache
padded to the same length, GQA through enable_gqa) and flash-attn's flash_attn_with_kvcache
when the package is installed. Each figure is the median of timed runs after warm-up; flashc
and flash-attn are timed replaying a CUDA graph of the call (so that the host's launch cost,
which exceeds the kernel's time for small caches, is not what is measured) and also eagerly.

Writes a markdown table (date, GPU, commit) into bench/results/.

    python3 bench/bench_decode_gpu.py --lib build-gpu/libflashc.so [--commit HASH] [--quick]
        [--timeline]   (also each row's kernels, start and duration, over four calls)
"""
import argparse
import ctypes
import datetime
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu import BF16, F32, Flashc, Params, Tensor, desc  # noqa: E402

HQ, HKV, D = 32, 4, 128


class KvParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("cache_seqlens", ctypes.c_void_p),
                ("block_table", ctypes.c_void_p), ("max_pages_per_seq", ctypes.c_int32),
                ("block_table_stride", ctypes.c_int64), ("num_splits", ctypes.c_int32)]


def setup_lib(fc):
    L = fc.lib
    P, T, K = ctypes.POINTER(Params), ctypes.POINTER(Tensor), ctypes.POINTER(KvParams)
    L.flashc_kvcache_params_init_sized.argtypes = [K, ctypes.c_size_t]
    L.flashc_forward_kvcache.argtypes = [ctypes.c_void_p, P, K, T, T, T, T, T, T, T]
    L.flashc_kvcache_workspace_size.argtypes = [ctypes.c_void_p, P, K, T, T, T, T, T, T, T,
                                                ctypes.POINTER(ctypes.c_size_t)]


def median_ms(fn, warmup=10, rep=50):
    start = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    for i in range(rep):
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def capture_graph(fn, calls):
    """A graph of `calls` calls, after a warm-up call outside the capture (kernel attributes,
    allocator pools); None if the call cannot be captured."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode="relaxed"):
            for _ in range(calls):
                fn()
    except Exception as e:  # noqa: BLE001 - report it, the caller falls back
        print("  graph capture failed:", str(e).splitlines()[0][:100])
        torch.cuda.synchronize()
        return None
    return g


def graph_ms(fn, calls=20):
    """Median time of one call, from replays of a graph of `calls` calls; None if the call
    cannot be captured."""
    g = capture_graph(fn, calls)
    return None if g is None else median_ms(g.replay, warmup=3, rep=20) / calls


def kernel_timeline(fn, calls=4):
    """The device kernels of `calls` calls replayed from a graph, as (start us from the first,
    duration us, name) from the profiler: where a call's time goes between its kernels."""
    from torch.profiler import ProfilerActivity, profile
    g = capture_graph(fn, calls)
    if g is None:
        return []
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start if ev else 0
    return [(e.time_range.start - t0, e.time_range.end - e.time_range.start, e.name) for e in ev]


def copy_gbps(nbytes=2 << 30):
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a), warmup=5, rep=30)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def small_copy_gbps(moved):
    """The rate of a device-to-device copy that moves as many bytes as the call (half read,
    half written), timed like flashc from graph replays: what one operation of that size
    reaches, launch and ramp included."""
    a = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = graph_ms(lambda: b.copy_(a))
    del a, b
    return moved / (ms * 1e-3) / 1e9 if ms else None


class FlashcDecode:
    """One prepared flashc_forward_kvcache call on fixed tensors; with workspace, the split-KV
    partial results go to a buffer allocated once here (as a serving loop keeps one), else the
    call allocates and frees them on the stream."""

    def __init__(self, fc, q, kc, vc, seqlens, table, workspace=True):
        self.fc = fc
        B = q.shape[0]
        self.o = torch.empty_like(q)
        self.lse = torch.empty(B, HQ, 1, device="cuda", dtype=torch.float32)
        self.p = Params()
        fc.lib.flashc_params_init_sized(ctypes.byref(self.p), ctypes.sizeof(Params))
        self.p.causal = 1
        self.kv = KvParams()
        fc.lib.flashc_kvcache_params_init_sized(ctypes.byref(self.kv), ctypes.sizeof(KvParams))
        self.kv.cache_seqlens = seqlens.data_ptr()
        if table is not None:
            self.kv.block_table = table.data_ptr()
            self.kv.max_pages_per_seq = table.shape[1]
        self.keep = (q, kc, vc, seqlens, table)
        self.t = [desc(x) for x in (q, kc, vc, self.o)]
        self.tl = desc(self.lse, F32)
        r = ctypes.byref
        self.args = (fc.be, r(self.p), r(self.kv), r(self.t[0]), r(self.t[1]), r(self.t[2]), None,
                     None, r(self.t[3]), r(self.tl))
        self.ws = None
        if workspace:
            size = ctypes.c_size_t(0)
            fc.check(fc.lib.flashc_kvcache_workspace_size(*self.args, ctypes.byref(size)))
            if size.value:
                self.ws = torch.empty(size.value, dtype=torch.uint8, device="cuda")
                self.p.workspace = self.ws.data_ptr()
                self.p.workspace_size = size.value

    def __call__(self):
        self.p.stream = torch.cuda.current_stream().cuda_stream
        self.fc.check(self.fc.lib.flashc_forward_kvcache(*self.args))


def make_case(B, L, page):
    """q [B, 1, 32, 128]; caches [B, L, 4, 128] or a pool of shuffled pages."""
    q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    if page:
        pages = (L + page - 1) // page
        perm = torch.randperm(B * pages, device="cuda").to(torch.int32)
        table = perm.view(B, pages).contiguous()
        kc = torch.randn(B * pages, page, HKV, D, device="cuda", dtype=torch.bfloat16)
    else:
        table = None
        kc = torch.randn(B, L, HKV, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    return q, kc, vc, seqlens, table


def dense_kv(kc, vc, table, B, L):
    """The caches as [B, L, 4, 128] (gathered through the table when paged)."""
    if table is None:
        return kc, vc
    idx = table.long()
    return (kc[idx].reshape(B, -1, HKV, D)[:, :L], vc[idx].reshape(B, -1, HKV, D)[:, :L])


def time_sdpa(q, k, v):
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    f = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)  # noqa: E731
    try:
        out = f()
    except (RuntimeError, TypeError) as e:
        return None, None, str(e).splitlines()[0][:60]
    return median_ms(f), out.transpose(1, 2), None


def time_flash_attn(q, kc, vc, seqlens, table):
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None, None
    f = lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,  # noqa: E731
                                        causal=True)
    try:
        f()
    except RuntimeError as e:
        print("  flash-attn:", str(e).splitlines()[0][:80])
        return None, None
    return graph_ms(f), median_ms(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build-gpu/libflashc.so")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--quick", action="store_true", help="batch 1/16/64, cache 4k/32k/128k")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--caches", default="1024,4096,8192,16384,32768,65536,131072")
    ap.add_argument("--page", type=int, default=256)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--timeline", action="store_true",
                    help="print each row's kernels (start, duration) over four graph-replayed calls")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = ap.parse_args()
    if args.quick:
        args.batches, args.caches = "1,16,64", "4096,32768,131072"
    torch.manual_seed(0)
    fc = Flashc(args.lib)
    setup_lib(fc)
    gpu = torch.cuda.get_device_name()
    copy = copy_gbps()
    print(f"{gpu}: device copy {copy:.0f} GB/s; {fc.describe()}", flush=True)
    free = torch.cuda.mem_get_info()[0]
    rows = []
    for page in (0, args.page):
        for B in [int(x) for x in args.batches.split(",")]:
            for L in [int(x) for x in args.caches.split(",")]:
                kv_bytes = 2 * B * L * HKV * D * 2
                if 2.5 * kv_bytes > free:
                    print(f"  skip B{B} L{L}: {kv_bytes / 2**30:.0f} GiB of cache does not fit twice")
                    continue
                q, kc, vc, seqlens, table = make_case(B, L, page)
                moved = kv_bytes + 2 * B * HQ * D * 2
                call = FlashcDecode(fc, q, kc, vc, seqlens, table)
                g = graph_ms(call)
                e = median_ms(call)
                g_alloc = graph_ms(FlashcDecode(fc, q, kc, vc, seqlens, table, workspace=False))
                best = g if g is not None else e
                r = {"page": page, "B": B, "L": L, "graph_us": g and g * 1e3, "eager_us": e * 1e3,
                     "graph_alloc_us": g_alloc and g_alloc * 1e3, "gbps": moved / (best * 1e-3) / 1e9}
                small = small_copy_gbps(moved)
                if small:
                    r["copy_same"] = small
                if not args.no_peers:
                    fg, fe = time_flash_attn(q, kc, vc, seqlens, table)
                    if fg or fe:
                        r["fa_gbps"] = moved / ((fg or fe) * 1e-3) / 1e9
                    k, v = dense_kv(kc, vc, table, B, L)
                    ms, out, err = time_sdpa(q, k, v)
                    if ms is not None:
                        r["sdpa_gbps"] = moved / (ms * 1e-3) / 1e9
                        r["diff"] = ((call.o.float() - out.float()).norm() / out.float().norm()).item()
                    del k, v, out
                rows.append(r)
                print(f"{'paged' if page else 'contig'} B{B:3d} L{L:7d}: flashc {r['gbps']:6.0f} GB/s "
                      f"({100 * r['gbps'] / copy:3.0f}% of copy; graph {fmt_us(r['graph_us'])} "
                      f"(allocating {fmt_us(r['graph_alloc_us'])}) "
                      f"eager {r['eager_us']:.1f} us; a copy of the same bytes {r.get('copy_same', 0):.0f} GB/s)  sdpa {r.get('sdpa_gbps', 0):5.0f}  "
                      f"flash-attn {r.get('fa_gbps', 0):5.0f}  diff {r.get('diff', float('nan')):.1e}",
                      flush=True)
                if args.timeline:
                    for start, dur, name in kernel_timeline(call):
                        print(f"    {start:8.2f} +{dur:6.2f} us  {name[:80]}")
                del q, kc, vc, seqlens, table, call
                torch.cuda.empty_cache()
    write_results(rows, args, gpu, copy, fc.describe())


def fmt_us(x):
    return "-" if x is None else f"{x:.1f} us"


def write_results(rows, args, gpu, copy, description):
    os.makedirs(args.out, exist_ok=True)
    date = datetime.date.today().isoformat()
    tag = f"{date}-decode-{gpu.replace(' ', '_')}-{args.commit}"
    g = lambda r, k: f"{r[k]:.0f}" if k in r else ""  # noqa: E731
    lines = [f"# flashc CUDA decode benchmark, {date}", "",
             f"GPU: {gpu}; flashc commit {args.commit}; {description}; torch {torch.__version__}.",
             f"Device copy rate (2 GiB device-to-device, read + write, same run): **{copy:.0f} GB/s**.",
             "", "flashc_forward_kvcache, GQA 8:1 (32 q heads, 4 kv heads), d128, bf16, one query "
             "per sequence, causal, every sequence at the cache length. GB/s = (K + V bytes of "
             "the cache + q + out) / median time; % = of the copy rate. flashc time from CUDA-graph "
             "replays, the call given a workspace (flashc_kvcache_workspace_size) as a serving "
             "loop would; beside it the graph time of the call allocating its split-KV scratch "
             "itself (memory nodes in the graph) and the eager per-call time. sdpa: torch SDPA on the cache padded to "
             "the same length (dense); flash-attn: flash_attn_with_kvcache where installed. diff = "
             "||O_flashc - O_sdpa|| / ||O_sdpa||. same-size copy: a device-to-device copy moving the "
             "call's bytes (half read, half written), graph-timed like flashc: what a single "
             "operation of that size reaches; % of it = flashc GB/s / its rate.", "",
             "| cache | batch | keys | flashc GB/s | % of copy | graph us | graph us, allocating | "
             "eager us | sdpa GB/s | flash-attn GB/s | diff | same-size copy GB/s | % of it |",
             "|" + "---|" * 13]
    for r in rows:
        lines.append("| " + " | ".join([
            f"paged {args.page}" if r["page"] else "contiguous", str(r["B"]), str(r["L"]),
            f"{r['gbps']:.0f}", f"{100 * r['gbps'] / copy:.0f}",
            "" if r["graph_us"] is None else f"{r['graph_us']:.1f}",
            "" if r["graph_alloc_us"] is None else f"{r['graph_alloc_us']:.1f}", f"{r['eager_us']:.1f}",
            g(r, "sdpa_gbps"), g(r, "fa_gbps"),
            f"{r['diff']:.1e}" if "diff" in r else "", g(r, "copy_same"),
            f"{100 * r['gbps'] / r['copy_same']:.0f}" if "copy_same" in r else ""]) + " |")
    target = [100 * r["gbps"] / copy for r in rows if r["L"] >= 8192]
    if target:
        lines += ["", f"Rows with cache >= 8k: flashc at {min(target):.0f}% (min) / "
                      f"{statistics.median(target):.0f}% (median) of the copy rate; "
                      f"{sum(1 for x in target if x >= 80)} of {len(target)} at >= 80%."]
        same = [100 * r["gbps"] / r["copy_same"] for r in rows if r["L"] >= 8192 and "copy_same" in r]
        if same:
            lines += [f"Against a copy of the same bytes: {min(same):.0f}% (min) / "
                      f"{statistics.median(same):.0f}% (median); "
                      f"{sum(1 for x in same if x >= 80)} of {len(same)} at >= 80%."]
    md = os.path.join(args.out, tag + ".md")
    with open(md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote", md)


if __name__ == "__main__":
    main()
