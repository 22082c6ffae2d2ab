# See README.md here: one device call, from the repository root. speculation's cost and gain for the three
# 1B-class families side by side (spec_decode, back-off 16, 64 new tokens, median of 5), into $OUT; the
# checkpoints are built first, in parallel; about 400 s.
set -u
WITH_MAMBA_SSM=1 source benchmarks/gpu/common.sh
build_checkpoints
for f in $FAMILIES; do
  timeout ${SPEC_CAP:-150} python3 benchmarks/spec_decode.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 16 64 --max-tokens 64 --repeat 5 ${SPEC_FLAGS:-} --json $OUT/spec_decode-$f-backoff16.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards"
done
echo "total ${SECONDS}s"
