# See README.md here: one device call, from the repository root, about 400 s on a cold compile cache. Issue 10's
# target figures on the GPU it runs on: the replay verify of each recurrent op against per-token states
# (ops_gdn.py, ops_mamba2.py, ops_kda.py: GB/s against the measured copy bandwidth), then the batch-1 graph
# step of each 1B-class family (tok/s against the weight-bandwidth limit, docs/benchmarks.md); into $OUT, named
# by the GPU, for docs/bench-data. OPS=0 skips the verify ops; with HYBRIDCACHE_PDL=0 the steps launch plainly, so
# `--by-module`'s kernel times are each kernel's own (under PDL they include waiting on the one before), files
# `-nopdl` (not for docs/bench-data: the report would take them as the newest run).
set -u
source benchmarks/gpu/common.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o "H[0-9]00" | tr H h)
echo "$gpu"
build_checkpoints >/dev/null 2>&1 &
for op in $([ "${OPS:-1}" = 1 ] && echo gdn mamba2 kda); do
  timeout 60 python3 benchmarks/ops_$op.py --device cuda --batches 1 16 64 256 --drafts 3 \
      --json $OUT/ops_$op-$gpu.json 2>&1 | grep -v Warn | tail -6
done
wait
for f in $FAMILIES; do
  timeout ${STEP_CAP:-150} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-bs1-$gpu$([ "${HYBRIDCACHE_PDL:-1}" = 0 ] && echo -nopdl).json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | head -14
done
echo "total ${SECONDS}s"
