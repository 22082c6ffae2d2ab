# See README.md here: one device call, from the repository root. The recurrent verify kernels: their GPU
# tests, the tiling sweep (tune_delta_rule), ops_gdn and ops_mamba2 (replay vs per-token states) into $OUT,
# then the Mamba2 8 x 1,024 prefill row (ours vs mamba_ssm) the last prefill run did not reach; about 470 s
# (the sweep takes batch 64 first).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-./bench-out}; mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rf tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_options.py tests/ops/test_delta_rule_verify_raw_gate.py \
    tests/ops/test_mamba2_verify_triton.py 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -8
timeout 250 python3 benchmarks/tune_delta_rule.py --batches 64 16 1 --block-v 16 32 64 --warps 1 2 4 2>&1 | grep -v Warn | tail -34
timeout 45 python3 benchmarks/ops_gdn.py --device cuda --batches 1 16 64 256 --drafts 3 --json $OUT/ops_gdn.json 2>&1 | tail -5
timeout 45 python3 benchmarks/ops_mamba2.py --device cuda --batches 1 16 64 256 --drafts 3 --json $OUT/ops_mamba2.json 2>&1 | tail -5
timeout ${PREFILL_CAP:-100} python3 benchmarks/ops_kernels.py --skip-decode --prefill-ops mamba2 --prefill-shapes 8x1024 \
    --json $OUT/ops_kernels_prefill-mamba2-8x1024.json 2>&1 | grep -v Warn | tail -4
echo "total ${SECONDS}s"
