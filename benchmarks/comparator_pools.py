"""Fed-CBS and FedCor, the large-K paths (``pool = C``: the rule run on C available clients drawn
uniformly each round) against the exact rules (every client a candidate), at K = 10^3 and 10^4.

For each K, m in {K / 100, K / 10} and pools C in {2 m, 5 m, 10 m} below K:

* **Fed-CBS** (``fedcbs``, defaults: 6 repeats, first pick argmax, floor 1e-3). Planted
  federation: B = 10 classes, each client's label mix Dirichlet(0.3), its size uniform in
  [20, 200), rounded to counts; round 10, pulls ``T_k = 1 + Poisson(10 m / K)`` (the
  exploration bonus acts). Statistic: the cohort's QCID (the quantity the rule lowers), mean
  over ``draws`` rounds, for the exact rule, each pool and uniform sampling (the baseline the
  paper improves on).
* **FedCor** (its greedy on a Gaussian process, D = 15, sigma_n = 0.01, beta = 1: a GP round).
  Planted embeddings: 20 groups, each client its group's center (N(0, 1) / sqrt(D)) plus
  N(0, 0.3^2 / D) noise, weights ``w_i = n_i / N`` with sizes uniform in [20, 200).
  Statistics, per chosen set S: the share of the prior variance of the global loss change
  ``w^T Delta L`` that observing ``Delta L_S`` explains,
  ``w^T Sigma_{:,S} Sigma_SS^-1 Sigma_{S,:} w / w^T Sigma w`` (float64; what the greedy's score
  ``cov(w^T Delta L, Delta L_k) / sd(Delta L_k)`` ranks by, one pick at a time), the
  unexplained variance (the same, ``1 -`` it, absolute), and the overlap ``|S & S_exact| / m``;
  mean over ``draws`` pools, for the exact greedy, each pool and uniform sets.

Seconds: one jitted selection, the median of 3 after compiling (Fed-CBS: the strategy's
``select``; FedCor: the greedy alone, :func:`fedjax_sel.strategies.fedcor.run_greedy` or
:func:`~fedjax_sel.strategies.fedcor.pooled_greedy`, what a greedy round adds to the GP work).
Example::

    python benchmarks/comparator_pools.py --out benchmarks/results/cpu/comparator_pools.json

A dry run at a small size: ``--clients 200 --draws 5``.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import RoundInputs
from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.kernels import fedcbs as kc
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.fedcbs import FedCBSState
from fedjax_sel.strategies.fedcor import pooled_greedy, run_greedy

CLASSES, ALPHA, ROUND = 10, 0.3, 10
DIM, NOISE, GROUPS, SPREAD = 15, 0.01, 20, 0.3
POOL_FACTORS = (2, 5, 10)


def seconds(fn, *args) -> float:
    """The median of 3 calls of a jitted ``fn`` after one compiling call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[1]


def pools_of(k: int, m: int) -> list[int]:
    return [f * m for f in POOL_FACTORS if f * m < k]


# ----------------------------------------------------------------------------- Fed-CBS
def fedcbs_case(k: int, m: int, draws: int) -> dict:
    rng = np.random.default_rng(0)
    mix = rng.dirichlet(np.full(CLASSES, ALPHA), k)
    sizes = rng.integers(20, 200, k)
    counts = np.floor(mix * sizes[:, None])
    pulls = 1.0 + rng.poisson(ROUND * m / k, k)
    state = FedCBSState(jnp.asarray(counts, jnp.float32), jnp.asarray(pulls, jnp.float32))
    n = jnp.asarray(counts.sum(axis=1), jnp.int32)
    inputs = RoundInputs(jnp.int32(ROUND), jnp.ones(k, bool), None, n)
    keys = jax.random.split(jax.random.key(1), draws)
    row: dict = {"method": "fedcbs", "K": k, "m": m, "samplers": {}}
    for pool in [0, *pools_of(k, m)]:
        strategy = make_strategy("fedcbs", m, pool=pool)

        def one(key, strategy=strategy):
            return strategy.select(state, inputs, None, key)[0].diagnostics["qcid"]

        q = np.asarray(jax.jit(lambda ks, f=one: jax.lax.map(f, ks))(keys))
        row["samplers"]["exact" if pool == 0 else f"pool{pool}"] = {
            "pool": pool,
            "qcid": float(q.mean()),
            "qcid_se": float(q.std(ddof=1) / np.sqrt(draws)) if draws > 1 else None,
            "select_seconds": seconds(jax.jit(one), keys[0]),
        }

    def uniform(key):
        clients, ok = uniform_without_replacement(key, inputs.available, m)
        return kc.qcid(state.counts, jnp.zeros(k).at[clients].add(ok))

    q = np.asarray(jax.jit(jax.vmap(uniform))(keys))
    row["samplers"]["uniform"] = {"pool": None, "qcid": float(q.mean())}
    return row


# ----------------------------------------------------------------------------- FedCor
def explained(x: np.ndarray, w: np.ndarray, chosen: np.ndarray) -> float:
    """Share of ``Var(w^T Delta L)`` explained by observing ``Delta L_chosen`` (float64)."""
    g = x @ w
    xs = x[:, chosen]
    b = xs.T @ g + NOISE**2 * w[chosen]
    cov = xs.T @ xs + NOISE**2 * np.eye(len(chosen))
    prior = g @ g + NOISE**2 * w @ w
    return float(b @ np.linalg.solve(cov, b) / prior)


def fedcor_case(k: int, m: int, draws: int) -> dict:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(DIM, GROUPS)) / np.sqrt(DIM)
    x = centers[:, rng.integers(0, GROUPS, k)] + SPREAD * rng.normal(size=(DIM, k)) / np.sqrt(DIM)
    sizes = rng.integers(20, 200, k).astype(np.float64)
    w = sizes / sizes.sum()
    args = (jnp.asarray(x, jnp.float32), jnp.float32(NOISE), jnp.asarray(w, jnp.float32))
    beta, available = jnp.ones(k, jnp.float32), jnp.ones(k, bool)
    keys = jax.random.split(jax.random.key(1), draws)
    row: dict = {"method": "fedcor", "K": k, "m": m, "samplers": {}}

    def summary(sets: list[np.ndarray], exact: np.ndarray, pool, secs=None) -> dict:
        share = np.array([explained(x, w, s) for s in sets])
        return {
            "pool": pool,
            "explained": float(share.mean()),
            "unexplained": float((1.0 - share).mean()),
            "overlap": float(np.mean([len(np.intersect1d(s, exact)) / m for s in sets])),
            "select_seconds": secs,
        }

    exact_fn = jax.jit(lambda: run_greedy(*args, beta, available, m, "lowrank").clients)
    exact = np.asarray(exact_fn())
    row["samplers"]["exact"] = summary([exact], exact, 0, seconds(exact_fn))
    for pool in pools_of(k, m):

        def one(key, pool=pool):
            return pooled_greedy(key, *args, beta, available, m, pool, "lowrank")[0]

        sets = list(np.asarray(jax.jit(lambda ks, f=one: jax.lax.map(f, ks))(keys)))
        row["samplers"][f"pool{pool}"] = summary(sets, exact, pool, seconds(jax.jit(one), keys[0]))
    sets = [rng.choice(k, m, replace=False) for _ in range(draws)]
    row["samplers"]["uniform"] = summary(sets, exact, None)
    return row


COLUMNS = [
    ("method", "method", "{}"),
    ("K", "K", "{:,}"),
    ("m", "m", "{:,}"),
    ("sampler", "sampler", "{}"),
    ("QCID", "qcid", "{:.4f}"),
    ("explained", "explained", "{:.4f}"),
    ("unexplained", "unexplained", "{:.2e}"),
    ("overlap", "overlap", "{:.3f}"),
    ("select s", "select_seconds", "{:.4f}"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, action="append", help="K values (default 1000, 10000)")
    p.add_argument("--draws", type=int, default=100, help="rounds (pools) per sampler")
    p.add_argument("--out", default=None, help="JSON output file")
    a = p.parse_args()
    rows = []
    for k in a.clients or [1000, 10_000]:
        for m in (max(1, k // 100), k // 10):
            for case in (fedcbs_case, fedcor_case):
                t0 = time.perf_counter()
                rows.append(case(k, m, a.draws))
                rows[-1]["wall_seconds"] = time.perf_counter() - t0
                print(json.dumps(rows[-1]), flush=True)
    info = machine_info()
    print(f"device: {info['device_kind']} ({info['backend']}, {info['cpu_count']} CPUs)")
    flat = [
        {**{c: r[c] for c in ("method", "K", "m")}, "sampler": name, **s}
        for r in rows
        for name, s in r["samplers"].items()
    ]
    print_table(flat, COLUMNS)
    write_json_rows(a.out, {"machine": info, "draws": a.draws, "rows": rows})


if __name__ == "__main__":
    main()
