"""The package's layout: which layer may import which, one import path per name, modules of a
readable size, and the environment read in one module. The benchmarks (benchmarks/) and the
docs generator (docs/hooks/) are consumers beside the package: they may import any layer, and
nothing in it imports them. Read from the source, nothing run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .helpers import REPO

PACKAGE = REPO / "nmt"
GROUND = {"environment", "atomic", "cli", "config", "config_checks"}
BELOW_STORE = GROUND | {"data", "models", "runtime"}
# what each part of the package may import from nmt (besides itself), from the ground up
ALLOWED: dict[str, set[str]] = {
    "environment": set(),
    "atomic": set(),
    "cli": {"environment"},
    "config": {"environment", "cli"},
    "config_checks": {"environment", "cli", "config"},
    "data": GROUND,
    "models": set(),
    "runtime": GROUND | {"data"},
    "store": BELOW_STORE,
    "decode": BELOW_STORE | {"store"},
    "evaluate": BELOW_STORE | {"store", "decode"},
    "viz": BELOW_STORE | {"store", "decode", "evaluate"},
    "train": BELOW_STORE | {"store", "decode", "evaluate", "viz"},
    "ship": BELOW_STORE | {"store", "decode", "evaluate"},
    "serve": BELOW_STORE | {"store", "decode", "viz"},
}
# the consumers beside the package, in the checkout: top-level import names and folders
CONSUMERS = {"benchmarks": REPO / "benchmarks", "docs.hooks": REPO / "docs" / "hooks"}
MAX_LINES = 600


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES = {name: ast.parse(p.read_text(encoding="utf-8")) for name, p in SOURCES.items()}
# every module a test, script or consumer may import from the checkout
IMPORTABLE = SOURCES | {
    module_name(p): p for folder in CONSUMERS.values() for p in sorted(folder.rglob("*.py"))
}


def part(module: str) -> str:
    """The part of the package a module belongs to: ``nmt.data.corpus`` -> ``data``."""
    return module.split(".")[1] if module != "nmt" else ""


def ours(module: str, roots: tuple[str, ...] = ("nmt", *CONSUMERS)) -> bool:
    """Whether ``module`` is nmt's, or a consumer's from the checkout."""
    return any(module == root or module.startswith(f"{root}.") for root in roots)


def nmt_imports(
    tree: ast.Module, roots: tuple[str, ...] = ("nmt",)
) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) of every import of nmt (or of ``roots``), at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if ours(node.module, roots):
                found.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if ours(a.name, roots)]
    return found


def defined_names(tree: ast.Module) -> set[str]:
    """The names a module defines at its top level (not the ones it imports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                elts = target.elts if isinstance(target, ast.Tuple) else [target]
                names |= {e.id for e in elts if isinstance(e, ast.Name)}
    return names


DEFINED = {
    name: defined_names(ast.parse(p.read_text(encoding="utf-8"))) for name, p in IMPORTABLE.items()
}


def test_every_part_imports_only_the_layers_below_it() -> None:
    wrong = []
    for name, tree in TREES.items():
        mine = part(name)
        if not mine:
            continue
        assert mine in ALLOWED, f"{name}: a part of nmt that the layer table does not know"
        for module, _, line in nmt_imports(tree):
            theirs = part(module)
            if theirs and theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{SOURCES[name]}:{line}: {mine} imports {module}")
    assert wrong == []


def test_nothing_in_the_package_imports_its_consumers() -> None:
    """The wheel holds nmt alone: an import of the benchmarks or the docs generator from the
    package would fail wherever nmt is installed outside a checkout."""
    wrong = [
        f"{SOURCES[name]}:{line}: imports {module}"
        for name, tree in TREES.items()
        for module, _, line in nmt_imports(tree, tuple(CONSUMERS) + ("docs",))
    ]
    assert wrong == []


def test_the_table_has_no_cycle() -> None:
    """Each part's allowed imports are a subset of a part strictly below it plus that part."""
    order = list(ALLOWED)
    for i, name in enumerate(order):
        assert ALLOWED[name] <= set(order[:i]), name


@pytest.mark.parametrize("where", ["nmt", "benchmarks", "docs/hooks", "tests", "scripts"])
def test_every_name_is_imported_from_the_module_that_defines_it(where: str) -> None:
    """No re-exports: ``from nmt.X import name`` names the module where ``name`` is defined
    (or a submodule of the package X)."""
    wrong = []
    for path in sorted((REPO / where).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for module, names, line in nmt_imports(tree, ("nmt", *CONSUMERS)):
            assert module in IMPORTABLE, f"{path}:{line}: no module {module}"
            for imported in names:
                if f"{module}.{imported}" not in IMPORTABLE and imported not in DEFINED[module]:
                    wrong.append(f"{path}:{line}: {imported} is not defined in {module}")
    assert wrong == []


@pytest.mark.parametrize("where", ["nmt", "benchmarks", "docs/hooks", "scripts", "tests"])
def test_no_module_is_longer_than_a_sitting(where: str) -> None:
    """Modules of the package, scripts and test files alike."""
    paths = sorted((REPO / where).rglob("*.py"))
    assert paths
    lengths = {
        p.relative_to(REPO).as_posix(): len(p.read_text("utf-8").splitlines()) for p in paths
    }
    assert {n: k for n, k in lengths.items() if k > MAX_LINES} == {}


def test_the_environment_is_read_and_set_in_one_module() -> None:
    """Only nmt.environment touches os.environ or calls os.getenv / os.putenv."""
    touching = set()
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            named = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            if named and node.value.id == "os" and node.attr in ("environ", "getenv", "putenv"):
                touching.add(name)
    assert touching == {"nmt.environment"}


def test_every_package_says_what_lives_there_and_what_it_may_import() -> None:
    for name in ALLOWED:
        path = PACKAGE / name / "__init__.py"
        if path.is_file():
            doc = ast.get_docstring(TREES[f"nmt.{name}"]) or ""
            assert "import" in doc and len(doc) > 120, f"{path}: a one-paragraph docstring"
