"""``fedjax-sel demo``: a paired comparison of three selection rules at the same budget on the
embedded digits data (no network): every strategy trains 5 of the 30 clients each round, so
the rows differ only in which clients they pick. The seeds of each strategy run together in one
compiled program, and the table gives each strategy's mean with its 95% interval and its paired
difference against uniform sampling with its interval."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fedjax_sel.config import ConfigError
from fedjax_sel.experiment.compare import compare, markdown
from fedjax_sel.experiment.sweep import run_sweep

# The comparison the README's first example shows (examples/sweep_digits.toml): every rule
# trains the same per_round clients a round, the benchmark's equal-budget track.
DEMO_STRATEGIES: tuple[dict[str, Any], ...] = (
    {"strategy": "uniform"},
    {"label": "power_of_choice", "strategy": "power_of_choice", "strategy_args": {"d": 10}},
    {"strategy": "active_fl"},
)
PER_ROUND = 5
DEMO_METRICS = ("final_accuracy", "stable_accuracy")


def demo_spec(*, rounds: int = 40, seeds: int = 5, num_clients: int = 30) -> dict[str, Any]:
    """The demo as a sweep specification (the mapping a sweep file holds)."""
    if seeds < 2:
        raise ConfigError(f"demo: a paired interval needs at least 2 seeds, got seeds={seeds}")
    if rounds < 1:
        raise ConfigError(f"demo: rounds must be >= 1, got {rounds}")
    if num_clients < PER_ROUND:
        raise ConfigError(
            f"demo: {PER_ROUND} clients a round need at least {PER_ROUND} clients, "
            f"got num_clients={num_clients}"
        )
    return {
        "sweep": {"seeds": seeds, "baseline": "uniform"},
        "base": {
            "dataset": "digits",
            "partition": "dirichlet:0.3",
            "num_clients": num_clients,
            "per_round": PER_ROUND,
            "rounds": rounds,
            "local_steps": 10,
            "batch_size": 16,
            "lr": 0.1,
            "eval_every": max(1, min(5, rounds)),
        },
        "strategies": [dict(s) for s in DEMO_STRATEGIES],
    }


def run_demo(
    out: Path, *, rounds: int = 40, seeds: int = 5, num_clients: int = 30, progress: bool = True
) -> list[dict[str, Any]]:
    """Runs FedAvg with uniform sampling, Power-of-Choice (d = 10) and Active FL, each training
    5 clients a round, on digits (30 clients, Dirichlet 0.3 label skew, MLP) with ``seeds``
    paired seeds, prints what each spent and the paired comparison (final and stable accuracy),
    and writes ``out/comparison.{md,json,csv,png}`` (mean curves with 95% bands) and one run
    folder per strategy and seed. Returns the rows."""
    out = Path(out)
    t0 = time.perf_counter()
    print(
        f"digits: {num_clients} clients, Dirichlet(0.3) label skew, MLP 64-200-200-10, "
        f"{rounds} rounds, {seeds} paired seeds per strategy (run together)"
    )
    print(
        f"the same budget for every strategy: {PER_ROUND} clients trained a round, "
        f"{PER_ROUND * rounds} client updates in all; Power-of-Choice also asks 10 candidates "
        "a round for their loss (a forward pass each, not an update)"
    )
    run_sweep(
        demo_spec(rounds=rounds, seeds=seeds, num_clients=num_clients),
        out,
        progress=progress,
        echo=print,
        compare_results=False,
    )
    rows = compare(
        dirs=[out / "runs"], baseline="uniform", metrics=DEMO_METRICS, out=out, echo=None
    )
    print()
    print(markdown(rows))
    print(f"plot: {out / 'comparison.png'}   (run folders under {out}/runs/)")
    print(f"demo finished in {time.perf_counter() - t0:.1f} s")
    return rows
