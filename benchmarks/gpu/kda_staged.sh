# See README.md here: one device call, from the repository root, about 150 s on an H100 (an estimate). KDA's
# verify in the staged form (ops/kda/triton_verify.py STAGED: a fixed grid, the next item's tile and vectors copied
# into shared memory by Triton's software pipeline while this item's passes run) against one program an item: its
# GPU tests, then ops_kda.py (replay verify + accept against per-token states, into $OUT with the GPU's name) at
# 16 and 8 value columns, then tune_delta_rule.py's KDA verify rows over tilings with it off and on.
source benchmarks/gpu/common.sh
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -rf tests/ops/test_delta_rule_verify_triton.py \
    -k "kda" 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -6
forms=("STAGED = False" "STAGED = True" "STAGED = True; STAGED_BLOCK_V = 8")
tags=(one-item staged16 staged8)
for i in "${!forms[@]}"; do
  each_setting kda.triton_verify 45 "${forms[$i]}" -- ops_kda --device cuda --batches 1 16 64 256 --drafts 3 \
      --json "$OUT/ops_kda-${tags[$i]}-$gpu.json" | grep -v "^k=3\|^measured\|^copy band"
done
each_setting kda.triton_verify 60 "STAGED = False" "STAGED = True" -- tune_delta_rule --cases "kda verify T=4$" \
    --block-v 8 16 32 --warps 1 2 --batches 64 256
echo "total ${SECONDS}s"
