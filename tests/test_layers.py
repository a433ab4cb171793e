"""The package's floors (docs/development.md, "What is inside"): a module imports only from
floors below its own, at module level or inside a function. An import that runs upward (the
engine reaching into the experiment layer, the configuration into the registries) is how the
same value comes to be parsed or defined in two places."""

from __future__ import annotations

from test_public_api import _import_graph

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


def test_every_import_runs_downward():
    upward = []
    for module, imported in sorted(_import_graph().items()):
        if module == "fedjax_sel":
            continue  # the package's front door re-exports from every floor
        room = _room(module)
        assert room in FLOORS, f"{module}: a room with no floor; add it to FLOORS and the docs"
        for other_module in sorted(imported - {"fedjax_sel"}):  # the version, lazily
            other = _room(other_module)
            if other != room and FLOORS[other] >= FLOORS[room]:
                upward.append(
                    f"{module} imports {other_module} (floor {FLOORS[other]} >= {FLOORS[room]})"
                )
    assert not upward, "\n".join(upward)


def test_the_floors_see_imports_inside_functions():
    # cmd_demo imports the demo only when it runs: an edge the floors must still see
    assert "fedjax_sel.demo" in _import_graph()["fedjax_sel.cli.demo"]
