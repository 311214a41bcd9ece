"""Layering, checked on the source: core modules never import the built-in plugins, and the
fit package has no import cycle (``fit/ridge.py`` <-> ``fit/select.py`` went through ``fit/solve.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvbridge

SRC = Path(kvbridge.__file__).resolve().parent
#: not core: the plugins themselves, the command line, the test helpers for plugin authors and the
#: conformance sweep (it exercises the built-in families, as testing/ does)
NOT_CORE = ("builtin", "cli", "testing", "conformance")
#: the plugin host is the composition root: it loads the built-ins (by name) and falls back to the
#: built-in generic family adapter for model types no plugin claims
COMPOSITION_ROOT = ("plugins.py",)


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    return imports_of(path.read_text(), package)


def imports_of(text: str, package: str = "") -> set[str]:
    tree = ast.parse(text)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def core_files() -> list[Path]:
    return [p for p in SRC.rglob("*.py")
            if p.relative_to(SRC).parts[0] not in NOT_CORE and str(p.relative_to(SRC)) not in COMPOSITION_ROOT]


def test_core_never_imports_the_builtin_plugins():
    files = core_files()
    assert len(files) > 30
    bad = {str(p.relative_to(SRC)): sorted(m for m in imports(p) if m.startswith("kvbridge.builtin"))
           for p in files}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"core modules import kvbridge.builtin (go through the plugin host instead): {bad}"


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    text = "def f():\n    from kvbridge.builtin.identity import IdentityMapping\n    import kvbridge.builtin.metrics\n"
    assert {"kvbridge.builtin.identity", "kvbridge.builtin.metrics"} <= imports_of(text)
    assert "kvbridge.builtin.fitters" in imports_of("from ..builtin import fitters\n", "kvbridge.fit")


def test_the_fit_package_has_no_import_cycle():
    fit = SRC / "fit"
    mods = {_module(p): p for p in fit.glob("*.py")}
    graph = {m: {d for d in imports(p) if d in mods and d != m} for m, p in mods.items()}
    graph = {m: {d for d in deps if d != "kvbridge.fit"} for m, deps in graph.items()}
    seen, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(m):] + [m])}")
        if m in seen:
            return
        stack.append(m)
        for d in graph.get(m, ()):
            visit(d)
        stack.pop()
        seen.add(m)

    for m in graph:
        visit(m)
    assert "kvbridge.fit.solve" in graph["kvbridge.fit.select"]
