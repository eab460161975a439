#!/usr/bin/env python3
"""run_cpu_varlen.py - flashc's variable-length (packed, cu_seqlens) prefill on the CPU against
the same tokens run as fixed-length calls, in one run.

The target: a varlen call within 5% of the time of the same tokens run as a padding-free
fixed-length batch (ratio = varlen time / fixed time <= 1.05), forward and backward.

For each case `cpu_bench varlen` builds a packed batch of TOTAL tokens from one length set
(equal: four sequences of TOTAL / 4; uniform: lengths drawn from [1, TOTAL / 2]; ragged: most
short, a few long, with empty sequences first and last and one of length 1), runs it once
through cu_seqlens and once as fixed-length calls grouped by length (the sequences of each
distinct length copied into their own [n, L, H, D] batch), checks that the two agree
sequence by sequence, and times both alternately (medians; "fixed" is the sum of the grouped
calls' medians). GFLOP/s count 4 H D per visible (query, key) pair, x2.5 backward.

    python3 bench/cpu/run_cpu_varlen.py [--threads 2] [--total 4096] [--bench PATH]
                                        [--base PATH] [--quick] [--out PATH]

--base PATH times a second cpu_bench (another build of the library) in the same run, case by
case, for before / after comparisons. Writes
bench/results/varlen_cpu_<machine>_<date>_<threads>t[_quick].md
and prints it.
"""
import argparse
import datetime
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_cpu_bench import ROOT, build_bench, cpu_model, parse  # noqa: E402

TARGET = 1.05


def cases(quick):
    sets = ["equal", "ragged"] if quick else ["equal", "uniform", "ragged"]
    for dtype in ("bf16", "f32"):
        for mode in ("fwd", "bwd"):
            for s in sets:
                for d in (64, 128):
                    for causal in (0, 1):
                        for heads_kv in ((16,) if quick else (16, 2)):
                            yield dtype, mode, s, d, causal, heads_kv


def run_case(bench, threads, total, case):
    dtype, mode, s, d, causal, heads_kv = case
    out = subprocess.check_output([bench, "varlen", str(threads), dtype, mode, s, str(total),
                                   str(d), str(causal), "16", str(heads_kv)], text=True)
    return parse(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--total", type=int, default=4096)
    ap.add_argument("--bench", default=None, help="path of a built cpu_bench")
    ap.add_argument("--base", default=None, help="a second cpu_bench to time beside it")
    ap.add_argument("--quick", action="store_true", help="equal and ragged sets, MHA only")
    ap.add_argument("--out", default=None, help="the table's file")
    a = ap.parse_args()
    bench = build_bench(a.bench)
    model = cpu_model()
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    machine = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-") + f"-{ncpu}c"
    rows = []
    for case in cases(a.quick):
        r = run_case(bench, a.threads, a.total, case)
        b = run_case(a.base, a.threads, a.total, case) if a.base else None
        rows.append((case, r, b))
        print(" ".join(map(str, case)), "ratio", r["ratio"], "base", b["ratio"] if b else "-",
              flush=True)

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    date = datetime.date.today().isoformat()
    lines = [f"# flashc CPU varlen prefill, {model} ({ncpu} logical CPUs), {date}, commit {commit}",
             "",
             f"{a.threads} threads, {a.total} tokens, 16 query heads. ratio = varlen ms / fixed ms "
             "(the same tokens as fixed-length calls grouped by length); target <= "
             f"{TARGET}. maxdiff: largest difference between the varlen and the fixed outputs "
             "(O forward; dQ, dK, dV backward).",
             ""]
    head = "| dtype | pass | set | seqs | longest | d | heads q/kv | causal | varlen ms | fixed ms | ratio | GFLOP/s | maxdiff |"
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    if a.base:
        head += " base varlen ms | base fixed ms | base ratio |"
        sep += "---|---|---|"
    lines += [head, sep]
    met = 0
    for (dtype, mode, s, d, causal, heads_kv), r, b in rows:
        ratio = float(r["ratio"])
        met += ratio <= TARGET
        line = (f"| {dtype} | {mode} | {s} | {r['seqs']} | {r['longest']} | {d} | 16/{heads_kv} | "
                f"{'yes' if causal else 'no'} | {r['varlen_ms']} | {r['fixed_ms']} | "
                f"{'**' + r['ratio'] + '**' if ratio > TARGET else r['ratio']} | {r['gflops']} | "
                f"{r['maxdiff']} |")
        if b:
            line += f" {b['varlen_ms']} | {b['fixed_ms']} | {b['ratio']} |"
        lines.append(line)
    lines += ["", f"{met} of {len(rows)} rows within {TARGET}."]
    text = "\n".join(lines) + "\n"
    name = f"varlen_cpu_{machine}_{date}_{a.threads}t{'_quick' if a.quick else ''}.md"
    out = a.out or os.path.join(ROOT, "bench", "results", name)
    with open(out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
