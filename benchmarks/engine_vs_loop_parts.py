"""Where the engine's round loses to a plain loop when one client's step fills the CPU.

``fedjax-sel bench throughput`` compares the whole compiled round with a Python loop over
per-client trainers. This script splits the difference for one model and workload (fixed
local steps, the same clients and data), timing five calls in turn (a, b, c, d, e, a, ...,
so a drifting machine slows them alike):

* ``loop``: the benchmark's loop, one jitted ``lax.scan`` trainer per client (plain
  flax/optax SGD on float32 copies of each client's data), weighted into a running sum;
* ``loop of the engine's update``: the same Python loop, calling the engine's per-client
  update (:func:`fedjax_sel.training.local.make_client_update`: minibatches gathered from the
  stacked data, its loss statistics) jitted once;
* ``trainer``: the engine's trainer for all P clients in one program (``--mode``), which
  stacks the P clients' models;
* ``trainer, aggregated as it trains``: the same with the aggregation weights (``map``
  only): each client's update is added into a running sum as it finishes, as in the loop;
* ``round``: the whole compiled round (full participation: the trainer, aggregating as it
  trains where the mode allows, then the server step).

The byte count printed with it: the stacked models the stacked trainer writes (and an
aggregation after it would read). Writes JSON, prints a table::

    python benchmarks/engine_vs_loop_parts.py --model mlp --per-round 100 \\
        --out benchmarks/results/cpu_xeon/engine_vs_loop_parts_mlp.json
"""

from __future__ import annotations

import argparse
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.bench import throughput as tp
from fedjax_sel.bench.common import interleaved_times, machine_info, print_table, write_json_rows
from fedjax_sel.models import make_model
from fedjax_sel.training.local import LocalConfig, make_client_update, make_trainer


def measure(model_name: str, per_round: int, mode: str, local_steps: int, repeats: int) -> dict:
    shape, classes, tokens, _ = tp.MODEL_SPECS[model_name]
    model = make_model(model_name, input_shape=shape, num_classes=classes)
    bsz = 32
    sizes = tp.client_sizes("steps", per_round, 2 * bsz * local_steps)
    xs, ys, scale = tp.random_clients(shape, classes, tokens, sizes)
    ds = tp.dataset_of(model_name, shape, classes, xs, ys, scale)
    local = LocalConfig(batch_size=bsz, lr=0.01, local_steps=local_steps)
    params = model.init(jax.random.key(0))
    data = jax.device_put(ds.train)
    key = jax.random.key(5)
    clients = jnp.arange(per_round, dtype=jnp.int32)
    weights = sizes / sizes.sum()

    loop = tp._loop_client(model, (xs, ys, scale), sizes, local, params)

    update = make_client_update(model, local, int(data.n_max))
    one_update = jax.jit(lambda p, d, c, k: update(p, None, d, c, k)[0])
    accumulate = jax.jit(lambda acc, p, w: jax.tree.map(lambda a, b: a + w * b, acc, p))
    zeros = jax.tree.map(jnp.zeros_like, params)

    def loop_of_update():
        acc = zeros
        for c in range(per_round):
            p = one_update(params, data, jnp.int32(c), jax.random.fold_in(key, c))
            acc = accumulate(acc, p, float(weights[c]))
        return acc

    trainer = make_trainer(model, local, int(data.n_max), parallel=mode)
    train = jax.jit(lambda p, d, c, k: trainer(p, d, c, jnp.ones_like(c, bool), k).params)
    one_round, _ = tp._engine(model, ds, per_round, mode, local, 2 * repeats + 4)
    calls = {
        "loop": loop,
        "loop of the engine's update": loop_of_update,
        f"trainer ({mode})": lambda: train(params, data, clients, key),
    }
    if trainer.streams:
        w = jnp.asarray(weights, jnp.float32)
        streamed = jax.jit(
            lambda p, d, c, k: (
                trainer(p, d, c, jnp.ones_like(c, bool), k, aggregate_weights=w).weighted_delta
            )
        )
        calls[f"trainer ({mode}), aggregated as it trains"] = lambda: streamed(
            params, data, clients, key
        )
    calls[f"round ({mode})"] = one_round
    times = interleaved_times(calls, repeats)
    loop_times = times["loop"]["times"]
    rows = []
    for name, t in times.items():
        ratios = [lt / x for lt, x in zip(loop_times, t["times"], strict=True)]
        rows.append(
            {
                "part": name,
                "seconds": t["seconds"],
                "milliseconds": 1e3 * t["seconds"],
                "client_updates_per_s": per_round / t["seconds"],
                "loop_over_this": statistics.median(ratios),
                "times": t["times"],
            }
        )
    num_params = int(sum(np.size(x) for x in jax.tree.leaves(params)))
    return {
        "model": model_name,
        "work": "steps",
        "per_round": per_round,
        "local_steps": local_steps,
        "batch_size": bsz,
        "mode": mode,
        "repeats": repeats,
        "num_params": num_params,
        "stacked_model_bytes": per_round * num_params * 4,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="mlp", choices=sorted(tp.MODEL_SPECS))
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--mode", default="map", help="the engine's client parallelism")
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    result = measure(a.model, a.per_round, a.mode, a.local_steps, a.repeats)
    info = machine_info()
    print(f"device: {info['cpu_model']} ({info['cpu_count']} CPUs), jax {info['jax_version']}")
    print(
        f"{a.model}, P = {a.per_round}, {a.local_steps} steps of batch 32; stacked models "
        f"{result['stacked_model_bytes'] / 1e6:.1f} MB"
    )
    print_table(
        result["rows"],
        [
            ("part", "part", "{}"),
            ("ms/round", "milliseconds", "{:.1f}"),
            ("upd/s", "client_updates_per_s", "{:.1f}"),
            ("loop/this", "loop_over_this", "{:.3f}"),
        ],
    )
    write_json_rows(a.out, {**result, "machine": info})


if __name__ == "__main__":
    main()
