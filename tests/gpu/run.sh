#!/bin/sh
# The GPU tests in one go. Builds the library with the CUDA backend (or uses the build in
# FLASHC_BUILD_DIR when it already holds libflashc.so), then runs:
#   test_gpu          forward and backward over the full grid, with the kernels the device
#                     picks (wgmma on sm_90) and again with the mma.sync kernels forced;
#   test_gpu_decode   KV-cache decode and the LSE merge;
#   on sm_90, the standalone checks of the Hopper forward and backward (tests/gpu/hopper), and
#   of the backward built with its persistent grid (FC_SM90B_PERSIST, off by default);
#   compute-sanitizer memcheck, racecheck and synccheck on the small shapes that reach every
#   kernel (the Hopper ones with few CTAs, so each walks many tiles);
# and prints one line per step and a summary. Usage: tests/gpu/run.sh [--no-sanitizer | --sanitizer-only]
# FLASHC_HOPPER_PREBUILT=1: use the standalone Hopper checks already built in $BUILD/hopper.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${FLASHC_BUILD_DIR:-$ROOT/build-gpu}
JOBS=$(nproc 2>/dev/null || echo 4)
LOGS=$BUILD/gpu-test-logs
mkdir -p "$LOGS"

if [ ! -f "$BUILD/libflashc.so" ]; then
    echo "== building flashc with CUDA in $BUILD"
    cmake -S "$ROOT" -B "$BUILD" -DFLASHC_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null &&
        cmake --build "$BUILD" -j "$JOBS" >/dev/null || { echo "build failed"; exit 1; }
fi
for t in test_gpu test_gpu_decode; do
    cc -O2 -std=c11 -D_GNU_SOURCE -I"$ROOT/include" "$ROOT/tests/gpu/$t.c" -o "$BUILD/$t" \
        -L"$BUILD" -lflashc -lpthread -lm -Wl,-rpath,"$BUILD" || { echo "$t build failed"; exit 1; }
done
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
echo "== device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1) (compute capability $cap)"

failed=0
summary=""
# step NAME LOG COMMAND...: runs COMMAND with its output in LOG, prints the lines that say how
# it went, and records the status.
step() {
    name=$1 log=$LOGS/$2
    shift 2
    "$@" >"$log" 2>&1
    rc=$?
    grep -E "^(summary|SUMMARY|FAIL|HANG)|ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 4 | sed 's/^/    /'
    echo "-- $name: rc=$rc"
    summary="$summary
    $(printf '%-48s %s' "$name" "$([ $rc = 0 ] && echo pass || echo "FAIL (rc $rc, $log)")")"
    [ $rc = 0 ] || failed=1
}
sanitize() { # TOOL PROGRAM ARGS...
    tool=$1
    shift
    compute-sanitizer --tool "$tool" --error-exitcode 3 "$@"
}

mode=${1:-}
if [ "$mode" != "--sanitizer-only" ]; then
echo "== test programs"
    step "test_gpu (device's kernels)" test_gpu.log "$BUILD/test_gpu" --threads "$JOBS"
    step "test_gpu (mma.sync kernels forced)" test_gpu_mma.log env FLASHC_CUDA_KERNELS=mma "$BUILD/test_gpu" --threads "$JOBS"
    step "test_gpu_decode" test_gpu_decode.log "$BUILD/test_gpu_decode"

fi

hopper=0
[ "$cap" = "9.0" ] && hopper=1
if [ $hopper = 1 ]; then
    echo "== Hopper standalone checks"
    HB=$BUILD/hopper
    mkdir -p "$HB"
    # FLASHC_HOPPER_PREBUILT=1 takes the checks already in $BUILD/hopper (built on another
    # machine with the same scripts; nvcc needs no GPU)
    if [ "${FLASHC_HOPPER_PREBUILT:-0}" = 1 ] && [ -x "$HB/check_fwd_sm90" ] && [ -x "$HB/check_bwd_sm90" ]; then
        cat "$HB/ptxas.txt" "$HB/ptxas_bwd.txt" >"$LOGS/hopper_build.log" 2>/dev/null
        prebuilt=1
    else
        prebuilt=0
    fi
    if [ $prebuilt = 1 ] || { sh "$ROOT/tests/gpu/hopper/build.sh" "$HB" >"$LOGS/hopper_build.log" 2>&1 &&
        sh "$ROOT/tests/gpu/hopper/build_bwd.sh" "$HB" >>"$LOGS/hopper_build.log" 2>&1; }; then
        grep -E "SASS|spill|WARNING" "$LOGS/hopper_build.log" | sort | uniq -c | sed 's/^/    /'
        [ "$mode" = "--sanitizer-only" ] || step "check_fwd_sm90" check_fwd_sm90.log timeout 300 "$HB/check_fwd_sm90" --check-only
        [ "$mode" = "--sanitizer-only" ] || step "check_fwd_sm90, 3 CTAs" check_fwd_sm90_3.log env FLASHC_SM90_CTAS=3 timeout 200 "$HB/check_fwd_sm90" --small
        [ "$mode" = "--sanitizer-only" ] || step "check_bwd_sm90" check_bwd_sm90.log timeout 300 "$HB/check_bwd_sm90" --check-only
        # the persistent backward (FC_SM90B_PERSIST, off by default), three CTAs walking every
        # case's tiles
        if { [ $prebuilt = 1 ] && [ -x "$HB/persist/check_bwd_sm90" ]; } || FC_NVCC_FLAGS=-DFC_SM90B_PERSIST=1 \
            sh "$ROOT/tests/gpu/hopper/build_bwd.sh" "$HB/persist" >>"$LOGS/hopper_build.log" 2>&1; then
            [ "$mode" = "--sanitizer-only" ] || step "check_bwd_sm90, persistent, 3 CTAs" check_bwd_sm90_persist.log \
                env FLASHC_SM90B_CTAS=3 FLASHC_HANG_SECONDS=10 timeout 300 "$HB/persist/check_bwd_sm90" --check-only
        else
            summary="$summary
    Hopper persistent backward check: build failed ($LOGS/hopper_build.log)"
            failed=1
        fi
    else
        tail -n 20 "$LOGS/hopper_build.log"
        summary="$summary
    Hopper checks: build failed"
        failed=1
    fi
fi

if [ "$mode" != "--no-sanitizer" ] && command -v compute-sanitizer >/dev/null 2>&1; then
    echo "== compute-sanitizer (small shapes)"
    for tool in memcheck racecheck synccheck; do
        step "$tool test_gpu" "test_gpu.$tool.log" sanitize $tool "$BUILD/test_gpu" --small
        step "$tool test_gpu (mma.sync)" "test_gpu_mma.$tool.log" env FLASHC_CUDA_KERNELS=mma \
            compute-sanitizer --tool $tool --error-exitcode 3 "$BUILD/test_gpu" --small
        step "$tool test_gpu_decode" "test_gpu_decode.$tool.log" sanitize $tool "$BUILD/test_gpu_decode" --small
        if [ $hopper = 1 ] && [ -x "$BUILD/hopper/check_fwd_sm90" ]; then
            # racecheck's instrumentation makes the persistent CTAs' spin waits crawl: it checks
            # one CTA per tile (FLASHC_SM90_CTAS=0); the other tools let 5 CTAs walk many tiles
            ctas=5
            [ "$tool" = racecheck ] && ctas=0
            step "$tool check_fwd_sm90, $ctas CTAs" "check_fwd_sm90.$tool.log" env FLASHC_SM90_CTAS=$ctas \
                compute-sanitizer --tool $tool --error-exitcode 3 "$BUILD/hopper/check_fwd_sm90" --small
            # racecheck turns milliseconds into minutes: a longer limit before a kernel is a HANG
            hang=30
            [ "$tool" = racecheck ] && hang=600
            step "$tool check_bwd_sm90" "check_bwd_sm90.$tool.log" env FLASHC_HANG_SECONDS=$hang \
                compute-sanitizer --tool $tool --error-exitcode 3 "$BUILD/hopper/check_bwd_sm90" --small
        fi
    done
fi

echo "== summary$summary"
[ $failed = 0 ] && echo "all GPU tests passed" || echo "some GPU tests FAILED (logs in $LOGS)"
exit $failed
