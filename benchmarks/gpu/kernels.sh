# See README.md here: one device call, from the repository root.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/ops 2>&1 | tail -25 > $OUT/ops_tests.log; tail -25 $OUT/ops_tests.log
timeout 150 python3 benchmarks/ops_kernels.py --json $OUT/ops_kernels.json 2>&1 | grep -v Warning | tail -40
timeout 60 python3 benchmarks/ops_gdn.py --device cuda --batches 1 16 64 256 --drafts 3 --json $OUT/ops_gdn.json 2>&1 | tail -6
timeout 60 python3 benchmarks/ops_mamba2.py --device cuda --batches 1 16 64 256 --drafts 3 --json $OUT/ops_mamba2.json 2>&1 | tail -6
timeout ${PROFILE_CAP:-150} python3 benchmarks/profile_prefill.py --top 6 2>&1 | grep -v "Warn\|warn" | tee $OUT/profile_prefill.log
