"""Programmatic dependent launch's switch (hybridcache/ops/pdl_triton.py): on CUDA unless switched off.
Its kernels' PTX: tests/ops/test_compile_for_h200.py; its tokens on the GPU: tests/engine/test_cuda_graphs.py."""
from __future__ import annotations

import pytest
import torch

pdl_triton = pytest.importorskip("hybridcache.ops.pdl_triton", reason="triton is not installed")


@pytest.mark.parametrize("env,enabled", [(None, True), ("0", False), ("1", True)])
def test_the_variable_is_read_when_the_module_is_imported(env, enabled):
    """HYBRIDCACHE_PDL=0, and nothing else, switches PDL off (read once, in a fresh interpreter here)."""
    import os
    import subprocess
    import sys

    environ = {k: v for k, v in os.environ.items() if k != pdl_triton.ENV}
    if env is not None:
        environ[pdl_triton.ENV] = env
    run = subprocess.run([sys.executable, "-c", "from hybridcache.ops import pdl_triton; print(pdl_triton.ENABLED)"],
                         env=environ, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == str(enabled)


@pytest.mark.parametrize("enabled", [False, True])
def test_cpu_tensors_never_launch_with_pdl(enabled, monkeypatch):
    monkeypatch.setattr(pdl_triton, "ENABLED", enabled)
    assert pdl_triton.pdl_launch(torch.zeros(2)) == {"PDL": False}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_launches_take_pdl_only_where_enabled(monkeypatch):
    t = torch.zeros(2, device="cuda")
    monkeypatch.setattr(pdl_triton, "ENABLED", False)
    assert pdl_triton.pdl_launch(t) == {"PDL": False}
    monkeypatch.setattr(pdl_triton, "ENABLED", True)
    on = torch.cuda.get_device_capability()[0] >= 9
    assert pdl_triton.pdl_launch(t) == ({"PDL": True, "launch_pdl": True} if on else {"PDL": False})


def _kernels_and_launches() -> tuple[dict, list]:
    """Every `@triton.jit` function of hybridcache/ by name (its def), and every launch `name[grid](...)`."""
    import ast
    from pathlib import Path

    root = Path(pdl_triton.__file__).resolve().parents[1]
    jitted, launches = {}, []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
                jitted[node.name] = node
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                base = node.func.value
                name = getattr(base, "id", None) or getattr(base, "attr", None)
                if name and name.endswith("_kernel"):
                    launches.append((f"{path.name}:{node.lineno}", name, node))
    return jitted, launches


def _reads_before_wait(statements: list, jitted: dict) -> list[str]:
    """What the statements call that may read or write memory: tl.load / tl.store / atomics, and any jit
    function of ours other than those `pdl_triton.BEFORE_WAIT` admits."""
    import ast

    found = []
    for node in (n for s in statements for n in ast.walk(s) if isinstance(n, ast.Call)):
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
        if name in ("load", "store") or name.startswith("atomic") or (name in jitted
                                                                          and name not in pdl_triton.BEFORE_WAIT):
            found.append(name)
    return found


def test_every_launched_kernel_waits_at_its_entry_and_every_launch_asks():
    """Under PDL a kernel may start before its predecessor ends: each launched kernel must take PDL and wait
    first (`pdl_entry(PDL)` before any load or store but of parameters no kernel writes, through a function
    `pdl_triton.BEFORE_WAIT` names), and each launch must pass `pdl_launch(...)`, or the switch would race (a
    kernel launched early that reads before waiting) or silently leave kernels out."""
    import ast

    jitted, launches = _kernels_and_launches()
    assert len(launches) >= 30, f"found only {len(launches)} launches: the scan is broken"
    for where, name, call in launches:
        kernel = jitted[name]
        assert any(a.arg == "PDL" for a in kernel.args.args), f"{name} takes no PDL"
        docstring = isinstance(kernel.body[0], ast.Expr) and isinstance(kernel.body[0].value, ast.Constant)
        body = kernel.body[1:] if docstring else kernel.body
        entry = [i for i, s in enumerate(body) if ast.unparse(s) == "pdl_entry(PDL)"]
        assert entry, f"{name} never calls pdl_entry(PDL) at its top level"
        reads = _reads_before_wait(body[:entry[0]], jitted)
        assert not reads, f"{name} calls {reads} before pdl_entry(PDL)"
        asks = [k for k in call.keywords if k.arg is None and "pdl_launch" in ast.unparse(k.value)]
        assert asks, f"{where}: the launch of {name} does not pass **pdl_launch(...)"


def test_the_entry_check_catches_a_read_before_the_wait():
    """A mutation guard for the check above: a load, a store, or a jit function of ours outside BEFORE_WAIT ahead
    of pdl_entry is reported; a BEFORE_WAIT function and index arithmetic are not."""
    import ast

    jitted, _ = _kernels_and_launches()
    assert "_w_step" in jitted and "_weights_first" in jitted, "the routers' helpers moved: update this test"
    cases = {"x = tl.load(p + i)": ["load"], "tl.store(p, x)": ["store"], "tl.atomic_add(p, 1)": ["atomic_add"],
             "w = _w_step(p, D, e, r, d)": ["_w_step"], "w = _weights_first(p, D, e, r, 8, 16, True)": [],
             "e = tl.arange(0, 8) * 2": []}
    for source, want in cases.items():
        assert _reads_before_wait(ast.parse(source).body, jitted) == want, source
