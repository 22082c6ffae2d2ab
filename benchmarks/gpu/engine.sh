# See README.md here: one device call, from the repository root. The decode step of the three 1B-class
# families (step_profile: wall vs GPU time, launches), then speculation's cost and gain (spec_decode), into $OUT.
set -u
WITH_MAMBA_SSM=1 source benchmarks/gpu/common.sh
build_checkpoints
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
