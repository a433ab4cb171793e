"""How fast XLA:CPU runs the MLP's first-layer products as the number of rows shrinks.

An SGD step of one client multiplies its minibatch (B rows) by its own weights: the forward
product ``a @ w`` and the weight gradient ``a.T @ g``. Federated clients do not share weights,
so a round cannot stack the clients' rows into one taller product (``vmap`` gives a batch of
the same B-row products). This script times that pair of products for the MLP's first layer
(784 x 200) at B = 10 (FedJAX's batch), 32, 100 and 1,000 rows, inside one compiled loop (no
dispatch between iterations), the sizes in turns, and reports GFLOP/s (4 B x 784 x 200 per
iteration; the fastest of the turns)::

    python benchmarks/skinny_matmul.py --out benchmarks/results/cpu_xeon/skinny_matmul.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from fedjax_sel.bench.common import interleaved_times, machine_info, print_table, write_json_rows

IN, OUT = 784, 200  # the MLP's first layer


def products(rows: int, iterations: int):
    """The compiled loop of ``iterations`` forward products and weight gradients of B rows."""
    a = jnp.full((rows, IN), 0.5, jnp.float32)
    w = jnp.full((IN, OUT), 1e-3, jnp.float32)

    def body(_, w):  # forward product, then the weight gradient of a linear loss
        return w - 1e-6 * (a.T @ (a @ w))

    run = jax.jit(lambda w: jax.lax.fori_loop(0, iterations, body, w))
    return lambda: run(w)


def measure(row_counts: list[int], repeats: int) -> list[dict]:
    """Each row count's loop timed in turns with the others (the fastest of ``repeats``)."""
    iterations = {r: max(20, 20_000 // r) for r in row_counts}
    times = interleaved_times({r: products(r, iterations[r]) for r in row_counts}, repeats)
    rows = []
    for r in row_counts:
        seconds = times[r]["min_seconds"]
        flops = 4.0 * r * IN * OUT * iterations[r]
        rows.append(
            {
                "rows": r,
                "iterations": iterations[r],
                "seconds": seconds,
                "gflops": flops / seconds / 1e9,
            }
        )
    biggest = max(row["gflops"] for row in rows)
    for row in rows:
        row["fraction_of_fastest"] = row["gflops"] / biggest
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 32, 100, 1000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = measure(a.rows, a.repeats)
    print_table(
        rows,
        [
            ("rows B", "rows", "{}"),
            ("GFLOP/s", "gflops", "{:.1f}"),
            ("of the fastest", "fraction_of_fastest", "{:.2f}"),
        ],
    )
    write_json_rows(
        a.out,
        {
            "command": "python benchmarks/skinny_matmul.py",
            "layer": [IN, OUT],
            "machine": machine_info(),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
