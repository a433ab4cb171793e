"""A suite's cells on a Ray cluster (``fedjax-sel suite FILE --out DIR --executor ray``;
``pip install 'fedjax-sel[ray]'``; docs/benchmark.md, "On a cluster").

The driver (this process, holding ``OUT``'s lock) sends each *unit* of work to Ray as one
task: the cells that run as one compiled program, a strategy's tuning grid on one task, or
its evaluation seeds in one scenario (:func:`~fedjax_sel.benchmark.cells.tuning_cells`,
:func:`~fedjax_sel.benchmark.cells.eval_cells`). A strategy's evaluation units go out when
its tuning is back and its point chosen (a grid whose best point sits at an edge first sends
its extension, one unit at a time: :mod:`.tuned`), so units of different strategies, tasks
and scenarios run side by side.

* **Resources.** Each task declares ``job_cpus`` CPUs, and one GPU where the cluster has
  GPUs (``job_gpus``). ``ray:ADDRESS`` or ``RAY_ADDRESS`` joins a running cluster (every
  node needs this package installed, the same version); without either, a local cluster of
  ``ray_cpus`` CPUs (default: all) starts and stops with the suite.
* **Records.** A worker records its unit's cells in a part of its own
  (``OUT/parts/ray-.../``, :mod:`.records`: no two workers share a file) after each program,
  and returns them; the driver puts them into ``OUT/per_seed/`` (written atomically) and
  drops the part. A killed driver loses no finished unit: its parts wait in ``OUT/parts/``
  (on a shared file system) and the next run merges them before it plans, so a rerun picks
  up where it stopped without recomputing a recorded cell.
* **Failures.** Ray retries a unit whose worker died, or that raised, once
  (``max_retries=1``, ``retry_exceptions=True``); a unit that fails twice is reported with
  its error at the end (:class:`UnitsFailed`: the CLI exits 1 and writes no leaderboard),
  with the evaluations that waited on a failed tuning; every other unit still runs.
* **Progress.** One bar over all cells, with the cluster's throughput in cells per second,
  advanced as workers record cells (their parts are read every few seconds).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
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
from fedjax_sel.benchmark.suite import SUITE_VERSION, Entry, Suite, Task
from fedjax_sel.benchmark.tuned import record_tuned, tuned_eval_cells, tuning_state
from fedjax_sel.benchmark.units import pending_groups, run_group, task_deadlines
from fedjax_sel.experiment.outdir import folder_name
from fedjax_sel.experiment.outputs import read_json, write_json
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.experiment.records import (
    INVOCATIONS,
    PER_SEED,
    Store,
    invocation_entry,
    part_folder,
    read_invocations,
    task_store,
)

POLL_SECONDS = 2.0


class UnitsFailed(RuntimeError):
    """Units of a Ray-run suite that failed twice (each with its error)."""

    def __init__(self, failures: Sequence[tuple[str, str]]):
        self.failures = list(failures)
        lines = "\n".join(f"  {unit}: {error}" for unit, error in self.failures)
        super().__init__(
            f"{len(self.failures)} unit(s) of the suite failed on Ray (each tried twice); their "
            f"cells are not recorded, every other unit's are (rerun to retry):\n{lines}"
        )


def run_unit(
    todo: Sequence[Planned], part_file: str, together, overwrite: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A Ray worker's unit: runs ``todo`` (one compiled program's cells, none recorded yet)
    and records them in the part file ``part_file``. Returns the records and what ran them
    (the worker's machine, seconds, cells)."""
    start = time.perf_counter()
    store = Store(Path(part_file), overwrite)
    for group in pending_groups(todo, store):  # one program: a unit is one strategy's
        run_group(group, store, together, _quiet)
    worker = {
        **machine_info(),
        "node": os.uname().nodename,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "cells_run": len(todo),
    }
    return list(store.records.values()), worker


def _quiet(*args, **kwargs) -> None:
    del args, kwargs


@dataclasses.dataclass
class _Unit:
    """A unit sent to Ray: its cells, its part and what to do once it is back."""

    name: str
    task: Task
    todo: list[Planned]
    part: Path
    then: Callable[[], None] | None
    counted: int = 0  # cells the bar has counted from the part so far


def _unit_name(task: Task, phase: str, scenario: str, entry: Entry) -> str:
    return f"{task.name}/{phase}/{scenario}/{entry.label}"


def run_on_ray(
    suite: Suite,
    tasks: Sequence[Task],
    out: Path,
    *,
    together,
    overwrite: bool,
    progress: bool,
    echo: Callable,
    address: str | None,
    job_cpus: float,
    job_gpus: float | None,
    ray_cpus: int | None,
) -> None:
    """Runs the suite's unrecorded cells on Ray (module docstring). The caller holds
    ``out``'s lock and has merged its parts."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--executor ray needs Ray: pip install 'fedjax-sel[ray]' (or pip install ray)"
        ) from None
    if job_cpus <= 0:
        raise ConfigError(f"--job-cpus must be positive, got {job_cpus!r}")
    started = not ray.is_initialized()
    if started:
        address = address or os.environ.get("RAY_ADDRESS") or None
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
        if address is None:
            kwargs["num_cpus"] = ray_cpus
        with warnings.catch_warnings():  # Ray forks only to exec its daemons at once
            warnings.filterwarnings("ignore", message="os.fork", category=RuntimeWarning)
            ray.init(address=address, **kwargs)
    try:
        _drive(
            ray,
            suite,
            tasks,
            out,
            together=together,
            overwrite=overwrite,
            progress=progress,
            echo=echo,
            job_cpus=job_cpus,
            job_gpus=job_gpus,
        )
    finally:
        if started:
            ray.shutdown()


def _drive(ray, suite, tasks, out, *, together, overwrite, progress, echo, job_cpus, job_gpus):
    resources = ray.cluster_resources()
    if job_gpus is None:
        job_gpus = 1.0 if resources.get("GPU", 0) > 0 else 0.0
    if job_cpus > resources.get("CPU", 0) or job_gpus > resources.get("GPU", 0):
        raise ConfigError(
            f"each unit asks for {job_cpus:g} CPU(s) and {job_gpus:g} GPU(s); the Ray cluster "
            f"has {resources.get('CPU', 0):g} and {resources.get('GPU', 0):g}"
        )
    remote = ray.remote(run_unit).options(
        num_cpus=job_cpus, num_gpus=job_gpus, max_retries=1, retry_exceptions=True
    )
    stores = {t.name: task_store(out, t.name, overwrite) for t in tasks}
    by_name = {s.name: s for s in suite.scenarios}
    start = time.perf_counter()
    entry = invocation_entry(
        executor="ray",
        cluster={k: resources[k] for k in ("CPU", "GPU") if k in resources},
        workers=[],
    )
    entries = read_invocations(out) + [entry]
    waiting: dict[Any, _Unit] = {}
    failures: list[tuple[str, str]] = []
    all_jobs = jobs(suite, tasks)
    bar = _bar(suite, all_jobs, progress)

    def submit(name: str, task: Task, planned: list[Planned], then) -> None:
        store = stores[task.name]
        todo = [p for group in pending_groups(planned, store) for p in group]
        if bar is not None:
            bar.update(len(planned) - len(todo))
        if not todo:
            if then is not None:
                then()
            return
        part = part_folder(out, "ray-" + folder_name(name.replace("/", "-")))
        part_file = part / PER_SEED / f"{task.name}.json"
        ref = remote.remote(todo, str(part_file), together, store.overwrite)
        waiting[ref] = _Unit(name, task, todo, part, then)

    def evaluate(task, entry_, tune_name, scenarios, deadlines) -> Callable[[], None]:
        def then() -> None:
            tune_in, deadline = by_name[tune_name], deadlines.get(tune_name)
            state = tuning_state(suite, task, tune_in, entry_, stores[task.name], deadline)
            if state is not None and state.pending:  # the grid extends: one more unit first
                cells = tuning_cells(
                    suite, task, tune_in, entry_, out, deadline, state.pending, state.step
                )
                if bar is not None and state.step:
                    bar.total += len(cells)
                phase = f"tune+{state.step}" if state.step else "tune"
                submit(_unit_name(task, phase, tune_name, entry_), task, cells, then)
                return
            record_tuned(stores[task.name].meta, tune_name, entry_.label, state)
            for scenario in scenarios:
                cells = tuned_eval_cells(
                    suite, task, scenario, entry_, out, state, deadlines.get(scenario.name)
                )
                submit(_unit_name(task, "eval", scenario.name, entry_), task, cells, None)

        return then

    for task in tasks:
        deadlines = task_deadlines(suite, task, echo, stores[task.name].meta)
        store = stores[task.name]
        store.meta.update(task=task.name, deadlines=deadlines, suite_version=SUITE_VERSION)
        store.meta["tuned_lr"], store.meta["tuned"] = {}, {}
        for task_, entry_ in all_jobs:
            if task_ is not task:
                continue
            for tune_name, scenarios in tuned_scenarios(suite, task, entry_).items():
                cells = tuning_cells(
                    suite, task, by_name[tune_name], entry_, out, deadlines.get(tune_name)
                )
                then = evaluate(task, entry_, tune_name, scenarios, deadlines)
                submit(_unit_name(task, "tune", tune_name, entry_), task, cells, then)
        store.save()
    try:
        while waiting:
            ready, _ = ray.wait(list(waiting), num_returns=1, timeout=POLL_SECONDS)
            if not ready:
                _advance(bar, waiting.values())
                continue
            unit = waiting.pop(ready[0])
            try:
                records, worker = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                failures.append((unit.name, _last_line(e)))
                if unit.then is not None:
                    failures.append((f"{unit.name} -> its evaluations", "not run: tuning failed"))
                continue
            store = stores[unit.task.name]
            for record in records:
                store.put(record)
            store.save()
            shutil.rmtree(unit.part, ignore_errors=True)
            if bar is not None:
                bar.update(len(unit.todo) - unit.counted)
            entry["cells_run"] += len(records)
            _tally(entry["workers"], worker)
            entry["wall_seconds"] = round(time.perf_counter() - start, 1)
            write_json(out / INVOCATIONS, entries)
            if unit.then is not None:
                unit.then()
                store.save()
    finally:
        if bar is not None:
            bar.close()
        entry["wall_seconds"] = round(time.perf_counter() - start, 1)
        if entry["cells_run"]:
            write_json(out / INVOCATIONS, entries)
    if failures:
        raise UnitsFailed(failures)


def _bar(suite: Suite, job_list, show: bool):
    if not show:
        return None
    from tqdm.auto import tqdm

    total = sum(n for task, entry in job_list for _, n in job_units(suite, task, entry))
    return tqdm(total=total, desc=f"suite {suite.name} on ray", unit="cell")


def _advance(bar, units) -> None:
    """Counts the cells workers have recorded in their parts so far."""
    if bar is None:
        return
    for unit in units:
        path = unit.part / PER_SEED / f"{unit.task.name}.json"
        try:
            cells = len(read_json(path).get("cells", []))
        except (ConfigError, AttributeError, OSError):
            continue  # not written yet, or being replaced
        if cells > unit.counted:
            bar.update(cells - unit.counted)
            unit.counted = cells


def _tally(workers: list[dict[str, Any]], worker: Mapping[str, Any]) -> None:
    """Adds a unit's worker to the invocation's per-node summary (units, cells, seconds)."""
    machine = {k: v for k, v in worker.items() if k not in ("wall_seconds", "cells_run")}
    node = next((w for w in workers if w["machine"] == machine), None)
    if node is None:
        node = {"machine": machine, "units": 0, "cells_run": 0, "busy_seconds": 0.0}
        workers.append(node)
    node["units"] += 1
    node["cells_run"] += worker["cells_run"]
    node["busy_seconds"] = round(node["busy_seconds"] + worker["wall_seconds"], 1)


def _last_line(error: BaseException) -> str:
    """The gist of a Ray error: its cause's last line."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    return lines[-1] if lines else type(error).__name__
