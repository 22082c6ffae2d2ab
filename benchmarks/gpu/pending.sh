# See README.md here: one device call, from the repository root. What the last session could not run, in the
# order the open issues need it, each step capped so the whole stays inside one 600 s call (about 560 s):
# the GPU tests of the files it changed (the fixes of the 17 CUDA failures, the verify kernels' one-token
# tiling), the MoE routers and experts alone (ops_moe: the routers' one-step weight read, never timed), kimi_linear's
# step profile (graph against spec-idle, by layer kind), then kimi_linear's speculation (spec_decode); into $OUT.
set -u
source benchmarks/gpu/common.sh  # no mamba_ssm: transformers (the tests' oracle) would import its missing extension
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${TESTS_CAP:-170} python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q -rf -p no:warnings \
    tests/models/test_gdn_projection_layout.py tests/models/test_kda_fused_layout.py tests/ops/test_activation_triton.py \
    tests/ops/test_delta_rule_verify_triton.py tests/ops/test_delta_rule_verify_raw_gate.py \
    tests/engine/test_cuda_graphs.py tests/engine/test_cuda_async_verify.py 2>&1 | tail -12
FAMILIES=kimi_linear build_checkpoints
timeout ${MOE_CAP:-50} python3 benchmarks/ops_moe.py --batches 1 16 64 --iters 30 --json $OUT/ops_moe.json 2>&1 | tail -16
timeout ${PROFILE_CAP:-110} python3 benchmarks/step_profile.py --family kimi_linear --size 1b --device cuda \
    --dtype bfloat16 --batch 1 64 --steps 20 --modes graph spec-idle --by-module \
    --json $OUT/step_profile-kimi_linear-spec-idle.json 2>&1 | grep -v "Warn\|warn\|Loading\|shards" | tail -60
timeout $((575 - SECONDS)) python3 benchmarks/spec_decode.py --family kimi_linear --size 1b --device cuda \
    --dtype bfloat16 --batch 64 16 1 --max-tokens 64 --repeat 5 --json $OUT/spec_decode-kimi_linear-backoff16.json 2>&1 \
    | grep -v "Warn\|warn\|Loading\|shards"
echo "total ${SECONDS}s"
