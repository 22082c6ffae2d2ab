#!/usr/bin/env bash
# The GPU benchmark set, on one H200, in under 8 minutes: every script writes its JSON into $OUT (else
# ./bench-out), with its log beside it. Then, here: copy the JSON to docs/bench-data/ and run
#   PYTHONPATH=. .venv/bin/python benchmarks/report.py docs/bench-data
#
#   bash benchmarks/run_gpu.sh                      # from the repository root (python3: the image's torch)
#   MAX_TOKENS=64 HF_BATCHES="1 16 64" bash benchmarks/run_gpu.sh   # fuller, if the time allows
#
# What it runs (cheapest first; each step is capped, and all of them by BUDGET_S, so the set ends in time;
# a step cut short keeps the rows it finished, its JSON is rewritten after every row):
#   ops_mamba2, ops_gdn    replay vs per-token states, full layer shapes, bf16, CUDA graphs   (~30 s each)
#   swap_vs_reprefill      nemotron_h 1b, contexts 512 2048 8192 32768                           (~60 s)
#   engine_throughput      nemotron_h, qwen3_next, kimi_linear 1b, bf16, batches 1 16 64, prompt 128,
#                          transformers at batches 1 and 16                              (~80 s a family)
# The estimate behind the defaults (FIELD-NOTES, H200): transformers 17.8 tok/s at batch 1 and 246 at 16,
# hybridcache 45 at batch 1 and 738 at 64, on the 857M nemotron_h. Each figure is a warm-up run and 5 timed
# runs (6 runs). At 64 new tokens one family takes ~135 s (transformers at 1 and 16: 6 x (3.6 + 4.2) s =
# 47 s; ours at 1, 16, 64: 6 x (1.4 + ~2.6 + 5.5) s = 57 s; checkpoint build, loads, kernel compiles and
# graph captures: ~30 s), three ~6.8 min: with the ops and the swap sweep (~2 min) over 8 minutes. At
# MAX_TOKENS=32 a family takes ~80 s and the whole set ~6 min, leaving room for families slower than
# nemotron_h under transformers' torch paths.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-450}
MAX_TOKENS=${MAX_TOKENS:-32}
PROMPT_LEN=${PROMPT_LEN:-128}
BATCHES=${BATCHES:-"1 16 64"}
HF_BATCHES=${HF_BATCHES-"1 16"}        # empty: no transformers baseline
ENGINES=${ENGINES:-hybridcache}         # add "ngram" for the n-gram speculative engine too
CONTEXTS=${CONTEXTS:-"512 2048 8192 32768"}
FAMILIES=${FAMILIES:-"nemotron_h qwen3_next kimi_linear"}
# a CPU smoke test of this script: DEVICE=cpu SIZE=tiny DTYPE=float32 OPS_ARGS="--batches 1 4 --iters 2" ...
DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-1b}
DTYPE=${DTYPE:-bfloat16}
OPS_ARGS=${OPS_ARGS:-}
mkdir -p "$OUT"
START=$(date +%s)
: > "$OUT/times.txt"

# run NAME CAP_S ARGS...: the script with the time left (at most CAP_S), its log in $OUT/NAME.log
run() {
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$(( BUDGET_S - ($(date +%s) - START) ))
    (( left < cap )) && cap=$left
    if (( cap < 15 )); then
        echo "$name: skipped, ${left}s of the ${BUDGET_S}s budget left" | tee -a "$OUT/times.txt"
        return
    fi
    t0=$(date +%s)
    timeout -k 5 "$cap" "$PY" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: rc=$rc, $(( $(date +%s) - t0 ))s (cap ${cap}s)$( ((rc == 124)) && echo ', cut short')" \
        | tee -a "$OUT/times.txt"
    grep -v "falling back\|Loading weights" "$OUT/$name.log" | tail -n 25
}

"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
      torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"
run ops_mamba2 60 benchmarks/ops_mamba2.py --device "$DEVICE" $OPS_ARGS --json "$OUT/ops_mamba2.json"
run ops_gdn 60 benchmarks/ops_gdn.py --device "$DEVICE" $OPS_ARGS --json "$OUT/ops_gdn.json"
run swap_vs_reprefill 100 benchmarks/swap_vs_reprefill.py --family nemotron_h --size "$SIZE" --device "$DEVICE" \
    --dtype "$DTYPE" --contexts $CONTEXTS --json "$OUT/swap_vs_reprefill-nemotron_h.json"
for family in $FAMILIES; do
    run "engine_throughput-$family" 150 benchmarks/engine_throughput.py --family "$family" --size "$SIZE" \
        --device "$DEVICE" --dtype "$DTYPE" --batch $BATCHES --hf-batches $HF_BATCHES --prompt-len "$PROMPT_LEN" \
        --max-tokens "$MAX_TOKENS" --engines $ENGINES --json "$OUT/engine_throughput-$family.json"
done
echo "total $(( $(date +%s) - START ))s; JSON in $OUT:" | tee -a "$OUT/times.txt"
ls "$OUT"/*.json
# tables only (the image has no matplotlib): a preview of docs/benchmarks.md beside the JSON
"$PY" benchmarks/report.py "$OUT" --out "$OUT/benchmarks.md" --no-plots > /dev/null && echo "preview: $OUT/benchmarks.md"
