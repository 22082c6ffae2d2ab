"""Which Triton entry points an op reached: `record_calls` wraps functions of a module (pytest's
monkeypatch undoes it after the test) and lists each call by name, in order; `record_launches` wraps a kernel
of a module and lists each launch's keyword arguments (its constexprs and launch options) with its grid under
"grid", launching it."""
from __future__ import annotations


def record_calls(monkeypatch, module, *names: str) -> list[str]:
    calls: list[str] = []
    for name in names:
        def wrapper(*args, _real=getattr(module, name), _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)
    return calls


def record_launches(monkeypatch, module, name: str) -> list[dict]:
    launches: list[dict] = []
    kernel = getattr(module, name)

    class Recording:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append({**kwargs, "grid": grid})
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(module, name, Recording())
    return launches
