#!/bin/sh
# Builds the standalone check of the Hopper backward (check_bwd_sm90.cu) from the kernel's own
# files, with the register and spill report of every kernel (-Xptxas -v) kept in
# build/ptxas_bwd.txt and the SASS in build/check_bwd_sm90.sass when cuobjdump is found.
# Usage: tests/gpu/hopper/build_bwd.sh [output-dir]   (default: tests/gpu/hopper/build)
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=${1:-$here/build}
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I"$root/src" ${FC_NVCC_FLAGS:-} \
    -o "$out/check_bwd_sm90" "$here/check_bwd_sm90.cu" "$root/src/cuda/hopper/bwd_sm90.cu" "$root/src/cuda/hopper/sm90_tmap.cu" -lpthread \
    2> "$out/ptxas_bwd.txt" || { cat "$out/ptxas_bwd.txt"; exit 1; }
# A spill, a stack frame, an ignored setmaxnreg (C7508) or a serialized wgmma (C7515) is a
# performance bug: say so loudly.
grep -E "spill|stack frame|Used" "$out/ptxas_bwd.txt" | sort | uniq -c
if grep -E "C75[0-9][0-9]|[1-9][0-9]* bytes spill|[1-9][0-9]* bytes stack" "$out/ptxas_bwd.txt"; then
    echo "build_bwd.sh: WARNING: see above (spills, stack or wgmma/setmaxnreg warnings)"
fi
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -n "$cuobjdump" ]; then
    "$cuobjdump" --dump-sass "$out/check_bwd_sm90" > "$out/check_bwd_sm90.sass"
    echo "SASS: $(grep -c HGMMA "$out/check_bwd_sm90.sass") HGMMA, $(grep -c -E 'LDL|STL' "$out/check_bwd_sm90.sass") LDL/STL"
fi
echo "built $out/check_bwd_sm90"
