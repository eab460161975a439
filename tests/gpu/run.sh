#!/bin/sh
# Builds the library with the CUDA backend (or uses the build in FLASHC_BUILD_DIR when it
# already holds libflashc.so), builds and runs the GPU test programs over their full grids
# (test_gpu: forward and backward; test_gpu_decode: KV-cache decode and the LSE merge), then
# compute-sanitizer memcheck and racecheck of both on the small shapes that reach every
# kernel, and prints a summary. Usage: tests/gpu/run.sh [--no-sanitizer]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FLASHC_BUILD_DIR:-$ROOT/build-gpu}
JOBS=$(nproc 2>/dev/null || echo 4)

if [ ! -f "$BUILD/libflashc.so" ]; then
    echo "== building flashc with CUDA in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DFLASHC_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
        cmake --build "$BUILD" -j "$JOBS" >/dev/null || { echo "build failed"; exit 1; }
fi
for t in test_gpu test_gpu_decode; do
    cc -O2 -std=c11 -D_GNU_SOURCE -I"$ROOT/include" "$ROOT/tests/gpu/$t.c" -o "$BUILD/$t" \
        -L"$BUILD" -lflashc -lpthread -lm -Wl,-rpath,"$BUILD" || { echo "$t build failed"; exit 1; }
done

echo "== test_gpu (full grid)"
"$BUILD/test_gpu" --threads "$JOBS"
grid_rc=$?
echo "== test_gpu_decode (full grid)"
"$BUILD/test_gpu_decode"
decode_rc=$?

# sanitize PROGRAM TOOL: runs PROGRAM --small under compute-sanitizer TOOL, prints the tool's
# summary lines and returns its status
sanitize() {
    compute-sanitizer --tool "$2" --error-exitcode 3 "$BUILD/$1" --small >"$BUILD/$1.$2.log" 2>&1
    rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|summary:" "$BUILD/$1.$2.log"
    return $rc
}

mem_rc=skipped
race_rc=skipped
dmem_rc=skipped
drace_rc=skipped
if [ "${1:-}" != "--no-sanitizer" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    echo "== compute-sanitizer memcheck, test_gpu (small shapes)"
    sanitize test_gpu memcheck; mem_rc=$?
    echo "== compute-sanitizer racecheck, test_gpu (small shapes)"
    sanitize test_gpu racecheck; race_rc=$?
    echo "== compute-sanitizer memcheck, test_gpu_decode (small shapes)"
    sanitize test_gpu_decode memcheck; dmem_rc=$?
    echo "== compute-sanitizer racecheck, test_gpu_decode (small shapes)"
    sanitize test_gpu_decode racecheck; drace_rc=$?
fi

echo "== summary: test_gpu rc=$grid_rc memcheck rc=$mem_rc racecheck rc=$race_rc;" \
    "test_gpu_decode rc=$decode_rc memcheck rc=$dmem_rc racecheck rc=$drace_rc (0 = pass)"
pass() { [ "$1" = 0 ] || [ "$1" = skipped ]; }
[ "$grid_rc" = 0 ] && [ "$decode_rc" = 0 ] && pass "$mem_rc" && pass "$race_rc" &&
    pass "$dmem_rc" && pass "$drace_rc"
