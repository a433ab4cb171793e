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

    [[strategies]]
    label = "poc"
    strategy = "power_of_choice"
    strategy_args = { d = 10 }

Each cell (strategy x grid point x seed) is a run folder ``OUT/runs/<setting>/<label>/seed<S>``
written exactly as ``fedjax-sel run`` writes one. Cells that differ only in their seed share
one compiled program and run together, vmapped over a leading seed axis of the whole
simulation state; a finished cell (``summary.json`` of the same configuration) is never
recomputed, and an interrupted one resumes from its checkpoint. At the end the sweep writes
``OUT/comparison.*`` (:func:`fedjax_sel.experiment.compare.compare`).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig, read_config_file
from fedjax_sel.experiment import run as run_lib
from fedjax_sel.experiment.outputs import write_json


@dataclasses.dataclass
class Cell:
    """One run of a sweep: its configuration, folder, label and setting (the non-seed grid
    values, ``""`` without a grid)."""

    config: RunConfig
    out: Path
    label: str
    setting: str = ""


@dataclasses.dataclass
class Sweep:
    """An expanded sweep: its cells and options."""

    cells: list[Cell]
    baseline: str | None = None
    seeds_together: int | str = "auto"
    source: dict[str, Any] = dataclasses.field(default_factory=dict)
    compare_options: dict[str, Any] = dataclasses.field(default_factory=dict)


# [sweep] keys passed on to compare(): extra metrics of the comparison
COMPARE_OPTIONS = ("metrics", "at_rounds", "targets", "time_targets")


def _setting_name(point: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items())


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-=._" else "_" for c in text) or "default"


def expand_sweep(spec: Mapping[str, Any], out: str | Path) -> Sweep:
    """The cells of a sweep specification (the mapping of a sweep file)."""
    unknown = set(spec) - {"sweep", "base", "grid", "strategies", "override"}
    if unknown:
        raise ConfigError(
            f"sweep: unknown section(s) {sorted(unknown)}; use sweep, base, grid, strategies "
            "(and override)"
        )
    override = dict(spec.get("override", {}))
    options = dict(spec.get("sweep", {}))
    base = dict(spec.get("base", {}))
    grid = dict(spec.get("grid", {}))
    strategies = list(spec.get("strategies") or [{}])
    bad = set(options) - {"seeds", "baseline", "seeds_together", "percent", *COMPARE_OPTIONS}
    if bad:
        raise ConfigError(f"sweep: unknown [sweep] option(s) {sorted(bad)}")
    seeds = options.get("seeds", 5)
    seeds = list(range(int(seeds))) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seeds:
        raise ConfigError("sweep: seeds must be a positive number or a non-empty list")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep: grid {key!r} must be a non-empty list, got {values!r}")
        if key in ("seed", "label"):
            raise ConfigError(f"sweep: {key!r} cannot be a grid axis (use [sweep] seeds)")
    labels = []
    for entry in strategies:
        if not isinstance(entry, Mapping):
            raise ConfigError(f"sweep: each [[strategies]] entry must be a table, got {entry!r}")
        labels.append(
            str(entry.get("label") or entry.get("strategy") or base.get("strategy") or "uniform")
        )
    if len(set(labels)) != len(labels):
        raise ConfigError(f"sweep: strategy labels must be distinct (set label=...), got {labels}")
    baseline = options.get("baseline")
    if baseline is not None and baseline not in labels:
        raise ConfigError(f"sweep: baseline {baseline!r} is not one of the strategies {labels}")
    together = options.get("seeds_together", "auto")
    if together != "auto" and not (isinstance(together, int) and together >= 1):
        raise ConfigError(f"sweep: seeds_together must be 'auto' or >= 1, got {together!r}")
    cells = []
    out = Path(out)
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, values, strict=True))
        setting = _setting_name(point)
        for label, entry in zip(labels, strategies, strict=True):
            fields = {**base, **point, **{k: v for k, v in entry.items() if k != "label"}}
            fields.update(override)
            for seed in seeds:
                config = RunConfig.from_dict(
                    {**fields, "seed": seed, "label": label}, source="sweep"
                ).validate()
                where = out / "runs" / _slug(setting) / _slug(label) / f"seed{seed}"
                cells.append(Cell(config, where, label, setting))
    for c in cells:
        c.config.resolve()
    compare_options = {k: options[k] for k in COMPARE_OPTIONS if k in options}
    for key, values in compare_options.items():
        if not isinstance(values, list):
            raise ConfigError(f"sweep: [sweep] {key} must be a list, got {values!r}")
    if "percent" in options:
        if not isinstance(options["percent"], bool):
            raise ConfigError(
                f"sweep: [sweep] percent must be true or false, got {options['percent']!r}"
            )
        compare_options["percent"] = options["percent"]
    return Sweep(cells, baseline, together, dict(spec), compare_options)


def load_sweep(path: str | Path, out: str | Path) -> Sweep:
    """Reads and expands a sweep file (TOML or JSON)."""
    return expand_sweep(read_config_file(path), out)


def memory_map_fraction() -> float | None:
    """The process's memory mappings as a share of the kernel's limit (``vm.max_map_count``);
    ``None`` where neither can be read (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps") as f:
            count = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return count / limit if limit > 0 else None


def release_compiled_programs(threshold: float = 0.5) -> bool:
    """Drops JAX's compiled programs when the process's memory mappings pass ``threshold`` of
    the kernel's limit; returns whether it did.

    XLA's CPU backend maps the machine code of every program it compiles, and JAX's caches keep
    the programs of finished cells alive. A long reproduction (hundreds of cells with different
    learning rates, each its own program) passed the default limit of 65,530 mappings, and LLVM
    then failed (``Cannot allocate memory``) and the process crashed. Between groups of cells,
    which share no program, dropping the caches costs nothing the next group would reuse."""
    fraction = memory_map_fraction()
    if fraction is None or fraction < threshold:
        return False
    import jax

    jax.clear_caches()
    gc.collect()
    return True


def run_cells(
    cells: Sequence[Cell],
    *,
    seeds_together: int | str = "auto",
    progress: bool = True,
    echo: Callable = print,
    bar: Any = None,
) -> list[run_lib.RunResult]:
    """Runs every unfinished cell (finished ones are read back): cells that share a compiled
    program run together in vmapped batches of ``seeds_together`` seeds (``"auto"``: as many
    as fit the memory, :func:`fedjax_sel.experiment.run.batch_size`). ``bar``: a progress bar
    of the caller's to advance (a suite's), instead of one of its own."""
    results: dict[int, run_lib.RunResult] = {}
    todo = []
    for i, cell in enumerate(cells):
        done = run_lib.finished_result(cell.config, cell.out)
        if done is not None:
            results[i] = done
        else:
            todo.append(i)
    if len(todo) < len(cells):
        echo(f"{len(cells) - len(todo)} of {len(cells)} cells already finished; reusing them")
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
                [cells[i].config for i in members],
                [cells[i].out for i in members],
                infos=[
                    {"sweep": {"label": cells[i].label, "setting": cells[i].setting}}
                    for i in members
                ],
                seeds_together=seeds_together,
                bar=bar,
                echo=echo,
            )
            for i, r in zip(members, out, strict=True):
                results[i] = r
            release_compiled_programs()
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
) -> list[dict[str, Any]]:
    """Runs a sweep (a :class:`Sweep`, a sweep file or its mapping) into ``out`` and compares its
    strategies; returns the comparison rows (``out/comparison.json``)."""
    from fedjax_sel.experiment.compare import compare

    out = Path(out)
    if isinstance(sweep, Mapping):
        sweep = expand_sweep(sweep, out)
    elif not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep, out)
    out.mkdir(parents=True, exist_ok=True)
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
    run_cells(sweep.cells, seeds_together=together, progress=progress, echo=echo)
    if not compare_results:
        return []
    return compare(
        runs=None,
        dirs=[out / "runs"],
        baseline=sweep.baseline or sweep.cells[0].label,
        out=out,
        echo=echo,
        **sweep.compare_options,
    )
