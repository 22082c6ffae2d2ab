from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from hybridcache import SamplingParams

from .helpers import PROMPTS, SAVERS, assert_clean, build, tokens


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Callable[[str], Path]:
    """`checkpoint(family)`: the path of that family's tiny checkpoint, saved once per session."""
    paths: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in paths:
            paths[family], _ = SAVERS[family](tmp_path_factory.mktemp(family))
        return paths[family]

    return get


@pytest.fixture(scope="session")
def reference(checkpoint) -> Callable[..., list[list[int]]]:
    """`reference(family, speculative, params, **build_kw)`: the tokens of an undisturbed `generate` of
    `PROMPTS` on a fresh LLM built the same way (`build(..., pressure=True, **build_kw)`; once per session)."""
    outputs: dict[tuple, list[list[int]]] = {}

    def get(family: str, speculative, params: list[SamplingParams], **build_kw) -> list[list[int]]:
        key = (family, speculative, tuple(params), tuple(sorted(build_kw.items())))
        if key not in outputs:
            llm = build(checkpoint(family), speculative, **{"pressure": True, **build_kw})
            outputs[key] = tokens(llm.generate(PROMPTS, params))
            assert_clean(llm)
        return outputs[key]

    return get
