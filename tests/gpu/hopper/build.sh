#!/bin/sh
# Builds a standalone check of the Hopper kernels from the kernel's own files: the forward's
# (check_fwd_sm90.cu), or with --backward the backward's (check_bwd_sm90.cu, what build_bwd.sh
# runs). The register and spill report of every kernel (-Xptxas -v) is kept in
# build/ptxas.txt (backward: build/ptxas_bwd.txt) and the SASS in build/check_*_sm90.sass when
# cuobjdump is found.
# Usage: tests/gpu/hopper/build.sh [--backward] [output-dir]   (default: tests/gpu/hopper/build)
# FC_NVCC_FLAGS adds compiler flags (-DFC_SM90_FWD_TILES=0 builds the earlier tile shapes).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
# The backward keeps the names it had as a script of its own, which tests/gpu/run.sh and the
# prebuilt checks it takes rely on.
if [ "${1:-}" = --backward ]; then
    shift
    check=check_bwd_sm90 ptxas=ptxas_bwd.txt me=build_bwd.sh
else
    check=check_fwd_sm90 ptxas=ptxas.txt me=build.sh
fi
kernel=${check#check_}
out=${1:-$here/build}
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I"$root/src" ${FC_NVCC_FLAGS:-} \
    -o "$out/$check" "$here/$check.cu" "$root/src/cuda/hopper/$kernel.cu" "$root/src/cuda/hopper/sm90_tmap.cu" -lpthread \
    2> "$out/$ptxas" || { cat "$out/$ptxas"; exit 1; }
# A spill, a stack frame, an ignored setmaxnreg (C7508) or a serialized wgmma (C7515) is a
# performance bug: say so loudly.
grep -E "spill|stack frame|Used" "$out/$ptxas" | sort | uniq -c
if grep -E "C75[0-9][0-9]|[1-9][0-9]* bytes spill|[1-9][0-9]* bytes stack" "$out/$ptxas"; then
    echo "$me: WARNING: see above (spills, stack or wgmma/setmaxnreg warnings)"
fi
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -n "$cuobjdump" ]; then
    "$cuobjdump" --dump-sass "$out/$check" > "$out/$check.sass"
    echo "SASS: $(grep -c HGMMA "$out/$check.sass") HGMMA, $(grep -c -E 'LDL|STL' "$out/$check.sass") LDL/STL"
fi
echo "built $out/$check"
