"""Why a convolution model trains slower inside the compiled round than in a plain loop on a CPU.

One client's SGD steps on the user CNN of ``examples/user_cnn.py`` (two 3x3 convolutions,
batch 10 of 28x28x1, FedJAX's EMNIST workload), timed three ways for each convolution
implementation (``fedjax_sel.models.conv``):

* ``loop``: one jitted step per call, from Python (FedJAX's way);
* ``scan``: the steps inside one compiled ``lax.scan`` (the engine's way);
* the gradients' agreement with the plain loop's XLA convolution after the steps.

``xla`` inside ``scan`` is the slow case: jax writes the kernel gradient as a convolution with
batch and features swapped, which XLA:CPU runs as a naive loop nest inside a ``while`` body.
``xla_nhwc`` transposes it to channels-last first. Writes JSON, prints a table::

    python benchmarks/conv_in_loops.py --out benchmarks/results/cpu/conv_in_loops.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

from fedjax_sel.bench.common import print_table, time_call, write_json_rows
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.models.conv import convolutions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from user_cnn import UserCNN  # noqa: E402

IMPLS = ("xla", "xla_nhwc", "patches")


def measure(steps: int = 20, batch: int = 10, repeats: int = 5) -> list[dict]:
    module = UserCNN()
    xs = jax.random.normal(jax.random.key(0), (steps, batch, 28, 28, 1))
    ys = jax.random.randint(jax.random.key(1), (steps, batch), 0, 62)
    params = module.init(jax.random.key(2), xs[0])
    rows, finals = [], {}
    for impl in IMPLS:

        def step(p, xb, yb, impl=impl):
            def loss(p):
                with convolutions(impl):
                    logits = module.apply(p, xb)
                return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean()

            return jax.tree.map(lambda a, g: a - 0.01 * g, p, jax.grad(loss)(p))

        one = jax.jit(step)
        batches = [(xs[i], ys[i]) for i in range(steps)]

        def loop(one=one, batches=batches):
            p = params
            for xb, yb in batches:
                p = one(p, xb, yb)
            return p

        scanned = jax.jit(
            lambda p, xs, ys, step=step: jax.lax.scan(
                lambda p, b: (step(p, *b), None), p, (xs, ys)
            )[0]
        )
        for where, fn in (("loop", loop), ("scan", lambda s=scanned: s(params, xs, ys))):
            seconds = time_call(fn, repeats=repeats)["min_seconds"]
            finals[(impl, where)] = fn()
            rows.append({"conv_impl": impl, "where": where, "ms_per_step": 1e3 * seconds / steps})
    reference = finals[("xla", "loop")]
    for r in rows:
        got = finals[(r["conv_impl"], r["where"])]
        r["max_param_diff_vs_xla_loop"] = max(
            float(jnp.abs(a - b).max())
            for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(reference), strict=True)
        )
        r["vs_xla_loop"] = r["ms_per_step"] / next(
            q["ms_per_step"] for q in rows if (q["conv_impl"], q["where"]) == ("xla", "loop")
        )
    return rows


COLUMNS = [
    ("conv", "conv_impl", "{}"),
    ("where", "where", "{}"),
    ("ms/step", "ms_per_step", "{:.2f}"),
    ("x loop (xla)", "vs_xla_loop", "{:.2f}"),
    ("max |param diff|", "max_param_diff_vs_xla_loop", "{:.1e}"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = measure(a.steps, repeats=a.repeats)
    print_table(rows, COLUMNS)
    write_json_rows(a.out, {"machine": machine_info(), "steps": a.steps, "rows": rows})


if __name__ == "__main__":
    main()
