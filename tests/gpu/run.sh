#!/bin/sh
# Builds the library with the CUDA backend (or uses the build in FLASHC_BUILD_DIR when it
# already holds libflashc.so), builds and runs the GPU test program over its full grid, then
# compute-sanitizer memcheck and racecheck on the small shapes that reach every kernel, and
# prints a summary. Usage: tests/gpu/run.sh [--no-sanitizer]
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FLASHC_BUILD_DIR:-$ROOT/build-gpu}
JOBS=$(nproc 2>/dev/null || echo 4)

if [ ! -f "$BUILD/libflashc.so" ]; then
    echo "== building flashc with CUDA in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DFLASHC_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
        cmake --build "$BUILD" -j "$JOBS" >/dev/null || { echo "build failed"; exit 1; }
fi
cc -O2 -std=c11 -D_GNU_SOURCE -I"$ROOT/include" "$ROOT/tests/gpu/test_gpu.c" -o "$BUILD/test_gpu" \
    -L"$BUILD" -lflashc -lpthread -lm -Wl,-rpath,"$BUILD" || { echo "test build failed"; exit 1; }

echo "== test_gpu (full grid)"
"$BUILD/test_gpu" --threads "$JOBS"
grid_rc=$?

mem_rc=skipped
race_rc=skipped
if [ "${1:-}" != "--no-sanitizer" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    echo "== compute-sanitizer memcheck (small shapes)"
    compute-sanitizer --tool memcheck --error-exitcode 3 "$BUILD/test_gpu" --small >"$BUILD/memcheck.log" 2>&1
    mem_rc=$?
    grep -E "ERROR SUMMARY|summary:" "$BUILD/memcheck.log"
    echo "== compute-sanitizer racecheck (small shapes)"
    compute-sanitizer --tool racecheck --error-exitcode 3 "$BUILD/test_gpu" --small >"$BUILD/racecheck.log" 2>&1
    race_rc=$?
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|summary:" "$BUILD/racecheck.log"
fi

echo "== summary: grid rc=$grid_rc memcheck rc=$mem_rc racecheck rc=$race_rc (0 = pass)"
[ "$grid_rc" = 0 ] && { [ "$mem_rc" = 0 ] || [ "$mem_rc" = skipped ]; } &&
    { [ "$race_rc" = 0 ] || [ "$race_rc" = skipped ]; }
