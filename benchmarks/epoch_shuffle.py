"""The epoch permutation of local training (``local_epochs``), before and after its radix sort,
in one process.

Every client draws one permutation per local epoch over the ``n_max`` positions of the largest
client (fixed shapes): uniform keys, then a stable argsort. XLA:CPU sorts the (key, index) pairs
of an argsort several times slower than one uint32 operand, so the engine now sorts the keys'
23 random bits by least-significant-digit passes of single-operand uint32 sorts
(:func:`fedjax_sel.training.local.stable_argsort_uint`); the permutation is the same, bit for
bit (checked here). With skewed client sizes (LEAF Synthetic: median 115 examples, largest
10677) every small client pays for the largest one's sort, which dominated the round.

Measures (1) one epoch's positions for 100 clients at several ``n_max`` and (2) ten rounds of
the CA-Fed Fig. 1 Synthetic run at the paper's size (paper profile: 100 clients, all train 2
epochs of batch 32, logistic regression; ten seeds batched, ``chunked:4`` as the reproduction
ran), each with the argsort the engine had (``before``) and with the radix sort (``after``),
and checks that the two give the same results. Writes a JSON and prints a table::

    python benchmarks/epoch_shuffle.py --out benchmarks/results/cpu/epoch_shuffle.json
"""

from __future__ import annotations

import argparse
import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.bench.common import print_table, time_call, write_json_rows
from fedjax_sel.engine.state import stack_states
from fedjax_sel.experiment.build import build_simulation
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.training import HParams, local
from studies import ca_fed_setup


def argsort_epoch_positions(key, count, n_max: int, batch_size: int):
    """The engine's epoch positions before the radix sort (a stable argsort of the uniform
    keys), kept here to time it."""
    u = jax.random.uniform(key, (n_max,))
    u = jnp.where(jnp.arange(n_max) < count, u, 2.0)
    perm = jnp.argsort(u).astype(jnp.int32)
    rows = -(-n_max // batch_size)
    perm = jnp.pad(perm, (0, rows * batch_size - n_max), constant_values=n_max)
    return perm.reshape(rows, batch_size)


@contextlib.contextmanager
def engine_shuffle(variant: str):
    """Local training traced with the ``before`` (argsort) or ``after`` (radix) positions."""
    current = local.epoch_positions
    if variant == "before":
        local.epoch_positions = argsort_epoch_positions
    try:
        yield
    finally:
        local.epoch_positions = current


def permutation_rows(repeats: int, clients: int = 100, batch_size: int = 32) -> list[dict]:
    rows = []
    for n_max in (600, 10677, 60000):
        keys = jax.random.split(jax.random.key(n_max), clients)
        counts = jnp.asarray(np.random.default_rng(0).integers(1, n_max + 1, clients), jnp.int32)
        out, seconds = {}, {}
        for variant, fn in (("before", argsort_epoch_positions), ("after", local.epoch_positions)):
            f = jax.jit(jax.vmap(lambda k, c, fn=fn, n=n_max: fn(k, c, n, batch_size)))
            out[variant] = np.asarray(f(keys, counts))
            seconds[variant] = time_call(lambda f=f: f(keys, counts), repeats=repeats)["seconds"]
        rows.append(
            {
                "what": f"epoch positions, n_max={n_max}",
                "n_max": n_max,
                "clients": clients,
                "before_ms": 1e3 * seconds["before"] / clients,
                "after_ms": 1e3 * seconds["after"] / clients,
                "speedup": seconds["before"] / seconds["after"],
                "identical": bool(np.array_equal(out["before"], out["after"])),
                "unit": "ms per client-epoch",
            }
        )
    return rows


def simulation_row(repeats: int, seeds: int = 10, rounds: int = 10) -> dict:
    profile, scale = ca_fed_setup.PROFILES["paper"], ca_fed_setup.SCALES["paper"]
    config = ca_fed_setup.make_config(
        "ca_fed", "synthetic", profile, scale, lr=(0.001, 1.0), rounds=200
    ).replace(parallel="chunked:4", eval_every=rounds)
    seconds, finals = {}, {}
    for variant in ("before", "after"):
        with engine_shuffle(variant):
            resolved = resolve(config)
            sim = build_simulation(resolved)
            hparams = HParams.from_config(resolved.config)
            states = stack_states([sim.init(seed=s, hparams=hparams) for s in range(seeds)])

            def run(sim=sim, states=states):
                return sim.run_rounds_batch(states, None, rounds)[0].params

            finals[variant] = jax.tree.map(np.asarray, run())
            seconds[variant] = time_call(run, repeats=repeats)["seconds"]
    same = all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(finals["before"]), jax.tree.leaves(finals["after"]), strict=True
        )
    )
    return {
        "what": f"CA-Fed Fig. 1 Synthetic, paper size, {seeds} seeds batched",
        "n_max": sim.dataset.train.n_max,
        "clients": config.num_clients,
        "before_ms": 1e3 * seconds["before"] / (rounds * seeds),
        "after_ms": 1e3 * seconds["after"] / (rounds * seeds),
        "speedup": seconds["before"] / seconds["after"],
        "identical": same,
        "unit": "ms per seed-round",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = permutation_rows(a.repeats) + [simulation_row(a.repeats)]
    print_table(
        rows,
        [
            ("measured", "what", "{}"),
            ("before (argsort)", "before_ms", "{:.3f}"),
            ("after (radix)", "after_ms", "{:.3f}"),
            ("speedup", "speedup", "{:.2f}x"),
            ("same result", "identical", "{}"),
            ("unit", "unit", "{}"),
        ],
    )
    write_json_rows(a.out, {"machine": machine_info(), "repeats": a.repeats, "rows": rows})


if __name__ == "__main__":
    main()
