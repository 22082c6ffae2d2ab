# See README.md here: one device call, from the repository root. Where a bs1 (and bs64) decode step's GPU time
# goes, for the three 1B-class families: step_profile's graph step, the speculative engine's steps with every row
# backing off (spec-idle: for good, plain steps; spec-chain: a short pause, one-token chained steps), a k=3 verify step and an eager step charged by layer kind (--by-module), with the kernels taking
# the most time; then the MoE routers and experts alone (ops_moe: the router's one-step weight read, against
# docs/bench-data/ops_moe.json's 8.9 / 7.2 us at batch 1 for kimi_linear / qwen3_next); into $OUT. About 230 s.
set -u
source benchmarks/gpu/common.sh
build_checkpoints
for f in $FAMILIES; do
  timeout ${PROFILE_CAP:-100} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch ${BATCHES:-1 64} --steps 20 --modes graph spec-idle spec-chain verify eager --by-module --json $OUT/step_profile-$f-bs1.json \
      2>&1 | grep -v "Warn\|warn\|Loading\|shards" | tee $OUT/step_profile-$f-bs1.txt | tail -${TAIL:-120}
done
timeout ${MOE_CAP:-40} python3 benchmarks/ops_moe.py --batches 1 16 64 --iters 30 --json $OUT/ops_moe.json 2>&1 | tail -16
echo "total ${SECONDS}s"
