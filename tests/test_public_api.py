"""The flat public API: every name in ``fedjax_sel.__all__`` imports, and the package imports
without circular-import errors in any order of its modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

import fedjax_sel


@pytest.mark.parametrize("name", fedjax_sel.__all__)
def test_every_public_name_imports(name):
    assert getattr(fedjax_sel, name) is not None


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        fedjax_sel.nope  # noqa: B018


@pytest.mark.parametrize(
    "module",
    [
        "fedjax_sel.cli.main",
        "fedjax_sel.demo",
        "fedjax_sel.kernels.nystrom",
        "fedjax_sel.kernels.spectral",
        "fedjax_sel.models.resnet",
        "fedjax_sel.data.datasets",
        "fedjax_sel.experiment.sweep",
    ],
)
def test_modules_import_first_in_a_fresh_interpreter(module):
    """Each module imports on its own first (import cycles fail this)."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _import_graph() -> dict[str, set[str]]:
    """Every fedjax_sel module -> the fedjax_sel modules it imports (anywhere in its code, lazy
    imports inside functions included)."""
    import ast
    from pathlib import Path

    root = Path(fedjax_sel.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    graph[name].add(sub if sub in modules else node.module)
    return graph


def test_no_import_cycles_between_modules():
    """Layers import downwards only (design section 2): no module reaches itself through
    imports (the package __init__ files re-export lazily by name, so they add no edges)."""
    graph = _import_graph()
    seen, on_path, cycles = set(), [], []

    def visit(m):
        if m in on_path:
            cycles.append(on_path[on_path.index(m) :] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for n in sorted(graph[m]):
            visit(n)
        on_path.pop()

    for m in sorted(graph):
        visit(m)
    assert not cycles, cycles
