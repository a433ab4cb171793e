"""The package's floors (docs/development.md, "What is inside"): a module imports only from
floors below its own, at module level or inside a function. An import that runs upward (the
engine reaching into the experiment layer, the configuration into the registries) is how the
same value comes to be parsed or defined in two places."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedjax_sel"

# room -> floor; a room imports only rooms on lower floors
FLOORS = {
    "base": 0,
    "tree": 1,
    "input_checks": 1,
    "registry": 1,
    "safe_pickle": 1,
    "distributed": 1,
    "members": 1,
    "metrics": 1,
    "config": 2,
    "data": 2,
    "models": 2,
    "kernels": 2,
    "availability": 3,
    "training": 3,
    "strategies": 4,
    "engine": 5,
    "personalized": 6,
    "experiment": 7,
    "benchmark": 8,
    "bench": 8,
    "demo": 9,
    "cli": 10,
    "__main__": 11,
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "fedjax_sel"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fedjax_sel":
                found |= {f"fedjax_sel.{a.name}" for a in node.names}
            elif node.module.startswith("fedjax_sel."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fedjax_sel.")}
    return found


def test_every_import_runs_downward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py" and rel.parent == Path("."):
            continue  # the package's front door re-exports from every floor
        room = rel.parts[0].removesuffix(".py")
        assert room in FLOORS, f"{rel}: a room with no floor; add it to FLOORS and the docs"
        for module in _imports(path):
            other = _room(module)
            if other != room and FLOORS[other] >= FLOORS[room]:
                upward.append(f"{rel} imports {module} (floor {FLOORS[other]} >= {FLOORS[room]})")
    assert not upward, "\n".join(upward)


def test_the_floor_test_sees_a_planted_upward_import(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("def f():\n    from fedjax_sel.experiment.run import run_group\n")
    assert _imports(planted) == {"fedjax_sel.experiment.run"}
