# See README.md here: one device call, from the repository root. The decode step of the three 1B-class
# families (step_profile: wall vs GPU time, launches), then speculation's cost and gain (spec_decode), into $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
FAMILIES=${FAMILIES:-"nemotron_h qwen3_next kimi_linear"}
# the random checkpoints first, side by side (CPU work: a first benchmark otherwise spends its cap on it)
for f in $FAMILIES; do
  python3 -c "from pathlib import Path; from benchmarks.families import build; build(Path('/tmp/hybridcache-bench-$f-1b'), '$f', '1b')" &
done
wait; echo "checkpoints built after ${SECONDS}s"
for f in $FAMILIES; do
  timeout ${PROFILE_CAP:-110} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch ${PROFILE_BATCHES:-1 64} --steps 20 --modes ${MODES:-graph graph-sync} ${PROFILE_FLAGS:-} --json $OUT/step_profile-$f.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | tail -${TAIL:-8}
done
for f in ${SPEC_FAMILIES-nemotron_h}; do
  timeout ${SPEC_CAP:-120} python3 benchmarks/spec_decode.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 16 64 --max-tokens 48 --repeat 5 --json $OUT/spec_decode-$f.json 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | tail -6
done
echo "total ${SECONDS}s"
