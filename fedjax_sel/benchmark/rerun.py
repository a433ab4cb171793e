"""Rerunning one recorded cell of a suite (``fedjax-sel suite FILE --out DIR --rerun
TASK/SCENARIO/STRATEGY --seed S``), to check that its record is what the code computes.

A per-seed record holds the cell's whole configuration, its batch (the members vmapped with it)
and the client parallelism it ran with (:func:`fedjax_sel.experiment.records.cell_execution`).
A run's last float bits can depend on its batch and on the data of the members it ran beside
(the batch is padded to the largest of them, and XLA's reductions take the batch's shape), so
the rerun runs the cell's whole program group again as the suite ran it: the records of the
same phase, scenario and strategy that share its compiled program (the seeds, and in tuning the
learning rates), in the suite's order, in batches of the recorded size, with the recorded
parallelism. Nothing is written; the cell's metrics are compared with its record, value by
value, exactly.

The bits also depend on what XLA compiled the code for: the record names its CPU target
(``cpu_target``: vendor, family, model and vector extensions,
:func:`fedjax_sel.experiment.provenance.cpu_code_target`), and a rerun on another target (an
AVX-512 machine's record rerun on an AVX2 one, say) may differ in the last bits and, through a
selection or an accuracy that hangs on them, visibly. The result says whether the targets
match (``same_target``: ``None`` for a record that does not name its target, made before
records did), and a difference on another target is reported as such, not as a wrong record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark.cells import cell_metrics, cell_series
from fedjax_sel.benchmark.suite import Suite
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.loop import program_key
from fedjax_sel.experiment.provenance import cpu_code_target
from fedjax_sel.experiment.records import Store
from fedjax_sel.experiment.run import run_group
from fedjax_sel.experiment.tuning import Point


def parse_cell(cell: str, suite: Suite) -> tuple[str, str, str]:
    """``TASK/SCENARIO/STRATEGY`` -> its three names, each checked against the suite."""
    parts = cell.split("/")
    if len(parts) != 3 or not all(parts):
        raise ConfigError(f"--rerun takes TASK/SCENARIO/STRATEGY, got {cell!r}")
    task, scenario, strategy = parts
    for name, known, what in (
        (task, [t.name for t in suite.tasks], "task"),
        (scenario, [s.name for s in suite.scenarios], "scenario"),
        (strategy, [e.label for e in suite.strategies], "strategy"),
    ):
        if name not in known:
            raise ConfigError(f"--rerun: {name!r} is not a {what} of the suite ({known})")
    return task, scenario, strategy


def _order(suite: Suite, record: dict[str, Any], grid: list[Point]) -> tuple[int, int]:
    """Where a record's cell stood in the suite's plan (tuning: its grid point, learning rate
    then knobs, then seed; an extension's one point comes after the grid)."""

    def position(values: Sequence[Any], value: Any) -> int:
        return list(values).index(value) if value in values else len(values)

    if record["phase"] == "tune":
        knobs = record.get("knobs") or {}
        names = [k for p in grid[:1] for k, _ in p[1]]  # the grid's knob order
        point = (record.get("lr"), tuple((k, knobs[k]) for k in names if k in knobs))
        return position(grid, point), position(suite.tuning.seeds, record["seed"])
    return 0, position(suite.seeds, record["seed"])


def rerun_cell(
    suite: Suite,
    out: str | Path,
    cell: str,
    seed: int,
    *,
    lr: float | None = None,
    knobs: dict[str, float] | None = None,
    echo: Callable = print,
) -> dict[str, Any]:
    """Reruns the recorded cell ``cell`` (``TASK/SCENARIO/STRATEGY``) of seed ``seed`` (a tuning
    cell with ``lr``, and ``knobs`` where the strategy tunes some) from ``out``'s records (see
    the module docstring). Returns ``recorded`` and ``rerun`` metrics (the cost series as
    ``series:NAME``) and ``differs``, those whose values are not identical; ``recorded_on``
    and ``rerun_on``, the CPU targets of the record (``None`` where it names none) and of this
    machine, and ``same_target``, whether they are the same (``None``: not known)."""
    task_name, scenario, strategy = parse_cell(cell, suite)
    task = next(t for t in suite.tasks if t.name == task_name)
    path = Path(out) / "per_seed" / f"{task_name}.json"
    if not path.exists():
        raise ConfigError(f"--rerun: {str(path)!r} does not exist; run the suite into --out first")
    store = Store(path)
    ident = {"phase": "eval" if lr is None else "tune", "scenario": scenario}
    if knobs and lr is None:
        raise ConfigError("--rerun: --knob names a tuning cell's knob; give its --lr too")
    ident.update(strategy=strategy, seed=seed, lr=lr, knobs=knobs or None)
    record = store.records.get(Store.id(ident))
    if record is None:
        same = sorted(
            Store.id(r)
            for r in store.records.values()
            if (r["scenario"], r["strategy"]) == (scenario, strategy)
        )
        raise ConfigError(
            f"--rerun: {str(path)!r} has no record {Store.id(ident)!r}; it has {same or 'none'} "
            "for that scenario and strategy (a tuning cell needs --lr, and --knob NAME=VALUE "
            "for each knob its strategy tunes)"
        )
    if "config" not in record:
        raise ConfigError(
            f"--rerun: the record {Store.id(ident)!r} predates records that keep their "
            "configuration and batch; run the suite into a new --out to rerun its cells"
        )
    target = RunConfig.from_dict(record["config"])
    key = program_key(target)
    group = [
        r
        for r in store.records.values()
        if (r["phase"], r["scenario"], r["strategy"]) == (ident["phase"], scenario, strategy)
        and "config" in r
        and r.get("step", 0) == record.get("step", 0)  # a grid's extension ran on its own
        and program_key(RunConfig.from_dict(r["config"])) == key
    ]
    entry = next(e for e in suite.strategies if e.label == strategy)
    grid = suite.tuning_grid(task, entry)
    group.sort(key=lambda r: _order(suite, r, grid))
    configs = [
        RunConfig.from_dict(r["config"]).replace(parallel=r.get("parallel") or target.parallel)
        for r in group
    ]
    size = int(record.get("batch", {}).get("size") or 1)
    echo(
        f"rerunning {Store.id(ident)} with its program group ({len(group)} cells, batches of "
        f"{size}, parallel {configs[0].parallel})"
    )
    results = run_group(configs, [None] * len(configs), seeds_together=size, echo=echo)
    i = next(j for j, r in enumerate(group) if r is record)
    metrics = cell_metrics(results[i].evals, results[i].summary, configs[i], task)
    # the cost series compared column by column, beside the metrics
    metrics |= {f"series:{k}": v for k, v in cell_series(results[i].evals).items()}
    recorded = record["metrics"] | {f"series:{k}": v for k, v in record.get("series", {}).items()}
    differs = sorted(k for k in set(recorded) | set(metrics) if recorded.get(k) != metrics.get(k))
    recorded_on, rerun_on = record.get("cpu_target"), cpu_code_target()
    return {
        "cell": Store.id(ident),
        "recorded": recorded,
        "rerun": metrics,
        "differs": differs,
        "recorded_on": recorded_on,
        "rerun_on": rerun_on,
        "same_target": None if recorded_on is None else recorded_on == rerun_on,
    }


def print_rerun(result: dict[str, Any], echo: Callable = print) -> None:
    """The recorded and rerun metrics side by side, and the verdict."""
    recorded, rerun = result["recorded"], result["rerun"]
    names = sorted(set(recorded) | set(rerun))
    width = max(len(n) for n in names) if names else 6
    echo(f"{'metric'.ljust(width)}  {'recorded':>22}  {'rerun':>22}")

    def shown(v: Any) -> str:  # a series by its length and last value
        return f"{len(v)} values, last {v[-1]:g}" if isinstance(v, list) and v else str(v)

    for n in names:
        mark = "" if n not in result["differs"] else "  differs"
        echo(f"{n.ljust(width)}  {shown(recorded.get(n)):>22}  {shown(rerun.get(n)):>22}{mark}")
    if result["differs"]:
        echo(f"{result['cell']}: {len(result['differs'])} metric(s) differ from the record")
        same = result.get("same_target")
        if same is False:
            echo(
                f"the record was made on another CPU target ({result['recorded_on']}; this "
                f"machine: {result['rerun_on']}): XLA's code, and so the last bits, can differ "
                "between them; rerun it on a machine of the record's target"
            )
        elif same is None:
            echo(
                "the record does not name the CPU target it was made on (records before "
                "2026-12-08; invocations.json lists the suite's machines); on another target "
                f"than this machine's ({result['rerun_on']}) the last bits can differ"
            )
    else:
        echo(f"{result['cell']}: every metric equals its record, bit for bit")
