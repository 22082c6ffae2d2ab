"""Import rules of ops/: ops never reach up (states, cache, models, engine), and every `naive.py` stands
alone (a reference that imports the fast path would share its bugs)."""
import ast
from pathlib import Path

import hybridcache.ops

OPS = Path(hybridcache.ops.__file__).parent
# what a reference may take from the package: the shared naive plumbing and the typed errors
NAIVE_MAY_IMPORT = {"hybridcache.ops.delta_rule_naive": None, "hybridcache.ops.attention": {"PageTableError"}}


def _imports(path: Path) -> list[tuple[str, set[str]]]:
    """(absolute module, names) of each import of a module under ops/."""
    package = ".".join(("hybridcache", "ops", *path.relative_to(OPS).parent.parts))
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, set()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.level and node.module else (base if node.level else node.module)
            out.append((module, {a.name for a in node.names}))
    return out


def test_ops_never_import_the_layers_above():
    for path in OPS.rglob("*.py"):
        for module, _ in _imports(path):
            top = module.split(".")[:2]
            assert top[0] != "hybridcache" or top[1] == "ops", f"{path.relative_to(OPS)} imports {module}"


def test_naive_references_stand_alone():
    for path in OPS.rglob("naive.py"):
        for module, names in _imports(path):
            if not module.startswith("hybridcache"):
                continue
            assert module in NAIVE_MAY_IMPORT, f"{path.relative_to(OPS)} imports {module}"
            allowed = NAIVE_MAY_IMPORT[module]
            assert allowed is None or names <= allowed, f"{path.relative_to(OPS)} imports {names} from {module}"
