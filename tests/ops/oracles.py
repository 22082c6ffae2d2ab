"""Outside references for the op tests, loaded without triton.

flash-linear-attention's `naive.py` files are loaded by path (`import fla.ops` pulls in triton);
transformers' pure-torch functions come from its qwen3_next and kimi_linear modeling modules, which
tests/conftest.py imports with fla hidden so that they keep their torch paths on a GPU image too.
"""
import importlib.util
import os
from functools import cache
from types import ModuleType


os.environ.setdefault("HF_HUB_OFFLINE", "1")


@cache
def fla_naive(op: str) -> ModuleType:
    """op: 'gated_delta_rule' or 'kda' -> the module fla/ops/<op>/naive.py."""
    spec = importlib.util.find_spec("fla")
    assert spec is not None and spec.submodule_search_locations, "fla-core is not installed"
    path = os.path.join(spec.submodule_search_locations[0], "ops", op, "naive.py")
    module_spec = importlib.util.spec_from_file_location(f"_fla_naive_{op}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@cache
def hf_qwen3_next() -> ModuleType:
    from transformers.models.qwen3_next import modeling_qwen3_next

    return modeling_qwen3_next


@cache
def hf_kimi_linear() -> ModuleType:
    from transformers.models.kimi_linear import modeling_kimi_linear

    return modeling_kimi_linear
