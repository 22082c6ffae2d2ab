# See README.md here: one device call, from the repository root. The GPU tests of the verify and prefix paths,
# then the verify step's host share (step_profile) and speculation's cost and gain (spec_decode, nemotron_h), into $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
python3 -c "from pathlib import Path; from benchmarks.families import build; build(Path('/tmp/hybridcache-bench-nemotron_h-1b'), 'nemotron_h', '1b')" &
timeout ${TEST_CAP:-200} python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q -rf ${TESTS:-tests/ops/test_conv_shift_triton.py \
    tests/engine/test_cuda_prefix_caching.py tests/engine/test_cuda_graphs.py tests/engine/test_host_syncs.py \
    tests/engine/test_async_verify.py tests/engine/test_cuda_async_verify.py tests/engine/test_drafter.py} 2>&1 | grep -v "Warning\|warn(" | tail -15
wait; echo "tests and checkpoint after ${SECONDS}s"
timeout ${PROFILE_CAP:-100} python3 benchmarks/step_profile.py --family nemotron_h --size 1b --device cuda --dtype bfloat16 \
    --batch 1 16 64 --steps 20 --modes graph verify verify-sync --json $OUT/step_profile-verify.json 2>&1 | grep -v "Warn\|warn\|Loading\|shards\|USDT"
timeout ${SPEC_CAP:-150} python3 benchmarks/spec_decode.py --family nemotron_h --size 1b --device cuda --dtype bfloat16 \
    --batch 1 16 64 --max-tokens 48 --repeat 5 --backoff 16 --json $OUT/spec_decode-nemotron_h.json 2>&1 | grep -v "Warn\|warn\|Loading\|shards"
echo "total ${SECONDS}s"
