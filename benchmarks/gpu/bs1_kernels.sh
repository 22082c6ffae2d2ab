# See README.md here: one device call, from the repository root, 260 s for the three families on an H100 (with the
# checkpoints' build; 2026-12-07); into $OUT each family's summary JSON and its raw CSV and log in one
# ncu-raw.tgz (a call brings back eight files). Nsight Compute on one batch-1 CUDA-graph decode step of each of $FAMILIES
# (benchmarks/kernel_bandwidth.py): every kernel alone, caches flushed, its time and DRAM bytes, then per kernel
# name its share of the measured copy bandwidth and its time over what its bytes take at it; into $OUT.
set -u
source benchmarks/gpu/common.sh
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
nvidia-smi --query-gpu=name --format=csv,noheader
build_checkpoints
copy=$(python3 -c "from benchmarks.ops_gdn import copy_bandwidth; print(round(copy_bandwidth('cuda', 1 << 30)))")
echo "copy bandwidth (read + write): $copy GB/s"
for f in $FAMILIES; do
  echo "== $f"
  timeout ${FAMILY_TIMEOUT:-200} $NCU --profile-from-start off --graph-profiling node --clock-control none --print-units base --csv \
      --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      python3 benchmarks/kernel_bandwidth.py run --family $f > $OUT/ncu-$f-bs1.csv 2> $OUT/ncu-$f-bs1.err
  tail -3 $OUT/ncu-$f-bs1.err | grep -v "^$"
  python3 benchmarks/kernel_bandwidth.py summarize $OUT/ncu-$f-bs1.csv --copy-gbs $copy --family $f \
      --json $OUT/kernel_bandwidth-$f-bs1.json | head -24
done
(cd $OUT && tar czf ncu-raw.tgz ncu-*.csv ncu-*.err && rm -f ncu-*.csv ncu-*.err)
echo "total ${SECONDS}s"
