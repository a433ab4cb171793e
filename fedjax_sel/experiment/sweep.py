"""Sweeps: a grid of strategies x settings x seeds, the seeds of one compiled program run
together (README, "Comparing strategies").

A sweep file (TOML or JSON) has four parts::

    [sweep]
    seeds = 5                 # or a list of seeds
    baseline = "uniform"      # the strategy ``compare`` pairs the others against
    seeds_together = "auto"   # members per vmapped batch: "auto" (by memory) or a number
    time_targets = [0.85]     # optional, passed to compare: also metrics, at_rounds, targets
    percent = true            # optional: accuracies in %, differences in percentage points

    [base]                    # RunConfig fields shared by every cell
    dataset = "digits"
    rounds = 40

    [grid]                    # optional: field -> values, crossed
    num_clients = [30, 60]

    [[strategies]]            # one entry per strategy (any RunConfig fields, and a label)
    strategy = "uniform"

    [override]                # optional: set in every cell, after everything else
    rounds = 2                # (the CLI's --set rounds=2)

    [sweep.tune]              # optional: each strategy picks its own point of the grid
    metric = "final_accuracy" # chosen on this metric's mean over the tuning seeds
    seeds = 2                 # the first 2 seeds tune (or a list); the others compare
    axes = ["lr"]             # grid axes tuned (default: all of them)

    [[strategies]]
    label = "poc"
    strategy = "power_of_choice"
    strategy_args = { d = 10 }

    [[strategies]]            # a grid of the strategy's own, crossed with [grid]
    strategy = "active_fl"
    grid = { strategy_args.alpha2 = [0.01, 0.1, 1.0] }

A grid axis is a ``RunConfig`` field, ``strategy_args`` (a list of tables, merged into each
cell's) or ``strategy_args.<name>`` (the values of one strategy option). An entry's own grid is
crossed with ``[grid]``; its points are labelled ``label[axis=value,...]`` in ``comparison.*``
and, with ``[sweep.tune]``, always tuned (the other strategies need not have the option).

Each cell (strategy x grid point x seed) is a run folder ``OUT/runs/<setting>/<label>/seed<S>``
written exactly as ``fedjax-sel run`` writes one. Cells that differ only in their seed and in
traced hyperparameters (learning rates, FedProx mu: :func:`~fedjax_sel.experiment.loop.
program_key`) share one compiled program and run together, vmapped over a leading axis of the
whole simulation state; a finished cell (``summary.json`` of the same configuration) is never
recomputed, and an interrupted one resumes from its checkpoint. At the end the sweep writes
``OUT/comparison.*`` (:func:`fedjax_sel.experiment.compare.compare`; strategies paired at each
grid point) and, with ``[sweep.tune]``, ``OUT/tuning.json`` (every tuned point's score on the
tuning seeds, the chosen point per strategy) and ``OUT/tuned/comparison.*``: the chosen points
paired on the seeds that did not choose them (:func:`tuned_comparison`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig, read_config_file
from fedjax_sel.experiment import run as run_lib
from fedjax_sel.experiment.loop import finished_by_other_code
from fedjax_sel.experiment.mappings import release_if_crowded
from fedjax_sel.experiment.outdir import check_distinct_folders, claim, folder_name, owned
from fedjax_sel.experiment.outputs import SUMMARY, read_json, write_json
from fedjax_sel.experiment.resolve import Resolved, resolve
from fedjax_sel.experiment.tuning import (
    Tuning,
    best_index,
    parse_tuning,
    point_score,
    setting_name,
)
from fedjax_sel.input_checks import seed_list


@dataclasses.dataclass
class Cell:
    """One run of a sweep: its configuration, folder, label and setting (the non-seed grid
    values, ``""`` without a grid). The configuration is resolved once, when the cell is made
    (``resolved``; ``config`` becomes its canonical configuration)."""

    config: RunConfig
    out: Path
    label: str
    setting: str = ""
    point: dict[str, Any] = dataclasses.field(default_factory=dict)
    strategy: str = ""  # the [[strategies]] entry's label (label adds its own grid's point)
    own_axes: tuple[str, ...] = ()  # the axes of the entry's own grid
    resolved: Resolved = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.resolved = resolve(self.config)
        self.config = self.resolved.config

    @property
    def entry(self) -> str:
        return self.strategy or self.label


@dataclasses.dataclass
class Sweep:
    """An expanded sweep: its cells and options."""

    cells: list[Cell]
    baseline: str | None = None
    seeds_together: int | str = "auto"
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    compare_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    tuning: Tuning | None = None


# [sweep] keys passed on to compare(): extra metrics of the comparison
COMPARE_OPTIONS = ("metrics", "at_rounds", "targets", "time_targets")


def expand_sweep(spec: Mapping[str, Any], out: str | Path) -> Sweep:
    """The cells of a sweep specification (the mapping of a sweep file)."""
    unknown = set(spec) - {"sweep", "base", "grid", "strategies", "override"}
    if unknown:
        raise ConfigError(
            f"sweep: unknown section(s) {sorted(unknown)}; use sweep, base, grid, strategies "
            "(and override)"
        )
    override, options, base, grid = (
        file_table(spec, key) for key in ("override", "sweep", "base", "grid")
    )
    if not base and not spec.get("strategies"):  # an empty file is no default sweep
        raise ConfigError(
            "sweep: the file gives neither a [base] table nor [[strategies]] entries, so there "
            "is nothing to run (see examples/sweep_digits.toml)"
        )
    if not isinstance(spec.get("strategies") or [], list):
        raise ConfigError(
            f"sweep: [[strategies]] must be a list of tables, got {spec['strategies']!r}"
        )
    strategies = list(spec.get("strategies") or [{}])
    bad = set(options) - {
        "seeds",
        "baseline",
        "seeds_together",
        "percent",
        "tune",
        *COMPARE_OPTIONS,
    }
    if bad:
        raise ConfigError(f"sweep: unknown [sweep] option(s) {sorted(bad)}")
    seeds = seed_list(options.get("seeds", 5), "sweep: [sweep] seeds")
    grid = grid_axes(grid, "[grid]")
    labels, own_grids = [], []
    for entry in strategies:
        if not isinstance(entry, Mapping):
            raise ConfigError(f"sweep: each [[strategies]] entry must be a table, got {entry!r}")
        labels.append(
            str(entry.get("label") or entry.get("strategy") or base.get("strategy") or "uniform")
        )
        own = grid_axes(entry.get("grid") or {}, f"strategy {labels[-1]!r} grid")
        clash = sorted(set(own) & set(grid))
        if clash:
            raise ConfigError(
                f"sweep: strategy {labels[-1]!r} grids {clash}, which [grid] already varies"
            )
        own_grids.append(own)
    if len(set(labels)) != len(labels):
        raise ConfigError(f"sweep: strategy labels must be distinct (set label=...), got {labels}")
    baseline = options.get("baseline")
    if baseline is not None and baseline not in labels:
        raise ConfigError(f"sweep: baseline {baseline!r} is not one of the strategies {labels}")
    if own_grids[labels.index(baseline) if baseline is not None else 0]:
        raise ConfigError(
            f"sweep: the baseline {baseline or labels[0]!r} has a grid of its own; every point "
            "is paired against one baseline, so give it fixed values (or tune it on [grid])"
        )
    together = check_together(options.get("seeds_together", "auto"))
    rows = []
    out = Path(out)
    for point in _points(grid):
        setting = setting_name(point)
        for label, entry, own in zip(labels, strategies, own_grids, strict=True):
            entry_fields = {k: v for k, v in entry.items() if k not in ("label", "grid")}
            for own_point in _points(own):
                full = {**point, **own_point}
                name = f"{label}[{setting_name(own_point)}]" if own_point else label
                fields = {**base, **_fields_of(full), **entry_fields}
                fields["strategy_args"] = _merged_args(base, full, entry, label)
                fields.update(override)
                for seed in seeds:
                    config = RunConfig.from_dict(
                        {**fields, "seed": seed, "label": name}, source="sweep"
                    ).validate()
                    where = out / "runs" / folder_name(setting) / folder_name(name) / f"seed{seed}"
                    rows.append((config, where, name, setting, full, label, tuple(own)))
    check_distinct_folders([r[3] for r in rows], "sweep: grid settings")
    check_distinct_folders([r[2] for r in rows], "sweep: strategy labels")
    cells = [Cell(*r) for r in rows]  # each configuration resolved (and checked) here
    compare_options = {k: options[k] for k in COMPARE_OPTIONS if k in options}
    for key, values in compare_options.items():
        if not isinstance(values, list):
            raise ConfigError(f"sweep: [sweep] {key} must be a list, got {values!r}")
        for v in values:  # checked now, not by the comparison after every cell has run
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if key == "metrics" and not isinstance(v, str):
                raise ConfigError(f"sweep: [sweep] metrics holds {v!r}, not a metric name")
            if key == "at_rounds" and not (number and v == int(v) and v >= 1):
                raise ConfigError(f"sweep: [sweep] at_rounds holds {v!r}, not a round >= 1")
            if key in ("targets", "time_targets") and not (number and 0 < v <= 1):
                raise ConfigError(f"sweep: [sweep] {key} holds {v!r}, not an accuracy in (0, 1]")
    if "percent" in options:
        if not isinstance(options["percent"], bool):
            raise ConfigError(
                f"sweep: [sweep] percent must be true or false, got {options['percent']!r}"
            )
        compare_options["percent"] = options["percent"]
    tuning = None
    if "tune" in options:
        tuning = parse_tuning(options["tune"], grid, seeds, own=any(own_grids))
    return Sweep(cells, baseline, together, dict(spec), compare_options, tuning)


def file_table(spec: Mapping[str, Any], key: str, kind: str = "sweep") -> dict[str, Any]:
    """The ``[key]`` table of a sweep (or suite: ``kind``) file (empty when absent)."""
    value = spec.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{kind}: [{key}] must be a table, got {value!r}")
    return dict(value)


def check_together(value: Any, kind: str = "sweep") -> int | str:
    """A file's ``seeds_together``: ``"auto"`` or a whole number >= 1 (``true`` is none)."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if value != "auto" and not (whole and value >= 1):
        raise ConfigError(f"{kind}: seeds_together must be 'auto' or >= 1, got {value!r}")
    return value


def grid_axes(grid: Any, where: str) -> dict[str, list]:
    """The axes of a grid table: ``field -> values``; ``strategy_args`` either a list of
    tables or a table ``name -> values`` (axes ``strategy_args.<name>``)."""
    if not isinstance(grid, Mapping):
        raise ConfigError(f"sweep: {where} must be a table of field -> values, got {grid!r}")
    axes = {}
    for key, values in grid.items():
        if key == "strategy_args" and isinstance(values, Mapping):
            axes.update(grid_axes({f"strategy_args.{k}": v for k, v in values.items()}, where))
            continue
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep: {where} {key!r} must be a non-empty list, got {values!r}")
        if key in ("seed", "label", "grid"):
            raise ConfigError(f"sweep: {key!r} cannot be a grid axis (use [sweep] seeds)")
        axes[key] = list(values)
    return axes


def _points(axes: Mapping[str, list]) -> list[dict[str, Any]]:
    """The crossed points of ``axes``, in grid order (one empty point without axes)."""
    keys = list(axes)
    return [dict(zip(keys, v, strict=True)) for v in itertools.product(*axes.values())]


def _fields_of(point: Mapping[str, Any]) -> dict[str, Any]:
    """The RunConfig fields a grid point sets (its strategy options go to _merged_args)."""
    return {k: v for k, v in point.items() if not k.startswith("strategy_args")}


def _merged_args(
    base: Mapping[str, Any], point: Mapping[str, Any], entry: Mapping[str, Any], label: str
) -> dict[str, Any]:
    """A cell's ``strategy_args``: the base's, the grid point's (a grid over strategy
    hyperparameters: ``strategy_args`` tables and ``strategy_args.<name>`` values) and the
    strategy entry's merged key by key; a key the grid and the entry both set is refused (the
    entry would silently undo the grid)."""
    for t, where in ((base, "[base]"), (point, "[grid]"), (entry, f"strategy {label!r}")):
        if not isinstance(t.get("strategy_args") or {}, Mapping):
            raise ConfigError(
                f"sweep: {where} strategy_args must be a table, got {t['strategy_args']!r}"
            )
    from_grid = dict(point.get("strategy_args") or {})
    by_name = {k.split(".", 1)[1]: v for k, v in point.items() if k.startswith("strategy_args.")}
    twice = sorted(set(from_grid) & set(by_name))
    if twice:
        raise ConfigError(
            f"sweep: strategy {label!r}: the grids set strategy_args {twice} twice "
            "(a strategy_args table and a strategy_args.<name> axis)"
        )
    from_grid.update(by_name)
    tables = [
        dict(base.get("strategy_args") or {}),
        from_grid,
        dict(entry.get("strategy_args") or {}),
    ]
    both = sorted(set(tables[1]) & set(tables[2]))
    if both:
        raise ConfigError(
            f"sweep: strategy {label!r} sets strategy_args {both}, which the grid varies; "
            "leave them to the grid"
        )
    return {**tables[0], **tables[1], **tables[2]}


def load_sweep(path: str | Path, out: str | Path) -> Sweep:
    """Reads and expands a sweep file (TOML or JSON)."""
    return expand_sweep(read_config_file(path), out)


def tuned_comparison(sweep: Sweep, out: str | Path, echo: Callable = print) -> dict[str, Any]:
    """The tuned comparison of a finished sweep with ``[sweep.tune]``.

    Per strategy and per setting of the untuned axes, every point of the tuned axes (and of
    the strategy's own grid) is scored
    by the mean of ``metric`` over the tuning seeds (a run without the metric, e.g. diverged,
    scores worst) and the best point is chosen (ties: the first in grid order). The chosen
    points are then compared, paired by seed against the baseline, on the remaining seeds only:
    no number of the comparison was seen by the choice. Writes ``OUT/tuning.json`` and
    ``OUT/tuned/comparison.*``; returns the tuning record (with the comparison ``rows``).
    """
    from fedjax_sel.experiment.compare import Run, compare, metric_value
    from fedjax_sel.experiment.metric_table import higher_is_better
    from fedjax_sel.experiment.outputs import METRICS, SUMMARY, read_json, read_metrics

    tuning = sweep.tuning
    if tuning is None:
        raise ConfigError("sweep: no [sweep.tune] section")
    out = Path(out)
    better = higher_is_better(tuning.metric)

    def tuned_axes(cell: Cell) -> tuple[str, ...]:
        return (*tuning.axes, *cell.own_axes)

    def rest_of(cell: Cell) -> str:
        return setting_name({k: v for k, v in cell.point.items() if k not in tuned_axes(cell)})

    def tuned_of(cell: Cell) -> dict[str, Any]:
        return {k: cell.point[k] for k in tuned_axes(cell)}

    def run_of(cell: Cell, setting: str) -> Run:
        return Run(
            cell.out,
            cell.entry,
            setting,
            cell.config.seed,
            read_json(cell.out / SUMMARY),
            read_metrics(cell.out / METRICS),
        )

    scores: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for cell in sweep.cells:
        if cell.config.seed not in tuning.seeds:
            continue
        tuned = tuned_of(cell)
        entry = scores.setdefault((cell.entry, rest_of(cell)), {}).setdefault(
            setting_name(tuned), {"point": tuned, "values": {}}
        )
        entry["values"][cell.config.seed] = metric_value(run_of(cell, ""), tuning.metric)
    choices = []
    for (label, setting), points in scores.items():
        for entry in points.values():
            entry["score"] = point_score(list(entry["values"].values()))
        best = list(points.values())[best_index([e["score"] for e in points.values()], better)]
        choices.append(
            {
                "strategy": label,
                "setting": setting,
                "chosen": best["point"],
                "score": best["score"],
                "points": [
                    {
                        "point": e["point"],
                        "score": e["score"],
                        "values": {str(k): v for k, v in e["values"].items()},
                    }
                    for e in points.values()
                ],
            }
        )
    chosen = {(c["strategy"], c["setting"]): c["chosen"] for c in choices}
    runs = [
        run_of(cell, rest_of(cell))
        for cell in sweep.cells
        if cell.config.seed not in tuning.seeds
        and tuned_of(cell) == chosen[(cell.entry, rest_of(cell))]
    ]
    if any(c.config.data_seed is not None for c in sweep.cells):
        echo(
            "tuning note: a fixed data_seed gives every seed the same test set, so the choice "
            "has seen the data the comparison reports; let the data seed follow the seed for a "
            "clean hold-out"
        )
    for c in choices:
        where = f" ({c['setting']})" if c["setting"] else ""
        echo(
            f"tuned {c['strategy']}{where}: {setting_name(c['chosen'])} "
            f"({tuning.metric} {c['score']} on seeds {list(tuning.seeds)})"
        )
    rows = compare(
        runs=runs,
        baseline=sweep.baseline or sweep.cells[0].label,
        out=out / "tuned",
        echo=echo,
        **sweep.compare_options,
    )
    record = {
        "metric": tuning.metric,
        "higher_is_better": better,
        "axes": list(tuning.axes),
        "tuning_seeds": list(tuning.seeds),
        "held_out_seeds": sorted({c.config.seed for c in sweep.cells} - set(tuning.seeds)),
        "choices": choices,
    }
    write_json(out / "tuning.json", record)
    return {**record, "rows": rows}


def run_cells(
    cells: Sequence[Cell],
    *,
    seeds_together: int | str = "auto",
    progress: bool = True,
    echo: Callable = print,
    bar: Any = None,
    overwrite: bool = False,
    data_memo: MutableMapping[str, Any] | None = None,
    plots: bool = True,
) -> list[run_lib.RunResult]:
    """Runs every unfinished cell (finished ones are read back): cells that share a compiled
    program run together in vmapped batches of ``seeds_together`` seeds (``"auto"``: as many
    as fit the memory, :func:`fedjax_sel.experiment.run.batch_size`). ``bar``: a progress bar
    of the caller's to advance (a suite's), instead of one of its own. ``data_memo`` and
    ``plots``: as :func:`fedjax_sel.experiment.run.run_group`'s.

    A cell whose folder holds results of another configuration is refused before anything
    runs (:class:`~fedjax_sel.base.ConfigError`), unless ``overwrite``: then those results
    are removed and the cell recomputed."""
    results: dict[int, run_lib.RunResult] = {}
    todo, other_code = [], 0
    for i, cell in enumerate(cells):
        done = run_lib.finished_result(cell.config, cell.out)
        if done is not None:
            results[i] = done
        else:
            todo.append(i)
            other_code += bool(finished_by_other_code(cell.config, cell.out))
    claim(
        [(cells[i].out, cells[i].config.results_key()) for i in todo],
        f"{len(todo)} cells",
        overwrite=overwrite,
        echo=echo,
    )
    if len(todo) < len(cells):
        echo(f"{len(cells) - len(todo)} of {len(cells)} cells already finished; reusing them")
    if other_code:
        echo(
            f"{other_code} of {len(cells)} cells were finished by other code (their config.json "
            "records another source digest, or none): recomputed, not mixed with this code's"
        )
    groups: dict[str, list[int]] = {}
    for i in todo:
        groups.setdefault(run_lib.program_key(cells[i].config), []).append(i)
    own_bar = bar is None
    if bar is not None:
        bar.update(sum(cells[i].config.rounds for i in range(len(cells)) if i not in todo))
    elif progress and todo:
        from tqdm.auto import tqdm

        total = sum(cells[i].config.rounds for i in todo)
        bar = tqdm(total=total, desc="sweep", unit="round")
    try:
        for members in groups.values():
            out = run_lib.run_group(
                [cells[i].resolved for i in members],
                [cells[i].out for i in members],
                infos=[
                    {"sweep": {"label": cells[i].label, "setting": cells[i].setting}}
                    for i in members
                ],
                seeds_together=seeds_together,
                bar=bar,
                echo=echo,
                data_memo=data_memo,
                plots=plots,
            )
            for i, r in zip(members, out, strict=True):
                results[i] = r
            release_if_crowded(echo=echo)
    finally:
        if bar is not None and own_bar:
            bar.close()
    return [results[i] for i in range(len(cells))]


def run_sweep(
    sweep: Sweep | Mapping[str, Any] | str | Path,
    out: str | Path,
    *,
    seeds_together: int | str | None = None,
    progress: bool = True,
    echo: Callable = print,
    compare_results: bool = True,
    overwrite: bool = False,
) -> list[dict[str, Any]]:
    """Runs a sweep (a :class:`Sweep`, a sweep file or its mapping) into ``out`` and compares its
    strategies; returns the comparison rows (``out/comparison.json``).

    ``out`` is locked while the sweep writes (:mod:`.outdir`: a second writer is refused); a
    cell folder holding another configuration's results is refused unless ``overwrite``; the
    comparison reads this sweep's cells only (other folders under ``out/runs`` are left out)."""
    out = Path(out)
    if isinstance(sweep, Mapping):
        sweep = expand_sweep(sweep, out)
    elif not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep, out)
    with owned(out, echo):
        return _run_sweep(sweep, out, seeds_together, progress, echo, compare_results, overwrite)


def _run_sweep(
    sweep: Sweep,
    out: Path,
    seeds_together: int | str | None,
    progress: bool,
    echo: Callable,
    compare_results: bool,
    overwrite: bool,
) -> list[dict[str, Any]]:
    from fedjax_sel.experiment.compare import compare

    write_json(
        out / "sweep.json",
        {
            "source": sweep.source,
            "cells": [
                {"label": c.label, "setting": c.setting, "seed": c.config.seed, "out": str(c.out)}
                for c in sweep.cells
            ],
        },
    )
    together = seeds_together if seeds_together is not None else sweep.seeds_together
    run_cells(
        sweep.cells, seeds_together=together, progress=progress, echo=echo, overwrite=overwrite
    )
    if not compare_results:
        return []
    rows = compare(
        runs=None,
        dirs=[c.out for c in sweep.cells],
        baseline=sweep.baseline or sweep.cells[0].label,
        out=out,
        echo=echo,
        **sweep.compare_options,
    )
    if sweep.tuning is not None:
        echo("\ntuned comparison (each strategy at its chosen point, on held-out seeds):")
        tuned_comparison(sweep, out, echo=echo)
    return rows


def diverged_cells(out: str | Path) -> list[str]:
    """The cells of the sweep written to ``out`` (its ``sweep.json``) whose run diverged, each
    named ``label (setting) seed S``: the comparison leaves them out and counts them, and
    ``fedjax-sel sweep`` exits with status 3 when there are any (unless ``--allow-diverged``)."""
    from fedjax_sel.experiment.compare import sweep_cell_folders

    out = Path(out)
    names = []
    cells = read_json(out / "sweep.json").get("cells", [])
    for cell, folder in zip(cells, sweep_cell_folders(out) or [], strict=True):
        summary = folder / SUMMARY
        if summary.exists() and read_json(summary).get("diverged"):
            setting = f" ({cell['setting']})" if cell.get("setting") else ""
            names.append(f"{cell['label']}{setting} seed {cell['seed']}")
    return names
