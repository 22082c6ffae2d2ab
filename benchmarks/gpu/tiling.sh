# See README.md here: one device call, from the repository root, about 100 s. GDN's closed-form verify at register
# caps of none, 128, 144, 168 (the default from 16 programs an SM) and 192 a thread, at batches 32 to 256; Mamba2's
# closed form at 2, 4 (Triton's default) and 8 warps a program over block_p 32 and 64; Mamba2's GPU test of its
# warps option first.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_mamba2_verify_triton.py \
    -k "warps" 2>&1 | grep -v "Warning\|warn(" | tail -3
timeout 50 python3 benchmarks/tune_delta_rule.py --cases "gdn verify T=4 registers" --block-v 64 --warps 2 \
    --batches 32 64 256 2>&1 | grep -v Warn
timeout 60 python3 benchmarks/tune_mamba2_verify.py --batches 16 64 256 --block-p 32 64 --warps 2 0 8 2>&1 | grep -v Warn
echo "total ${SECONDS}s"
