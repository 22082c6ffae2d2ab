# See README.md here: one device call, from the repository root. speculation's cost and gain for the three
# 1B-class families side by side (spec_decode, back-off 16, 64 new tokens, median of 5), into $OUT; the
# checkpoints are built first, in parallel; about 400 s.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
for f in ${FAMILIES:-nemotron_h qwen3_next kimi_linear}; do
  python3 -c "from pathlib import Path; from benchmarks.families import build; build(Path('/tmp/hybridcache-bench-$f-1b'), '$f', '1b')" &
done
wait; echo "checkpoints after ${SECONDS}s"
for f in ${FAMILIES:-nemotron_h qwen3_next kimi_linear}; do
  timeout ${SPEC_CAP:-150} python3 benchmarks/spec_decode.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 16 64 --max-tokens 64 --repeat 5 ${SPEC_FLAGS:-} --json $OUT/spec_decode-$f-backoff16.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards"
done
echo "total ${SECONDS}s"
