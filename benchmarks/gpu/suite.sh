# The whole test suite on the GPU machine in one device call: tests spread over 14 processes (pytest-xdist),
# because Triton compiles every kernel variant the tests use and compiling is CPU work (16 cores there).
# Triton's compile cache travels between sessions: `.whl/triton-cache.tgz` (carried with the wheels) is
# unpacked first, and the cache after the run comes back as $OUT/triton-cache.tgz when it fits (16 MB);
# copy it into .whl/ for the next session.
# mamba_ssm (the prefill benchmark's peer) stays out: transformers would import its missing CUDA extension.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v mamba_ssm) >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/triton-cache
mkdir -p "$TRITON_CACHE_DIR"
[ -f .whl/triton-cache.tgz ] && tar -xzf .whl/triton-cache.tgz -C /tmp && echo "triton cache: $(ls $TRITON_CACHE_DIR | wc -l) entries"
timeout ${SUITE_TIMEOUT:-580} python3 -m pytest -n ${WORKERS:-14} -p no:cacheprovider -o addopts="" -q -rf ${@:-tests} 2>&1 \
    | grep -v "Warning\|warn(" | tail -40
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/triton-cache.tgz" -C /tmp triton-cache
  [ "$(stat -c %s "$OUT/triton-cache.tgz")" -le 16000000 ] || { echo "triton cache too large to bring back"; rm "$OUT/triton-cache.tgz"; }
fi
