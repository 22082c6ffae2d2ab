# See README.md here: one device call, from the repository root. What session 38 left unrun, in one call of about
# 480 s: the GPU tests of the files it changed (the activation tests' bound for base + product, the attention
# kernels' key steps, the experts' per-kernel launch, the verify chain a long back-off leaves), kimi_linear's
# step profile (graph, spec-idle: plain steps after leaving the chain, spec-chain: chained one-token steps), then
# kimi_linear's speculation (spec_decode, batch 64 first; H200 on 2026-12-06 before the change: 0.88x / 0.91x /
# 0.92x at zero acceptance, batch 64 / 16 / 1); into $OUT. `tune_bs1.sh` is the second call.
set -u
source benchmarks/gpu/common.sh  # no mamba_ssm: transformers (the tests' oracle) would import its missing extension
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES=kimi_linear build_checkpoints >/dev/null 2>&1 &
timeout ${TESTS_CAP:-150} python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q -rf -p no:warnings \
    tests/ops/test_activation_triton.py tests/ops/test_attention_triton.py tests/ops/test_attention_triton_glue.py \
    tests/ops/test_moe_triton.py tests/engine/test_async_verify.py tests/engine/test_cuda_async_verify.py \
    tests/engine/test_cuda_graphs.py 2>&1 | grep -v "^\.\|^s" | tail -12
wait
timeout ${PROFILE_CAP:-100} python3 benchmarks/step_profile.py --family kimi_linear --size 1b --device cuda \
    --dtype bfloat16 --batch 1 64 --steps 20 --modes graph spec-idle spec-chain \
    --json $OUT/step_profile-kimi_linear-spec-chain.json 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | tail -12
timeout $((575 - SECONDS)) python3 benchmarks/spec_decode.py --family kimi_linear --size 1b --device cuda \
    --dtype bfloat16 --batch 64 16 1 --max-tokens 64 --repeat 5 --json $OUT/spec_decode-kimi_linear-backoff16.json 2>&1 \
    | grep -v "Warn\|warn\|Loading\|shards"
echo "total ${SECONDS}s"
