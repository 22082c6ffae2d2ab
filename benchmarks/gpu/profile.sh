# See README.md here: one device call, from the repository root, about 90 s on an H100. Nsight Compute (the
# image's /usr/local/cuda/bin/ncu) on the three verify kernels at batch 64, T = 4, their default tilings, as
# tune_delta_rule.py and tune_mamba2_verify.py launch them: throughput, occupancy and stall reasons, then
# shared-memory wavefronts and bank conflicts. ncu locks clocks and flushes caches between passes, so its
# durations run long: compare its ratios, and time with the tuners.
set -u
source benchmarks/gpu/common.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name --format=csv,noheader
SECTIONS="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats
  --section MemoryWorkloadAnalysis"
METRICS=$(echo l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum \
  l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
  smsp__average_warp_latency_issue_stalled_{barrier,short_scoreboard,long_scoreboard,mio_throttle} | tr ' ' ,)
KEEP="^  [a-z_]+_kernel|Duration|Throughput|Registers|Occupancy|Spilling|Hit Rate|Cycles Per Issued|Waves|Grid|Block Size|\.sum|\.ratio"
profile() {  # name, then the command
  local name=$1; shift
  for what in "$SECTIONS" "--metrics $METRICS"; do
    echo "== $name ${what%% *}"
    timeout 60 $NCU --target-processes all -k regex:verify -c 1 $what "$@" 2>&1 | grep -E "$KEEP" | head -30
  done
}
profile gdn python3 benchmarks/tune_delta_rule.py --cases "gdn verify T=4$" --block-v 64 --warps 2 --batches 64 --iters 2
profile kda python3 benchmarks/tune_delta_rule.py --cases "kda verify T=4$" --block-v 32 --warps 1 --batches 64 --iters 2
profile mamba2 python3 benchmarks/tune_mamba2_verify.py --block-p 64 --batches 64 --iters 2
echo "total ${SECONDS}s"
