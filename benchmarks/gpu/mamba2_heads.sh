# See README.md here: one device call, from the repository root. Mamba2's replay verify in the heads form
# (ops/mamba2/triton_verify_heads.py, the default from triton_verify.HEADS_FROM rows): its GPU tests, then each
# setting of the module's constants in FORMS (one per line, `NAME = VALUE; ...`; by default today's, and the head
# loop at NUM_STAGES 2) in ops_mamba2.py (replay verify + accept against per-token states, into $OUT with the GPU's
# name and the setting's position: at most 8 files come back), then in tune_mamba2_verify.py at 4 heads and 8 a
# program where no row folds and where every row folds (TUNE=0 skips them). Then nemotron_h's batch-64 verify step
# (step_profile.py) with the heads form off and on, each capped at STEP_CAP s (120 by default; 0 skips them).
# Session 60's five forms took 180 s on an H100 with STEP_CAP=0.
source benchmarks/gpu/common.sh
[ "${STEP_CAP:-120}" = 0 ] || { FAMILIES=nemotron_h build_checkpoints >/dev/null 2>&1 & }
gpu=$(python3 -c "import torch; n = torch.cuda.get_device_name(); print('h200' if 'H200' in n else 'h100')")
timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -rf tests/ops/test_mamba2_verify_triton.py \
    -k "heads or default_run" 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -6
mapfile -t forms <<< "${FORMS:-NUM_STAGES = 1
NUM_STAGES = 2}"
for i in "${!forms[@]}"; do
  each_setting mamba2.triton_verify_heads 45 "${forms[$i]}" -- ops_mamba2 --device cuda --batches 1 16 64 256 \
      --drafts 3 --json "$OUT/ops_mamba2-form$i-$gpu.json"
done
for pnat in $([ "${TUNE:-1}" = 1 ] && echo 8 14); do  # no row folds, every row folds
  each_setting mamba2.triton_verify_heads 35 "${forms[@]}" -- \
      tune_mamba2_verify --batches 64 256 --pnat $pnat --block-p 64 --runs 4 8 --warps 4
done
wait
[ "${STEP_CAP:-120}" = 0 ] || each_setting mamba2.triton_verify "${STEP_CAP:-120}" "HEADS = False" "HEADS = True" \
    -- step_profile --family nemotron_h --size 1b --device cuda --dtype bfloat16 --batch 64 --steps 20 --modes verify \
    2>&1 | grep -v "Loading\|shards\|USDT\|debug_mode"
echo "total ${SECONDS}s"
