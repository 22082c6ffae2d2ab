# See README.md here: one device call, from the repository root, about 150 s. KDA's verify as a persistent grid
# (`ops/kda/triton_verify.py` PERSISTENT: several items a program, the next tile loaded during this one's passes)
# against one program an item: its GPU tests first, then tune_delta_rule.py at 16 / 32 value columns and 1 / 2 warps
# with 8 and 16 warps an SM, then ops_kda.py's replay off and on.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_options.py -k "kda" 2>&1 | grep -v "Warning\|warn(" | tail -3
each_setting kda.triton_verify 90 "PERSISTENT_WARPS_PER_SM = 8" "PERSISTENT_WARPS_PER_SM = 16" -- tune_delta_rule \
    --cases 'kda verify T=4( persistent)?$' --block-v 16 32 --warps 1 2 --batches 16 64 256
each_setting kda.triton_verify 45 "PERSISTENT = False" "PERSISTENT = True" -- ops_kda --device cuda \
    --batches 16 64 256 --drafts 3
echo "total ${SECONDS}s"
