"""Which Triton entry points an op reached: `record_calls` wraps functions of a module (pytest's
monkeypatch undoes it after the test) and lists each call by name, in order."""
from __future__ import annotations


def record_calls(monkeypatch, module, *names: str) -> list[str]:
    calls: list[str] = []
    for name in names:
        def wrapper(*args, _real=getattr(module, name), _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)
    return calls
