"""The selection benchmark's cost curves and its rankings at equal client updates (issue 54),
from the per-seed records alone (``OUT/per_seed/<task>.json``: each evaluation record's
``series``, :func:`~fedjax_sel.benchmark.cells.cell_series`).

**Cost curves** (``cost_curves.json``, ``cost_curves_<task>.png``): per task, scenario, track
and strategy, test accuracy against each cost axis (:data:`AXES`: cumulative client updates,
uploaded bytes, client FLOPs and, where the scenario has a clock, simulated seconds). Each
seed's curve is a step function, the accuracy *held* at cost ``x``: that of its last
evaluation made at a cost at or below ``x`` (:func:`~.cells.held_accuracy`, what a run stopped
at ``x`` reports; beyond the run's last evaluation it holds its final accuracy, having spent no
more). Before a seed's first evaluation it has **no value** (``None``; nothing was measured:
``update_auc`` counts that stretch as 0, the curves leave it blank). At each point of a common
grid the curve is the mean over the evaluation seeds with its 95% Student-t interval, given
only where every seed recorded on that axis holds a value (``None`` elsewhere, so a band never
averages a subset of seeds). The grid: :data:`POINTS` evenly spaced points from 0 to the
baseline's median final total on that axis in that task and scenario (the median over its
seeds; when the baseline has no records there, the median over every plotted seed), so every
strategy is read at the costs the baseline spent: a reference that spends more (``full``) is
cut at them. The figures show the ranked track (rows: scenarios; columns: cost axes; a line
and band per strategy, references dashed).

**Rankings at equal client updates** (:func:`~.leaderboard.budget_rankings`, ``leaderboard.json``'s
``budget_rankings``): the mean rank over (task, scenario) cells of the ranked track's
strategies, as :func:`~fedjax_sel.benchmark.leaderboard.rank` computes it, on ``update_auc``
(mean accuracy held over ``[0, B]`` client updates) and on ``accuracy@updates:B``, ``B`` each
task's largest update budget (a task without update budgets is left out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.benchmark.cells import held_accuracy, per_seed
from fedjax_sel.benchmark.suite import Suite, Task
from fedjax_sel.benchmark.tracks import track_entries
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.outputs import save_figure, subplots, write_json
from fedjax_sel.experiment.records import Store, task_store
from fedjax_sel.experiment.stats import LEVEL, mean_ci

# the cost axes (series columns) and how the figures name them
AXES = {
    "client_updates": "client updates",
    "uplink_bytes": "uplink bytes",
    "client_flops": "client FLOPs",
    "sim_seconds": "simulated seconds",
}
POINTS = 50  # grid points per axis, 0 included


def figure_name(task: str) -> str:
    """The cost-curve figure of ``task``: ``cost_curves_<task>.png``."""
    return f"cost_curves_{folder_name(task)}.png"


# ----------------------------------------------------------------------------- curves
def held_curve(
    xs: Sequence[float | None], accuracies: Sequence[float | None], grid: Sequence[float]
) -> list[float | None]:
    """One seed's held accuracy at each cost of ``grid`` (``xs``: its cumulative cost at each
    evaluation; an evaluation without a cost is skipped): ``None`` before its first
    evaluation."""
    pairs = [(x, a) for x, a in zip(xs, accuracies, strict=True) if x is not None]
    costs, values = [x for x, _ in pairs], [a for _, a in pairs]
    return [held_accuracy(costs, values, float(g)) for g in grid]


def band(
    curves: Sequence[Sequence[float | None]],
) -> tuple[list[float | None], list[float | None], list[float | None]]:
    """The mean over seeds (``curves``: one held curve per seed on a common grid) and its 95%
    Student-t interval at each grid point; ``None`` where any seed has no value, and bounds
    ``None`` with a single seed."""
    points = [
        (None, None, None) if any(v is None for v in column) else mean_ci(list(column), LEVEL)
        for column in zip(*curves, strict=True)
    ]
    means, lows, highs = (list(c) for c in zip(*points, strict=True)) if points else ([], [], [])
    return means, lows, highs


def _series(records: Mapping[int, Mapping[str, Any]], axis: str) -> dict[int, dict]:
    """The seeds whose record has a series on ``axis``, with that series."""
    out = {}
    for seed, r in records.items():
        s = r.get("series") or {}
        if s.get(axis) and s.get("test_accuracy"):
            out[seed] = s
    return out


def _final(series: Mapping[str, Sequence[float | None]], axis: str) -> float | None:
    done = [x for x in series[axis] if x is not None]
    return done[-1] if done else None


def grid_end(
    base: Mapping[int, Mapping[str, Any]],
    others: Iterable[Mapping[int, Mapping[str, Any]]],
    axis: str,
    baseline: str,
) -> tuple[float | None, str]:
    """Where a cost axis's grid ends, and whose seeds set it: the median final total of the
    baseline's seeds (``base``), else of every seed of ``others``; ``None`` when no seed
    records the axis or the median is not positive."""
    ends, end_from = [_final(s, axis) for s in _series(base, axis).values()], baseline
    if not any(v is not None for v in ends):
        ends = [_final(s, axis) for r in others for s in _series(r, axis).values()]
        end_from = "all"
    ends = [v for v in ends if v is not None]
    end = float(np.median(ends)) if ends else None
    return (end if end is not None and end > 0 else None), end_from


def task_panels(suite: Suite, task: Task, store: Store) -> list[dict[str, Any]]:
    """The cost curves of one task (module doc): a panel per scenario and cost axis with
    records, each with its grid and a line per track and applicable strategy."""
    panels = []
    for scenario in suite.scenarios:
        lines = [
            (track, e)
            for track in suite.tracks
            for e in track_entries(suite.strategies, track)
            if e.reason(task.name, scenario.name) is None
        ]
        records = {e.label: per_seed(store, scenario.name, e.label, suite.seeds) for _, e in lines}
        base = per_seed(store, scenario.name, suite.baseline, suite.seeds)
        for axis in AXES:
            end, end_from = grid_end(base, records.values(), axis, suite.baseline)
            if end is None:
                continue
            grid = np.linspace(0.0, end, POINTS)
            drawn = []
            for track, e in lines:
                seeds = _series(records[e.label], axis)
                if not seeds:
                    continue
                held = [held_curve(s[axis], s["test_accuracy"], grid) for s in seeds.values()]
                mean, lo, hi = band(held)
                drawn.append(
                    {
                        "strategy": e.label,
                        "track": track,
                        "reference": e.reference,
                        "seeds": sorted(seeds),
                        "mean": mean,
                        "ci_low": lo,
                        "ci_high": hi,
                    }
                )
            if drawn:
                panels.append(
                    {
                        "task": task.name,
                        "scenario": scenario.name,
                        "axis": axis,
                        "end": end,
                        "end_from": end_from,
                        "grid": grid.tolist(),
                        "lines": drawn,
                    }
                )
    return panels


def build(suite: Suite, out: str | Path) -> dict[str, Any] | None:
    """``cost_curves.json``'s document from ``out/per_seed/*.json`` (module doc), or ``None``
    when no evaluation record has a series."""
    panels = []
    for task in suite.tasks:
        panels += task_panels(suite, task, task_store(Path(out), task.name))
    if not panels:
        return None
    return {
        "suite": suite.name,
        "baseline": suite.baseline,
        "ranked_track": suite.tracks[0],
        "points": POINTS,
        "level": LEVEL,
        "grid": f"{POINTS} evenly spaced costs from 0 to the baseline's median final total on "
        "the axis ('end_from': the strategy whose seeds set it, 'all' when the baseline has "
        "none there)",
        "held": "the accuracy of the last evaluation at or below the cost; none before the "
        "first; mean and 95% Student-t interval over the seeds, only where every seed holds one",
        "axes": AXES,
        "panels": panels,
    }


# ----------------------------------------------------------------------------- pictures
def plot_task(doc: Mapping[str, Any], task: str, path: Path) -> Path | None:
    """The cost curves of ``task`` on the ranked track: rows scenarios, columns cost axes,
    a line per strategy with its 95% band, references dashed."""
    track = doc["ranked_track"]
    panels = [p for p in doc["panels"] if p["task"] == task]
    scenarios = list(dict.fromkeys(p["scenario"] for p in panels))
    axes_names = [a for a in doc["axes"] if any(p["axis"] == a for p in panels)]
    if not panels:
        return None
    labels = list(
        dict.fromkeys(ln["strategy"] for p in panels for ln in p["lines"] if ln["track"] == track)
    )
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    fig, axes = subplots(
        len(scenarios),
        len(axes_names),
        figsize=(4.2 * len(axes_names), 3.4 * len(scenarios)),
        squeeze=False,
    )
    for i, scenario in enumerate(scenarios):
        for j, axis in enumerate(axes_names):
            ax = axes[i][j]
            panel = next(
                (p for p in panels if (p["scenario"], p["axis"]) == (scenario, axis)), None
            )
            ax.set_title(f"{task} / {scenario}", fontsize=9)
            ax.set_xlabel(doc["axes"][axis])
            if panel is None:
                ax.text(0.5, 0.5, "not recorded (no clock)", ha="center", va="center",
                        transform=ax.transAxes, fontsize=8)  # fmt: skip
                ax.set_xticks([]), ax.set_yticks([])
                continue
            _draw(ax, panel, track, colours)
            ax.set_ylabel("test accuracy (%)")
            ax.grid(alpha=0.3)
    legend: dict[str, Any] = {}  # label -> handle, once each
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(n, h)
    names = list(legend)
    if names:
        fig.legend(list(legend.values()), names, loc="lower center", ncol=min(6, len(names)),
                   fontsize=7)  # fmt: skip
    fig.suptitle(
        f"{task}: accuracy held at equal cost, {track} track (mean and 95% t-interval over "
        "seeds; dashed: references)",
        fontsize=10,
    )
    rows = len(scenarios)
    fig.tight_layout(rect=(0, 0.04 + 0.02 * (len(names) // 6), 1, 1 - 0.05 / rows))
    return save_figure(fig, path, dpi=110)


def _draw(ax: Any, panel: Mapping[str, Any], track: str, colours: Mapping[str, str]) -> None:
    xs = np.asarray(panel["grid"])
    for line in (ln for ln in panel["lines"] if ln["track"] == track):

        def arr(key: str, line: Mapping[str, Any] = line) -> np.ndarray:
            return 100 * np.array([np.nan if v is None else v for v in line[key]], float)

        colour = colours[line["strategy"]]
        ax.plot(xs, arr("mean"), ls="--" if line["reference"] else "-", color=colour, lw=1.2,
                label=line["strategy"], drawstyle="steps-post")  # fmt: skip
        ax.fill_between(xs, arr("ci_low"), arr("ci_high"), color=colour, alpha=0.15, lw=0,
                        step="post")  # fmt: skip
    ax.set_xlim(0.0, panel["end"])  # from 0: the stretch before a first evaluation shows
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))


def write(suite: Suite, out: str | Path) -> dict[str, Any] | None:
    """Writes ``cost_curves.json`` and ``cost_curves_<task>.png`` for each task with curves;
    nothing (and ``None``) when no record has a series."""
    out = Path(out)
    doc = build(suite, out)
    if doc is None:
        return None
    write_json(out / "cost_curves.json", doc)
    for task in dict.fromkeys(p["task"] for p in doc["panels"]):
        plot_task(doc, task, out / figure_name(task))
    return doc


def curve_tasks(suite: Suite, stores: Mapping[str, Store]) -> list[str]:
    """The tasks that get a cost-curve figure (those with a panel), in suite order."""
    return [t.name for t in suite.tasks if task_panels(suite, t, stores[t.name])]
