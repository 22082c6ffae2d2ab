# See README.md here: one device call, from the repository root, about 560 s, after a call of `suite.sh` (session
# 40 changed the GDN and Mamba2 verify defaults: key blocks, closed form, pipeline depths). KDA's verify against
# per-token states (`ops_kda.py`, new: its GB/s against the copy for issue 10's 70%), the software-pipeline
# depth of every kernel that loops over loads (`tune_stages.py`: session 40 found GDN's verify 15% faster at one
# stage than at Triton's 3), where the batch-1 graph steps of qwen3_next and nemotron_h spend their GPU time
# (`step_profile.py --by-module`; kimi_linear's was session 40's), and issue 10's Mamba2 8 x 1,024 prefill row
# against mamba_ssm (.whl/ needs its wheel: README.md here); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
FAMILIES="qwen3_next nemotron_h" build_checkpoints >/dev/null 2>&1 &
timeout ${KDA_CAP:-60} python3 benchmarks/ops_kda.py --device cuda --batches 1 16 64 256 --drafts 3 \
    --json $OUT/ops_kda.json 2>&1 | grep -v Warn | tail -6
timeout ${STAGES_CAP:-260} python3 benchmarks/tune_stages.py --batches 1 16 64 256 2>&1 | grep -v Warn \
    | tee $OUT/tune_stages.txt
wait
for f in qwen3_next nemotron_h; do
  timeout ${STEP_CAP:-70} python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 \
      --batch 1 --steps 20 --modes graph --by-module --json $OUT/step_profile-$f-bs1.json 2>&1 \
      | grep -v "Warn\|warn\|Loading\|shards" | tail -40
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/mamba_ssm*.whl \
    >/dev/null 2>&1  # after everything that imports transformers (it would import the wheel's missing extension)
timeout $((590 - SECONDS)) python3 benchmarks/ops_kernels.py --skip-decode --prefill-ops mamba2 --prefill-shapes 8x1024 \
    --json $OUT/ops_kernels_prefill-mamba2-8x1024.json 2>&1 | grep -v Warn | tail -4
echo "total ${SECONDS}s"
