"""``fedjax-sel bench grid``: a learning-rate grid x seeds in one compiled program against the
same runs one by one.

Both sides run the same cells (4 client learning rates x 4 seeds of a 20-round run, each seed
its own partition) through the product's own path (:func:`fedjax_sel.experiment.sweep.
run_cells`): together, cells that differ only in learning rate and seed share one program and
run vmapped (``seeds_together``, default ``auto``); separately, each cell is a run of its own.
Reported per workload: the wall time of the whole grid including data loading and compilation
(what a user waits for), the steady seconds per configuration-round (from each run's summary,
its first chunk excluded), and the number of XLA compilations each way (every program the
backend compiled, small eager operations included) and of round programs (one per vmapped
batch shape). JAX's caches are cleared before each side so neither reuses the other's programs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.bench.sweep import WORKLOADS
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import run as run_lib
from fedjax_sel.experiment.build import build_simulation
from fedjax_sel.experiment.execution import parse_seeds_together
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.experiment.sweep import Cell, run_cells
from fedjax_sel.training.autotune import cache_path

LEARNING_RATES = (0.01, 0.03, 0.1, 0.3)


def grid_cells(model: str, rounds: int, seeds: int, out: Path) -> list[Cell]:
    """The grid's cells: every learning rate x seed of ``model``'s workload (each resolved
    once, as a :class:`Cell` is)."""
    if model not in WORKLOADS:
        raise ConfigError(f"bench grid: unknown workload {model!r}; known: {list(WORKLOADS)}")
    cells = []
    for lr in LEARNING_RATES:
        for seed in range(seeds):
            config = RunConfig(
                **WORKLOADS[model],
                rounds=rounds,
                eval_every=max(1, rounds // 4),
                local_steps=10,
                lr=lr,
                seed=seed,
            )
            cells.append(Cell(config, out / f"lr{lr}" / f"seed{seed}", model, f"lr={lr}"))
    return cells


class _Compilations:
    """Counts the backend's compilations while installed (``jax.monitoring``)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        del duration, kwargs
        if event == self.EVENT:
            self.count += 1


def _side(cells: list[Cell], together: int | str, counter: _Compilations) -> dict:
    """Runs ``cells`` (``together``: members per vmapped batch; 1 = one by one)."""
    jax.clear_caches()
    groups = []
    real = run_lib.run_group

    def counting(configs, *args, **kwargs):
        results = real(configs, *args, **kwargs)
        sims = {id(r.simulation): r.simulation for r in results}
        groups.extend(sim.round_programs() for sim in sims.values())
        return results

    start = counter.count
    run_lib.run_group = counting
    try:
        t0 = time.perf_counter()
        if together == 1:  # one by one: each cell a run (and a program) of its own
            results = [r for c in cells for r in run_cells([c], progress=False, echo=_quiet)]
        else:
            results = run_cells(cells, seeds_together=together, progress=False, echo=_quiet)
        wall = time.perf_counter() - t0
    finally:
        run_lib.run_group = real
    steady = [1.0 / r.timings["rounds_per_second"] for r in results]
    return {
        "wall_s": wall,
        "s_per_config_round": float(np.mean(steady)),
        "programs": counter.count - start,
        "round_programs": int(sum(groups)),
        "final_accuracy": [r.summary.get("final_accuracy") for r in results],
        "train_loss": [r.evals[-1].get("train_loss") for r in results],
    }


@contextlib.contextmanager
def _own_batch_cache(folder: Path):
    """Measurement caches in ``folder`` while inside, holding a copy of the user's
    ``--parallel auto`` choices but no batch sizes."""
    previous = os.environ.get("FEDJAX_SEL_CACHE_DIR")
    folder.mkdir(parents=True, exist_ok=True)
    if cache_path().exists():
        shutil.copy(cache_path(), folder / cache_path().name)
    os.environ["FEDJAX_SEL_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("FEDJAX_SEL_CACHE_DIR", None)
        else:
            os.environ["FEDJAX_SEL_CACHE_DIR"] = previous


def _quiet(*args, **kwargs) -> None:
    del args, kwargs


def grid_main(
    *,
    models: list[str] | None = None,
    rounds: int = 20,
    seeds: int = 4,
    seeds_together: int | str = "auto",
    out: str | None = None,
) -> list[dict]:
    """Times the grid together and separately for each workload; prints a table, writes JSON.

    With ``seeds_together="auto"`` the together side runs twice: first measuring its batch
    size (a cache of its own, empty; ``--parallel auto``'s choice is copied in so neither side
    pays for that), then again as a later sweep of the same shape does, reading the cached
    batch (``together_cached_*``)."""
    rows = []
    info = machine_info()
    counter = _Compilations()
    for model in models or list(WORKLOADS):
        with tempfile.TemporaryDirectory() as tmp, _own_batch_cache(Path(tmp) / "cache"):
            try:
                cells = grid_cells(model, rounds, seeds, Path(tmp) / "together")
                build_simulation(cells[0].resolved)  # --parallel auto measured (cached) here
                together = _side(cells, seeds_together, counter)
            except ConfigError as e:
                print(f"  {model}: skipped ({e})")
                continue
            cached = _side(
                grid_cells(model, rounds, seeds, Path(tmp) / "again"), seeds_together, counter
            )
            separate = _side(grid_cells(model, rounds, seeds, Path(tmp) / "separate"), 1, counter)
            choice = json.loads((cells[0].out / "config.json").read_text()).get("batch_choice")
        diff = np.abs(np.subtract(together.pop("final_accuracy"), separate.pop("final_accuracy")))
        together_losses = together.pop("train_loss")
        separate.pop("train_loss")
        cached.pop("train_loss")
        cached.pop("final_accuracy")
        c = cells[0].config
        row = {
            "model": model,
            "dataset": c.dataset,
            "num_clients": c.num_clients,
            "per_round": c.per_round,
            "learning_rates": list(LEARNING_RATES),
            "seeds": seeds,
            "rounds": rounds,
            "seeds_together": seeds_together,
            "batch_choice": choice,
            **{f"together_{k}": v for k, v in together.items()},
            **{f"together_cached_{k}": v for k, v in cached.items()},
            **{f"separate_{k}": v for k, v in separate.items()},
            "programs_together": together["programs"],
            "programs_separate": separate["programs"],
            "wall_speedup": separate["wall_s"] / together["wall_s"],
            "cached_wall_speedup": separate["wall_s"] / cached["wall_s"],
            "steady_speedup": separate["s_per_config_round"] / together["s_per_config_round"],
            # each grid point against its separate run: the float reduction order of the
            # padded data a group shares can move an accuracy by a test example or two
            "final_accuracy_max_abs_diff": float(diff.max()),
            "final_accuracy_mean_abs_diff": float(diff.mean()),
            "final_accuracy_max_abs_diff_by_lr": {
                str(lr): float(d.max())
                for lr, d in zip(LEARNING_RATES, diff.reshape(len(LEARNING_RATES), -1), strict=True)
            },
            "final_train_loss_by_lr": {
                str(lr): float(np.mean(v))
                for lr, v in zip(
                    LEARNING_RATES,
                    np.reshape(together_losses, (len(LEARNING_RATES), -1)),
                    strict=True,
                )
            },
            "machine": info,
        }
        rows.append(row)
        print(
            f"  {model}: together {row['together_wall_s']:.1f} s wall "
            f"({row['together_cached_wall_s']:.1f} s with the batch cached), separate "
            f"{row['separate_wall_s']:.1f} s ({row['wall_speedup']:.2f}x); steady "
            f"{row['steady_speedup']:.2f}x; programs {row['programs_together']} vs "
            f"{row['programs_separate']}",
            flush=True,
        )
    print(f"device: {info['device_kind']} ({info['backend']}), jax {info['jax_version']}")
    print_table(
        [
            dict(
                r,
                together_ms=r["together_s_per_config_round"] * 1e3,
                separate_ms=r["separate_s_per_config_round"] * 1e3,
                batch_size=(r["batch_choice"] or {}).get("size", r["seeds_together"]),
            )
            for r in rows
        ],
        [
            ("model", "model", "{}"),
            ("configs", "seeds", "4 lr x {} seeds"),
            ("together wall s", "together_wall_s", "{:.1f}"),
            ("separate wall s", "separate_wall_s", "{:.1f}"),
            ("wall speedup", "wall_speedup", "{:.2f}x"),
            ("cached", "cached_wall_speedup", "{:.2f}x"),
            ("together ms/config-round", "together_ms", "{:.2f}"),
            ("separate ms/config-round", "separate_ms", "{:.2f}"),
            ("steady speedup", "steady_speedup", "{:.2f}x"),
            ("batch", "batch_size", "{}"),
            ("round programs", "together_round_programs", "{}"),
            ("cached", "together_cached_round_programs", "{}"),
            ("vs", "separate_round_programs", "{}"),
            ("XLA compilations", "programs_together", "{}"),
            ("vs", "programs_separate", "{}"),
        ],
    )
    write_json_rows(out, rows)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench grid``'s flags."""
    p.add_argument("--model", action="append", help="workloads: logreg, mlp (default both)")
    p.add_argument("--rounds", type=int, default=20, help="rounds of each run")
    p.add_argument("--seeds", type=int, default=4, help="seeds of each learning rate")
    p.add_argument(
        "--seeds-together", default=None, help="members per vmapped batch (default auto)"
    )
    p.add_argument("--out", default=None, help="JSON output file")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench grid``: :func:`grid_main` with the flags."""
    return grid_main(
        models=a.model,
        rounds=a.rounds,
        seeds=a.seeds,
        seeds_together=parse_seeds_together(a.seeds_together or "auto"),
        out=a.out,
    )
