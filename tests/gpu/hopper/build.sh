#!/bin/sh
# Builds the standalone check of the Hopper forward (check_fwd_sm90.cu) from the kernel's own
# files, with the register and spill report of every kernel (-Xptxas -v) kept in
# build/ptxas.txt and the SASS in build/check_fwd_sm90.sass when cuobjdump is found.
# Usage: tests/gpu/hopper/build.sh [output-dir]   (default: tests/gpu/hopper/build)
# FC_NVCC_FLAGS adds compiler flags (-DFC_SM90_FWD_TILES=0 builds the earlier tile shapes).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
out=${1:-$here/build}
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I"$root/src" ${FC_NVCC_FLAGS:-} \
    -o "$out/check_fwd_sm90" "$here/check_fwd_sm90.cu" "$root/src/cuda/hopper/fwd_sm90.cu" "$root/src/cuda/hopper/sm90_tmap.cu" -lpthread \
    2> "$out/ptxas.txt" || { cat "$out/ptxas.txt"; exit 1; }
# A spill, a stack frame, an ignored setmaxnreg (C7508) or a serialized wgmma (C7515) is a
# performance bug: say so loudly.
grep -E "spill|stack frame|Used" "$out/ptxas.txt" | sort | uniq -c
if grep -E "C75[0-9][0-9]|[1-9][0-9]* bytes spill|[1-9][0-9]* bytes stack" "$out/ptxas.txt"; then
    echo "build.sh: WARNING: see above (spills, stack or wgmma/setmaxnreg warnings)"
fi
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -n "$cuobjdump" ]; then
    "$cuobjdump" --dump-sass "$out/check_fwd_sm90" > "$out/check_fwd_sm90.sass"
    echo "SASS: $(grep -c HGMMA "$out/check_fwd_sm90.sass") HGMMA, $(grep -c -E 'LDL|STL' "$out/check_fwd_sm90.sass") LDL/STL"
fi
echo "built $out/check_fwd_sm90"
