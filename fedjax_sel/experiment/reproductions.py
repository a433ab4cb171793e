"""The registry of paper reproductions (``fedjax-sel reproduce NAME``) and how one is run.

The reproductions themselves are not in this package: each registers itself with
:func:`register_reproduction` when its module is imported. The repository's ``studies``
package holds the five papers' (``studies/``, installed beside ``fedjax_sel`` by
``pip install -e .``); :data:`REPRODUCTIONS` imports every package named by the
``fedjax_sel.studies`` entry-point group the first time it is read, and ``--plugin MODULE``
imports another one (docs/reproductions.md, "Where the studies live").
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.registry import Registry

SIZES = ("cpu", "paper")
PROFILES = ("paper", "code")

REPRODUCTIONS = Registry(
    "reproduction",
    fixed=("seeds", "out", "size", "profile", "data_dir", "execution"),
    entry_points="fedjax_sel.studies",
)


def register_reproduction(name: str, description: str, **info) -> Callable:
    """Decorator registering ``run(*, seeds, out, size, profile, data_dir, **options) -> dict``:
    runs the paper's settings, prints our numbers beside the paper's and writes JSON and plots
    under ``out``."""
    return REPRODUCTIONS.register(name, description=description, **info)


def select_parts(
    name: str,
    parts: tuple[str, ...] | str | None,
    env_var: str,
    default: tuple[str, ...],
    known: tuple[str, ...],
) -> tuple[str, ...]:
    """The parts of reproduction ``name`` to run: ``parts`` (a tuple or a comma-separated
    string), else ``$env_var``, else ``default``; a :class:`ConfigError` names unknown ones."""
    if parts is None:
        parts = os.environ.get(env_var) or default
    if isinstance(parts, str):
        parts = tuple(p.strip() for p in parts.split(",") if p.strip())
    unknown = set(parts) - set(known)
    if unknown:
        raise ConfigError(f"unknown {name} reproduction part(s) {sorted(unknown)}; known: {known}")
    return tuple(parts)


def output_dir(out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_reproduction(
    name: str,
    *,
    out: Path | str,
    profile: str = "paper",
    size: str = "cpu",
    seeds: int | None = None,
    data_dir: str | None = None,
    seeds_together: int | str = "auto",
    only_seeds: Sequence[int] | None = None,
    **options: Any,
) -> dict:
    """Runs reproduction ``name`` (``fedjax-sel reproduce NAME``) and returns its results.

    Besides the reproduction's own files, writes ``out/run_info.json``: the arguments, the wall
    time of the whole reproduction and the machine it ran on (how a full-size run's cost is
    reported). A run into a folder that already holds one (resuming it, or adding parts) keeps
    the earlier runs' records under ``earlier_runs`` and their summed cost with this one's in
    ``total_wall_seconds``. ``seeds=None`` takes the reproduction's default.
    ``seeds_together`` and ``only_seeds``: how the runs are executed
    (:class:`~fedjax_sel.experiment.execution.Execution`), recorded in ``run_info.json`` when
    given. With ``only_seeds`` the reproduction stops once those seeds' runs are done and
    returns ``{"only_seeds", "runs", "message"}`` (its ``run_info.json`` says ``only_seeds``)."""
    from fedjax_sel.experiment.execution import Execution, SeedsRunOnly
    from fedjax_sel.experiment.outputs import write_json
    from fedjax_sel.experiment.provenance import code_record, machine_info

    execution = Execution(
        seeds_together, None if only_seeds is None else tuple(int(s) for s in only_seeds)
    )

    out = output_dir(Path(out))
    # read before the run: a malformed record stops it now, not after hours of work
    earlier = earlier_runs(out / "run_info.json")
    kw = {} if seeds is None else {"seeds": seeds}
    start = time.perf_counter()
    try:
        results = REPRODUCTIONS.build(
            name,
            **kw,
            out=out,
            size=size,
            profile=profile,
            data_dir=data_dir,
            execution=execution,
            **options,
        )
    except SeedsRunOnly as stop:
        print(stop)
        results = {"only_seeds": stop.seeds, "runs": stop.runs, "message": str(stop)}
    info = {
        "reproduction": name,
        "profile": profile,
        "size": size,
        "seeds": seeds if seeds is not None else (results or {}).get("seeds"),
        "options": options,
        **({} if seeds_together == "auto" else {"seeds_together": seeds_together}),
        **({} if only_seeds is None else {"only_seeds": list(execution.only_seeds)}),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "machine": machine_info(),
        "code": code_record(),
        "command": shlex.join(sys.argv) if sys.argv and "fedjax-sel" in sys.argv[0] else None,
    }
    if earlier:
        info["earlier_runs"] = earlier
        info["total_wall_seconds"] = round(
            sum(r["wall_seconds"] for r in earlier) + info["wall_seconds"], 1
        )
    write_json(out / "run_info.json", info)
    return results


def earlier_runs(path: Path) -> list[dict]:
    """The records of every run into ``path``'s folder so far, oldest first (``[]`` when it
    holds none); a :class:`ConfigError` names a record that is not a reproduction's."""
    from fedjax_sel.experiment.outputs import read_json

    if not path.exists():
        return []
    last = read_json(path)
    if not isinstance(last, dict) or not isinstance(last.get("wall_seconds"), int | float):
        raise ConfigError(f"{str(path)!r} is not a reproduction's run record (no wall_seconds)")
    history = last.pop("earlier_runs", [])
    last.pop("total_wall_seconds", None)
    return [*history, last]
