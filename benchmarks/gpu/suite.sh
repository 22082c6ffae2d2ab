# The whole test suite on the GPU machine in one device call: tests spread over 8 processes (pytest-xdist),
# because Triton compiles every kernel variant the tests use and compiling is CPU work (16 cores there).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout ${SUITE_TIMEOUT:-560} python3 -m pytest -n ${WORKERS:-8} -p no:cacheprovider -o addopts="" -q -rf ${@:-tests} 2>&1 \
    | grep -v "Warning\|warn(" | tail -40
