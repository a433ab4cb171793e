"""CA-Fed Fig. 4a: mean absolute error of the availability estimates ``pi_hat`` and
``lambda_hat`` against the number of observed rounds ``t'`` in ``{10^1, 10^1.5, ..., 10^4}``,
on the paper's population (N = 100, ``g = 0.4``, ``nu = 0.9``, ``eps = 1e-2``), averaged over
seeds (one chain trajectory per seed).

Estimators: ``bayes`` (section IV-B, the correct conditional Beta posterior of the transition
matrix, flat prior of ``H = 2`` pseudo-rounds centred on ``pi_0 = 1/2, lambda_0 = 0``) and
``reference`` (the public code's joint-frequency lambda estimator, biased; same flat prior).
Writes a JSON list of rows, prints a table and saves a log-log plot. Example::

    python benchmarks/fig4a_estimators.py --seeds 5 --out runs/fig4a
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np

from fedjax_sel.availability import estimators as est
from fedjax_sel.availability.markov_population import markov_population

CHECKPOINTS = tuple(int(round(10**e)) for e in np.arange(1.0, 4.01, 0.5))


def trajectory(num_clients: int, rounds: int, seed: int):
    """``(available bool[T, K], pi, lambda)`` of the paper's population."""
    model = markov_population()
    state = model.init(jax.random.key(seed), num_clients)

    def body(s, key):
        available, s = model.step(s, key)
        return s, available

    keys = jax.random.split(jax.random.fold_in(jax.random.key(seed), 1), rounds)
    _, traj = jax.lax.scan(body, state, keys)
    truth = model.true_params(state)
    return traj, truth.pi, truth.lam


def measure(num_clients: int = 100, seeds: int = 5, checkpoints=CHECKPOINTS) -> list[dict]:
    rows = []
    for estimator in est.ESTIMATORS:
        errors = []
        for seed in range(seeds):
            traj, pi, lam = trajectory(num_clients, max(checkpoints), seed)
            errors.append(
                est.estimation_error_curve(traj, pi, lam, checkpoints, estimator=estimator)
            )
        errors = np.asarray(errors)  # [seeds, 2, checkpoints]
        for i, t in enumerate(checkpoints):
            rows.append(
                {
                    "estimator": estimator,
                    "rounds": t,
                    "pi_mae": float(errors[:, 0, i].mean()),
                    "pi_mae_std": float(errors[:, 0, i].std()),
                    "lambda_mae": float(errors[:, 1, i].mean()),
                    "lambda_mae_std": float(errors[:, 1, i].std()),
                }
            )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for estimator in est.ESTIMATORS:
        sel = [r for r in rows if r["estimator"] == estimator]
        t = [r["rounds"] for r in sel]
        style = "-" if estimator == "bayes" else "--"
        ax.plot(t, [r["pi_mae"] for r in sel], "o" + style, label=f"pi ({estimator})")
        ax.plot(t, [r["lambda_mae"] for r in sel], "s" + style, label=f"lambda ({estimator})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("observed rounds t'")
    ax.set_ylabel("mean absolute error")
    ax.set_title("Fig. 4a: availability estimates, N = 100")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--out", default="runs/fig4a")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(a.clients, a.seeds)
    print(f"{'estimator':>10s} {'t':>6s} {'pi MAE':>10s} {'lambda MAE':>11s}")
    for r in rows:
        print(f"{r['estimator']:>10s} {r['rounds']:6d} {r['pi_mae']:10.4f} {r['lambda_mae']:11.4f}")
    (out / "fig4a_estimators.json").write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, out / "fig4a_estimators.png")
    print(f"wrote {out / 'fig4a_estimators.json'} and {out / 'fig4a_estimators.png'}")


if __name__ == "__main__":
    main()
