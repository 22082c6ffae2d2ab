# Sourced by the scripts here (from the repository root): the wheels the GPU image lacks into /tmp/site
# (mamba_ssm only with WITH_MAMBA_SSM=1: where it is importable, transformers imports its CUDA extension,
# which the wheel lacks), the environment, $OUT, $FAMILIES, and build_checkpoints: the 1B-class random
# checkpoints of $FAMILIES side by side (CPU work a first benchmark would otherwise spend its cap on).
wheels=$(ls .whl/*.whl | if [ "${WITH_MAMBA_SSM:-0}" = 1 ]; then cat; else grep -v mamba_ssm; fi)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
    >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# suite.sh's compile cache: a call that follows another on the still-warm machine starts with its kernels compiled
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
FAMILIES=${FAMILIES:-"nemotron_h qwen3_next kimi_linear"}

build_checkpoints() {
  for f in $FAMILIES; do
    python3 -c "from pathlib import Path; from benchmarks.families import build; build(Path('/tmp/hybridcache-bench-$f-1b'), '$f', '1b')" &
  done
  wait; echo "checkpoints built after ${SECONDS}s"
}

# each_setting MODULE SECONDS SETTING... -- SCRIPT ARGS...: benchmarks/SCRIPT.py with ARGS once per SETTING of
# hybridcache.ops.MODULE ('NAME = VALUE; ...', through with_setting.py), each under a header, capped at SECONDS
each_setting() {
  local module=$1 cap=$2 settings=()
  shift 2
  while [ "$1" != "--" ]; do settings+=("$1"); shift; done
  shift
  for setting in "${settings[@]}"; do
    echo "== $setting"
    timeout "$cap" python3 benchmarks/gpu/with_setting.py "$module" "$setting" "$@" 2>&1 | grep -v "Warn\|warn("
  done
}
