"""A Gluon kernel (explicit layouts; triton.experimental.gluon) for test_compile_for_h200: `double_launch` compiles
it as launched through benchmarks/sm90_compile.py. Gluon kernels run in no interpreter, so nothing launches it."""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _double_kernel(x_ptr, y_ptr, N: gl.constexpr):
    """y[:N] = 2·x[:N], one warp, N / 32 elements a lane."""
    layout: gl.constexpr = gl.BlockedLayout([N // 32], [32], [1], [0])
    i = gl.arange(0, N, layout=layout)
    gl.store(y_ptr + i, gl.load(x_ptr + i) * 2)


def double_launch(captured_launches) -> list:
    """The kernel's launch on 128 fp32 elements, as `captured_launches` records it."""
    x = torch.zeros(128)
    with captured_launches() as launches:
        _double_kernel[(1,)](x, torch.empty_like(x), 128, num_warps=1)
    return launches
