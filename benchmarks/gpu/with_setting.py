"""Run a benchmark script with module constants of the library set first:

    python3 benchmarks/gpu/with_setting.py MODULE 'NAME = VALUE[; NAME = VALUE ...]' SCRIPT [ARGS ...]

sets each NAME of `hybridcache.ops.MODULE` (e.g. `kda.triton_verify`) to VALUE (a Python expression), then runs
benchmarks/SCRIPT.py as __main__ with ARGS; a NAME with dots names its own module (`moe.FOLD_NORM`: FOLD_NORM of
`hybridcache.ops.moe`). The scripts here use it for A/B timings of an op's settings.
"""
from __future__ import annotations

import ast
import importlib
import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    module, settings, script, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    for setting in filter(None, (part.strip() for part in settings.split(";"))):
        name, value = (side.strip() for side in setting.split("=", 1))
        where, _, name = f"{module}.{name}".rpartition(".") if "." not in name else name.rpartition(".")
        target = importlib.import_module(f"hybridcache.ops.{where}")
        if not hasattr(target, name):
            sys.exit(f"hybridcache.ops.{where} has no {name}")
        setattr(target, name, ast.literal_eval(value))
    path = Path(__file__).resolve().parents[1] / f"{script}.py"
    sys.argv = [str(path), *args]
    runpy.run_path(str(path), run_name="__main__")


if __name__ == "__main__":
    main()
