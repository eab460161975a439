#!/usr/bin/env bash
# Ring attention over MPI on this machine: forward and backward with 1, 2 and 4 ranks at one
# sequence length, causal and not, written as a table to bench/results/. The ranks of one
# machine share its cores (one thread each here), so on a machine with few cores the table
# measures the ring's overhead, not a speedup: scaling needs one node (or socket) per rank.
#
#     bench/ring/run_mpi.sh [build-dir] [seqlen]
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
seqlen="${2:-4096}"
bin="$build/bench/ring/bench_ring_mpi"
[ -x "$bin" ] || { echo "no $bin: configure with MPI found (libflashc_ring) and build"; exit 1; }
out="bench/results/ring_mpi_$(date +%Y-%m-%d).md"
cores=$(nproc)
{
    echo "# Ring attention over MPI (CPU backend), $(date +%Y-%m-%d)"
    echo
    echo "Commit $(git rev-parse --short HEAD); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') ($cores cores);"
    echo "$(mpirun --version 2>/dev/null | head -1). One thread per rank (FLASHC_NUM_THREADS=1)."
    echo "Seconds are the median of 3 runs on the slowest rank; GFLOP/s counts the whole sequence"
    echo "(4*B*H*N^2*D forward, x2.5 backward, x0.5 causal)."
    echo
    if [ "$cores" -lt 4 ]; then
        echo "**Caveat:** this machine has $cores cores, so 4 ranks oversubscribe it and 2 ranks at"
        echo "most use both cores: these rows show the cost of the ring (messages, merges,"
        echo "more flashc calls), not the scaling of a machine with a core or a node per rank;"
        echo "from 1 to 2 ranks the gain is mostly the second core, since each rank runs one thread."
        echo
    fi
    echo "| ranks | dtype | seqlen | batch | heads q/kv | dim | causal | fwd s | fwd GFLOP/s | bwd s | bwd GFLOP/s |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|"
    for causal in "" "--causal"; do
        for np in 1 2 4; do
            FLASHC_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root -np "$np" "$bin" \
                --seqlen "$seqlen" --heads 8 --kv-heads 2 --dim 64 $causal
        done
    done
} | tee "$out"
echo "written: $out"
