#!/usr/bin/env bash
# Run here, not on the GPU machine: fetches the wheels its image lacks into .whl/ (git-ignored; each device call
# that needs them names it in `carry`): fla-core and einops (the GDN/KDA chunk kernels and oracles), hypothesis
# and sortedcontainers (the property tests), pytest-xdist and execnet (suite.sh's workers), built for its CPython
# 3.12 on x86-64. mamba_ssm (the Mamba2 prefill peer) needs torch to build: see README.md here.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .git/info .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    fla-core==0.6.0 einops==0.8.2 hypothesis==6.170.27 sortedcontainers==2.4.0 pytest-xdist==3.8.0 execnet==2.1.2
ls .whl
