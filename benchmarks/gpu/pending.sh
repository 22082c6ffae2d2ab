# See README.md here: one device call, from the repository root, about 500 s. KDA's verify with a new token's two
# reductions side by side (`one_pass`, off until this times it) against one after the other, at the tilings
# around its default (`tune_delta_rule.py`); ops_kda with each; the software-pipeline depth of every kernel that
# loops over loads (`tune_stages.py`: session 40 found GDN's verify 15% faster at one stage than at Triton's 3);
# where the batch-1 graph steps of qwen3_next and kimi_linear spend their GPU time (`step_profile.py
# --by-module`, PDL on); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="qwen3_next kimi_linear" build_checkpoints >/dev/null 2>&1 &
timeout ${TUNE_CAP:-90} python3 benchmarks/tune_delta_rule.py --cases "kda verify T=4" --block-v 16 32 --warps 1 2 \
    --batches 1 16 64 256 2>&1 | grep -v Warn
for one_pass in False True; do
  echo "== ops_kda one_pass=$one_pass"
  timeout 60 python3 -c "
import runpy, sys
from hybridcache.ops.kda import triton_verify as m
m.ONE_PASS = $one_pass
sys.argv = ['ops_kda', '--device', 'cuda', '--batches', '1', '16', '64', '256', '--drafts', '3',
            '--json', '$OUT/ops_kda-onepass$one_pass.json']
runpy.run_path('benchmarks/ops_kda.py', run_name='__main__')" 2>&1 | grep -v Warn | tail -6
done
timeout ${STAGES_CAP:-200} python3 benchmarks/tune_stages.py --batches 1 16 64 256 2>&1 | grep -v Warn \
    | tee $OUT/tune_stages.txt
wait
for f in qwen3_next kimi_linear; do
  timeout ${STEP_CAP:-70} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-bs1.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | tail -40
done
echo "total ${SECONDS}s"
