#!/usr/bin/env bash
# run_h200_cpu.sh - the CPU half of the benchmark on a many-core x86 machine with PyTorch
# (written for the Xeon of the H200 host): builds flashc's CPU backend, runs the CPU tests
# with every micro-kernel set the processor has - the AMX set forced through FLASHC_CPU_ISA -
# and then the benchmark beside PyTorch's CPU SDPA at 1, 2 and all cores, printing the table
# (also written to bench/results/).
#
#   bash bench/cpu/run_h200_cpu.sh [extra run_cpu_bench.py arguments]
set -euo pipefail
cd "$(dirname "$0")/../.."

cmake -S . -B build-cpu -DFLASHC_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cpu -j"$(nproc)" --target test_cpu test_cpu_exp test_cpu_determinism flashc

echo "== processor"
grep -m1 "model name" /proc/cpuinfo || true
grep -o -w -E 'amx_tile|amx_bf16|amx_fp16|avx512_bf16|avx512f' /proc/cpuinfo | sort | uniq -c || true

echo "== tests, every supported set (test_cpu runs each one it finds)"
./build-cpu/tests/c/test_cpu_exp
./build-cpu/tests/c/test_cpu_determinism
./build-cpu/tests/c/test_cpu

echo "== the AMX set forced (fails loudly if AMX is missing or the kernel refuses it)"
FLASHC_CPU_ISA=amx ./build-cpu/tests/c/test_cpu

echo "== benchmark (auto picks amx where available: bf16 forward on tiles)"
# the driver builds cpu_bench against the library in build/; point it at build-cpu
cc -O2 -std=gnu11 -Iinclude bench/cpu/cpu_bench.c -Lbuild-cpu -lflashc -lpthread -lm \
   -Wl,-rpath,"$PWD/build-cpu" -o build-cpu/cpu_bench
python3 bench/cpu/run_cpu_bench.py --bench build-cpu/cpu_bench --threads 1,2,all "$@"
echo "== the same bf16 forward with AMX off (AVX512_BF16), for the AMX gain"
for t in 2 "$(nproc)"; do
  FLASHC_CPU_ISA=avx512 ./build-cpu/cpu_bench attn "$t" bf16 fwd 4096 128 0
  FLASHC_CPU_ISA=amx ./build-cpu/cpu_bench attn "$t" bf16 fwd 4096 128 0
done
