"""Running a suite (``fedjax-sel suite FILE --out DIR``): every cell without a matching record
runs and is recorded (:mod:`.suite` defines the cells, :mod:`.records` keeps the records).

Three ways, one result (a cell's record is the same whichever ran it, on the same kind of
machine, since its batch is part of its unit):

* **here** (the default): job after job in this process, ``OUT`` locked exclusively;
* **a shard** (``--shard I/N``): the ``I``-th of ``N`` deterministic shares of the jobs (a job
  is one strategy on one task: its tuning and the evaluations at the point it chose), for a
  SLURM array or machines without Ray. Shards run side by side on one folder: each holds
  ``OUT``'s lock shared and its own part's exclusively, and writes only its part
  (``OUT/parts/shard-I-of-N/``); ``--report-only`` (or any later run) merges them;
* **on Ray** (``--executor ray``): :mod:`.ray_executor` sends each unit of work (one compiled
  program: a strategy's tuning grid, one extension of it, or its evaluation seeds in one
  scenario) to a Ray cluster.

A strategy's tuning grid extends itself while its best point sits at an edge
(:mod:`.tuned`): each extension is one more unit, run once the previous ones are recorded, so a
killed suite resumes its tuning where it stopped like any other unit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark.cells import (
    Planned,
    job_units,
    jobs,
    tuned_scenarios,
    tuning_cells,
)
from fedjax_sel.benchmark.suite import (
    SUITE_VERSION,
    Entry,
    Scenario,
    Suite,
    Task,
    load_suite,
    parse_suite,
)
from fedjax_sel.benchmark.tuned import TuningState, record_tuned, tuned_eval_cells, tuning_state
from fedjax_sel.benchmark.units import pending_groups, run_group, task_deadlines
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.outdir import owned
from fedjax_sel.experiment.outputs import read_json, write_json
from fedjax_sel.experiment.records import (
    INVOCATIONS,
    Store,
    invocation_entry,
    merge_parts,
    part_folder,
    part_store,
    shard_share,
    task_store,
)
from fedjax_sel.experiment.tuning import Point

EXECUTORS = ("local", "ray")


def as_suite(suite: Suite | Mapping[str, Any] | str | Path) -> Suite:
    if isinstance(suite, Mapping):
        return parse_suite(suite)
    return suite if isinstance(suite, Suite) else load_suite(suite)


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as ``(I, N)``, ``1 <= I <= N``."""
    try:
        index, count = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise ConfigError(f"--shard must be I/N (e.g. 1/4), got {text!r}") from None
    if not 1 <= index <= count:
        raise ConfigError(f"--shard {text!r}: I must be between 1 and N")
    return index, count


def run_suite(
    suite: Suite | Mapping[str, Any] | str | Path,
    out: str | Path,
    *,
    seeds_together: int | str | None = None,
    progress: bool = True,
    echo: Callable = print,
    only_tasks: Sequence[str] | None = None,
    overwrite: bool = False,
    shard: tuple[int, int] | None = None,
    executor: str = "local",
    job_cpus: float = 1.0,
    job_gpus: float | None = None,
    ray_cpus: int | None = None,
) -> float:
    """Runs (or resumes) a suite into ``out``: every cell without a matching record runs and is
    recorded in ``out/per_seed/`` (a shard: in its part). Returns the wall seconds;
    :func:`fedjax_sel.benchmark.report.write` turns the records into the leaderboard.

    ``out`` is locked while the suite writes (:mod:`.outdir`); a cell whose record or folder
    holds another configuration's results is refused before it runs, unless ``overwrite``.
    Parts left by shards or by a killed Ray driver are merged first (:func:`merge_parts`).

    ``shard``: ``(I, N)``, run the ``I``-th share only (module docstring). ``executor``:
    ``local``, ``ray`` (``RAY_ADDRESS``'s cluster, else a local one of ``ray_cpus``) or
    ``ray:ADDRESS``; ``job_cpus``/``job_gpus``: what each Ray task declares (GPUs: one where
    the cluster has them, unless given)."""
    suite = as_suite(suite)
    out = Path(out)
    kind = executor.split(":", 1)[0]
    if kind not in EXECUTORS:
        raise ConfigError(f"--executor must be local, ray or ray:ADDRESS, got {executor!r}")
    if shard is not None and kind != "local":
        raise ConfigError("--shard runs its share here; it does not combine with --executor ray")
    together = seeds_together if seeds_together is not None else suite.seeds_together
    tasks = [t for t in suite.tasks if only_tasks is None or t.name in only_tasks]
    start = time.perf_counter()
    if shard is not None:
        _run_shard(suite, out, tasks, shard, together, progress, echo, overwrite)
        return time.perf_counter() - start
    with owned(out, echo):
        write_json(out / "suite.json", suite.source)
        merge_parts(out, overwrite=overwrite, echo=echo)
        if kind == "ray":
            from fedjax_sel.benchmark.ray_executor import run_on_ray

            run_on_ray(
                suite,
                tasks,
                out,
                together=together,
                overwrite=overwrite,
                progress=progress,
                echo=echo,
                address=executor.split(":", 1)[1] if ":" in executor else None,
                job_cpus=job_cpus,
                job_gpus=job_gpus,
                ray_cpus=ray_cpus,
            )
            return time.perf_counter() - start
        stores = {t.name: task_store(out, t.name, overwrite) for t in tasks}
        mine = jobs(suite, tasks)
        bar = _Progress(suite, mine, progress, out / INVOCATIONS)
        try:
            for task in tasks:
                entries = [e for t, e in mine if t is task]
                _run_task(suite, task, stores[task.name], out, together, bar, echo, entries)
        finally:
            bar.close()
    return time.perf_counter() - start


def _run_shard(suite, out, tasks, shard, together, progress, echo, overwrite) -> None:
    """Shard ``shard`` of the suite's jobs into its part of ``out`` (module docstring)."""
    index, count = shard
    part = f"shard-{index}-of-{count}"
    mine = shard_share(jobs(suite, tasks), index, count)
    echo(
        f"shard {index}/{count}: {len(mine)} of {len(jobs(suite, tasks))} jobs "
        f"({', '.join(f'{t.name}/{e.label}' for t, e in mine) or 'none'})"
    )
    with owned(out, echo, shared=True), owned(part_folder(out, part), echo):
        write_json(out / "suite.json", suite.source)  # the same text from every shard
        bar = _Progress(suite, mine, progress, part_folder(out, part) / INVOCATIONS)
        bar.entry["shard"] = f"{index}/{count}"
        try:
            for task in tasks:
                entries = [e for t, e in mine if t is task]
                if entries:
                    store = part_store(out, part, task.name, overwrite)
                    _run_task(suite, task, store, out, together, bar, echo, entries)
        finally:
            bar.close()


class _Progress:
    """One bar over the jobs (rounds of every cell not yet recorded), with the time left;
    cells found finished are counted as done. It also keeps this invocation's entry in
    ``path`` (``OUT/invocations.json``, or a shard's part's: machine, wall seconds so far,
    cells run), rewritten whenever cells are recorded, so a killed suite leaves its wall
    time behind too."""

    def __init__(
        self,
        suite: Suite | None,
        job_list: Sequence[tuple[Task, Entry]],
        show: bool,
        path: Path | None = None,
    ):
        self.bar = None
        self.start = time.perf_counter()
        self.path = path
        self.entries = read_json(path) if path is not None and path.exists() else []
        self.entry = invocation_entry()
        self.entries.append(self.entry)
        if not show or suite is None:
            return
        from tqdm.auto import tqdm

        self.bar = tqdm(
            total=total_rounds(suite, job_list), desc=f"suite {suite.name}", unit="round"
        )

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def grow(self, n: int) -> None:
        """``n`` more rounds to run: a tuning grid's extension, not known ahead."""
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def recorded(self, cells: int) -> None:
        """``cells`` were run and recorded: the invocation's entry is brought up to date."""
        self.entry["cells_run"] += cells
        self.entry["wall_seconds"] = round(time.perf_counter() - self.start, 1)
        if self.path is not None and self.entry["cells_run"] > 0:
            write_json(self.path, self.entries)

    def close(self) -> None:
        self.recorded(0)
        if self.bar is not None:
            self.bar.close()


def _rounds(suite: Suite, task: Task, scenario: Scenario, entry: Entry) -> int:
    fields = {**task.fields, **scenario.fields, **entry.fields, **suite.override}
    return int(fields.get("rounds", RunConfig.rounds))


def total_rounds(suite: Suite, job_list: Sequence[tuple[Task, Entry]]) -> int:
    """The rounds of every cell of ``job_list``: tuning grids and evaluation seeds."""
    return sum(
        _rounds(suite, task, scenario, entry) * cells
        for task, entry in job_list
        for scenario, cells in job_units(suite, task, entry)
    )


def _run_cells(
    planned: list[Planned],
    store: Store,
    together,
    bar: _Progress,
    echo: Callable,
    data_memo: MutableMapping[str, Any] | None = None,
) -> None:
    """Runs the planned cells that have no matching record, one compiled program at a time,
    and records each program's cells as soon as they finish."""
    for todo in pending_groups(planned, store, bar.update):
        run_group(todo, store, together, echo, bar.bar, data_memo)
        bar.recorded(len(todo))


def _tune(
    suite: Suite,
    task: Task,
    scenario: Scenario,
    entry: Entry,
    store: Store,
    out: Path,
    deadline: float | None,
    bar: _Progress,
    run: Callable[[list[Planned]], None],
) -> TuningState | None:
    """``entry``'s tuning on ``task`` in ``scenario``: its grid, then each extension the
    choice asks for (:func:`~.tuned.tuning_state`), until the choice is final."""
    ran: tuple[int, list[Point]] | None = None
    while True:
        state = tuning_state(suite, task, scenario, entry, store, deadline)
        if state is None or not state.pending:
            return state
        if ran == (state.step, state.pending):  # run, yet not recorded: never loop on it
            raise RuntimeError(f"{entry.label}'s tuning cells {state.pending} left no record")
        ran = (state.step, state.pending)
        cells = tuning_cells(suite, task, scenario, entry, out, deadline, state.pending, state.step)
        if state.step:  # an extension: rounds the bar did not count
            bar.grow(len(cells) * _rounds(suite, task, scenario, entry))
        run(cells)


def _run_task(
    suite: Suite,
    task: Task,
    store: Store,
    out: Path,
    together,
    bar: _Progress,
    echo: Callable,
    entries: Sequence[Entry],
) -> None:
    """The jobs of ``entries`` on ``task``: each strategy's tuning (its grid, then any
    extensions, :mod:`.tuned`), then its evaluations at the point it chose."""
    from fedjax_sel.experiment.build import DataMemo  # jax: not on the CLI's import path

    # the task's data sets, loaded once for every program (a seed's partition is the same
    # for every strategy and scenario): one data configuration's seeds at a time
    data_memo = DataMemo(len(suite.seeds) + len(suite.tuning.seeds))
    deadlines = task_deadlines(suite, task, echo, store.meta, data_memo)
    store.meta.update(task=task.name, deadlines=deadlines, suite_version=SUITE_VERSION)
    by_name = {s.name: s for s in suite.scenarios}
    chosen: dict[str, Any] = {}

    def run(cells: list[Planned]) -> None:
        _run_cells(cells, store, together, bar, echo, data_memo)

    for entry in entries:
        for tune_name, scenarios in tuned_scenarios(suite, task, entry).items():
            tune_in = by_name[tune_name]
            deadline = deadlines.get(tune_name)
            state = _tune(suite, task, tune_in, entry, store, out, deadline, bar, run)
            record_tuned(chosen, tune_name, entry.label, state)
            for scenario in scenarios:
                cells = tuned_eval_cells(
                    suite, task, scenario, entry, out, state, deadlines.get(scenario.name)
                )
                run(cells)
    store.meta["tuned_lr"] = chosen.get("tuned_lr", {})
    store.meta["tuned"] = chosen.get("tuned", {})
    if store.records or store.base is None:  # a part that ran nothing leaves no file
        store.save()
