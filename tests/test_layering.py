"""Layering, checked on the source: core modules never import the built-in plugins (the host loads
them by name); no module imports from a layer above its own (:data:`LAYERS`, docs/design.md's
list); and the import graph of the whole package has no cycle. Imports inside functions count, and
so do ``if TYPE_CHECKING:`` imports (a type-only import up a layer is still a cycle waiting).
Public names: no private name is imported across packages, and ``__all__`` appears only where a
module re-exports (docs/decisions.md, "Public names")."""

from __future__ import annotations

import ast
from pathlib import Path

import kvbridge

SRC = Path(kvbridge.__file__).resolve().parent
#: not core: the plugins themselves, the command line, the test helpers for plugin authors and the
#: conformance sweep (it exercises the built-in families, as testing/ does)
NOT_CORE = ("builtin", "cli", "testing", "conformance")
#: docs/design.md's layers, lowest first: a module (by its top-level name under kvbridge/) imports
#: only from its own layer or the ones before it
LAYERS = (
    (
        "value types",
        (
            "version",
            "errors",
            "safe_text",
            "stats",
            "dtypes",
            "sizes",
            "spec",
            "settings_fields",
            "threads",
            "paths",
            "corpus",
            "faults",
            "module_hooks",
            "plugin_types",
            "hookspecs",
            "hf_compat",
        ),
    ),
    ("the host", ("plugins",)),
    ("config-only checks", ("check",)),
    (
        "the codec and state",
        (
            "rope_native",
            "rope_kernels",
            "rope",
            "attention",
            "kvstate",
            "kvstate_io",
            "buffers",
            "transfer",
            "handoff",
            "durable",
            "artifacts",
            "progress",
            "divergence",
        ),
    ),
    ("models", ("models", "family_adapter", "run")),
    ("stages: fit, prefix, zoo", ("fit", "prefix", "zoo")),
    ("stages: evaluate", ("evaluate",)),
    ("stages: recompute", ("recompute",)),
    (
        "stages: harness, steer, engines, adapters, transfer",
        ("harness", "steer", "engines", "adapters", "transfer_settings", "transfer_run"),
    ),
    (
        "entry points, plugins, contracts",
        ("api", "demo", "cli", "builtin", "__main__", "testing", "conformance"),
    ),
)
#: imports up a layer still to be moved (none: ``eval --recompute/--frontier`` are condition sets that
#: recompute/eval_run.py hands to evaluate/run.py's runner)
KNOWN_UP: set = set()


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


def _type_checking_nodes(tree, runtime_only: bool = False) -> set[int]:
    """Nodes inside ``if TYPE_CHECKING:`` blocks, skipped only when ``runtime_only``."""
    skip = set()
    if not runtime_only:
        return skip
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for sub in node.body for n in ast.walk(sub))
    return skip


def imports_of(text: str, package: str = "", runtime_only: bool = False) -> set[str]:
    tree = ast.parse(text)
    skip = _type_checking_nodes(tree, runtime_only)
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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
    return [p for p in SRC.rglob("*.py") if p.relative_to(SRC).parts[0] not in NOT_CORE]


def test_core_never_imports_the_builtin_plugins():
    files = core_files()
    assert len(files) > 30
    bad = {str(p.relative_to(SRC)): sorted(m for m in imports(p) if m.startswith("kvbridge.builtin")) for p in files}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"core modules import kvbridge.builtin (go through the plugin host instead): {bad}"


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    text = "def f():\n    from kvbridge.builtin.identity import IdentityMapping\n    import kvbridge.builtin.metrics\n"
    assert {"kvbridge.builtin.identity", "kvbridge.builtin.metrics"} <= imports_of(text)
    assert "kvbridge.builtin.fitters" in imports_of("from ..builtin import fitters\n", "kvbridge.fit")


def module_graph(runtime_only: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (``runtime_only``: not counting ``TYPE_CHECKING``
    blocks): ``from P import N`` is an import of ``P.N`` when that is a module, else of ``P`` itself."""
    mods = {_module(p): p for p in SRC.rglob("*.py")}

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for m, p in mods.items():
        package = m if p.name == "__init__.py" else m.rpartition(".")[0]
        tree = ast.parse(p.read_text())
        skip = _type_checking_nodes(tree, runtime_only)
        deps = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(owner(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = package.split(".")
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
                deps.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else owner(base) for a in node.names)
        graph[m] = {d for d in deps if d and d != m}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first == last), or None."""
    done, stack, on_stack = set(), [], set()

    def visit(m):
        stack.append(m)
        on_stack.add(m)
        for d in sorted(graph.get(m, ())):
            if d in on_stack:
                return stack[stack.index(d) :] + [d]
            if d not in done:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        on_stack.discard(m)
        done.add(m)
        return None

    for m in sorted(graph):
        if m not in done:
            found = visit(m)
            if found:
                return found
    return None


def test_the_package_import_graph_has_no_cycle_type_only_imports_included():
    graph = module_graph()
    assert len(graph) > 100
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_cycles_and_sees_type_checking_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvbridge.family_adapter import X\n"
    assert "kvbridge.family_adapter" in imports_of(text)
    assert "kvbridge.family_adapter" not in imports_of(text, runtime_only=True)
    assert "kvbridge.family_adapter" in imports_of("def f():\n    from kvbridge.family_adapter import X\n")


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``kvbridge.NAME...`` (None for the package itself)."""
    parts = module.split(".")
    if len(parts) == 1:
        return None
    return next((i for i, (_, names) in enumerate(LAYERS) if parts[1] in names), -1)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in module_graph() if layer_of(m) == -1)
    assert not unplaced, f"modules in no layer (add them to LAYERS and docs/design.md): {unplaced}"


def test_no_import_goes_up_a_layer():
    """Function-level and type-only imports included; see :data:`LAYERS`."""
    graph = module_graph()
    up = {
        (m, d)
        for m, deps in graph.items()
        for d in deps
        if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)
    }
    new = sorted(up - KNOWN_UP)
    shown = [f"{m} ({LAYERS[layer_of(m)][0]}) -> {d} ({LAYERS[layer_of(d)][0]})" for m, d in new]
    assert not new, "imports from a layer above: " + "; ".join(shown)
    assert not KNOWN_UP - up, f"gone, drop from KNOWN_UP: {sorted(KNOWN_UP - up)}"


def test_design_doc_lists_every_layer_name():
    text = (SRC.parents[1] / "docs" / "design.md").read_text()
    listed = lambda n: f"`{n}" in text or (n.startswith("rope") and "`rope*.py`" in text)  # noqa: E731
    missing = sorted(n for _, names in LAYERS for n in names if not listed(n))
    assert not missing, f"docs/design.md's layer list misses {missing}"


def test_the_host_loads_the_builtins_by_name_only():
    """plugins.py imports no built-in plugin module (they are leaves it loads from BUILTIN_PLUGINS)."""
    from kvbridge.plugins import BUILTIN_PLUGINS

    assert not {m for m in imports(SRC / "plugins.py") if m.startswith("kvbridge.builtin")}
    assert "kvbridge.builtin.family_fallback" in BUILTIN_PLUGINS and "kvbridge.builtin.model_sources" in BUILTIN_PLUGINS


def test_the_fit_package_has_no_import_cycle():
    fit = SRC / "fit"
    mods = {_module(p): p for p in fit.glob("*.py")}
    graph = {m: {d for d in imports(p) if d in mods and d != m} for m, p in mods.items()}
    graph = {m: {d for d in deps if d != "kvbridge.fit"} for m, deps in graph.items()}
    seen, stack = set(), []

    def visit(m):
        if m in stack:
            raise AssertionError(f"import cycle: {' -> '.join(stack[stack.index(m) :] + [m])}")
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


def _imported_from(path: Path):
    """(the module ``path`` imports from, a name it takes) for each ``from kvbridge... import name``."""
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([base] if base else []))
            yield from ((base, alias.name) for alias in node.names)


def _package_of(module: str) -> str:
    return module if (SRC.parent / module.replace(".", "/")).is_dir() else module.rpartition(".")[0]


def test_no_private_name_is_imported_across_packages():
    """A leading underscore is the one declaration of "private" (docs/decisions.md, "Public names"):
    a private name is used only inside its own package."""
    found = []
    for path in SRC.rglob("*.py"):
        here = _package_of(_module(path))
        for base, name in _imported_from(path):
            private = name.startswith("_") and not name.startswith("__")
            if private and base.startswith("kvbridge") and _package_of(base) != here:
                found.append(f"{_module(path)} imports {base}.{name}")
    assert not found, found


def test_all_lists_only_re_exports_and_names_that_exist():
    """``__all__`` is written only where a module re-exports what it imports (a package's
    ``__init__``, or a module that keeps an import path working): there it is what keeps the
    re-export public to linters and type checkers; elsewhere the underscore says it all. Every name
    an ``__all__`` lists exists."""
    found = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        listed, imported = None, set()
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                listed = node
        if listed is None:
            continue
        module = __import__(_module(path), fromlist=["_"])
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        if missing:
            found.append(f"{_module(path)}.__all__ lists missing {missing}")
        if path.name != "__init__.py" and not imported & set(module.__all__):
            found.append(f"{_module(path)}.__all__ re-exports nothing: drop it")
    assert not found, found
