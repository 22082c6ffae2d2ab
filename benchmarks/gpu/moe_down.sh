# See README.md here: one device call, from the repository root, about 400 s on a cold compile cache. The MoE pair
# kernels' second launch gathered (`ops/moe/experts_triton.py` DOWN_GATHERED: a token's pairs read in one tile a
# step) against pair by pair, and the first launch's loop in 3 stages (UP_STAGES) against 1: their GPU tests, then
# ops_moe.py's experts and shared-expert layers at batches 1 and 4 with each, then the batch-1 graph steps of
# kimi_linear and qwen3_next: off, gathered, gathered with 3 stages, off (gemv_steps.sh).
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_moe_triton.py \
    2>&1 | grep -v "Warning\|warn(" | tail -3
each_setting moe.experts_triton 60 "DOWN_GATHERED = False" "DOWN_GATHERED = True" "UP_STAGES = 3" \
    "DOWN_GATHERED = True; UP_STAGES = 3" -- ops_moe --batches 1 4 --iters 50
MODULE=moe.experts_triton SETTING=DOWN_GATHERED VALUES="False True True;UP_STAGES=3 False" FAMILIES="kimi_linear qwen3_next" \
    bash benchmarks/gpu/gemv_steps.sh
echo "total ${SECONDS}s"
