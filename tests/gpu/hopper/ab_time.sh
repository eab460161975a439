#!/bin/sh
# Times two or more builds of a standalone Hopper check (check_fwd_sm90 or check_bwd_sm90) shape
# by shape, each shape in its own process and the builds alternating within every round, so
# that no build's figures depend on what ran before them in the same process (on a card that
# is power-bound, a row's clock depends on how busy the rows before it kept the tensor cores).
#
# Usage: sh tests/gpu/hopper/ab_time.sh ROUNDS CHECK_A CHECK_B [CHECK_C ...]
#   SHAPES="bf16,128,1,2048 fp16,64,0,16384"   the shapes (dtype,head dim,causal,seqlen) to
#                                             time; default: bf16 d64 and d128, causal and not,
#                                             2k and 16k
# Prints one line per timed row and round: the row (the check's columns up to seqlen) and each
# build's TFLOP/s in the order given.
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 ROUNDS CHECK_A CHECK_B [CHECK_C ...]" >&2
    exit 2
fi
rounds=$1
shift
for c in "$@"; do
    [ -x "$c" ] || { echo "not an executable: $c" >&2; exit 2; }
done
shapes=${SHAPES:-"bf16,64,0,2048 bf16,64,1,2048 bf16,64,0,16384 bf16,64,1,16384 bf16,128,0,2048 bf16,128,1,2048 bf16,128,0,16384 bf16,128,1,16384"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "row | round | TFLOP/s per build: $*"
for shape in $shapes; do
    r=1
    while [ "$r" -le "$rounds" ]; do
        i=0
        for c in "$@"; do
            i=$((i + 1))
            # the timing's rows start with the dtype; the last field is TFLOP/s
            FC_BENCH_SHAPE=$shape "$c" --bench-only 2>&1 | grep -E '^(bf16|fp16) ' >"$tmp/$i"
        done
        # one line per row of this shape: the row's fields, then each build's figure
        awk -v n="$i" -v r="$r" -v dir="$tmp" 'BEGIN {
            # the row: the fields before batch, heads, ms and TFLOP/s
            while ((getline line < (dir "/1")) > 0) {
                m = split(line, f, " ")
                row = f[1]
                for (j = 2; j <= m - 4; j++) row = row " " f[j]
                rows[++nrows] = row " | round " r " |"
            }
            close(dir "/1")
            for (b = 1; b <= n; b++) {
                k = 0
                while ((getline line < (dir "/" b)) > 0) {
                    m = split(line, f, " ")
                    k++
                    rows[k] = rows[k] " " f[m]
                }
            }
            for (k = 1; k <= nrows; k++) print rows[k]
        }'
        r=$((r + 1))
    done
done
