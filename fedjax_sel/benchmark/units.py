"""A unit of a suite's work run and recorded: the cells of one compiled program (a strategy's
tuning grid on a task, or its evaluation seeds in one scenario) that have no matching record,
run together and recorded at once; shared by every executor (:mod:`.suite_run` here and in
shards, :mod:`.ray_executor` on Ray's workers)."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark.cells import (
    DEADLINE_CUT_BOUNDS,
    Planned,
    cell_key,
    cell_metrics,
    cell_series,
    deadline_for,
)
from fedjax_sel.benchmark.suite import SUITE_VERSION, Suite, Task
from fedjax_sel.experiment.records import Store, cell_execution


def task_deadlines(
    suite: Suite,
    task: Task,
    echo: Callable,
    meta: dict[str, Any] | None = None,
    data_memo: MutableMapping[str, Any] | None = None,
) -> dict[str, float]:
    """Each scenario's deadline on ``task`` (those with a ``deadline_quantile``), checked
    against the realised uniform rounds (:func:`~.cells.deadline_for`): one that cuts fewer
    than 25% or more than 75% of them is a :class:`ConfigError` naming the scenario, the
    deadline and the share. ``meta``: the task's record facts, given each scenario's share
    (``deadline_cut_share``) beside its deadline. ``data_memo``: the task's data sets loaded
    before, reused and added to."""
    deadlines: dict[str, float] = {}
    shares: dict[str, float] = {}
    lo, hi = DEADLINE_CUT_BOUNDS
    for scenario in suite.scenarios:
        if scenario.deadline_quantile is None or all(
            e.reason(task.name, scenario.name) for e in suite.strategies
        ):
            continue  # no deadline, or no strategy runs there
        d = deadline_for(suite, task, scenario, data_memo)
        where = f"{task.name}/{scenario.name}"
        if not lo <= d.cut_share <= hi:
            raise ConfigError(
                f"suite: scenario {scenario.name!r} on task {task.name!r}: the deadline "
                f"{d.seconds:g} s (the {scenario.deadline_quantile:g} quantile of a uniform "
                f"round's length) cuts {100 * d.cut_share:.1f}% of the realised uniform rounds, "
                f"outside {100 * lo:.0f}-{100 * hi:.0f}%: too many rounds share a length near that "
                "quantile (give another deadline_quantile, or a system model with more "
                "spread)"
            )
        deadlines[scenario.name], shares[scenario.name] = d.seconds, d.cut_share
        echo(
            f"{where}: deadline {d.seconds:g} s, the {scenario.deadline_quantile:g} quantile "
            "of a uniform round's length (availability, dropouts and over-commitment "
            f"included); it cuts {100 * d.cut_share:.1f}% of the realised uniform rounds"
        )
    if meta is not None:
        meta["deadline_cut_share"] = shares
    return deadlines


def pending_groups(
    planned: Sequence[Planned], store: Store, done: Callable[[int], None] | None = None
) -> list[list[Planned]]:
    """The planned cells with no matching record, grouped by compiled program; ``done``
    hears the rounds of those found recorded. A cell whose record holds another
    configuration's results is refused (unless the store may overwrite)."""
    from fedjax_sel.experiment.loop import program_key

    groups: dict[str, list[Planned]] = {}
    for p in planned:
        if store.get(p.ident, cell_key(p.config)) is not None:
            if done is not None:
                done(p.config.rounds)
        else:
            groups.setdefault(program_key(p.config), []).append(p)
    stale = store.conflicts([(p.ident, cell_key(p.config)) for g in groups.values() for p in g])
    if stale and not store.overwrite:
        more = f" (and {len(stale) - 3} more)" if len(stale) > 3 else ""
        raise ConfigError(
            f"{store.path} holds records of another configuration for {len(stale)} cell(s) "
            f"about to run ({', '.join(stale[:3])}{more}): running them would replace finished "
            "results. Choose another --out, or pass --overwrite to replace them"
        )
    return list(groups.values())


def run_group(
    todo: Sequence[Planned],
    store: Store,
    together,
    echo: Callable,
    bar=None,
    data_memo: MutableMapping[str, Any] | None = None,
) -> None:
    """Runs one compiled program's cells and records them in ``store`` (saved at once).
    ``data_memo``: the task's data sets loaded before, reused and added to. A cell's folder
    gets no plots: the leaderboard draws the curves from the records."""
    from fedjax_sel.experiment import sweep as sweep_lib

    cells = [
        sweep_lib.Cell(p.config, p.out, p.ident["strategy"], p.ident["scenario"]) for p in todo
    ]
    results = sweep_lib.run_cells(
        cells,
        overwrite=store.overwrite,
        seeds_together=todo[0].together or together,
        progress=False,
        echo=echo,
        bar=bar,
        data_memo=data_memo,
        plots=False,
    )
    for p, r in zip(todo, results, strict=True):
        store.put(
            {
                **p.ident,
                "key": cell_key(p.config),
                "suite_version": SUITE_VERSION,
                "diverged": bool(r.summary.get("diverged", False)),
                "rounds": int(r.summary.get("rounds_completed", p.config.rounds)),
                "metrics": cell_metrics(r.evals, r.summary, p.config, p.task),
                "series": cell_series(r.evals),
                "config": p.config.to_dict(),
                **cell_execution(r.out_dir),
            }
        )
    store.save()
