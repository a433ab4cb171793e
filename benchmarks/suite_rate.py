"""A suite's cells per second, seeds (and tuning grid points) batched against one at a time.

On a GPU many cells of the small tasks fit at once: a unit of a suite (a strategy's tuning grid,
or its evaluation seeds) runs as one compiled program whose members are vmapped in batches of
``seeds_together``. This script runs the same small suite (one task, uniform and
Power-of-Choice, a tuning grid of ``--grid`` learning rates on 3 tuning seeds, not extended,
``--seeds`` evaluation seeds) into fresh folders, once with every member of a unit in one batch
and once with one member at a time, in one process after a warm-up run, and records the wall seconds
(compile included) and cells per second of each. Writes JSON, prints a table::

    python benchmarks/suite_rate.py --out benchmarks/results/gpu/suite_rate.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.benchmark.run import run_suite
from fedjax_sel.experiment.provenance import machine_info


def suite_spec(task: str, seeds: int, grid: int, rounds: int, clients: int) -> dict:
    lrs = [round(0.05 * 2**i, 4) for i in range(grid)]
    return {
        "suite": {"name": "rate", "seeds": seeds, "baseline": "uniform"},
        "tuning": {"lr": lrs, "seeds": [1000, 1001, 1002], "extend": 0},
        "tasks": {
            task: {
                "dataset": task,
                "num_clients": clients,
                "per_round": 10,
                "rounds": rounds,
                "local_steps": 5,
                "batch_size": 20,
                "eval_every": max(1, rounds // 5),
                "test_fraction": 0.2,
            }
        },
        "scenarios": {"ideal": {}},
        "strategies": [{"strategy": "uniform"}, {"strategy": "power_of_choice"}],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="leaf_synthetic")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--grid", type=int, default=4)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--clients", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    spec = suite_spec(a.task, a.seeds, a.grid, a.rounds, a.clients)
    cells = 2 * (a.seeds + 3 * a.grid)
    with tempfile.TemporaryDirectory() as tmp:  # warm-up: imports, data, the backend
        run_suite(suite_spec(a.task, 1, 2, 1, a.clients), Path(tmp) / "warm", progress=False,
                  echo=lambda *_: None)  # fmt: skip
    rows = []
    for together in (max(a.seeds, 3 * a.grid), 1):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            run_suite(spec, Path(tmp) / "out", seeds_together=together, progress=False,
                      echo=lambda *_: None)  # fmt: skip
            wall = time.perf_counter() - start
        rows.append(
            {
                "seeds_together": together,
                "cells": cells,
                "wall_s": round(wall, 2),
                "cells_per_s": cells / wall,
            }
        )
        write_json_rows(a.out, {"machine": machine_info(), "args": vars(a), "rows": rows})
    rows[0]["speedup"] = rows[1]["wall_s"] / rows[0]["wall_s"]
    write_json_rows(a.out, {"machine": machine_info(), "args": vars(a), "rows": rows})
    print_table(
        rows,
        [
            ("together", "seeds_together", "{}"),
            ("cells", "cells", "{}"),
            ("wall s", "wall_s", "{:.1f}"),
            ("cells/s", "cells_per_s", "{:.3f}"),
            ("speed-up", "speedup", "{:.2f}x"),
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
