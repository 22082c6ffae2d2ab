# See README.md here: one device call, from the repository root, about 540 s. What session 40 changed or still
# had untimed: Mamba2's verify in closed form by default (its CUDA tests, the nemotron_h graph-step tests and
# `ops_mamba2.py`, replay against per-token states), the GDN closed-form verify reading its state 64 / 32 key rows
# at a time (`tune_delta_rule.py`, on the branch gdn-verify-key-blocks: elsewhere those cases are absent and the
# sweep times the whole-tile form alone), and where kimi_linear's batch-1 graph step spends its GPU time
# (`step_profile.py --by-module`); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="kimi_linear" build_checkpoints >/dev/null 2>&1 &
timeout ${TEST_CAP:-150} python3 -m pytest -n 8 -p no:cacheprovider -o addopts="" -q \
    tests/ops/test_mamba2_verify_triton.py tests/ops/test_mamba2_triton.py "tests/engine/test_cuda_graphs.py" \
    -k "mamba2 or verify or nemotron" 2>&1 | grep -v "Warning\|warn(" | tail -4
timeout ${MAMBA_CAP:-60} python3 benchmarks/ops_mamba2.py --device cuda --batches 1 16 64 256 --drafts 3 \
    --json $OUT/ops_mamba2-h100.json 2>&1 | grep -v Warn | tail -12
timeout ${KB_CAP:-200} python3 benchmarks/tune_delta_rule.py --batches 16 64 256 --block-v 32 64 --warps 2 4 8 \
    --cases "gdn verify T=4" 2>&1 | grep -v Warn | tee $OUT/tune_key_blocks.txt
wait
timeout $((575 - SECONDS)) python3 benchmarks/step_profile.py --family kimi_linear --size 1b --device cuda \
    --dtype bfloat16 --batch 1 --steps 20 --modes graph --by-module --json $OUT/step_profile-kimi_linear-bs1.json 2>&1 \
    | grep -v "Warn\|warn\|Loading\|shards" | tail -60
echo "total ${SECONDS}s"
