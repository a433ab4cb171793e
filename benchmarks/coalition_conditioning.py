"""How well FedCVR-Bolt's coalitions are determined by their input: last-bit sensitivity of the
spectral clustering step (row-normalised sketches, RBF affinity, ``P`` spectral components,
k-means), by sketch dimension.

FedCVR-Bolt asks for as many coalitions as clients per round (``P = 10`` of ``K = 100`` in Table
1). When the row-normalised sketches carry fewer directions than that, most of the ``P``
eigenvalues of the normalised adjacency sit at float32 rounding level, their eigenvectors are
decided by rounding, and so are the coalitions. Table 1's regressions have sketches of one or
two coordinates (the models' parameters; ``sketch=all``); MNIST's last layer has thousands.

For sketches of ``D`` coordinates drawn around two planted group centres (the data has two
groups, as Table 1's non-IID setting), and several draws, computes the coalitions three ways:
alone (a vmapped batch of one), as the first member of a vmapped batch of 25 identical inputs
(XLA's CPU reductions depend on the array's shape, so the affinity can differ in the last bit),
and alone after moving one input coordinate by one unit in the last place. Reports the
adjusted Rand index (ARI) between those coalitions (1: identical partitions), the ARI against
the planted groups, and how many of the ``P`` eigenvalues exceed ``1e-4``. Writes a JSON and
prints a table::

    python benchmarks/coalition_conditioning.py \\
        --out benchmarks/results/cpu/coalition_conditioning.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.kernels.affinity import normalize_rows
from fedjax_sel.kernels.kmeans import adjusted_rand_index
from fedjax_sel.kernels.spectral import coalition_embedding, spectral_clustering

EIGENVALUE_FLOOR = 1e-4


def planted_sketches(rng: np.random.Generator, num_clients: int, dim: int, noise: float):
    """Two groups of client sketches: a shared positive offset plus a group centre plus noise
    (the groups differ in direction, as clients fitting two different models)."""
    offset = np.ones(dim)
    centres = 0.3 * rng.standard_normal((2, dim))
    groups = np.arange(num_clients) % 2
    x = offset + centres[groups] + noise * rng.standard_normal((num_clients, dim))
    return jnp.asarray(x, jnp.float32), groups


def one_draw(seed: int, num_clients: int, dim: int, coalitions: int, batch: int, noise: float):
    rng = np.random.default_rng(seed)
    table, groups = planted_sketches(rng, num_clients, dim, noise)
    x = normalize_rows(table)
    key = jax.random.key(seed)
    cluster = jax.jit(jax.vmap(lambda x, k: spectral_clustering(x, coalitions, k)))

    def labels(points, b: int):
        stacked = jnp.broadcast_to(points, (b,) + points.shape)
        return cluster(stacked, jnp.broadcast_to(key, (b,)))[0]

    alone = labels(x, 1)
    batched = labels(x, batch)
    nudged = labels(x.at[0, 0].set(jnp.nextafter(x[0, 0], jnp.inf)), 1)
    # the embedding spectral_clustering clusters (its key split too), FedCVR-Bolt's defaults
    k_embed, _ = jax.random.split(key)
    embed = jax.jit(lambda x: coalition_embedding(x, coalitions, k_embed))
    eigenvalues = np.asarray(embed(x).eigenvalues)

    def ari(a, b, num_b=coalitions):
        return float(adjusted_rand_index(a, jnp.asarray(b, jnp.int32), coalitions, num_b))

    return {
        "ari_batch_vs_alone": ari(batched, alone),
        "ari_nudged_vs_alone": ari(nudged, alone),
        "ari_vs_planted": ari(alone, groups, 2),
        "eigenvalues_above_floor": int(np.sum(eigenvalues > EIGENVALUE_FLOOR)),
        "smallest_eigenvalue": float(np.min(eigenvalues)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dims", default="1,2,3,10,100", help="sketch dimensions (comma-separated)")
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--coalitions", type=int, default=10, help="P (Table 1: 10 per round)")
    p.add_argument("--draws", type=int, default=5, help="sketch tables per dimension")
    p.add_argument("--batch", type=int, default=25, help="the vmapped batch compared with one")
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--out", default=None, help="JSON output file")
    a = p.parse_args()
    rows = []
    for dim in (int(d) for d in a.dims.split(",")):
        draws = [
            one_draw(s, a.clients, dim, a.coalitions, a.batch, a.noise) for s in range(a.draws)
        ]
        row = {"dim": dim, "clients": a.clients, "coalitions": a.coalitions, "draws": a.draws}
        for k in draws[0]:
            row[k] = float(np.mean([d[k] for d in draws]))
        row["min_ari_batch_vs_alone"] = min(d["ari_batch_vs_alone"] for d in draws)
        row["min_ari_nudged_vs_alone"] = min(d["ari_nudged_vs_alone"] for d in draws)
        rows.append(row)
    print_table(
        rows,
        [
            ("sketch dim", "dim", "{}"),
            ("eigenvalues > 1e-4 (of P)", "eigenvalues_above_floor", "{:.1f}"),
            ("ARI batch vs alone", "ari_batch_vs_alone", "{:.3f}"),
            ("(min)", "min_ari_batch_vs_alone", "{:.3f}"),
            ("ARI 1-ulp vs alone", "ari_nudged_vs_alone", "{:.3f}"),
            ("(min)", "min_ari_nudged_vs_alone", "{:.3f}"),
            ("ARI vs planted", "ari_vs_planted", "{:.3f}"),
        ],
    )
    meta = vars(a) | {"eigenvalue_floor": EIGENVALUE_FLOOR}
    write_json_rows(a.out, {"machine": machine_info(), "args": meta, "rows": rows})


if __name__ == "__main__":
    main()
