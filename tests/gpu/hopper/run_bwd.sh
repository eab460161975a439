#!/bin/sh
# One device call: builds the Hopper backward check there (nvcc is on the device machine), runs
# the correctness grid, the determinism check and the timing, and prints a summary. Run from
# the repository root: sh tests/gpu/hopper/run_bwd.sh [--check-only | --bench-only | --small]
# With OUT set, the build log, the SASS and the output are also left under $OUT.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/build}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv,noheader 2>/dev/null
sh "$here/build_bwd.sh" "$out" || exit 1
# 280 s for the whole run; the check itself reports a kernel that hangs for 30 s and exits 3.
timeout 280 "$out/check_bwd_sm90" "$@" > "$out/check_bwd_sm90.txt" 2>&1
rc=$?
cat "$out/check_bwd_sm90.txt"
echo "check_bwd_sm90 exit status: $rc (0 = all checks passed; 3 = a kernel hung; 124 = timeout)"
grep -E "^(SUMMARY|FAIL|HANG)" "$out/check_bwd_sm90.txt"
exit $rc
