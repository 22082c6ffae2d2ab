"""hybridcache: serve hybrid attention + recurrent LLMs without ever losing a request's state.

    from hybridcache import LLM, SamplingParams, SpeculativeConfig
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "RequestOutput", "SamplingParams", "SpeculativeConfig"]


def __getattr__(name: str):
    # Lazy, so `import hybridcache.cache` does not pull in the engine (and transformers).
    if name == "LLM":
        from .engine.llm import LLM

        return LLM
    if name in ("SamplingParams", "SpeculativeConfig"):
        from .engine import params

        return getattr(params, name)
    if name == "RequestOutput":
        from .engine.request import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'hybridcache' has no attribute {name!r}")
