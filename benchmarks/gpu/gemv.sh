# See README.md here: one device call, from the repository root, about 530 s. The few-row Triton GEMM
# (`ops/gemv_triton.py`, off by default: `ops/linear.py` GEMV_ROWS = 0) against cuBLAS: its GPU tests; the decode
# GEMMs at 1 and 4 rows through every path, and its tilings (`ops_linear.py --sweep`); then nemotron_h's and
# kimi_linear's batch-1 graph steps with GEMV_ROWS 0 (cuBLAS) and 4, back to back; into $OUT. Set GEMV_ROWS (and
# the tiling defaults) from it.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="nemotron_h kimi_linear" build_checkpoints >/dev/null 2>&1 &
timeout 40 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_gemv_triton.py 2>&1 \
    | grep -v "Warning\|warn(" | tail -3
timeout 150 python3 benchmarks/ops_linear.py --rows 1 4 --sweep --block-n 4 8 16 --block-k 128 256 512 --warps 4 8 \
    --json $OUT/ops_linear.json 2>&1 | grep -v Warn
wait
for f in nemotron_h kimi_linear; do
  for rows in 0 4; do
    echo "== $f GEMV_ROWS=$rows"
    timeout $([ $rows = 0 ] && echo 100 || echo 70) python3 -c "
import runpy, sys
from hybridcache.ops import linear as m
m.GEMV_ROWS = $rows
sys.argv = ['step_profile', '--family', '$f', '--size', '1b', '--device', 'cuda', '--dtype', 'bfloat16', '--batch', '1',
            '--steps', '20', '--modes', 'graph', '--by-module', '--json', '$OUT/step_profile-$f-bs1-gemv$rows.json']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | head -14
  done
done
echo "total ${SECONDS}s"
