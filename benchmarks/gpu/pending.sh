# See README.md here: one device call, from the repository root, about 330 s. What session 42 added after its GPU
# runs: the GPU tests of the verify kernels and paged attention (KDA's closed form both ways, GDN's one-pass token
# and register cap, the two-stage GQA decode loop); KDA's closed-form verify against its token-by-token kernel
# over tilings, with drafts pending and none; GDN's closed form with its cap as chosen against none at batches 16
# to 256; then ops_kda.py each way; into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_raw_gate.py tests/ops/test_attention_triton.py tests/ops/test_gdn_kda_sync_free.py \
    2>&1 | grep -v "Warning\|warn(" | tail -8
timeout 60 python3 benchmarks/tune_delta_rule.py --cases "kda verify T=4" --block-v 32 --warps 1 4 8 \
    --batches 16 64 256 2>&1 | grep -v Warn
timeout 45 python3 benchmarks/tune_delta_rule.py --cases "closed" --block-v 16 64 --warps 4 8 \
    --batches 16 64 256 2>&1 | grep -v Warn
timeout 30 python3 benchmarks/tune_delta_rule.py --cases "gdn verify T=4" --block-v 64 --warps 2 \
    --batches 16 32 64 256 2>&1 | grep -v "Warn\|stepwise\|whole\|key block"
for closed in False True; do
  echo "== ops_kda closed_form=$closed"
  timeout 45 python3 -c "
import runpy, sys
from hybridcache.ops.kda import triton_verify as m
m.CLOSED_FORM = $closed
sys.argv = ['ops_kda', '--device', 'cuda', '--batches', '1', '16', '64', '256', '--drafts', '3',
            '--json', '$OUT/ops_kda-closed$closed.json']
runpy.run_path('benchmarks/ops_kda.py', run_name='__main__')" 2>&1 | grep -v Warn | tail -6
done
echo "total ${SECONDS}s"
