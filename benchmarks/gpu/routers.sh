# See README.md here: one device call, from the repository root, about 80 s. The fused routers' one-token programs
# at 1, 2, 4 and 8 warps (`routers_triton.ONE_TOKEN_WARPS`, default None: 8 at the 1B shapes): the router GPU tests
# (the same choices at each warp count), then `tune_routers.py` at batches 1, 4, 16. Set ONE_TOKEN_WARPS from it.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 40 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_moe_routers_triton.py 2>&1 \
    | grep -v "Warning\|warn(" | tail -3
timeout 60 python3 benchmarks/tune_routers.py --batches 1 4 16 --warps 1 2 4 8 2>&1 | grep -v Warn
echo "total ${SECONDS}s"
