"""Clustered Sampling, Algorithm 2: the large-K path (Ward on a pool of R representatives)
against the exact path (Ward on every client), and both against Algorithm 1 and MD sampling.

Planted federation: K clients in G groups, each client's representative gradient its group's
random center (scale 2) plus Gaussian noise of the given scale (D = 64 coordinates), sizes
uniform in [10, 100). For each sampler: the mean number of distinct groups among the m drawn
clients over 200 rounds (the paper's "representativity"; a group heavier than 1/m is split by
the mass cut, so even the exact path covers fewer than G), and the seconds of one jitted
``select`` call (the median of 3, after compilation). Example::

    python benchmarks/clustered_sampling_pool.py \\
        --out benchmarks/results/cpu/clustered_sampling_pool.json
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import RoundInputs
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.clustered_sampling import ClusteredSimilarityState

CASES = [(1000, 20, 20, 0.5), (1000, 20, 20, 1.5), (2000, 40, 40, 1.0), (10000, 40, 40, 1.0)]
SAMPLERS = [
    ("exact", "clustered_similarity", {}),
    ("pool128", "clustered_similarity", {"pool": 128}),
    ("pool256", "clustered_similarity", {"pool": 256}),
    ("alg1", "clustered_size", {}),
]
EXACT_MAX_K = 2000  # the exact path's R x R matrices above that: minutes per round


def one_case(k: int, groups: int, m: int, noise: float, rounds: int = 200) -> dict:
    rng = np.random.default_rng(0)
    d = 64
    centers = rng.normal(size=(groups, d)) * 2.0
    group = rng.integers(0, groups, k)
    grads = centers[group] + noise * rng.normal(size=(k, d))
    sizes = rng.integers(10, 100, k)
    state = ClusteredSimilarityState(jnp.asarray(grads, jnp.float32), jnp.arange(d))
    inputs = RoundInputs(jnp.int32(0), jnp.ones(k, bool), {}, jnp.asarray(sizes, jnp.int32))
    row: dict = {"K": k, "groups": groups, "m": m, "noise": noise}
    for label, name, args in SAMPLERS:
        if label == "exact" and k > EXACT_MAX_K:
            continue
        strategy = make_strategy(name, m, **args)
        s0 = state if name == "clustered_similarity" else strategy.init(jax.random.key(0), None)
        one = jax.jit(lambda key, st=strategy, s0=s0: st.select(s0, inputs, None, key)[0])
        jax.block_until_ready(one(jax.random.key(0)))
        times = []
        for i in range(3):
            t0 = time.perf_counter()
            jax.block_until_ready(one(jax.random.key(i + 1)))
            times.append(time.perf_counter() - t0)
        picks = [one(key) for key in jax.random.split(jax.random.key(1), rounds)]
        cover = [len(set(group[np.asarray(s.clients)[np.asarray(s.mask)]])) for s in picks]
        row[label] = {"groups_covered": float(np.mean(cover)), "select_seconds": sorted(times)[1]}
    md = rng.choice(k, size=(rounds, m), p=sizes / sizes.sum())
    row["md"] = {"groups_covered": float(np.mean([len(set(group[c])) for c in md]))}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=None, help="JSON output file")
    a = p.parse_args()
    rows = []
    for case in CASES:
        rows.append(one_case(*case))
        print(json.dumps(rows[-1]))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": machine_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
