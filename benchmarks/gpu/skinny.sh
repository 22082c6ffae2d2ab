# See README.md here: one device call, from the repository root. Decides ops/linear.py's SKINNY: the skinny GEMM
# against cuBLAS alone (ops_linear.py with its tile sweep), then each family's bs1 / bs16 graph step with
# HYBRIDCACHE_SKINNY_GEMM=0 and =1 side by side (step_profile, graph mode); into $OUT. About 250 s.
set -u
source benchmarks/gpu/common.sh
timeout ${LINEAR_CAP:-90} python3 benchmarks/ops_linear.py --sweep --json $OUT/ops_linear.json 2>&1 | grep -v "Warn\|warn" | tail -60
build_checkpoints
for f in $FAMILIES; do
  for on in 0 1; do
    HYBRIDCACHE_SKINNY_GEMM=$on timeout ${PROFILE_CAP:-45} python3 benchmarks/step_profile.py --family $f --size 1b \
        --device cuda --dtype bfloat16 --batch 1 16 --steps 20 --modes graph --json $OUT/step_profile-$f-skinny$on.json \
        2>&1 | grep -v "Warn\|warn\|Loading\|shards" | tail -4
  done
done
echo "total ${SECONDS}s"
