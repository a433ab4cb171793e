"""A unit of a suite's work run and recorded: the cells of one compiled program (a strategy's
tuning grid on a task, or its evaluation seeds in one scenario) that have no matching record,
run together and recorded at once; shared by every executor (:mod:`.suite_run` here and in
shards, :mod:`.ray_executor` on Ray's workers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark.cells import Planned, cell_key, cell_metrics, deadline_for
from fedjax_sel.benchmark.suite import SUITE_VERSION, Suite, Task
from fedjax_sel.experiment.records import Store, cell_execution


def task_deadlines(suite: Suite, task: Task, echo: Callable) -> dict[str, float]:
    """Each scenario's deadline on ``task`` (those with a ``deadline_quantile``)."""
    deadlines: dict[str, float] = {}
    for scenario in suite.scenarios:
        if scenario.deadline_quantile is not None:
            deadlines[scenario.name] = deadline_for(suite, task, scenario)
            echo(
                f"{task.name}/{scenario.name}: deadline {deadlines[scenario.name]:g} s, the "
                f"{scenario.deadline_quantile:g} quantile of a uniform round's length"
            )
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


def run_group(todo: Sequence[Planned], store: Store, together, echo: Callable, bar=None) -> None:
    """Runs one compiled program's cells and records them in ``store`` (saved at once)."""
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
    )
    for p, r in zip(todo, results, strict=True):
        store.put(
            {
                **p.ident,
                "key": cell_key(p.config),
                "suite_version": SUITE_VERSION,
                "diverged": bool(r.summary.get("diverged", False)),
                "rounds": int(r.summary.get("rounds_completed", p.config.rounds)),
                "metrics": cell_metrics(
                    r.evals, r.summary, p.config, target=p.task.target, budgets=p.task.budgets
                ),
                "config": p.config.to_dict(),
                **cell_execution(r.out_dir),
            }
        )
    store.save()
