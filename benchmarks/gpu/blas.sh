# See README.md here: one device call, from the repository root, about 300 s. Whether cuBLAS's split-K GEMMs at
# batch 1 (nemotron_h: 27 a step, each with its own reduce kernel, about 0.045 ms of a 0.79 ms step on the H200)
# go away without a workspace to split into: nemotron_h's and qwen3_next's batch-1 graph steps `--by-module` with
# the default workspace, then with none (CUBLAS_WORKSPACE_CONFIG=:0:0, which PyTorch applies to cuBLAS and
# cuBLASLt alike); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="nemotron_h qwen3_next" build_checkpoints >/dev/null 2>&1
for f in nemotron_h qwen3_next; do
  for ws in default ":0:0"; do
    echo "== $f workspace $ws"
    ( [ "$ws" = default ] || export CUBLAS_WORKSPACE_CONFIG=$ws
      timeout ${STEP_CAP:-65} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
          --batch 1 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-bs1-ws${ws//:/_}.json 2>&1 \
          | grep -v "Warn\|warn\|Loading\|shards" | tail -30 )
  done
done
echo "total ${SECONDS}s"
