# See README.md here: one device call, from the repository root. Mamba2's replay verify in the heads form
# (ops/mamba2/triton_verify_heads.py, the default from triton_verify.HEADS_FROM rows): its GPU tests, then four
# untimed forms against today's: the fold launch from the last heads down (FOLD_LAST_HEADS_FIRST) and on a fixed grid
# sharing out the folding rows (FOLD_ITEMS), and the heads launch taking the folding rows last (HEADS_FOLDS_LAST),
# alone and with FOLD_ITEMS; in ops_mamba2.py (replay verify + accept against per-token states, into $OUT with the
# GPU's name), then in tune_mamba2_verify.py where no row folds and where every row folds. Then nemotron_h's
# batch-64 verify step (step_profile.py) with the heads form off and on, each capped at STEP_CAP s (120 by default;
# 0 skips them). About 450 s on an H100 (an estimate from its parts' times in session 56).
source benchmarks/gpu/common.sh
[ "${STEP_CAP:-120}" = 0 ] || { FAMILIES=nemotron_h build_checkpoints >/dev/null 2>&1 & }
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
timeout 60 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -rf tests/ops/test_mamba2_verify_triton.py \
    -k "heads or default_run" 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -6
forms=("FOLD_ITEMS = 0" "FOLD_LAST_HEADS_FIRST = True" "FOLD_ITEMS = 3" "HEADS_FOLDS_LAST = True"
       "HEADS_FOLDS_LAST = True; FOLD_ITEMS = 3")
tags=(today fold-last-first fold-items3 heads-folds-last heads-folds-last-items3)
for i in "${!forms[@]}"; do
  each_setting mamba2.triton_verify_heads 45 "${forms[$i]}" -- ops_mamba2 --device cuda --batches 1 16 64 256 \
      --drafts 3 --json "$OUT/ops_mamba2-${tags[$i]}-$gpu.json"
done
for pnat in 8 14; do  # no row folds, every row folds
  each_setting mamba2.triton_verify_heads 30 "${forms[@]}" -- \
      tune_mamba2_verify --batches 64 256 --pnat $pnat --block-p 64 --runs 8
done
wait
[ "${STEP_CAP:-120}" = 0 ] || each_setting mamba2.triton_verify "${STEP_CAP:-120}" "HEADS = False" "HEADS = True" \
    -- step_profile --family nemotron_h --size 1b --device cuda --dtype bfloat16 --batch 64 --steps 20 --modes verify \
    2>&1 | grep -v "Loading\|shards\|USDT\|debug_mode"
echo "total ${SECONDS}s"
