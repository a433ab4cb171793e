"""The per-round selection work of FedCVR-Bolt and CA-Fed at a million clients, part by part,
as `fedjax-sel bench scale` runs them (`fedjax_sel/bench/scale.py`): where their rounds spend
the time that keeps them above the 2-second goal.

* FedCVR-Bolt (landmark coalitions, m = 128, k-means fitted on 20 clients per coalition): the
  landmark draw, the landmark eigenpairs (kernel block, factor, Gram blocks, embedding), the
  k-means (the sample's fit and the assignments of every client) and the whole
  ``spectral_clustering``, on K sketches of ``D = 100`` coordinates around ``P = 100`` planted
  directions (row-normalised, as the strategy feeds them).
* CA-Fed's loss signal: one minibatch loss (32 examples) of each of the K clients under one
  logistic-regression model, on padded clients of 1 to 20 examples of 60 features (the scale
  benchmark's LEAF Synthetic shape).
* HeteRo-Select's (and the evaluation's) loss of every client on all its examples, the same
  data and model, in the passes the engine gives it (``eval_rows`` of the default 1,024-row
  evaluation batch where the checkout has it, else 1,024 rows).

Each part is timed ``--repeats`` times after a compiling call; the minimum is kept. The script
uses public functions only, so the same file times an older checkout: run it with
``PYTHONPATH=<checkout>`` and ``--label`` to add that checkout's rows to the same JSON::

    python benchmarks/million_selection_parts.py --label after \\
        --out benchmarks/results/cpu_xeon/million_selection_parts.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from labelled_runs import write_labelled_run

from fedjax_sel.bench.common import print_table, time_call
from fedjax_sel.data.client_data import ClientData
from fedjax_sel.kernels import kmeans as kmeans_lib
from fedjax_sel.kernels import nystrom
from fedjax_sel.kernels.affinity import normalize_rows, squared_distances
from fedjax_sel.kernels.spectral import CoalitionConfig, scale_embedding, spectral_clustering
from fedjax_sel.models import make_model
from fedjax_sel.training import evaluate
from fedjax_sel.training.evaluate import client_batch_losses, evaluate_all_clients

LANDMARKS = 128
COALITIONS = 100
SKETCH_DIM = 100
KMEANS_SAMPLE = 20 * COALITIONS
FEATURES, CLASSES, MAX_EXAMPLES, LOSS_BATCH = 60, 10, 20, 32


def timed(fn, *args, repeats: int) -> float:
    """The fastest of ``repeats`` calls after a compiling one."""
    return time_call(lambda: fn(*args), repeats=repeats)["min_seconds"]


def fedcvr_parts(num_clients: int, repeats: int) -> list[dict]:
    keys = jax.random.split(jax.random.key(0), 3)
    centers = jax.random.normal(keys[0], (COALITIONS, SKETCH_DIM))
    group = jax.random.randint(keys[1], (num_clients,), 0, COALITIONS)
    table = normalize_rows(
        centers[group] + 0.5 * jax.random.normal(keys[2], (num_clients, SKETCH_DIM))
    )
    key = jax.random.key(1)
    eig = jax.jit(
        lambda x, k: nystrom.landmark_eigenpairs(x, COALITIONS, k, num_landmarks=LANDMARKS)
    )
    _, vecs, inv_sqrt = eig(table, key)
    points = scale_embedding(vecs, inv_sqrt, "degree")
    fit = kmeans_lib.kmeans(key, points, COALITIONS, sample=KMEANS_SAMPLE)
    config = CoalitionConfig(method="landmark", landmarks=LANDMARKS)
    parts = {
        "landmark draw": (
            jax.jit(lambda k: nystrom.landmark_indices(k, num_clients, LANDMARKS)),
            (key,),
        ),
        "landmark eigenpairs": (eig, (table, key)),
        "k-means (sample fit + every client)": (
            jax.jit(lambda p, k: kmeans_lib.kmeans(k, p, COALITIONS, sample=KMEANS_SAMPLE)),
            (points, key),
        ),
        "spectral_clustering (whole)": (
            jax.jit(lambda x, k: spectral_clustering(x, COALITIONS, k, config)),
            (table, key),
        ),
        # every client's nearest fitted center alone (k-means runs two such assignments)
        "one assignment of every client": (
            jax.jit(lambda p, c: jnp.argmin(squared_distances(p, c), axis=1)),
            (points, fit.centers),
        ),
    }
    return [
        {"strategy": "fedcvr_bolt", "part": name, "seconds": timed(fn, *args, repeats=repeats)}
        for name, (fn, args) in parts.items()
    ]


def ca_fed_parts(num_clients: int, repeats: int) -> list[dict]:
    keys = jax.random.split(jax.random.key(2), 3)
    data = ClientData(
        x=jax.random.normal(keys[0], (num_clients, MAX_EXAMPLES, FEATURES)),
        y=jax.random.randint(keys[1], (num_clients, MAX_EXAMPLES), 0, CLASSES),
        counts=jax.random.randint(keys[2], (num_clients,), 1, MAX_EXAMPLES + 1),
        offsets=jnp.zeros((num_clients,), jnp.int32),
        layout="padded",
    )
    model = make_model("logreg", input_shape=(FEATURES,), num_classes=CLASSES)
    params = model.init(jax.random.key(3))
    clients = jnp.arange(num_clients, dtype=jnp.int32)
    # the data as an argument: a closure would capture 4.8 GB as a constant of the program
    losses = jax.jit(lambda p, d, k: client_batch_losses(model, p, d, clients, k, LOSS_BATCH))
    # an older checkout (no eval_rows) evaluates in the batch itself
    rows = getattr(evaluate, "eval_rows", lambda m, p, d, b: b)(model, params, data, 1024)
    whole = jax.jit(lambda p, d: evaluate_all_clients(model, p, d, rows)[0])
    return [
        {
            "strategy": "ca_fed",
            "part": f"minibatch loss ({LOSS_BATCH}) of every client",
            "seconds": timed(losses, params, data, jax.random.key(4), repeats=repeats),
        },
        {
            "strategy": "hetero_select",
            "part": "loss of every client on all its examples",
            "seconds": timed(whole, params, data, repeats=repeats),
        },
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="this checkout", help="names these rows in the JSON")
    ap.add_argument("--out", help="JSON file; rows of other labels already there are kept")
    a = ap.parse_args()
    rows = fedcvr_parts(a.clients, a.repeats) + ca_fed_parts(a.clients, a.repeats)
    for r in rows:
        r.update(label=a.label, clients=a.clients)
    print_table(
        rows,
        [
            ("label", "label", "{}"),
            ("strategy", "strategy", "{}"),
            ("part", "part", "{}"),
            ("K", "clients", "{:,}"),
            ("seconds", "seconds", "{:.3f}"),
        ],
    )
    if a.out:
        write_labelled_run(
            a.out,
            "python benchmarks/million_selection_parts.py",
            a.label,
            rows,
            repeats=a.repeats,
        )


if __name__ == "__main__":
    main()
