"""Padded SGD steps in epoch mode, before and after grouping the selected clients by size, on a
Dirichlet partition of MNIST (one local epoch, batch 10, FedAvg-style uniform selection).

``vmap`` runs every slot of a round to the largest selected client's step count (the engine
before grouping); ``chunked:C`` sorts the selected clients by size and runs chunks of C slots,
each to its own largest count (the engine's epoch mode now); ``map`` runs each client to its own
count (no padding, no batching). The fraction of padded steps is ``1 - needed / executed``,
averaged over 200 rounds of uniform selection.

    python benchmarks/padded_steps.py --out benchmarks/results/cpu/padded_steps.json
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.data import loaders
from fedjax_sel.data.partition import dirichlet
from fedjax_sel.training.local import executed_steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("FEDJAX_SEL_DATA_DIR", "../shared/data"))
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    labels = loaders.load_image_dataset("mnist", a.data_dir).y_train
    rows = []
    for clients, per_round, alpha in ((100, 10, 0.3), (100, 10, 0.1), (500, 100, 0.5)):
        parts = dirichlet(labels, clients, alpha, np.random.default_rng(0))
        steps = np.array([-(-len(part) // 10) for part in parts])  # one epoch, batch 10
        rng = np.random.default_rng(1)
        needed, executed = 0, {"vmap": 0, "chunked:4": 0, "chunked:2": 0, "map": 0}
        for _ in range(a.rounds):
            picked = steps[rng.choice(clients, per_round, replace=False)]
            needed += int(picked.sum())
            for mode in executed:
                kind, _, chunk = mode.partition(":")
                executed[mode] += executed_steps(picked, kind, int(chunk) if chunk else None)
        row = {
            "clients": clients,
            "per_round": per_round,
            "alpha": alpha,
            "client_examples": [int(min(map(len, parts))), int(max(map(len, parts)))],
        }
        for mode, n in executed.items():
            row[f"padded_{mode}"] = 1.0 - needed / n
        rows.append(row)
    print_table(
        rows,
        [
            ("K", "clients", "{}"),
            ("P", "per_round", "{}"),
            ("alpha", "alpha", "{}"),
            ("vmap (ungrouped)", "padded_vmap", "{:.1%}"),
            ("grouped chunks of 4", "padded_chunked:4", "{:.1%}"),
            ("grouped chunks of 2", "padded_chunked:2", "{:.1%}"),
            ("map", "padded_map", "{:.1%}"),
        ],
    )
    write_json_rows(a.out, {"rounds": a.rounds, "batch_size": 10, "local_epochs": 1, "rows": rows})


if __name__ == "__main__":
    main()
