# See README.md here: one device call, from the repository root.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 130 python3 benchmarks/tune_delta_rule.py 2>&1 | grep -v Warn | tail -20
timeout 45 python3 benchmarks/ops_gdn.py --device cuda --batches 1 16 64 256 --drafts 3 --json $OUT/ops_gdn.json 2>&1 | tail -5
timeout 45 python3 benchmarks/ops_mamba2.py --device cuda --batches 1 16 64 256 --drafts 3 --json $OUT/ops_mamba2.json 2>&1 | tail -5
timeout 120 python3 benchmarks/ops_kernels.py --skip-decode --json $OUT/ops_kernels_prefill.json 2>&1 | grep -v Warn | tail -12
timeout 220 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/ops -rf -x --deselect tests/ops/test_attention_triton.py 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -15
