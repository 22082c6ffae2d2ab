# See README.md here: one device call, from the repository root, about 500 s on a cold compile cache. The
# residual add + RMSNorm folded into a block's first GEMM or router at one row (`ops/linear.py` FUSE_NORM, off by
# default; `models/layers/prenorm.py`): its GPU tests; the two launches against one, alone (`ops_linear.py
# --norm`); then each of $FAMILIES' batch-1 graph step with it off and on (at NORM_BLOCK_K $BLOCKS, default 512),
# back to back, by module; into $OUT. Set FUSE_NORM and NORM_BLOCK_K from it.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
build_checkpoints >/dev/null 2>&1
timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_norm_gemv_triton.py \
    tests/ops/test_moe_routers_norm.py tests/models/test_fused_norm_block.py 2>&1 | grep -v "Warning\|warn(" | tail -3
timeout 90 python3 benchmarks/ops_linear.py --rows 1 --norm --json $OUT/ops_linear-norm.json 2>&1 | grep -v Warn
for f in $FAMILIES; do
  for setting in "False 512" $(for b in ${BLOCKS:-512}; do echo "True_$b"; done); do
    set -- ${setting/_/ }
    echo "== $f FUSE_NORM=$1 NORM_BLOCK_K=$2"
    timeout 150 python3 -c "
import runpy, sys
from hybridcache.ops import gemv_triton, linear
linear.FUSE_NORM, gemv_triton.NORM_BLOCK_K = $1, $2
sys.argv = ['step_profile', '--family', '$f', '--size', '1b', '--device', 'cuda', '--dtype', 'bfloat16',
            '--batch', '1', '--steps', '20', '--modes', 'graph', '--by-module',
            '--json', '$OUT/step_profile-$f-bs1-fuse$1-$2.json']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | head -14
  done
done
echo "total ${SECONDS}s"
