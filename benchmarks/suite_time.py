"""Where a suite's time went: seconds by task, strategy and phase, from its run folders.

Each finished cell's ``timings.json`` (under ``OUT/runs/``, kept on the machine that ran the
suite, not committed) holds the wall seconds its member spent in rounds and in evaluations,
compilation included (``evaluations[*].seconds``). This script adds them up by task, by
strategy (over tasks) and by phase (tuning grids, evaluations), and sets them against the
suite's recorded wall time (``OUT/invocations.json``: every invocation that ran cells): the
remainder is what no cell's clock saw, loading data sets, the deadlines' uniform rounds,
measuring batch sizes and writing records. Writes JSON (default ``OUT/suite_time.json``,
committed beside the records: the docs page quotes it) and prints a table::

    python benchmarks/suite_time.py --out benchmarks/results/selection/cpu

A suite finished over several sessions or machines keeps its earlier figures: the JSON holds
every timed cell's seconds (``cell_times``, by the cell's folder under ``OUT/runs``), and a
rerun keeps the cells of the previous JSON that this machine's ``runs`` no longer has, taking
this machine's value where both have one. A JSON written before ``cell_times`` existed is
carried as its totals (``carried``): its cells were all run before any cell of ``runs``.

Cells run again replace their earlier records (on 2026-12-08 the cells made on 2026-11-28, on
another CPU target, were run again so that every committed record reruns bit for bit on one
target): ``--superseded-before TIME`` sets aside the invocations that started before ``TIME``
and the carried totals, whose records are no longer committed. They stay in the JSON, under
``superseded``, but count in no total.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INVOCATION_KEYS = ("started", "wall_seconds", "cells_run", "cpu_model", "cpu_count")


def cell_row(cell: str, rounds: float, evaluation: float) -> dict[str, Any]:
    """A timed cell by its folder under ``OUT/runs`` (``task/scenario/strategy/seedS`` or
    ``task/tuning/scenario/strategy/point/seedS``): its task, phase, strategy and seconds."""
    parts = cell.split("/")
    phase = "tune" if parts[1] == "tuning" else "eval"
    return {
        "cell": cell,
        "task": parts[0],
        "phase": phase,
        "strategy": parts[3] if phase == "tune" else parts[2],
        "rounds": float(rounds),
        "eval": float(evaluation),
    }


def cell_seconds(runs: Path) -> Iterator[dict[str, Any]]:
    """Every finished cell under ``runs`` (``OUT/runs``): its task, phase, strategy and the
    seconds it spent in rounds and in evaluations."""
    for timings in sorted(runs.glob("**/seed*/timings.json")):
        if not (timings.parent / "summary.json").exists():
            continue  # unfinished
        spent: dict[str, float] = defaultdict(float)
        for evaluation in json.loads(timings.read_text()).get("evaluations", []):
            for name, seconds in evaluation.get("seconds", {}).items():
                spent[name] += float(seconds)
        cell = timings.parent.relative_to(runs).as_posix()
        yield cell_row(cell, spent.get("rounds", 0.0), spent.get("eval", 0.0))


def cell_rows(out: Path, previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every timed cell: this machine's ``OUT/runs`` and, for cells it no longer has, the
    previous JSON's ``cell_times``."""
    rows = {c["cell"]: c for c in cell_seconds(out / "runs")}
    for cell, rounds, evaluation in (previous or {}).get("cell_times", []):
        rows.setdefault(cell, cell_row(cell, rounds, evaluation))
    return [rows[k] for k in sorted(rows)]


def carried_figures(previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """The totals of a previous JSON that kept no per-cell seconds (or the block it carried
    itself): added to the tables as they are."""
    if not previous:
        return None
    if "cell_times" in previous:
        return previous.get("carried")
    keys = ("cells", "cell_seconds", "by_task", "by_phase", "by_strategy")
    return {k: previous[k] for k in keys}


def summarize(
    out: Path, previous: dict[str, Any] | None = None, superseded_before: str | None = None
) -> dict[str, Any]:
    """The suite's seconds by task, strategy and phase, and its recorded wall time; the
    cells and totals of ``previous`` (the JSON this writes) that ``OUT/runs`` lacks are kept,
    except what ``superseded_before`` (an ISO time) sets aside (module docstring)."""
    cells = cell_rows(out, previous)
    carried = carried_figures(previous)
    invocations = []
    path = out / "invocations.json"
    if path.exists():
        invocations = [e for e in json.loads(path.read_text()) if e.get("cells_run")]
    superseded = dict((previous or {}).get("superseded") or {})
    # set aside now, or by an earlier call (then it stays aside)
    before = superseded_before or superseded.get("before")
    old = [e for e in invocations if before is not None and e["started"] < before]
    invocations = [e for e in invocations if e not in old]
    if superseded_before is not None:
        superseded = {
            "before": superseded_before,
            "invocations": [{k: e.get(k) for k in INVOCATION_KEYS} for e in old],
            "wall_seconds": round(sum(float(e.get("wall_seconds", 0.0)) for e in old), 1),
            "carried": carried if carried is not None else superseded.get("carried"),
        }
        carried = None

    def table(key: str) -> list[dict[str, Any]]:
        groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for c in cells:
            g = groups[c[key]]
            g["cells"] += 1
            g["rounds_seconds"] += c["rounds"]
            g["eval_seconds"] += c["eval"]
        for r in (carried or {}).get(f"by_{key}", []):
            g = groups[r[key]]
            g["cells"] += r["cells"]
            g["rounds_seconds"] += r["rounds_seconds"]
            g["eval_seconds"] += r["eval_seconds"]
        rows = [
            {
                key: name,
                "cells": int(g["cells"]),
                "rounds_seconds": round(g["rounds_seconds"], 1),
                "eval_seconds": round(g["eval_seconds"], 1),
                "seconds": round(g["rounds_seconds"] + g["eval_seconds"], 1),
            }
            for name, g in groups.items()
        ]
        return sorted(rows, key=lambda r: -r["seconds"])

    in_cells = sum(c["rounds"] + c["eval"] for c in cells)
    in_cells += (carried or {}).get("cell_seconds", 0.0)
    wall = sum(float(e.get("wall_seconds", 0.0)) for e in invocations)
    return {
        "cells": len(cells) + (carried or {}).get("cells", 0),
        "cell_seconds": round(in_cells, 1),
        "wall_seconds": round(wall, 1),
        "outside_cells_seconds": round(wall - in_cells, 1) if invocations else None,
        "invocations": [{k: e.get(k) for k in INVOCATION_KEYS} for e in invocations],
        "by_task": table("task"),
        "by_phase": table("phase"),
        "by_strategy": table("strategy"),
        "carried": carried,
        "superseded": superseded or None,
        "cell_times": [[c["cell"], round(c["rounds"], 2), round(c["eval"], 2)] for c in cells],
    }


def print_summary(doc: dict[str, Any]) -> None:
    print(
        f"{doc['cells']} cells: {doc['cell_seconds']:.0f} s in rounds and evaluations; "
        f"{doc['wall_seconds']:.0f} s wall over {len(doc['invocations'])} invocation(s)"
    )
    for key in ("by_task", "by_phase", "by_strategy"):
        name = key.removeprefix("by_")
        print(f"\n| {name} | cells | rounds (s) | evaluations (s) | total (s) |")
        print("|---|---:|---:|---:|---:|")
        for r in doc[key]:
            print(
                f"| {r[name]} | {r['cells']} | {r['rounds_seconds']:.0f} | "
                f"{r['eval_seconds']:.0f} | {r['seconds']:.0f} |"
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/selection/cpu"))
    p.add_argument("--json", type=Path, default=None, help="default: OUT/suite_time.json")
    p.add_argument(
        "--note",
        action="append",
        default=[],
        help="what the figures cannot say, e.g. other work that ran beside the suite "
        "(repeatable; replaces the previous JSON's notes, which are kept without it)",
    )
    p.add_argument(
        "--superseded-before",
        default=None,
        metavar="TIME",
        help="ISO time (2026-12-07T00:00:00Z): the invocations started before it and the "
        "carried totals made records that were all run again; set aside, not counted",
    )
    a = p.parse_args(argv)
    target = a.json or a.out / "suite_time.json"
    previous = json.loads(target.read_text()) if target.exists() else None
    if not (a.out / "runs").is_dir() and previous is None:
        p.error(f"{a.out}/runs does not exist: run the suite into --out on this machine first")
    doc = summarize(a.out, previous, a.superseded_before)
    doc["notes"] = a.note or (previous or {}).get("notes", [])
    target.write_text(json.dumps(doc, indent=1) + "\n")
    print_summary(doc)
    print(f"\nwritten to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
