# See README.md here: one device call, from the repository root.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 210 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/engine/test_cuda_graphs.py tests/engine/test_host_syncs.py tests/models tests/ops/test_gdn_kda_sync_free.py -rf 2>&1 | grep -E "FAILED|ERROR|passed|failed|rror" | tail -15
for f in nemotron_h qwen3_next kimi_linear; do
  timeout 110 python3 benchmarks/step_profile.py --family $f --size 1b --device cuda --dtype bfloat16 --batch 1 64 --steps 20 2>&1 | grep -v "Warn\|warn\|Loading" | tail -6
done
