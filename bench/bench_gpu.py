"""bench_gpu.py - flashc's CUDA backend beside PyTorch's attention backends, in one run.

Times, on the standard grid (16k tokens per batch, hidden 2048: d64 x 32 heads, d128 x 16,
d256 x 8; seqlen 512..16k; causal and not; bf16 and fp16), the forward and the backward of:

  flashc      through the C library itself (ctypes over libflashc.so), [B, N, H, D] layout
  FA2         torch SDPA, SDPBackend.FLASH_ATTENTION (FlashAttention-2)
  cuDNN       torch SDPA, SDPBackend.CUDNN_ATTENTION
  mem-eff     torch SDPA, SDPBackend.EFFICIENT_ATTENTION
  flex        torch FlexAttention (compiled), on a subset (it compiles per shape)

and the cuBLAS bf16 GEMM rate (the ceiling) in the same run. Each figure is the median of
timed runs after warm-up (triton.testing.do_bench, CUDA events). TFLOP/s with forward FLOPs
4 B H N^2 D (x0.5 causal), backward x2.5. Before timing, flashc's O is compared with FA2's.

Writes a markdown table (date, GPU, commit) and a PNG plot into bench/results/.

    python3 bench/bench_gpu.py --lib build/libflashc.so [--commit HASH] [--quick]
"""
import argparse
import ctypes
import datetime
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# ---- the C API, through ctypes --------------------------------------------------------------

F16, BF16, F32 = 2, 3, 1


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]


class Params(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float),
                ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float),
                ("alibi_slopes", ctypes.c_void_p), ("cu_seqlens_q", ctypes.c_void_p),
                ("cu_seqlens_k", ctypes.c_void_p), ("max_seqlen_q", ctypes.c_int32),
                ("max_seqlen_k", ctypes.c_int32), ("dropout_p", ctypes.c_float),
                ("dropout_seed", ctypes.c_uint64), ("dropout_offset", ctypes.c_uint64),
                ("deterministic", ctypes.c_int32), ("stream", ctypes.c_void_p),
                ("workspace", ctypes.c_void_p), ("workspace_size", ctypes.c_size_t)]


class BackendConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_threads", ctypes.c_int32),
                ("device", ctypes.c_int32), ("cpu_isa", ctypes.c_char_p),
                ("cuda_kernels", ctypes.c_char_p)]


class Flashc:
    def __init__(self, path, kernels=None):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.flashc_last_error.restype = ctypes.c_char_p
        L.flashc_backend_describe.restype = ctypes.c_char_p
        L.flashc_backend_create.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        L.flashc_backend_describe.argtypes = [ctypes.c_void_p]
        L.flashc_params_init_sized.argtypes = [ctypes.POINTER(Params), ctypes.c_size_t]
        P, T = ctypes.POINTER(Params), ctypes.POINTER(Tensor)
        L.flashc_forward.argtypes = [ctypes.c_void_p, P, T, T, T, T, T]
        L.flashc_backward.argtypes = [ctypes.c_void_p, P, T, T, T, T, T, T, T, T, T]
        L.flashc_backward_workspace_size.argtypes = [ctypes.c_void_p, P, T, T, ctypes.POINTER(ctypes.c_size_t)]
        L.flashc_backend_config_init_sized.argtypes = [ctypes.POINTER(BackendConfig), ctypes.c_size_t]
        self.cfg = BackendConfig()
        L.flashc_backend_config_init_sized(ctypes.byref(self.cfg), ctypes.sizeof(BackendConfig))
        if kernels:  # "mma": the portable mma.sync kernels even where faster ones exist
            self.cfg.cuda_kernels = kernels.encode()
        self.be = ctypes.c_void_p()
        self.check(L.flashc_backend_create(b"cuda", ctypes.byref(self.cfg), ctypes.byref(self.be)))

    def check(self, status):
        if status != 0:
            raise RuntimeError("flashc: " + self.lib.flashc_last_error().decode())

    def describe(self):
        return self.lib.flashc_backend_describe(self.be).decode()


def desc(t, dtype=None):
    """A flashc_tensor for a torch tensor viewed as [B, N, H, D] (or [B, H, N] for LSE)."""
    d = Tensor()
    d.data = t.data_ptr()
    d.dtype = dtype if dtype is not None else (BF16 if t.dtype == torch.bfloat16 else F16)
    d.ndim = t.dim()
    for i in range(t.dim()):
        d.shape[i] = t.shape[i]
        d.stride[i] = t.stride(i)
    return d


class FlashcCall:
    """Prepared forward and backward calls on fixed tensors, so timing sees only the call."""

    def __init__(self, fc, q, k, v, do, causal, deterministic=0, dropout_p=0.0):
        self.fc = fc
        B, N, H, D = q.shape
        self.o = torch.empty_like(q)
        self.lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
        self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self.p = Params()
        fc.lib.flashc_params_init_sized(ctypes.byref(self.p), ctypes.sizeof(Params))
        self.p.causal = 1 if causal else 0
        self.p.deterministic = deterministic
        self.p.dropout_p = dropout_p
        self.p.dropout_seed = 2026
        self.bind(q, k, v, do)

    def bind(self, q, k, v, do):
        """The descriptors, the backward workspace (sized for self.p as set) and the call
        arguments, on the current stream."""
        fc = self.fc
        self.p.stream = torch.cuda.current_stream().cuda_stream
        self.t = [desc(x) for x in (q, k, v, self.o, do, self.dq, self.dk, self.dv)]
        self.tl = desc(self.lse, F32)
        size = ctypes.c_size_t()
        fc.check(fc.lib.flashc_backward_workspace_size(fc.be, ctypes.byref(self.p), ctypes.byref(self.t[0]),
                                                       ctypes.byref(self.t[1]), ctypes.byref(size)))
        self.ws = torch.empty(max(size.value, 16), dtype=torch.uint8, device=q.device)
        self.p.workspace = self.ws.data_ptr()
        self.p.workspace_size = size.value
        r = ctypes.byref
        tq, tk, tv, to, tdo, tdq, tdk, tdv = (r(x) for x in self.t)
        self.fwd_args = (fc.be, r(self.p), tq, tk, tv, to, r(self.tl))
        self.bwd_args = (fc.be, r(self.p), tdo, tq, tk, tv, to, r(self.tl), tdq, tdk, tdv)

    def forward(self):
        self.fc.check(self.fc.lib.flashc_forward(*self.fwd_args))

    def backward(self):
        self.fc.check(self.fc.lib.flashc_backward(*self.bwd_args))


# ---- timing -----------------------------------------------------------------------------------

def bench_ms(fn, warmup=25, rep=80):
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def peer_backward(out, inputs, dout):
    """A peer's backward as a timed call: the gradients of inputs returned, as flashc_backward
    returns dQ, dK, dV, rather than added into their .grad (out.backward on a leaf that already
    has one would time three extra element-wise additions, one per input)."""
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def flops_fwd(B, H, N, D, causal):
    f = 4.0 * B * H * N * N * D
    return f / 2 if causal else f


def gemm_tflops(n=8192):
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = bench_ms(lambda: torch.matmul(a, b), warmup=50, rep=300)
    return 2.0 * n ** 3 / (ms * 1e-3) / 1e12


PEERS = [("FA2", SDPBackend.FLASH_ATTENTION), ("cuDNN", SDPBackend.CUDNN_ATTENTION),
         ("mem-eff", SDPBackend.EFFICIENT_ATTENTION)]


def time_sdpa(backend, q, k, v, do, causal, dropout_p=0.0):
    """q, k, v: [B, N, H, D]; SDPA sees the [B, H, N, D] views (no copies)."""
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    with sdpa_kernel([backend]):
        f = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, dropout_p=dropout_p)  # noqa: E731
        try:
            out = f()
        except RuntimeError as e:
            return None, None, None, str(e).splitlines()[0][:80]
        fwd = bench_ms(f)
        bwd = bench_ms(peer_backward(out, (qt, kt, vt), dot), warmup=25, rep=80)
    return fwd, bwd, out.detach().transpose(1, 2), None


_flex_cache = {}


def time_flex(q, k, v, do, causal):
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    if "fn" not in _flex_cache:
        _flex_cache["fn"] = torch.compile(flex_attention, dynamic=False)
    fn = _flex_cache["fn"]
    B, N, H, D = q.shape
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    bm = None
    if causal:
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, N, N, device="cuda")
    f = lambda: fn(qt, kt, vt, block_mask=bm)  # noqa: E731
    out = f()
    fwd = bench_ms(f)
    bwd = bench_ms(peer_backward(out, (qt, kt, vt), dot), warmup=25, rep=80)
    return fwd, bwd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libflashc.so")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--quick", action="store_true", help="d64/d128, seqlen 1k/4k/16k, bf16")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--deterministic", action="store_true", help="flashc backward in deterministic mode")
    ap.add_argument("--only-flashc", action="store_true", help="time flashc alone (for variants)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--dims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--peers", default="FA2,cuDNN,mem-eff", help="SDPA backends to time beside flashc")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout probability for flashc and the peers (no flex, no diff: the masks differ)")
    ap.add_argument("--mma", action="store_true",
                    help="also time flashc with its mma.sync kernels forced (the portable path)")
    args = ap.parse_args()
    peers = [p for p in PEERS if p[0] in args.peers.split(",")]

    torch.manual_seed(0)
    fc = Flashc(args.lib)
    fc_mma = Flashc(args.lib, "mma") if args.mma else None
    gpu = torch.cuda.get_device_name()
    print(fc.describe(), flush=True)
    ceiling = gemm_tflops()
    print(f"cuBLAS bf16 GEMM 8192^3: {ceiling:.0f} TFLOP/s", flush=True)

    dims = [int(x) for x in args.dims.split(",")]
    seqlens = [int(x) for x in args.seqlens.split(",")]
    dtypes = args.dtypes.split(",")
    if args.quick:
        dims, seqlens, dtypes = [64, 128], [1024, 4096, 16384], ["bf16"]
    rows = []
    for dname in dtypes:
        dt = torch.bfloat16 if dname == "bf16" else torch.float16
        for D in dims:
            H = 2048 // D
            for causal in (False, True):
                for N in seqlens:
                    B = max(1, 16384 // N)
                    q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=dt) for _ in range(4))
                    call = FlashcCall(fc, q, k, v, do, causal, 1 if args.deterministic else 0, args.dropout)
                    call.forward()
                    torch.cuda.synchronize()
                    fl = flops_fwd(B, H, N, D, causal)
                    r = {"dtype": dname, "D": D, "causal": causal, "N": N, "B": B, "H": H}
                    r["flashc"] = (fl / bench_ms(call.forward) / 1e9, 2.5 * fl / bench_ms(call.backward) / 1e9)
                    if fc_mma:
                        mc = FlashcCall(fc_mma, q, k, v, do, causal, 1 if args.deterministic else 0, args.dropout)
                        r["mma"] = (fl / bench_ms(mc.forward) / 1e9, 2.5 * fl / bench_ms(mc.backward) / 1e9)
                        del mc
                    for name, be in ([] if args.only_flashc else peers):
                        fwd, bwd, out, err = time_sdpa(be, q, k, v, do, causal, args.dropout)
                        if err:
                            r[name] = (None, None)
                            continue
                        r[name] = (fl / fwd / 1e9, 2.5 * fl / bwd / 1e9)
                        if name == "FA2" and not args.dropout:
                            ref = out.float()
                            r["diff_fa2"] = ((call.o.float() - ref).norm() / ref.norm()).item()
                        del out
                    use_flex = (not args.no_flex and not args.only_flashc and not args.dropout and D == 128
                                and dname == "bf16"
                                and N in (4096, 16384))
                    if use_flex:
                        try:
                            fwd, bwd = time_flex(q, k, v, do, causal)
                            r["flex"] = (fl / fwd / 1e9, 2.5 * fl / bwd / 1e9)
                        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                            print("flex failed:", str(e).splitlines()[0][:100], flush=True)
                    rows.append(r)
                    fmt = lambda x: "  -  " if x is None else f"{x:5.0f}"  # noqa: E731
                    print(f"{dname} d{D} {'causal' if causal else 'full  '} N{N:6d}  "
                          f"flashc {fmt(r['flashc'][0])}/{fmt(r['flashc'][1])}  "
                          f"FA2 {fmt(r.get('FA2', (None, None))[0])}/{fmt(r.get('FA2', (None, None))[1])}  "
                          f"cuDNN {fmt(r.get('cuDNN', (None, None))[0])}/{fmt(r.get('cuDNN', (None, None))[1])}  "
                          f"diff {r.get('diff_fa2', float('nan')):.1e}", flush=True)
                    del q, k, v, do, call
                    torch.cuda.empty_cache()
    if not args.only_flashc:
        write_results(rows, args, gpu, ceiling, fc.describe())


def write_results(rows, args, gpu, ceiling, description):
    os.makedirs(args.out, exist_ok=True)
    date = datetime.date.today().isoformat()
    tag = f"{date}-{gpu.replace(' ', '_')}-{args.commit}" + (f"-dropout{args.dropout:g}" if args.dropout else "")
    peers = ["FA2", "cuDNN", "mem-eff", "flex"]
    has_mma = any("mma" in r for r in rows)
    f = lambda x: "" if x is None else f"{x:.0f}"  # noqa: E731
    lines = [f"# flashc CUDA benchmark, {date}", "",
             f"GPU: {gpu}; flashc commit {args.commit}; {description}; torch {torch.__version__}." +
             (f" Dropout p = {args.dropout:g} on every call (flashc and the peers)." if args.dropout else ""),
             f"cuBLAS bf16 GEMM (8192^3, same run): **{ceiling:.0f} TFLOP/s** (the ceiling).", "",
             "TFLOP/s, forward / backward (4 B H N^2 D forward, x0.5 causal, x2.5 backward); median of "
             "timed runs after warm-up (CUDA events). 16k tokens per batch, hidden 2048. "
             "ratio = flashc / best peer; vs FA2 = flashc / SDPA FLASH_ATTENTION. "
             "diff = ||O_flashc - O_FA2|| / ||O_FA2||.", "",
             "| dtype | d | causal | seqlen | flashc fwd | flashc bwd | " +
             " | ".join(f"{p} fwd | {p} bwd" for p in peers) +
             " | ratio fwd | ratio bwd | vs FA2 fwd | vs FA2 bwd | diff |" +
             (" mma.sync fwd | mma.sync bwd | mma vs FA2 fwd | mma vs FA2 bwd |" if has_mma else ""),
             "|" + "---|" * (6 + 2 * len(peers) + 5 + (4 if has_mma else 0))]
    summary, mma_summary = [], []
    for r in rows:
        cells = [r["dtype"], str(r["D"]), "yes" if r["causal"] else "no", str(r["N"]),
                 f(r["flashc"][0]), f(r["flashc"][1])]
        best = [0.0, 0.0]
        for p in peers:
            v = r.get(p, (None, None))
            cells += [f(v[0]), f(v[1])]
            for i in range(2):
                if v[i] is not None:
                    best[i] = max(best[i], v[i])
        ratio = [r["flashc"][i] / best[i] if best[i] else None for i in range(2)]
        fa2 = r.get("FA2", (None, None))
        vs = [r["flashc"][i] / fa2[i] if fa2[i] else None for i in range(2)]
        cells += [f"{x:.2f}" if x else "" for x in ratio] + [f"{x:.2f}" if x else "" for x in vs]
        cells.append(f"{r['diff_fa2']:.1e}" if "diff_fa2" in r else "")
        mvs = []
        if has_mma:
            m = r.get("mma", (None, None))
            mvs = [m[i] / fa2[i] if m[i] and fa2[i] else None for i in range(2)]
            cells += [f(m[0]), f(m[1])] + [f"{x:.2f}" if x else "" for x in mvs]
        lines.append("| " + " | ".join(cells) + " |")
        if r["N"] >= 1024 and r["D"] in (64, 128):
            summary += [x for x in vs if x is not None]
            mma_summary += [x for x in mvs if x is not None]
    if summary:
        lines += ["", f"Target rows (seqlen >= 1k, d64/d128): flashc / FA2 min {min(summary):.2f}, "
                      f"median {statistics.median(summary):.2f}, "
                      f"{sum(1 for x in summary if x >= 1.0)} of {len(summary)} figures >= 1.00."]
    if mma_summary:
        lines += ["", f"The same rows with the mma.sync kernels forced: / FA2 min {min(mma_summary):.2f}, "
                      f"median {statistics.median(mma_summary):.2f}, "
                      f"{sum(1 for x in mma_summary if x >= 1.0)} of {len(mma_summary)} figures >= 1.00."]
    md = os.path.join(args.out, tag + ".md")
    with open(md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote", md)
    try:
        plot(rows, os.path.join(args.out, tag + ".png"), gpu)
    except Exception as e:  # noqa: BLE001 - the table matters more than the plot
        print("plot failed:", e)


def plot(rows, path, gpu):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = sorted({(r["dtype"], r["D"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(len(configs), 2, figsize=(11, 2.6 * len(configs)), squeeze=False)
    for i, (dt, D, causal) in enumerate(configs):
        rs = sorted((r for r in rows if (r["dtype"], r["D"], r["causal"]) == (dt, D, causal)), key=lambda r: r["N"])
        for j, what in enumerate(("forward", "backward")):
            ax = axes[i][j]
            for name in ("flashc", "FA2", "cuDNN", "mem-eff", "flex"):
                pts = [(r["N"], r[name][j]) for r in rs if name in r and r[name][j] is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name,
                            linewidth=2.5 if name == "flashc" else 1.2)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{dt} d{D} {'causal' if causal else 'non-causal'} {what}", fontsize=9)
            ax.set_ylabel("TFLOP/s", fontsize=8)
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"flashc vs PyTorch attention backends, {gpu}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
