# See README.md here: one device call, from the repository root, about 120 s. KDA's verify with its key rows'
# decays kept beside the tile (`deferred_decay`, off by default: three passes over the tile a token, not four)
# against the default: the KDA verify GPU tests (both ways), the tiling sweep with drafts pending and none, then
# ops_kda.py each way; into $OUT. Set DEFERRED_DECAY from it.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_raw_gate.py -k kda 2>&1 | grep -v "Warning\|warn(" | tail -3
timeout 60 python3 benchmarks/tune_delta_rule.py --cases "kda verify T=4" --block-v 16 32 --warps 1 2 \
    --batches 16 64 256 2>&1 | grep -v Warn
for deferred in False True; do
  echo "== ops_kda deferred_decay=$deferred"
  timeout 45 python3 -c "
import runpy, sys
from hybridcache.ops.kda import triton_verify as m
m.DEFERRED_DECAY = $deferred
sys.argv = ['ops_kda', '--device', 'cuda', '--batches', '1', '16', '64', '256', '--drafts', '3',
            '--json', '$OUT/ops_kda-deferred$deferred.json']
runpy.run_path('benchmarks/ops_kda.py', run_name='__main__')" 2>&1 | grep -v Warn | tail -6
done
echo "total ${SECONDS}s"
