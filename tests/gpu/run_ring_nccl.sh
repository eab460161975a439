#!/bin/sh
# The NCCL ring-attention checks on a GPU machine. Uses the CUDA build in FLASHC_BUILD_DIR
# (default build-gpu; configured here when it has no CMakeCache.txt), brings libflashc and
# libflashc_ring up to date in it (the NCCL part is built when CMake finds nccl.h and libnccl,
# beside the CUDA toolkit or under NCCL_HOME), compiles test_ring_nccl and bench_ring_nccl
# against them, then runs:
#   test_ring_nccl over every visible GPU, and again over 1, 2 and 3 of them when there are
#   more (one rank per GPU; odd world sizes split unevenly);
#   bench_ring_nccl --quick over every visible GPU (its table goes to bench/results/);
# and prints one line per step and a summary. NCCL_NVLS_ENABLE=0 throughout: the ring's
# point-to-point transfers do not need NVLink multicast.
# Usage: tests/gpu/run_ring_nccl.sh [--no-bench]      (FLASHC_NO_REBUILD=1: use the libraries as they are)
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FLASHC_BUILD_DIR:-$ROOT/build-gpu}
case $BUILD in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
JOBS=$(nproc 2>/dev/null || echo 4)
LOGS=$BUILD/ring-nccl-logs
export NCCL_NVLS_ENABLE=0
mkdir -p "$LOGS" || exit 1

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "== configuring flashc with CUDA in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DFLASHC_CUDA=ON -DCMAKE_BUILD_TYPE=Release >"$LOGS/configure.log" 2>&1 ||
        { tail -n 20 "$LOGS/configure.log"; echo "configure failed"; exit 1; }
fi
if [ "${FLASHC_NO_REBUILD:-0}" != 1 ]; then
    echo "== building libflashc and libflashc_ring in $BUILD"
    cmake --build "$BUILD" -j "$JOBS" --target flashc flashc_ring >"$LOGS/build.log" 2>&1 ||
        { tail -n 30 "$LOGS/build.log"; echo "build failed (log: $LOGS/build.log)"; exit 1; }
fi
RINGLIB=$BUILD/src/ring/libflashc_ring.so
if [ ! -f "$BUILD/libflashc.so" ] || [ ! -f "$RINGLIB" ]; then
    echo "no $BUILD/libflashc.so or $RINGLIB: is the build configured with CUDA, and NCCL or MPI found?"
    exit 1
fi
if ! nm -D "$RINGLIB" 2>/dev/null | grep -q ' T flashc_ring_forward_nccl'; then
    echo "$RINGLIB has no NCCL part: CMake did not find NCCL (set NCCL_HOME and reconfigure)"
    exit 1
fi

# what CMake found, so that the programs compile against the same NCCL and CUDA
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -n 1; }
NCCL_INC=$(cache NCCL_INCLUDE_DIR)
NCCL_LIB=$(cache NCCL_LIBRARY)
NVCC=$(cache CMAKE_CUDA_COMPILER)
[ -n "$NVCC" ] || NVCC=$(command -v nvcc)
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
CUDA_LIBDIR=
for d in "$CUDA_HOME/lib64" "$CUDA_HOME"/targets/*/lib "$CUDA_HOME/lib"; do
    if [ -f "$d/libcudart.so" ]; then CUDA_LIBDIR=$d; break; fi
done
if [ -z "$NCCL_INC" ] || [ -z "$NCCL_LIB" ] || [ -z "$CUDA_LIBDIR" ]; then
    echo "cannot locate nccl.h ($NCCL_INC), libnccl ($NCCL_LIB) or libcudart (under $CUDA_HOME)"
    exit 1
fi
NCCL_LIBDIR=$(dirname "$NCCL_LIB")

for p in tests/ring/test_ring_nccl bench/ring/bench_ring_nccl; do
    name=$(basename "$p")
    cc -O2 -std=c11 -D_GNU_SOURCE -I"$ROOT/include" -isystem "$CUDA_HOME/include" -isystem "$NCCL_INC" \
        "$ROOT/$p.c" -o "$BUILD/$name" -L"$BUILD/src/ring" -L"$BUILD" -lflashc_ring -lflashc \
        -L"$NCCL_LIBDIR" -lnccl -L"$CUDA_LIBDIR" -lcudart -lpthread -lm \
        -Wl,-rpath,"$BUILD/src/ring:$BUILD:$NCCL_LIBDIR:$CUDA_LIBDIR" ||
        { echo "$name build failed"; exit 1; }
done

gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
echo "== devices: $gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
[ "$gpus" -ge 1 ] || { echo "no GPU visible"; exit 1; }

failed=0
summary=""
# step NAME LOG COMMAND...: runs COMMAND with its output in LOG, prints the lines that say how
# it went, and records the status.
step() {
    name=$1 log=$LOGS/$2
    shift 2
    "$@" >"$log" 2>&1
    rc=$?
    grep -E "^(summary|FAIL|HANG|\| [0-9])|ring FAILED|written:" "$log" | tail -n 12 | sed 's/^/    /'
    echo "-- $name: rc=$rc"
    summary="$summary
    $(printf '%-48s %s' "$name" "$([ $rc = 0 ] && echo pass || echo "FAIL (rc $rc, $log)")")"
    [ $rc = 0 ] || failed=1
}

echo "== test_ring_nccl"
step "test_ring_nccl, $gpus rank(s)" "test_ring_nccl_$gpus.log" timeout 1800 "$BUILD/test_ring_nccl"
for w in 1 2 3; do
    if [ "$w" -lt "$gpus" ]; then
        step "test_ring_nccl, $w rank(s)" "test_ring_nccl_$w.log" timeout 1800 "$BUILD/test_ring_nccl" --ranks "$w"
    fi
done

if [ "${1:-}" != "--no-bench" ]; then
    echo "== bench_ring_nccl --quick"
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    mkdir -p "$ROOT/bench/results"
    # from the repository root, where the bench writes bench/results/ring_nccl_*.md
    cd "$ROOT" || exit 1
    step "bench_ring_nccl --quick, $gpus GPU(s)" bench_ring_nccl_quick.log \
        timeout 1200 "$BUILD/bench_ring_nccl" --quick --commit "$commit"
fi

echo "== summary$summary"
[ $failed = 0 ] && echo "all NCCL ring checks passed" || echo "some NCCL ring checks FAILED (logs in $LOGS)"
exit $failed
