# See README.md here: one device call, from the repository root, about 550 s. The closed-form verify kernels'
# two sources of the history's share (`hist_products`: folded into each state block, or products with the new
# rows) side by side: the GDN and Mamba2 tuners (no folding row) and ops_gdn / ops_mamba2 (rows fold) under
# each default; ops_kda; then programmatic dependent launch against plain launches (HYBRIDCACHE_PDL=0 / 1) for
# kimi_linear's and qwen3_next's graph steps at batch 1 and 16 (`FAMILIES`); into $OUT.
set -u
FAMILIES=${FAMILIES:-"kimi_linear qwen3_next"}
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
build_checkpoints >/dev/null 2>&1 &
timeout 80 python3 benchmarks/tune_delta_rule.py --cases "gdn verify T=4" --block-v 64 --warps 2 4 \
    --batches 1 16 64 256 2>&1 | grep -v Warn
timeout 60 python3 benchmarks/tune_mamba2_verify.py --block-p 32 64 --batches 1 16 64 256 2>&1 | grep -v Warn
for products in False True; do
  for op in gdn mamba2; do
    echo "== ops_$op hist_products=$products"
    timeout 50 python3 -c "
import runpy, sys
from hybridcache.ops.gdn import triton_verify_chunked as g
from hybridcache.ops.mamba2 import triton_verify as m
g.HIST_PRODUCTS = m.HIST_PRODUCTS = $products
sys.argv = ['ops_$op', '--device', 'cuda', '--batches', '1', '16', '64', '256', '--drafts', '3',
            '--json', '$OUT/ops_$op-products$products.json']
runpy.run_path('benchmarks/ops_$op.py', run_name='__main__')" 2>&1 | grep -v Warn | tail -6
  done
done
timeout 60 python3 benchmarks/ops_kda.py --device cuda --batches 1 16 64 256 --drafts 3 \
    --json $OUT/ops_kda.json 2>&1 | grep -v Warn | tail -6
wait
runs=$(( 2 * $(echo $FAMILIES | wc -w) ))
cap=$(( (585 - SECONDS) / runs ))
for f in $FAMILIES; do
  for pdl in 0 1; do
    echo "== $f HYBRIDCACHE_PDL=$pdl (cap ${cap}s)"
    HYBRIDCACHE_PDL=$pdl timeout $cap python3 benchmarks/step_profile.py --family $f --size 1b --device cuda \
        --dtype bfloat16 --batch 1 16 --steps 20 --modes graph --json $OUT/step_profile-$f-pdl$pdl.json 2>&1 \
        | grep -v "Warn\|warn\|Loading\|shards" | grep -E "^ +(1|16) +graph|batch"
  done
done
echo "total ${SECONDS}s"
