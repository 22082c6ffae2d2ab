# See README.md here: one device call, from the repository root. Where a bs1 (and bs64) decode step's GPU time
# goes, for the three 1B-class families: step_profile's graph step, the speculative engine's one-token step
# (spec-idle), a k=3 verify step and an eager step charged by layer kind (--by-module), with the kernels taking
# the most time; into $OUT. About 200 s.
set -u
source benchmarks/gpu/common.sh
build_checkpoints
for f in $FAMILIES; do
  timeout ${PROFILE_CAP:-100} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch ${BATCHES:-1 64} --steps 20 --modes graph spec-idle verify eager --by-module --json $OUT/step_profile-$f-bs1.json \
      2>&1 | grep -v "Warn\|warn\|Loading\|shards" | tee $OUT/step_profile-$f-bs1.txt | tail -${TAIL:-120}
done
echo "total ${SECONDS}s"
