"""Label skew of the ``dirichlet`` partition against Dir(alpha) moments, and the bias of the
recipe's two corrections (the ``balance`` cap at N/K examples per client and ``min_size``
resampling), measured: for each class, the variance of the shares of its examples held by the
K clients, over 20 partitions, divided by Dir(alpha 1_K)'s (K - 1) / (K^2 (K alpha + 1)).

    python benchmarks/partition_moments.py --out benchmarks/results/cpu/partition_moments.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fedjax_sel.bench.common import print_table
from fedjax_sel.data.partition import dirichlet


def variance_ratio(k: int, n: int, alpha: float, min_size: int, balance: bool, repeats: int):
    classes = 10
    labels = np.repeat(np.arange(classes), n // classes)
    theory = (k - 1) / (k**2 * (k * alpha + 1))
    ratios = []
    for r in range(repeats):
        parts = dirichlet(
            labels, k, alpha, np.random.default_rng(r), min_size=min_size, balance=balance
        )
        counts = np.stack([np.bincount(labels[p], minlength=classes) for p in parts], axis=1)
        shares = counts / counts.sum(1, keepdims=True)
        ratios.append(shares.var(axis=1).mean() / theory)
    return float(np.mean(ratios)), float(np.std(ratios) / np.sqrt(repeats))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    for k, n in ((20, 20_000), (100, 60_000)):
        for alpha in (0.1, 0.3, 0.5, 1.0):
            for min_size, balance in ((0, False), (10, False), (0, True), (10, True)):
                ratio, se = variance_ratio(k, n, alpha, min_size, balance, a.repeats)
                rows.append(
                    dict(
                        clients=k,
                        examples=n,
                        alpha=alpha,
                        min_size=min_size,
                        balance=balance,
                        variance_ratio=ratio,
                        standard_error=se,
                    )
                )
    print_table(
        rows,
        [
            ("K", "clients", "{}"),
            ("N", "examples", "{}"),
            ("alpha", "alpha", "{}"),
            ("min_size", "min_size", "{}"),
            ("balance", "balance", "{}"),
            ("var / Dir var", "variance_ratio", "{:.3f}"),
            ("s.e.", "standard_error", "{:.3f}"),
        ],
    )
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
