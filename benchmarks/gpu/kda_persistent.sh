# See README.md here: one device call, from the repository root, about 150 s. KDA's verify as a persistent grid
# (`ops/kda/triton_verify.py` PERSISTENT: several items a program, the next tile loaded during this one's passes)
# against one program an item: its GPU tests first, then tune_delta_rule.py at 16 / 32 value columns and 1 / 2 warps
# with 8 and 16 warps an SM, then ops_kda.py's replay off and on.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -n 4 -p no:cacheprovider -o addopts="" -q -rf tests/ops/test_delta_rule_verify_triton.py \
    -k "kda" 2>&1 | grep -v "Warning\|warn(" | tail -3
for per_sm in 8 16; do
  echo "== PERSISTENT_WARPS_PER_SM=$per_sm"
  timeout 90 python3 benchmarks/gpu/with_setting.py kda.triton_verify "PERSISTENT_WARPS_PER_SM = $per_sm" \
      tune_delta_rule --cases 'kda verify T=4( persistent)?$' --block-v 16 32 --warps 1 2 --batches 16 64 256 \
      2>&1 | grep -v Warn
done
for on in False True; do
  echo "== ops_kda PERSISTENT=$on"
  timeout 45 python3 benchmarks/gpu/with_setting.py kda.triton_verify "PERSISTENT = $on" ops_kda \
      --device cuda --batches 16 64 256 --drafts 3 2>&1 | grep -v Warn | tail -4
done
echo "total ${SECONDS}s"
