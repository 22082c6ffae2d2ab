# See README.md here: one device call, from the repository root, about 540 s. What session 39 changed and did
# not time on the GPU (run `SUITE_TIMEOUT=560 bash benchmarks/gpu/suite.sh` in its own call first): Mamba2's
# and KDA's verify in closed form against token by token (tune_mamba2_verify.py, tune_delta_rule.py), then the
# MLA key splits (16 keys a split at least, 8 at most) and qwen3_next's shared expert on its own between the
# one-pair kernels and 64 tokens, seen in kimi_linear's and qwen3_next's graph steps at batch 1 / 16 / 64
# (step_profile --by-module); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="kimi_linear qwen3_next" build_checkpoints >/dev/null 2>&1 &
timeout ${M2_CAP:-90} python3 benchmarks/tune_mamba2_verify.py --batches 1 16 64 256 2>&1 | grep -v Warn \
    | tee $OUT/tune_mamba2_verify.txt
timeout ${KDA_CAP:-170} python3 benchmarks/tune_delta_rule.py --batches 1 16 64 256 --block-v 16 32 64 \
    --warps 1 2 4 8 --cases "kda verify T=4" 2>&1 | grep -v Warn | tee $OUT/tune_kda_closed.txt
wait
cap=$(( (575 - SECONDS) / 2 ))
for f in kimi_linear qwen3_next; do
  timeout $cap python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 16 64 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-graph.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | tail -30
done
echo "total ${SECONDS}s"
