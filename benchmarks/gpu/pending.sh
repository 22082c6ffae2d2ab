# See README.md here: one device call, from the repository root, about 570 s. Options added without a GPU, each
# against its default in the same run: KDA's verify with a new token's two reductions side by side (`one_pass`)
# at the tilings around its default, and ops_kda each way; GDN's closed-form verify capped at 168 registers a
# thread, and its one-token verify with its reductions side by side (`one_pass`); Mamba2's closed form reading
# its state 32 / 64 / 128 columns at a time, capped or not, with rows that append and rows that fold; then every
# looping kernel's pipeline depth (`tune_stages.py`) and where the batch-1 graph steps of qwen3_next and
# kimi_linear spend their GPU time (`step_profile.py --by-module`); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="qwen3_next kimi_linear" build_checkpoints >/dev/null 2>&1 &
timeout 100 python3 benchmarks/tune_delta_rule.py --cases "kda verify T=4" --block-v 16 32 --warps 1 2 \
    --batches 16 64 256 2>&1 | grep -v Warn
timeout 40 python3 benchmarks/tune_delta_rule.py --cases "gdn verify T=4" --block-v 64 --warps 2 \
    --batches 16 64 256 2>&1 | grep -v Warn
timeout 30 python3 benchmarks/tune_delta_rule.py --cases "gdn verify T=1" --block-v 32 --warps 2 \
    --batches 16 64 256 2>&1 | grep -v Warn
for pnat in 8 14; do
  timeout 50 python3 benchmarks/tune_mamba2_verify.py --batches 16 64 256 --block-p 64 --state-blocks 32 64 128 \
      --max-registers 0 168 --pnat $pnat 2>&1 | grep -v Warn
done
for one_pass in False True; do
  echo "== ops_kda one_pass=$one_pass"
  timeout 50 python3 -c "
import runpy, sys
from hybridcache.ops.kda import triton_verify as m
m.ONE_PASS = $one_pass
sys.argv = ['ops_kda', '--device', 'cuda', '--batches', '1', '16', '64', '256', '--drafts', '3',
            '--json', '$OUT/ops_kda-onepass$one_pass.json']
runpy.run_path('benchmarks/ops_kda.py', run_name='__main__')" 2>&1 | grep -v Warn | tail -6
done
timeout ${STAGES_CAP:-150} python3 benchmarks/tune_stages.py --batches 16 64 256 2>&1 | grep -v Warn \
    | tee $OUT/tune_stages.txt
wait
for f in qwen3_next kimi_linear; do
  timeout ${STEP_CAP:-65} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-bs1.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | tail -40
done
echo "total ${SECONDS}s"
