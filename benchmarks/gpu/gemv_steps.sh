# See README.md here: one device call, from the repository root, about 400 s for two families on a cold
# compile cache. The batch-1 graph steps of $FAMILIES (default nemotron_h and kimi_linear) with the few-row
# Triton GEMM off (GEMV_ROWS 0: cuBLAS) and on (1, the default), back to back, by module; into $OUT.
set -u
FAMILIES=${FAMILIES:-"nemotron_h kimi_linear"}
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
build_checkpoints >/dev/null 2>&1
for f in $FAMILIES; do
  for rows in 0 1; do
    echo "== $f GEMV_ROWS=$rows"
    timeout $([ $rows = 0 ] && echo 200 || echo 150) python3 -c "
import runpy, sys
from hybridcache.ops import linear as m
m.GEMV_ROWS = $rows
sys.argv = ['step_profile', '--family', '$f', '--size', '1b', '--device', 'cuda', '--dtype', 'bfloat16', '--batch', '1',
            '--steps', '20', '--modes', 'graph', '--by-module', '--json', '$OUT/step_profile-$f-bs1-gemv$rows.json']
runpy.run_path('benchmarks/step_profile.py', run_name='__main__')" 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | head -14
  done
done
echo "total ${SECONDS}s"
