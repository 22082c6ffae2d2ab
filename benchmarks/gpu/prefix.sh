# See README.md here: one device call, from the repository root. The verify step's host share next to a
# synchronous decode step (step_profile, nemotron_h), then prefix caching at the issue sizes (prefix_cache), into $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
python3 -c "from pathlib import Path; from benchmarks.families import build; build(Path('/tmp/hybridcache-bench-nemotron_h-1b'), 'nemotron_h', '1b')"
echo "checkpoint built after ${SECONDS}s"
timeout ${PROFILE_CAP:-120} python3 benchmarks/step_profile.py --family nemotron_h --size 1b --device cuda --dtype bfloat16 \
    --batch 1 64 --steps 20 --modes graph graph-sync verify --host-profile --json $OUT/step_profile-verify.json 2>&1 \
    | grep -v "Warn\|warn\|Loading\|shards\|USDT"
timeout ${PREFIX_CAP:-400} python3 benchmarks/prefix_cache.py --size 1b --device cuda --dtype bfloat16 \
    --workloads ${WORKLOADS:-shared multiturn} --json $OUT/prefix_cache-nemotron_h.json 2>&1 | grep -v "Warn\|warn\|Loading\|shards"
echo "total ${SECONDS}s"
