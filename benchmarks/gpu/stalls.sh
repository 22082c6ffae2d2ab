# See README.md here: one device call, from the repository root, about 30 s on an H100 (session 59). Nsight
# Compute's stall sampling, instruction by instruction, on KDA's verify kernel (32 value columns x 1 warp) and
# Mamba2's heads kernel (8 heads a program) at batch 64, T = 4, as the tuners launch them: each kernel's SASS with
# its executed count and warp-stall samples by reason, as CSV into $OUT (`<op>-sass.csv`), with the WarpStateStats
# summary and benchmarks/sass_stalls.py's summary printed (two files come back: a call brings back at most 8).
# Its clocks are locked and caches flushed: ratios only.
set -u
source benchmarks/gpu/common.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name --format=csv,noheader
stalls() {  # name, kernel regex, then the command
  local name=$1 kernel=$2; shift 2
  echo "== $name"
  timeout 120 $NCU --target-processes all -k regex:$kernel -c 1 --section WarpStateStats --section SourceCounters \
      --section LaunchStats --section Occupancy --import-source no -f -o /tmp/$name "$@" 2>&1 | tail -2
  $NCU -i /tmp/$name.ncu-rep --page details --print-units base 2>&1 \
      | grep -E "Registers|Achieved Occupancy|Theoretical Occupancy|Cycles Per Issued|Warp Cycles Per|Duration|Stall" | head -20
  $NCU -i /tmp/$name.ncu-rep --page source --csv --print-source sass > $OUT/$name-sass.csv 2> /tmp/$name-sass.err
  echo "$(wc -l < $OUT/$name-sass.csv) SASS rows; $(head -c 300 /tmp/$name-sass.err)"
  python3 benchmarks/sass_stalls.py $OUT/$name-sass.csv --top 8
}
stalls kda _kda_verify python3 benchmarks/tune_delta_rule.py --cases "kda verify T=4$" --block-v 32 --warps 1 \
    --batches 64 --iters 2
stalls mamba2 _heads python3 benchmarks/tune_mamba2_verify.py --block-p 64 --batches 64 --runs 8 --warps 4 --iters 2
echo "total ${SECONDS}s"
