"""Imports run one way: lenserve_contract <- services/* <- gateway <- lenserve <- evaluation
(lenserve imports evaluation only inside functions: `lenserve predictor eval` runs it, and the
service's image, which leaves it out, must still start).

Walks every module's AST (imports inside functions included: a lazy upward import is still
an upward dependency) and fails on the first import that points up a layer."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("lenserve_contract", "lenserve", "services", "gateway", "evaluation")
# What each layer may import of the project.
ALLOWED = {
    "lenserve_contract": {"lenserve_contract"},
    "services": {"lenserve_contract", "services"},
    "gateway": {"lenserve_contract", "services", "gateway"},
    "lenserve": {"lenserve_contract", "services", "gateway", "lenserve", "evaluation"},
    "evaluation": {"lenserve_contract", "services", "gateway", "lenserve", "evaluation"},
}
# What a layer may import only inside a function, never when its modules load.
LAZY_ONLY = {"lenserve": {"evaluation"}}


def imported_packages(path: Path, tree: ast.AST | None = None,
                      skip: frozenset[int] = frozenset()) -> set[tuple[str, int]]:
    tree = tree or ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update((a.name.split(".")[0], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return {(pkg, line) for pkg, line in found if pkg in PROJECT}


def module_level_packages(path: Path) -> set[tuple[str, int]]:
    """The project packages imported when the module loads: outside any function body."""
    tree = ast.parse(path.read_text(), str(path))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
    return imported_packages(path, tree, skip=frozenset(inside))


def layer_files():
    for layer in ALLOWED:
        for path in sorted((ROOT / layer).rglob("*.py")):
            yield layer, path


def test_every_layer_has_code():
    assert {layer for layer, _ in layer_files()} >= {"lenserve_contract", "services", "lenserve"}


@pytest.mark.parametrize("layer", list(ALLOWED))
def test_no_upward_import(layer):
    bad = [f"{path.relative_to(ROOT)}:{line} imports {pkg}"
           for lay, path in layer_files() if lay == layer
           for pkg, line in imported_packages(path) if pkg not in ALLOWED[layer]]
    assert not bad, "upward imports:\n" + "\n".join(bad)


@pytest.mark.parametrize("layer", list(LAZY_ONLY))
def test_lazy_only_imports_wait_for_a_call(layer):
    bad = [f"{path.relative_to(ROOT)}:{line} imports {pkg} when it loads"
           for lay, path in layer_files() if lay == layer
           for pkg, line in module_level_packages(path) if pkg in LAZY_ONLY[layer]]
    assert not bad, "imports that must be lazy:\n" + "\n".join(bad)


def test_the_walker_tells_lazy_from_module_level_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import evaluation\ntry:\n    from lenserve import a\nexcept ImportError:\n"
                 "    pass\ndef f():\n    import services.a\n")
    assert module_level_packages(f) == {("evaluation", 1), ("lenserve", 3)}


def test_the_walker_sees_lazy_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from lenserve.engine import x\n    import services.a\n")
    assert imported_packages(f) == {("lenserve", 2), ("services", 3)}
