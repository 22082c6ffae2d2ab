# See README.md here: one device call, from the repository root, about 400 s on a cold compile cache. Issue 10's
# target figures on the GPU it runs on: the replay verify of each recurrent op against per-token states
# (ops_gdn.py, ops_mamba2.py, ops_kda.py: GB/s against the measured copy bandwidth), then the batch-1 graph
# step of each 1B-class family (tok/s against the weight-bandwidth limit, docs/benchmarks.md); into $OUT, named
# by the GPU, for docs/bench-data. FOLD=1: also the folds' GPU tests, and each step again with the residual add +
# RMSNorm folded into the next op (`ops/linear.py` FUSE_NORM), then with the MLP activation folded into the down
# projection's gemv (FUSE_ACT) and the mixers' gated norms into their output projection (FUSE_GATED_NORM) too, back
# to back (files `-norm`, `-all`). OPS=0 skips the verify ops, FOLD_TESTS=0 the folds' tests
# (after suite.sh on the same machine); SETTINGS (e.g. "off all") the folds each family's step runs with.
set -u
source benchmarks/gpu/common.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o "H[0-9]00" | tr H h)
echo "$gpu"
build_checkpoints >/dev/null 2>&1 &
for op in $([ "${OPS:-1}" = 1 ] && echo gdn mamba2 kda); do
  timeout 60 python3 benchmarks/ops_$op.py --device cuda --batches 1 16 64 256 --drafts 3 \
      --json $OUT/ops_$op-$gpu.json 2>&1 | grep -v Warn | tail -6
done
[ "${FOLD:-0}" = 1 ] && [ "${FOLD_TESTS:-1}" = 1 ] && timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf \
    tests/ops/test_norm_gemv_triton.py tests/ops/test_moe_routers_norm.py tests/models/test_fused_norm_block.py \
    tests/ops/test_gemv_activation.py tests/ops/test_gemv_triton.py tests/ops/test_gated_norm_gemv.py 2>&1 \
    | grep -v "Warning\|warn(" | tail -3
wait
for f in $FAMILIES; do
  # FOLD=1: the folds off, the block norms folded (FUSE_NORM), then also the MLP activation (FUSE_ACT) and the
  # mixers' gated norms (FUSE_GATED_NORM)
  settings="off"
  [ "${FOLD:-0}" = 1 ] && settings="off norm all"
  settings=${SETTINGS:-$settings}
  for setting in $settings; do
    name=step_profile-$f-bs1-$gpu$([ $setting != off ] && echo "-$setting").json
    echo "== $f folds: $setting"
    timeout ${STEP_CAP:-110} python3 -c "
import runpy, sys
from hybridcache.ops import linear
linear.FUSE_NORM = '$setting' in ('norm', 'all')
linear.FUSE_ACT = linear.FUSE_GATED_NORM = '$setting' == 'all'
sys.argv = ['step_profile', '--family', '$f', '--size', '1b', '--device', 'cuda', '--dtype', 'bfloat16',
            '--batch', '1', '--steps', '20', '--modes', 'graph', '--by-module', '--json', '$OUT/$name']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | head -14
  done
done
echo "total ${SECONDS}s"
