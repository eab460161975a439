#!/usr/bin/env bash
# run_xeon_decode_varlen.sh - the CPU decode and varlen benchmarks on a many-core x86 machine
# (written for the Xeon of the GPU hosts, in one call of under ten minutes): builds the CPU
# backend, runs test_kvcache (every micro-kernel set, the AMX set forced too), then the decode
# benchmark with the AMX set and with the AVX-512 set at 2 and all cores, and the varlen
# benchmark's quick grid on all cores. Tables go to stdout; the varlen one also to
# bench/results/.
#
#   bash bench/cpu/run_xeon_decode_varlen.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

cmake -S . -B build-cpu -DFLASHC_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cpu -j"$(nproc)" --target test_kvcache flashc
for b in cpu_bench decode_bench; do
  cc -O2 -std=gnu11 -Iinclude "bench/cpu/$b.c" -Lbuild-cpu -lflashc -lpthread -lm \
     -Wl,-rpath,"$PWD/build-cpu" -o "build-cpu/$b"
done

echo "== processor"
grep -m1 "model name" /proc/cpuinfo || true

echo "== test_kvcache (every supported set), then the AMX set forced"
./build-cpu/tests/c/test_kvcache | tail -3
FLASHC_CPU_ISA=amx ./build-cpu/tests/c/test_kvcache | tail -1

cases=1x8k,1x32k,1x128k,8x8k,8x32k,64x8k
for t in 2 "$(nproc)"; do
  for isa in amx avx512; do
    echo "== decode, bf16, FLASHC_CPU_ISA=$isa, $t threads"
    FLASHC_CPU_ISA=$isa ./build-cpu/decode_bench "$t" 2 bf16 "$cases"
  done
done

echo "== varlen against grouped fixed-length calls, all cores"
python3 bench/cpu/run_cpu_varlen.py --bench build-cpu/cpu_bench --threads "$(nproc)" --quick
