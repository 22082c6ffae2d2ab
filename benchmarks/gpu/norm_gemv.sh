# See README.md here: one device call, from the repository root, about 300 s on a cold compile cache. The residual
# add + RMSNorm folded into a block's first GEMM at one row (`ops/linear.py` FUSE_NORM, off by default;
# `gemv_triton.add_rms_norm_gemv_triton`): its GPU tests, then nemotron_h's batch-1 graph step with it off and on
# (NORM_BLOCK_K 512 and 1,024), back to back, by module; into $OUT. Set FUSE_NORM and NORM_BLOCK_K from it.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES=nemotron_h build_checkpoints >/dev/null 2>&1
timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_norm_gemv_triton.py \
    tests/models/test_fused_norm_block.py 2>&1 | grep -v "Warning\|warn(" | tail -3
for setting in "False 512" "True 512" "True 1024"; do
  set -- $setting
  echo "== nemotron_h FUSE_NORM=$1 NORM_BLOCK_K=$2"
  timeout 150 python3 -c "
import runpy, sys
from hybridcache.ops import gemv_triton, linear
linear.FUSE_NORM, gemv_triton.NORM_BLOCK_K = $1, $2
sys.argv = ['step_profile', '--family', 'nemotron_h', '--size', '1b', '--device', 'cuda', '--dtype', 'bfloat16',
            '--batch', '1', '--steps', '20', '--modes', 'graph', '--by-module',
            '--json', '$OUT/step_profile-nemotron_h-bs1-fuse$1-$2.json']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | head -14
done
echo "total ${SECONDS}s"
