import os

import pytest
import torch

from tests import triton_interpreter_speed

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# With no CUDA device the Triton kernels' tests run in Triton's CPU interpreter; the variable must be set
# before triton is first imported (importing torch does not import it).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# In the interpreter, skip Triton 3.6's re-patch of triton.language at every @jit helper call inside a
# running kernel (tl.sum, tl.zeros, ...): a third of the kernels' CPU time, no change to any result.
triton_interpreter_speed.install()
torch.set_num_threads(1)  # tiny shapes: extra threads only add contention on a shared 2-core machine


def _import_transformers_oracles_on_torch_paths() -> None:
    """transformers binds fla's Triton kernels into its hybrid models at import whenever `fla` imports,
    whatever device the tensors are on; our oracles run its pure-torch paths: import those modeling
    modules with fla hidden (fla itself stays importable for everything else)."""
    import sys

    hidden = {n: sys.modules.pop(n) for n in list(sys.modules) if n == "fla" or n.startswith("fla.")}
    sys.modules["fla"] = None  # an import of it now raises ImportError
    try:
        import transformers.models.kimi_linear.modeling_kimi_linear  # noqa: F401
        import transformers.models.qwen3_next.modeling_qwen3_next  # noqa: F401
    finally:
        del sys.modules["fla"]
        sys.modules.update(hidden)


_import_transformers_oracles_on_torch_paths()

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Every device test runs on the CPU and, where one exists, on CUDA."""
    return request.param


@pytest.fixture
def cuda_only() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def pytest_addoption(parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="also run the tests marked slow")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: long; skipped unless --runslow is given or HYBRIDCACHE_SLOW=1")


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:  # a test module's SLOW_CASES: the ids of parametrised cases marked slow
        if any(case in item.name for case in getattr(getattr(item, "module", None), "SLOW_CASES", ())):
            item.add_marker(pytest.mark.slow)
    if config.getoption("--runslow") or os.environ.get("HYBRIDCACHE_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: pass --runslow or set HYBRIDCACHE_SLOW=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
