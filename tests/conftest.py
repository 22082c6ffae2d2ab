import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(1)  # tiny shapes: extra threads only add contention on a shared 2-core machine

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Every device test runs on the CPU and, where one exists, on CUDA."""
    return request.param


@pytest.fixture
def cuda_only() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
