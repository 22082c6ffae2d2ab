# See README.md here: one device call, from the repository root, about 540 s. What session 39 changed and did
# not time on the GPU (run `SUITE_TIMEOUT=560 bash benchmarks/gpu/suite.sh` in its own call first): Mamba2's
# verify in closed form against token by token (tune_mamba2_verify.py), the MLA key splits (16 keys a split at
# least, 8 at most) and qwen3_next's shared expert on its own between the one-pair kernels and 64 tokens, seen in
# kimi_linear's and qwen3_next's graph steps at batch 1 / 16 / 64 (step_profile --by-module), then the GQA rows
# of tune_decode_attention.py that session 39's call did not reach; into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="kimi_linear qwen3_next" build_checkpoints >/dev/null 2>&1 &
timeout ${M2_CAP:-90} python3 benchmarks/tune_mamba2_verify.py --batches 1 16 64 256 2>&1 | grep -v Warn \
    | tee $OUT/tune_mamba2_verify.txt
wait
for f in kimi_linear qwen3_next; do
  timeout ${PROFILE_CAP:-110} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 16 64 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-graph.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | tail -30
done
timeout $((570 - SECONDS)) python3 benchmarks/tune_decode_attention.py --batches 1 16 64 --contexts 160 1024 \
    --warps 4 8 --ops "gqa qwen3_next" "gqa nemotron_h" 2>&1 | grep -v Warn | tee $OUT/tune_decode_attention-gqa.txt | cut -c1-220
echo "total ${SECONDS}s"
