#!/bin/sh
# One run on a Hopper machine: builds a Hopper check there (nvcc must be on that machine), runs
# it and prints a summary. The forward's runs the layout probe, the correctness grid and the timing;
# with --backward (what run_bwd.sh runs) the backward's runs the correctness grid, the
# determinism check and the timing. Run from the repository root:
# sh tests/gpu/hopper/run.sh [--backward] [--check-only | --bench-only | --small]
# With OUT set, the build log, the SASS and the output are also left under $OUT.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/build}
# The check's own time limit, so that the whole script stays within 10 minutes: 540 s for the
# forward's, 280 s for the backward's; the check itself reports a kernel that hangs for 30 s and exits 3.
if [ "${1:-}" = --backward ]; then
    shift
    check=check_bwd_sm90 build=--backward limit=280
else
    check=check_fwd_sm90 build= limit=540
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader 2>/dev/null
sh "$here/build.sh" $build "$out" || exit 1
timeout $limit "$out/$check" "$@" > "$out/$check.txt" 2>&1
rc=$?
cat "$out/$check.txt"
echo "$check exit status: $rc (0 = all checks passed; 3 = a kernel hung; 124 = timeout)"
grep -E "^(SUMMARY|FAIL|HANG)" "$out/$check.txt"
exit $rc
