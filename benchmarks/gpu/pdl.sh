# See README.md here: one device call, from the repository root, about 500 s. Programmatic dependent launch
# (the default, HYBRIDCACHE_PDL=1: every Triton kernel may be scheduled while the one before it runs, and waits at its entry)
# against plain launches: kimi_linear's and qwen3_next's 1B graph steps at batch 1 / 16 / 64 (`step_profile.py`,
# about 75 s a run), each family off then on, back to back on the same machine (nemotron_h too where
# FAMILIES names it and the cap allows); into $OUT. The GPU tests of the switch first (`test_cuda_graphs.py -k
# programmatic`, `test_pdl.py`).
set -u
FAMILIES=${FAMILIES:-"kimi_linear qwen3_next"}
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
build_checkpoints >/dev/null 2>&1 &
timeout ${TEST_CAP:-120} python3 -m pytest -n 6 -p no:cacheprovider -o addopts="" -q tests/ops/test_pdl.py \
    tests/engine/test_cuda_graphs.py -k "programmatic or pdl" 2>&1 | grep -v "Warning\|warn(" | tail -3
wait
runs=$(( 2 * $(echo $FAMILIES | wc -w) ))
cap=$(( (570 - SECONDS) / runs ))
for f in $FAMILIES; do
  for pdl in 0 1; do
    echo "== $f HYBRIDCACHE_PDL=$pdl"
    HYBRIDCACHE_PDL=$pdl timeout $cap python3 benchmarks/step_profile.py --family $f --size 1b --device cuda \
        --dtype bfloat16 --batch 1 16 64 --steps 20 --modes graph --json $OUT/step_profile-$f-pdl$pdl.json 2>&1 \
        | grep -v "Warn\|warn\|Loading\|shards" | grep -E "^ +(1|16|64) +graph|batch"
  done
done
echo "total ${SECONDS}s"
