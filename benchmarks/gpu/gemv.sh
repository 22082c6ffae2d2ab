# See README.md here: one device call, from the repository root, about 60 s on an H100. The few-row Triton GEMM
# (`ops/gemv_triton.py`, one row by default: `ops/linear.py` GEMV_ROWS = 1) against cuBLAS: its GPU tests; the
# decode GEMMs through every path at 1 row with its tilings swept (`ops_linear.py --sweep`), then at 4 rows; into
# $OUT. (Before session 43's copies, a weight timed alone was read from L2: 8 x 256 won there and lost in the
# steps.) `gemv_steps.sh` times it inside the steps.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 40 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_gemv_triton.py 2>&1 \
    | grep -v "Warning\|warn(" | tail -3
timeout 220 python3 benchmarks/ops_linear.py --rows 1 --sweep --block-n 2 4 8 16 --block-k 256 512 1024 2048 \
    --warps 4 8 --json $OUT/ops_linear-rows1.json 2>&1 | grep -v Warn
timeout 60 python3 benchmarks/ops_linear.py --rows 4 --json $OUT/ops_linear-rows4.json 2>&1 | grep -v Warn
echo "total ${SECONDS}s"
