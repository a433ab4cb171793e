"""Where the engine's round loses to a plain loop when one client's step fills the CPU.

``fedjax-sel bench throughput`` compares the whole compiled round with a Python loop over
per-client trainers. This script splits the difference for one model and workload (fixed
local steps, the same clients and data), timing five calls in turn (a, b, c, d, e, a, ...,
so a drifting machine slows them alike):

* ``loop``: the benchmark's loop, one jitted ``lax.scan`` trainer per client (plain
  flax/optax SGD on float32 copies of each client's data), weighted into a running sum: the
  clients' SGD compiled with no Python between steps (a convolution model runs the engine's
  convolution here, which XLA:CPU runs well inside a scan);
* ``loop, one jitted step per minibatch``: FedJAX's loop (``bench throughput``'s
  ``loop_step``, XLA's own convolution at the top level); its time over ``loop``'s is the
  Python loop's overhead, the most that running the same SGD steps compiled can gain;
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
from fedjax_sel.bench.common import interleaved_times, print_table, write_json_rows
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.models import make_model
from fedjax_sel.models.base import with_conv_impl
from fedjax_sel.models.flops import train_step_flops
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import (
    LocalConfig,
    make_client_update,
    make_trainer,
    parse_parallel,
)

WEIGHT_PASSES = 5  # as benchmarks/gpu_roofline.py


def median_ratio(reference: list[float], times: list[float]) -> float:
    return statistics.median(r / t for r, t in zip(reference, times, strict=True))


def measure(
    model_name: str,
    per_round: int,
    mode: str,
    local_steps: int,
    repeats: int,
    batch_size: int = 32,
) -> dict:
    shape, classes, tokens, _ = tp.MODEL_SPECS[model_name]
    model = make_model(model_name, input_shape=shape, num_classes=classes)
    parallel = parse_parallel(mode)  # "map:conv=xla_nhwc": the engine's convolution
    if parallel.conv is not None:
        model = with_conv_impl(model, parallel.conv)
    bsz = batch_size
    sizes = tp.client_sizes("steps", per_round, 2 * bsz * local_steps)
    xs, ys, scale = tp.random_clients(shape, classes, tokens, sizes)
    ds = tp.dataset_of(model_name, shape, classes, xs, ys, scale)
    local = LocalConfig(batch_size=bsz, local_steps=local_steps)
    hparams = HParams.of(tp.LR)
    params = model.init(jax.random.key(0))
    data = jax.device_put(ds.train)
    key = jax.random.key(5)
    clients = jnp.arange(per_round, dtype=jnp.int32)
    weights = sizes / sizes.sum()

    loop = tp._loop_client(model, (xs, ys, scale), sizes, local, params)
    loop_step = tp._loop_step(tp.loop_model(model), (xs, ys, scale), sizes, local, "steps", params)

    update = make_client_update(model, local, int(data.n_max))
    one_update = jax.jit(lambda p, d, c, k: update(p, None, d, c, k, hparams)[0])
    accumulate = jax.jit(lambda acc, p, w: jax.tree.map(lambda a, b: a + w * b, acc, p))
    zeros = jax.tree.map(jnp.zeros_like, params)

    def loop_of_update():
        acc = zeros
        for c in range(per_round):
            p = one_update(params, data, jnp.int32(c), jax.random.fold_in(key, c))
            acc = accumulate(acc, p, float(weights[c]))
        return acc

    trainer = make_trainer(model, local, int(data.n_max), parallel=parallel)
    train = jax.jit(
        lambda p, d, c, k: trainer.train(p, d, c, jnp.ones_like(c, bool), k, hparams=hparams).params
    )
    one_round, _ = tp._engine(model, ds, per_round, parallel, local, 2 * repeats + 4)
    calls = {
        "loop": loop,
        "loop, one jitted step per minibatch": loop_step,
        "loop of the engine's update": loop_of_update,
        f"trainer ({mode})": lambda: train(params, data, clients, key),
    }
    if trainer.streams:
        w = jnp.asarray(weights, jnp.float32)
        streamed = jax.jit(
            lambda p, d, c, k: (
                trainer.train(
                    p, d, c, jnp.ones_like(c, bool), k, hparams=hparams, aggregate_weights=w
                ).weighted_delta
            )
        )
        calls[f"trainer ({mode}), aggregated as it trains"] = lambda: streamed(
            params, data, clients, key
        )
    calls[f"round ({mode})"] = one_round
    times = interleaved_times(calls, repeats)
    rows = []
    for name, t in times.items():
        rows.append(
            {
                "part": name,
                "seconds": t["seconds"],
                "milliseconds": 1e3 * t["seconds"],
                "client_updates_per_s": per_round / t["seconds"],
                # the median over the turns of each reference's round over this part's
                "loop_over_this": median_ratio(times["loop"]["times"], t["times"]),
                "step_loop_over_this": median_ratio(
                    times["loop, one jitted step per minibatch"]["times"], t["times"]
                ),
                "times": t["times"],
            }
        )
    num_params = int(sum(np.size(x) for x in jax.tree.leaves(params)))
    xb = jnp.zeros((bsz,) + tuple(shape), jnp.int32 if tokens else jnp.float32)
    step_flops = float(train_step_flops(model.module, xb))
    step_seconds = times["loop"]["seconds"] / (per_round * local_steps)
    return {
        "model": model_name,
        "conv": model.conv_impl,
        "work": "steps",
        "per_round": per_round,
        "local_steps": local_steps,
        "batch_size": bsz,
        "mode": mode,
        "repeats": repeats,
        "num_params": num_params,
        "stacked_model_bytes": per_round * num_params * 4,
        # one SGD step of one client: the analytic FLOPs, and the bytes of its own weights it
        # moves at least (forward read, backward read, gradient write, update reads and write)
        "flops_per_step": step_flops,
        "weight_bytes_per_step": WEIGHT_PASSES * 4 * num_params,
        "flops_per_weight_byte": step_flops / (WEIGHT_PASSES * 4 * num_params),
        "compiled_loop_step_ms": 1e3 * step_seconds,
        "compiled_loop_gflops": step_flops / step_seconds / 1e9,
        "rows": rows,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="mlp", choices=sorted(tp.MODEL_SPECS))
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument(
        "--mode", default="map", help="the engine's client parallelism (map:conv=xla_nhwc, ...)"
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    result = measure(a.model, a.per_round, a.mode, a.local_steps, a.repeats, a.batch_size)
    info = machine_info()
    print(f"device: {info['cpu_model']} ({info['cpu_count']} CPUs), jax {info['jax_version']}")
    print(
        f"{a.model}, P = {a.per_round}, {a.local_steps} steps of batch {a.batch_size}; stacked "
        f"models {result['stacked_model_bytes'] / 1e6:.1f} MB"
    )
    print(
        f"one step: {result['flops_per_step'] / 1e6:.1f} MFLOP, "
        f"{result['flops_per_weight_byte']:.1f} FLOP per weight byte; the compiled loop's step "
        f"{result['compiled_loop_step_ms']:.3f} ms ({result['compiled_loop_gflops']:.1f} GFLOP/s)"
    )
    print_table(
        result["rows"],
        [
            ("part", "part", "{}"),
            ("ms/round", "milliseconds", "{:.1f}"),
            ("upd/s", "client_updates_per_s", "{:.1f}"),
            ("loop/this", "loop_over_this", "{:.3f}"),
            ("step loop/this", "step_loop_over_this", "{:.3f}"),
        ],
    )
    write_json_rows(a.out, {**result, "machine": info})


if __name__ == "__main__":
    main()
