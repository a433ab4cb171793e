"""How fast XLA:CPU runs the MLP's first-layer products as the number of rows shrinks.

An SGD step of one client multiplies its minibatch (B rows) by its own weights: the forward
product ``a @ w`` and the weight gradient ``a.T @ g``. Federated clients do not share weights,
so a round cannot stack the clients' rows into one taller product (``vmap`` gives a batch of
the same B-row products). This script times that pair of products for the MLP's first layer
(784 x 200) at B = 10 (FedJAX's batch), 32, 100 and 1,000 rows, inside one compiled loop (no
dispatch between iterations), the sizes in turns, and reports GFLOP/s (4 B x 784 x 200 per
iteration; the fastest of the turns)::

    python benchmarks/skinny_matmul.py --out benchmarks/results/cpu_xeon/skinny_matmul.json

``--layer 60 10 --clients 10000`` times logistic regression's products on LEAF Synthetic
instead, each of 10,000 clients with its own weights (the pair of products vmapped over the
clients, as a round of every client runs them)::

    python benchmarks/skinny_matmul.py --layer 60 10 --clients 10000 --rows 10 \
        --out benchmarks/results/cpu_xeon/batched_logreg_products.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from fedjax_sel.bench.common import interleaved_times, print_table, write_json_rows
from fedjax_sel.experiment.provenance import machine_info

MLP_LAYER = (784, 200)  # the MLP's first layer
ROW_COUNTS = [10, 32, 100, 1000]


def products(rows: int, iterations: int, layer: tuple[int, int] = MLP_LAYER, clients: int = 1):
    """The compiled loop of ``iterations`` forward products and weight gradients of B rows,
    for one client's weights, or vmapped over ``clients`` clients' own weights (``clients > 1``)."""
    fan_in, fan_out = layer
    a = jnp.full((rows, fan_in), 0.5, jnp.float32)
    w = jnp.full((fan_in, fan_out), 1e-3, jnp.float32)

    def step(a, w):  # forward product, then the weight gradient of a linear loss
        return w - 1e-6 * (a.T @ (a @ w))

    if clients > 1:
        a = jnp.broadcast_to(a, (clients, *a.shape))
        w = jnp.broadcast_to(w, (clients, *w.shape))
        step = jax.vmap(step)
    run = jax.jit(lambda w: jax.lax.fori_loop(0, iterations, lambda _, w: step(a, w), w))
    return lambda: run(w)


def measure(
    row_counts: list[int],
    repeats: int,
    layer: tuple[int, int] = MLP_LAYER,
    clients: int = 1,
) -> list[dict]:
    """Each row count's loop timed in turns with the others (the fastest of ``repeats``)."""
    fan_in, fan_out = layer
    # the FLOPs of 20,000 one-row steps of the MLP layer (1.3 x 10^10) a call, at any size
    per_call = 20_000 * MLP_LAYER[0] * MLP_LAYER[1]
    iterations = {r: max(20, per_call // (r * fan_in * fan_out * clients)) for r in row_counts}
    loops = {r: products(r, iterations[r], layer, clients) for r in row_counts}
    times = interleaved_times(loops, repeats)
    rows = []
    for r in row_counts:
        seconds = times[r]["min_seconds"]
        flops = 4.0 * r * fan_in * fan_out * iterations[r] * clients
        rows.append(
            {
                "rows": r,
                "clients": clients,
                "iterations": iterations[r],
                "seconds": seconds,
                "gflops": flops / seconds / 1e9,
                "microseconds_per_client_step": 1e6 * seconds / (iterations[r] * clients),
            }
        )
    biggest = max(row["gflops"] for row in rows)
    for row in rows:
        row["fraction_of_fastest"] = row["gflops"] / biggest
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=ROW_COUNTS)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--layer", type=int, nargs=2, default=list(MLP_LAYER), metavar=("IN", "OUT"))
    ap.add_argument("--clients", type=int, default=1, help="clients with their own weights")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.clients < 1 or min(a.layer) < 1 or min(a.rows) < 1:
        raise SystemExit(
            f"--clients, --layer and --rows take positive sizes: {a.clients}, {a.layer}, {a.rows}"
        )
    layer = (a.layer[0], a.layer[1])
    rows = measure(a.rows, a.repeats, layer, a.clients)
    print_table(
        rows,
        [
            ("rows B", "rows", "{}"),
            ("clients", "clients", "{:,}"),
            ("GFLOP/s", "gflops", "{:.1f}"),
            ("us per client step", "microseconds_per_client_step", "{:.2f}"),
            ("of the fastest", "fraction_of_fastest", "{:.2f}"),
        ],
    )
    write_json_rows(
        a.out,
        {
            "command": "python benchmarks/skinny_matmul.py"
            + ("" if layer == MLP_LAYER else f" --layer {layer[0]} {layer[1]}")
            + ("" if a.clients == 1 else f" --clients {a.clients}")
            + ("" if a.rows == ROW_COUNTS else " --rows " + " ".join(map(str, a.rows))),
            "layer": list(layer),
            "machine": machine_info(),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
