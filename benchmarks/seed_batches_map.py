"""Seeds batched (``vmap``) over the engine's trainer in the ``map`` mode: seconds per member.

A sweep runs the paired seeds of a cell together, vmapped over a leading member axis. In the
``map`` mode the trainer runs only its active slots; the members select different clients, so
which slots are active differs between them. This script times the trainer of P clients
(logistic regression on MNIST-sized flat clients, fixed steps, the shared data) for one member
and for two members vmapped, with the active mask the same for both members or differing
(one slot off in the second), and, for reference, ``vmap``. Public functions only, so the same
file times an older checkout (``PYTHONPATH=<checkout>``, ``--label``)::

    python benchmarks/seed_batches_map.py --label after \\
        --out benchmarks/results/cpu_xeon/seed_batches_map.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from labelled_runs import write_labelled_run

from fedjax_sel.bench.common import print_table, time_call
from fedjax_sel.data import from_client_arrays
from fedjax_sel.models import make_model
from fedjax_sel.training import HParams, LocalConfig, parse_parallel
from fedjax_sel.training.local import make_trainer


def best_seconds(fn, *args, repeats: int) -> float:
    return time_call(lambda: fn(*args), repeats=repeats)["min_seconds"]


def measure(per_round: int, repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    sizes = rng.integers(100, 950, per_round)
    xs = [rng.normal(size=(n, 784)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, 10, n).astype(np.int32) for n in sizes]
    data = from_client_arrays(xs, ys, layout="flat")
    model = make_model("logreg", input_shape=(784,), num_classes=10)
    params = model.init(jax.random.key(0))
    cfg = LocalConfig(batch_size=64, local_steps=16)
    hparams = HParams.of(0.1)
    clients = jnp.arange(per_round, dtype=jnp.int32)
    keys = jax.random.split(jax.random.key(1), 2)
    same = jnp.ones((2, per_round), bool)
    differ = same.at[1, 0].set(False)
    rows = []
    for mode in ("map", "vmap"):
        trainer = make_trainer(model, cfg, data.n_max, parallel=parse_parallel(mode))

        def train(p, k, active, trainer=trainer):
            return trainer.train(p, data, clients, active, k, hparams=hparams).params

        alone = best_seconds(jax.jit(train), params, keys[0], same[0], repeats=repeats)
        batched = jax.jit(jax.vmap(train, in_axes=(None, 0, 0)))
        for masks, active in (("the same", same), ("differing", differ)):
            two = best_seconds(batched, params, keys, active, repeats=repeats) / 2
            rows.append(
                {
                    "mode": mode,
                    "active masks": masks,
                    "per_round": per_round,
                    "one_member_seconds": alone,
                    "two_members_seconds_per_member": two,
                    "per_member_ratio": two / alone,
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="this checkout", help="names these rows in the JSON")
    ap.add_argument("--out", help="JSON file; rows of other labels already there are kept")
    a = ap.parse_args()
    rows = measure(a.per_round, a.repeats)
    for r in rows:
        r["label"] = a.label
    print_table(
        rows,
        [
            ("label", "label", "{}"),
            ("mode", "mode", "{}"),
            ("masks", "active masks", "{}"),
            ("1 member s", "one_member_seconds", "{:.4f}"),
            ("2 members, s/member", "two_members_seconds_per_member", "{:.4f}"),
            ("ratio", "per_member_ratio", "{:.2f}"),
        ],
    )
    if a.out:
        write_labelled_run(a.out, "python benchmarks/seed_batches_map.py", a.label, rows)


if __name__ == "__main__":
    main()
