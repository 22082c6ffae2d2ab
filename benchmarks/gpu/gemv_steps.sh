# See README.md here: one device call, from the repository root, about 400 s for two families on a cold
# compile cache. The batch-1 graph steps of $FAMILIES (default nemotron_h and kimi_linear) at each of $VALUES of
# `ops/$MODULE.py`'s $SETTING (a module constant; MODULE linear unless given), back to back, by module; into $OUT.
# By default the few-row Triton GEMM off (GEMV_ROWS 0: cuBLAS) and on (1); the first value's run compiles cold
# (capped at 200 s). E.g. MODULE=moe SETTING=FOLD_NORM VALUES="False True"; a value may set more
# (no spaces): VALUES="False True True;linear.GEMV_ROWS=0" (`with_setting.py`).
set -u
FAMILIES=${FAMILIES:-"nemotron_h kimi_linear"}
MODULE=${MODULE:-linear}
SETTING=${SETTING:-GEMV_ROWS}
VALUES=${VALUES:-"0 1"}
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
build_checkpoints >/dev/null 2>&1
for f in $FAMILIES; do
  first=1
  for value in $VALUES; do
    echo "== $f $SETTING=$value"
    timeout $([ $first = 1 ] && echo 200 || echo 150) python3 benchmarks/gpu/with_setting.py $MODULE \
        "$SETTING = $value" step_profile --family $f --size 1b --device cuda --dtype bfloat16 --batch 1 --steps 20 \
        --modes graph --by-module --json $OUT/step_profile-$f-bs1-$SETTING-${value//[^A-Za-z0-9._-]/_}.json 2>&1 \
        | grep -v "Warn\|warn\|Loading\|shards" | head -14
    first=0
  done
done
echo "total ${SECONDS}s"
