"""``fedjax-sel bench NAME``: the benchmarks of :mod:`fedjax_sel.bench`, one sub-command each.

Each benchmark module declares its own flags (``add_arguments(parser)``) and runs from them
(``main(args) -> rows``); the command adds the checks every count flag gets.
"""

from __future__ import annotations

import argparse

from fedjax_sel.base import ConfigError
from fedjax_sel.bench import grid, kernels, scale, sweep, throughput, trace_phases, workloads
from fedjax_sel.cli.options import check_counts

# name -> (module, help), in the order `fedjax-sel bench --help` lists them
BENCHMARKS = {
    "throughput": (throughput, "one FedAvg round: the engine vs a Python loop vs a matmul"),
    "kernels": (kernels, "latency of each selection kernel against the number of clients K"),
    "sweep": (sweep, "S seeds in one compiled program against S separate runs"),
    "grid": (grid, "a learning-rate grid x seeds in one program against the runs one by one"),
    "phases": (trace_phases, "where a round's time goes, from a run --trace trace"),
    "scale": (scale, "rounds at K = 10^3 ... 10^6 clients for every strategy"),
    "workloads": (workloads, "the canonical cross-device workloads, timed in the engine"),
}
# every count flag a benchmark may declare
COUNTS = (
    "max_examples", "per_round", "local_steps", "batch_size", "classes", "clients", "seeds",
    "rounds", "repeats",
)  # fmt: skip


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Declares ``bench`` and one sub-command per benchmark, with that benchmark's flags."""
    p = sub.add_parser("bench", help="throughput, kernel and sweep benchmarks (JSON + table)")
    benches = p.add_subparsers(dest="what", required=True)
    for name, (module, text) in BENCHMARKS.items():
        q = benches.add_parser(name, help=text, description=text)
        module.add_arguments(q)
        q.set_defaults(func=cmd_bench, run=module.main)


def cmd_bench(a: argparse.Namespace) -> int:
    """Runs benchmark ``a.what``; exit 1 when it produced no row."""
    repeats = getattr(a, "repeats", None)
    if repeats is not None and repeats < 1:  # a median needs one timing at least
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    check_counts(a, *COUNTS)
    return 0 if a.run(a) else 1
