"""``fedjax-sel demo``: a small strategy comparison on the embedded digits data (no network)."""

from __future__ import annotations

import time
from pathlib import Path

from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import plot_curves, run_cells, write_json
from fedjax_sel.experiment.outputs import print_summary_table
from fedjax_sel.experiment.sweep import Cell

DEMO_STRATEGIES = (
    ("uniform", {}, 5),
    ("power_of_choice", {"d": 10}, 5),
    ("full", {}, None),
)


def demo_config(strategy: str, args: dict, per_round: int, num_clients: int, rounds: int):
    return RunConfig(
        strategy=strategy,
        strategy_args=dict(args),
        dataset="digits",
        partition="dirichlet:0.3",
        num_clients=num_clients,
        per_round=per_round,
        rounds=rounds,
        local_steps=10,
        batch_size=16,
        lr=0.1,
        eval_every=5,
        seed=0,
    )


def run_demo(out: Path, *, rounds: int = 60, num_clients: int = 30, progress: bool = True):
    """Runs FedAvg with uniform sampling, Power-of-Choice and full participation on digits
    (30 clients, Dirichlet 0.3 label skew, MLP), prints a table and writes
    ``out/comparison.png`` and one run folder per strategy."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(
        f"digits: {num_clients} clients, Dirichlet(0.3) label skew, MLP 64-200-200-10, "
        f"{rounds} rounds, seed 0"
    )
    cells = [
        Cell(
            demo_config(name, args, per_round or num_clients, num_clients, rounds), out / name, name
        )
        for name, args, per_round in DEMO_STRATEGIES
    ]
    results = run_cells(cells, progress=progress)
    summaries = [r.summary for r in results]
    plot = plot_curves(
        {r.config.strategy: r.evals for r in results},
        out / "comparison.png",
        title=f"digits, {num_clients} clients, Dirichlet 0.3",
    )
    write_json(out / "summary.json", {s["strategy"]: s for s in summaries})
    print()
    print_summary_table(summaries)
    print(f"\nplot: {plot}   (per-run outputs under {out}/<strategy>/)")
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return summaries
