#!/usr/bin/env python3
"""run_cpu_bench.py - flashc's CPU backend beside PyTorch's CPU scaled_dot_product_attention.

Runs, at each thread count (default 1, 2 and every core): the measured float32 FMA peak
(cpu_bench peak), then the grid batch 1, 16 heads, seqlen 1k and 4k, head dim 64 and 128,
causal and not, fp32 and bf16, forward and backward, for flashc (cpu_bench attn, one process
per case) and for torch when it is importable (same shapes, [batch, heads, seq, dim] tensors,
torch.set_num_threads). GFLOP/s use 4 B H N^2 D forward, 2.5x backward, half under a causal
mask; "% peak" divides by the FMA peak measured at the same thread count in the same run.
flashc also reports a CPU-time rate (process CPU time / threads), steadier on a shared host.

    python3 bench/cpu/run_cpu_bench.py [--threads 1,2,all] [--no-torch] [--machine NAME]
                                       [--bench PATH] [--quick]

Writes bench/results/cpu_<machine>_<date>.md and prints it.
"""
import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def build_bench(path):
    if path:
        return path
    out = os.path.join(ROOT, "build", "cpu_bench")
    lib = os.path.join(ROOT, "build")
    cmd = ["cc", "-O2", "-std=gnu11", "-I" + os.path.join(ROOT, "include"),
           os.path.join(ROOT, "bench", "cpu", "cpu_bench.c"), "-L" + lib, "-lflashc",
           "-lpthread", "-lm", "-Wl,-rpath," + lib, "-o", out]
    subprocess.check_call(cmd)
    return out


def parse(line):
    return {k: v for k, v in re.findall(r"(\w+)=([\w.\-]+)", line)}


def flops(n, d, heads, causal, bwd):
    f = 4.0 * heads * n * n * d
    return f * (2.5 if bwd else 1.0) * (0.5 if causal else 1.0)


def torch_case(torch, threads, dtype, mode, n, d, causal, heads):
    torch.set_num_threads(threads)
    F = torch.nn.functional
    dt = torch.float32 if dtype == "f32" else torch.bfloat16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(1, heads, n, d, generator=g).mul_(2).sub_(1).to(dt) for _ in range(3))
    bwd = mode == "bwd"
    if bwd:
        for t in (q, k, v):
            t.requires_grad_(True)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
    dout = torch.rand_like(out)

    def once():
        if bwd:
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        else:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))

    once()  # warm-up
    times = []
    while len(times) < 3 or (sum(times) < 1.0 and len(times) < 64):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    times.sort()
    med = times[len(times) // 2]
    return flops(n, d, heads, causal, bwd) / med / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2,all")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--machine", default=None)
    ap.add_argument("--bench", default=None, help="path of a built cpu_bench")
    ap.add_argument("--quick", action="store_true", help="seqlen 1k only")
    ap.add_argument("--out", default=None, help="the table's file, or a folder for it")
    ap.add_argument("--from-log", default=None,
                    help="rebuild the table from the progress lines of an earlier run's log")
    ap.add_argument("--torch-version", default=None, help="with --from-log: PyTorch's version")
    a = ap.parse_args()
    if a.from_log:
        return table_from_log(a)

    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = []
    for t in a.threads.split(","):
        t = ncpu if t == "all" else int(t)
        if t not in threads:
            threads.append(t)
    model = cpu_model()
    machine = a.machine or re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") + f"-{ncpu}c"
    bench = build_bench(a.bench)
    torch = None
    if not a.no_torch:
        try:
            import torch as _torch
            torch = _torch
        except ImportError:
            torch = None
    if torch is not None:
        print(f"torch {torch.__version__}", flush=True)

    seqlens = [1024] if a.quick else [1024, 4096]
    heads = 16
    rows = []
    peaks = {}
    for t in threads:
        p = parse(subprocess.check_output([bench, "peak", str(t)], text=True))
        peaks[t] = (float(p["gflops"]), float(p["cpu_gflops"]))
        print(f"peak {t} threads: {peaks[t][0]:.1f} GFLOP/s wall, {peaks[t][1]:.1f} cpu-time",
              flush=True)
        for dtype in ("f32", "bf16"):
            for mode in ("fwd", "bwd"):
                for n in seqlens:
                    for d in (64, 128):
                        for causal in (0, 1):
                            line = subprocess.check_output(
                                [bench, "attn", str(t), dtype, mode, str(n), str(d),
                                 str(causal), str(heads)], text=True).strip()
                            r = parse(line)
                            fg, fc = float(r["gflops"]), float(r["cpu_gflops"])
                            tg = None
                            if torch is not None:
                                tg = torch_case(torch, t, dtype, mode, n, d, causal, heads)
                            rows.append((t, dtype, mode, n, d, causal, fg, fc, tg))
                            print(f"  t={t} {dtype} {mode} n={n} d={d} causal={causal}: flashc "
                                  f"{fg:.1f} (cpu-time {fc:.1f})" +
                                  (f", torch {tg:.1f}" if tg else "") + " GFLOP/s", flush=True)

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    write_table(a.out, model, ncpu, machine, commit, torch.__version__ if torch else None,
                threads, peaks, rows)


PEAK_LINE = re.compile(r"^peak (\d+) threads: ([\d.]+) GFLOP/s wall, ([\d.]+) cpu-time")
CASE_LINE = re.compile(r"^\s*t=(\d+) (\w+) (fwd|bwd) n=(\d+) d=(\d+) causal=(\d): flashc ([\d.]+) "
                       r"\(cpu-time ([\d.]+)\)(?:, torch ([\d.]+))? GFLOP/s")


def table_from_log(a):
    """The table of a run whose log kept the progress lines (peaks and cases) but not the file."""
    model, ncpu, threads, peaks, rows, commit = "?", 0, [], {}, [], "?"
    with open(a.from_log) as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("commit "):
                commit = line.split()[1]
            elif line.startswith("torch ") and not a.torch_version:
                a.torch_version = line.split()[1]
            elif m := PEAK_LINE.match(line):
                t = int(m.group(1))
                threads.append(t)
                peaks[t] = (float(m.group(2)), float(m.group(3)))
            elif m := CASE_LINE.match(line):
                t, dtype, mode, n, d, causal = (int(m.group(1)), m.group(2), m.group(3),
                                                int(m.group(4)), int(m.group(5)), int(m.group(6)))
                tg = float(m.group(9)) if m.group(9) else None
                rows.append((t, dtype, mode, n, d, causal, float(m.group(7)), float(m.group(8)), tg))
    ncpu = max(threads) if threads else 0
    machine = a.machine or re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") + f"-{ncpu}c"
    torch_version = a.torch_version if any(r[8] for r in rows) else None
    write_table(a.out, model, ncpu, machine, commit, torch_version, threads, peaks, rows)


def write_table(out, model, ncpu, machine, commit, torch_version, threads, peaks, rows):
    date = datetime.date.today().isoformat()
    name = f"cpu_{machine}_{date}.md"
    if out is None:
        out = os.path.join(ROOT, "bench", "results", name)
    elif os.path.isdir(out):
        out = os.path.join(out, name)
    lines = [f"# CPU attention, {model} ({ncpu} logical CPUs), {date}, commit {commit}", ""]
    lines.append("batch 1, 16 heads; GFLOP/s with 4 B H N^2 D forward, x2.5 backward, x0.5 "
                 "causal; median of >= 3 runs. \"% peak\": of the float32 FMA peak measured "
                 "at the same thread count in this run (wall / wall; cpu / cpu-time).")
    if torch_version is not None:
        lines.append(f"PyTorch {torch_version}, F.scaled_dot_product_attention on "
                     "[B, H, N, D] tensors.")
    lines.append("")
    lines.append("| threads | FMA peak GFLOP/s (wall) | (cpu-time) |")
    lines.append("|---|---|---|")
    for t in threads:
        lines.append(f"| {t} | {peaks[t][0]:.1f} | {peaks[t][1]:.1f} |")
    lines.append("")
    hdr = "| threads | dtype | pass | seqlen | head dim | causal | flashc GFLOP/s | % peak | " \
          "flashc cpu-time GFLOP/s | % peak (cpu) |"
    sep = "|---|---|---|---|---|---|---|---|---|---|"
    if torch_version is not None:
        hdr += " torch GFLOP/s | flashc / torch |"
        sep += "---|---|"
    lines += [hdr, sep]
    for (t, dtype, mode, n, d, causal, fg, fc, tg) in rows:
        s = (f"| {t} | {dtype} | {mode} | {n} | {d} | {causal} | {fg:.1f} | "
             f"{100 * fg / peaks[t][0]:.0f}% | {fc:.1f} | {100 * fc / peaks[t][1]:.0f}% |")
        if torch_version is not None:
            s += f" {tg:.1f} | {fg / tg:.2f}x |" if tg else " | |"
        lines.append(s)
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(text)
    print("written to", out)


if __name__ == "__main__":
    sys.exit(main())
