# See README.md here: one device call, from the repository root. The verify kernels' two forms side by side:
# the GPU tests of both, the tiling sweep of both (tune_delta_rule), then ops_gdn and ops_mamba2 in each form
# into $OUT (…-parallel.json for the parallel one); about 300 s.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rf tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_raw_gate.py tests/ops/test_mamba2_verify_triton.py 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -8
timeout 150 python3 benchmarks/tune_delta_rule.py --batches 1 16 64 --block-v 16 32 64 --warps 1 2 4 2>&1 | grep -v Warn | tail -24
for form in "" "--parallel-verify"; do
  tag=${form:+-parallel}
  timeout 45 python3 benchmarks/ops_gdn.py --device cuda --batches 1 16 64 256 --drafts 3 $form --json $OUT/ops_gdn$tag.json 2>&1 | tail -5
  timeout 45 python3 benchmarks/ops_mamba2.py --device cuda --batches 1 16 64 256 --drafts 3 $form --json $OUT/ops_mamba2$tag.json 2>&1 | tail -5
done
echo "total ${SECONDS}s"
