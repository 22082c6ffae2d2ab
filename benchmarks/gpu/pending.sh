# See README.md here: one device call, from the repository root, about 400 s on an H100 (an estimate). What was
# built after the last GPU runs and is off until timed (session 60): the GPU tests of both, then
# - MLA's one-row absorbed products as gemv_triton's batched launch (linear.BATCHED_GEMV): kimi_linear's batch-1
#   graph step off and on, back to back (gemv_steps.sh);
# - KDA's verify with its first launch in closed form (kda.triton_verify.CLOSED_FORM): kda_closed.sh without its
#   tests (run here first).
source benchmarks/gpu/common.sh
timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider -o addopts="" -rf tests/ops/test_gemv_triton.py \
    tests/ops/test_attention_triton_glue.py tests/ops/test_delta_rule_verify_triton.py \
    tests/ops/test_delta_rule_verify_raw_gate.py 2>&1 | grep -E "FAILED|passed|failed|Error" | tail -8
FAMILIES=kimi_linear SETTING=BATCHED_GEMV VALUES="False True" bash benchmarks/gpu/gemv_steps.sh
KDA_TESTS=0 bash benchmarks/gpu/kda_closed.sh
echo "total ${SECONDS}s"
