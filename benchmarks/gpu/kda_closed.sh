# See README.md here: one device call, from the repository root, about 150 s on an H100 (an estimate). KDA's
# verify with its first launch in closed form (ops/kda/triton_verify_closed.py, triton_verify.CLOSED_FORM) against
# the token-by-token kernel: its GPU tests, then ops_kda.py (replay verify + accept against per-token states, into
# $OUT with the GPU's name) each way, then tune_delta_rule.py's KDA verify rows (drafts pending and none) over
# tilings each way. KDA_TESTS=0 skips the tests.
source benchmarks/gpu/common.sh
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
[ "${KDA_TESTS:-1}" = 0 ] || timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -rf \
    tests/ops/test_delta_rule_verify_triton.py tests/ops/test_delta_rule_verify_raw_gate.py -k "kda" 2>&1 \
    | grep -E "FAILED|passed|failed|Error" | tail -6
for closed in False True; do
  each_setting kda.triton_verify 45 "CLOSED_FORM = $closed" -- ops_kda --device cuda --batches 1 16 64 256 \
      --drafts 3 --json "$OUT/ops_kda-closed-$closed-$gpu.json" | grep -v "^k=3\|^measured"
done
each_setting kda.triton_verify 60 "CLOSED_FORM = False" -- tune_delta_rule --cases "kda verify T=4" --block-v 32 \
    --warps 1 --batches 16 64 256
each_setting kda.triton_verify 90 "CLOSED_FORM = True" -- tune_delta_rule --cases "kda verify T=4" --block-v 16 32 64 \
    --warps 4 8 --batches 16 64 256
echo "total ${SECONDS}s"
