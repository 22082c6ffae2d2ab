# See README.md here: one device call, from the repository root. Mamba2's replay verify in the heads form
# (ops/mamba2/triton_verify_heads.py, the default while triton_verify.HEADS is on) against the one-head kernel: its GPU
# tests, tune_mamba2_verify.py where no row folds and where every row folds, the fold launch's heads a program
# (FOLD_RUN), then ops_mamba2.py with HEADS off and on (replay verify + accept against per-token states, into
# $OUT with the GPU's name); 155 s on an H100 (2026-12-07).
source benchmarks/gpu/common.sh
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
timeout 60 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -rf tests/ops/test_mamba2_verify_triton.py \
    -k "heads or default_run" 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -6
timeout 40 python3 benchmarks/tune_mamba2_verify.py --batches 16 64 256 --block-p 64 --warps 0 --runs 4 8 2>&1 \
    | grep -v "Warn\|warn(\|token by"
for pnat in 8 14; do  # no row folds (the fold launch's programs all exit early), every row folds
  each_setting mamba2.triton_verify_heads 30 "FOLD_RUN = 1" "FOLD_RUN = 4" "FOLD_RUN = 8" -- \
      tune_mamba2_verify --batches 64 256 --pnat $pnat --block-p 64 --runs 8
done
for heads in False True; do
  each_setting mamba2.triton_verify 45 "HEADS = $heads" -- ops_mamba2 --device cuda --batches 1 16 64 256 --drafts 3 \
      --json "$OUT/ops_mamba2-heads-$heads-$gpu.json"
done
echo "total ${SECONDS}s"
