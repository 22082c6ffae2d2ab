# See README.md here: one device call, from the repository root, about 150 s. GDN's closed-form verify with its state
# blocks multiplied on bf16 operands (`ops/gdn/triton_verify_chunked.py` BF16_STATE) against tf32, g and beta given
# and from the raw gate (the engine's launch), at 32 and 16 key rows a block (KEY_BLOCK), 2 and 4 warps, register
# cap as chosen (168 from 16 programs an SM) and none; then ops_gdn.py's replay with each. The GPU tests of the
# bf16 form first.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_options.py -k "gdn" 2>&1 | grep -v "Warning\|warn(" | tail -3
each_setting gdn.triton_verify_chunked 60 "BF16_STATE = False" "BF16_STATE = True" "BF16_STATE = True; KEY_BLOCK = 16" \
    "BF16_STATE = True; MAX_REGISTERS = 0" -- tune_delta_rule --cases 'gdn verify T=4( raw gate)?$' --block-v 64 \
    --warps 2 4 --batches 16 64 256
each_setting gdn.triton_verify_chunked 45 "BF16_STATE = False" "BF16_STATE = True" -- ops_gdn --device cuda \
    --batches 16 64 256 --drafts 3
echo "total ${SECONDS}s"
