# See README.md here: one device call, from the repository root, about 560 s. The sweeps behind batch-1 decode's
# small kernels (issue 10): the decode attention kernels' splits x key step (x MLA's loop stages) (MLA 30 us a call on the
# H200 at bs1 and bs64), the pairs expert kernels' rows x inner step x warps (qwen3_next bs1 up 11.5 / down 6.5 us
# a layer), the decode GEMMs through F.linear, torch.mv and w @ x.T (nemotron_h's 27 split-K GEMMs a bs1 step, each
# with a reduce kernel), and the MoE layer with its shared expert folded against on its own at more token counts
# (qwen3_next folded was 64.6 us against 48.6 at 16 tokens, yet 17.9 against 26.6 at 1), and issue 10's Mamba2
# 8 x 1,024 prefill row against mamba_ssm (.whl/ needs its wheel: README.md here); into $OUT.
set -u
source benchmarks/gpu/common.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout ${ATTN_CAP:-200} python3 benchmarks/tune_decode_attention.py --batches 1 16 64 --contexts 160 1024 \
    --warps 8 --stages 0 1 4 2>&1 | grep -v Warn | tee $OUT/tune_decode_attention.txt | cut -c1-200
timeout ${MOE_TUNE_CAP:-130} python3 benchmarks/tune_moe.py --tokens 1 2 --rows 4 16 32 --inner 512 2048 \
    --warps 4 8 2>&1 | grep -v Warn | tee $OUT/tune_moe.txt | cut -c1-200
timeout ${LINEAR_CAP:-40} python3 benchmarks/ops_linear.py --rows 1 4 16 --json $OUT/ops_linear.json 2>&1 | tail -34
timeout ${MOE_CAP:-100} python3 benchmarks/ops_moe.py --batches 1 2 4 8 16 32 64 --iters 30 \
    --json $OUT/ops_moe.json 2>&1 | tail -60
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/mamba_ssm*.whl \
    >/dev/null 2>&1  # after everything that imports transformers (it would import the wheel's missing extension)
timeout $((590 - SECONDS)) python3 benchmarks/ops_kernels.py --skip-decode --prefill-ops mamba2 --prefill-shapes 8x1024 \
    --json $OUT/ops_kernels_prefill-mamba2-8x1024.json 2>&1 | grep -v Warn | tail -4
echo "total ${SECONDS}s"
