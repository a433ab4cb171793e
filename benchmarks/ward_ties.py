"""Ward's agglomeration with tied clients: the kernel's two ways of keeping nearest neighbours.

Clustered sampling by model similarity clusters the clients' latest updates; a client never
selected has none (G = 0) and sits at arccos distance 0 from every other such client. With
most clients unselected (the first rounds of a 1,000-client task), the rows tied with a merged
item used to be recomputed every step (``keep_ties=False``: ``O(R^2)`` a step); now they keep
the merged item (``keep_ties=True``). Both give the same flat clusters (checked here on each
case; tests/test_clustered_sampling.py against a literal NumPy loop). Writes JSON and prints a
table; medians of ``--repeats`` timed calls after a compiling one, both ways in one process::

    python benchmarks/ward_ties.py --out benchmarks/results/cpu/ward_ties.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.kernels.urns import dissimilarity, squared_row_distances, ward_flat_clusters

CASES = ((1000, 20), (1000, 500), (1000, 1000), (2000, 40))  # (clients, clients with an update)


def case(clients: int, updated: int, seed: int = 0) -> jax.Array:
    """The squared Ward input of the reference's rows rule on arccos dissimilarities of
    ``clients`` updates of which only ``updated`` are nonzero."""
    rng = np.random.default_rng(seed)
    g = np.zeros((clients, 50), np.float32)
    g[:updated] = rng.normal(size=(updated, 50))
    g = jnp.asarray(g[rng.permutation(clients)])
    return squared_row_distances(dissimilarity(g, g, "arccos"))


def measure(clients: int, updated: int, repeats: int) -> dict:
    sq = case(clients, updated)
    ones, alive = jnp.ones(clients), jnp.ones(clients, bool)
    masses, limit = jnp.full(clients, 1.0 / clients), jnp.float32(0.05)  # m = 20
    row = {"clients": clients, "updated": updated}
    labels = {}
    for keep in (False, True):
        run = jax.jit(lambda sq, k=keep: ward_flat_clusters(sq, ones, masses, alive, limit, k))
        labels[keep] = np.asarray(run(sq)[0])
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run(sq)[0].block_until_ready()
            times.append(time.perf_counter() - t)
        row["keep_ties" if keep else "recompute"] = float(np.median(times))
    row["same_clusters"] = bool(np.array_equal(labels[False], labels[True]))
    row["clusters"] = len(set(labels[True].tolist()))
    row["speedup"] = row["recompute"] / row["keep_ties"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu/ward_ties.json"))
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    rows = [measure(c, u, a.repeats) for c, u in CASES]
    doc = {
        "machine": machine_info(),
        "repeats": a.repeats,
        "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print("| clients | with an update | recompute (s) | keep ties (s) | speedup | same |")
    print("|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['clients']} | {r['updated']} | {r['recompute']:.3f} | {r['keep_ties']:.3f} | "
            f"{r['speedup']:.1f} | {r['same_clusters']} |"
        )
    print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
