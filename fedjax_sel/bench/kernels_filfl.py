"""Kernel benchmarks of FilFL's filtering pass (``--clients`` is n, the considered clients).

``filfl_dgf`` / ``filfl_rgf`` time one chi-GF pass over n local models of the MLP
(784-200-200-10, a filtering set of 600 MNIST-shaped examples: 1% of MNIST's training set);
``filfl_dgf_lstm`` / ``filfl_rgf_lstm`` the same with the character LSTM (8-dim embedding,
2 x 256) on 34 windows of 80 characters (FilFL's Shakespeare filtering set); ``filfl_brute``
the exhaustive search over all ``2^n - 1`` subsets (default n = 10).

A pass needs ``2n + 2`` forward passes over V (a pair per step, the full set and the empty
set); :func:`floor_report` measures one forward pass in the same process and reports each
kernel's time as a multiple of the ``2n``-forward-pass floor (``benchmarks/filfl_kernels.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.bench.common import print_table, time_call, write_json_rows
from fedjax_sel.bench.kernels import register_kernel
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.kernels.double_greedy import brute_force_filter, filter_dgf, filter_rgf
from fedjax_sel.models import Model, make_model
from fedjax_sel.training.evaluate import evaluate_central

MNIST_FILTER_SIZE = 600  # 1% of MNIST's 60,000 training images
SHAKESPEARE_FILTER_SIZE = 34  # windows of the FilFL introduction (paper, Fig. 3)


def problem(model_name: str, n: int, seed: int = 0):
    """A model, n perturbed local models stacked, a filtering set and the global model."""
    key = jax.random.key(seed)
    k_data, k_init, k_noise = jax.random.split(key, 3)
    if model_name == "lstm":
        model = make_model("lstm", input_shape=(80,), num_classes=80)
        x = jax.random.randint(k_data, (SHAKESPEARE_FILTER_SIZE, 80), 0, 80).astype(jnp.uint8)
        y = jax.random.randint(k_data, (SHAKESPEARE_FILTER_SIZE,), 0, 80)
    else:
        model = make_model("mlp", input_shape=(784,), num_classes=10)
        x = jax.random.uniform(k_data, (MNIST_FILTER_SIZE, 784))
        y = jax.random.randint(k_data, (MNIST_FILTER_SIZE,), 0, 10)
    params = model.init(k_init)
    leaves, tree = jax.tree.flatten(params)
    noise_keys = jax.random.split(k_noise, len(leaves))
    scales = jnp.linspace(0.01, 0.2, n)  # clients of different quality
    stacked = [
        p[None] + scales.reshape((n,) + (1,) * p.ndim) * jax.random.normal(k, (n,) + p.shape)
        for p, k in zip(leaves, noise_keys, strict=True)
    ]
    return model, jax.tree.unflatten(tree, stacked), x, y, params


def objective_of(model: Model, x, y):
    return lambda p: -evaluate_central(model, p, x, y, 1024)[0]


def _greedy(model_name: str, variant: str):
    def build(n: int):
        model, stacked, x, y, params = problem(model_name, n)
        valid = jnp.ones((n,), bool)

        def fn(stacked, valid, x, y, params, key):
            objective = objective_of(model, x, y)
            empty = objective(params)
            if variant == "dgf":
                return filter_dgf(stacked, valid, objective, empty).keep
            return filter_rgf(key, stacked, valid, objective, empty).keep

        return fn, (stacked, valid, x, y, params, jax.random.key(1))

    return build


# n local models are held at once (the MLP's are 0.8 MB each): larger n is skipped, not tried
for _model, _suffix, _clients, _limit in (
    ("mlp", "", (10, 100, 1000), 2000),
    ("lstm", "_lstm", (10, 100), 500),
):
    for _variant in ("dgf", "rgf"):
        register_kernel(
            f"filfl_{_variant}{_suffix}",
            default_clients=_clients,
            max_clients=_limit,
            description=f"one FilFL {_variant.upper()} pass over n {_model} local models",
        )(_greedy(_model, _variant))


@register_kernel(
    "filfl_brute",
    default_clients=(10,),
    max_clients=16,
    description="exhaustive FilFL optimum, 2^n-1 subsets",
)
def _brute(n: int):
    model, stacked, x, y, _ = problem("mlp", n)

    def fn(stacked, valid, x, y):
        return brute_force_filter(stacked, valid, objective_of(model, x, y)).value

    return fn, (stacked, jnp.ones((n,), bool), x, y)


def floor_report(
    models: tuple[str, ...] = ("mlp", "lstm"),
    clients: dict[str, tuple[int, ...]] | None = None,
    *,
    brute_n: int = 10,
    repeats: int = 3,
    out: str | None = None,
) -> list[dict]:
    """Times DGF and RGF against the floor of ``2n`` forward passes over V (one forward pass
    of one model timed in the same process), and the brute force against ``2^n - 1`` passes;
    also the approximation ratio ``(10 + R(S_f)) / (10 + R(OPT))`` of both greedies at
    ``brute_n`` (on the synthetic local models of :func:`problem`)."""
    clients = clients or {"mlp": (10, 100, 1000), "lstm": (10, 100)}
    rows = []
    for name in models:
        model, stacked1, x, y, params = problem(name, 1)
        forward = jax.jit(objective_of(model, x, y))
        t_forward = time_call(lambda: forward(params), repeats=max(repeats, 5))["seconds"]
        for n in clients[name]:
            for variant in ("dgf", "rgf"):
                fn, args = _greedy(name, variant)(n)
                jfn = jax.jit(fn)
                t = time_call(lambda jfn=jfn, args=args: jfn(*args), repeats=repeats)["seconds"]
                rows.append(_row(name, f"filfl_{variant}", n, t, t_forward, 2 * n))
        if name == "mlp":
            model, stacked, x, y, params = problem(name, brute_n)
            objective = objective_of(model, x, y)
            valid = jnp.ones((brute_n,), bool)
            brute = jax.jit(lambda s: brute_force_filter(s, valid, objective).value)
            t = time_call(lambda: brute(stacked), repeats=repeats)["seconds"]
            opt = float(brute(stacked))
            empty = float(objective(params))
            dgf = float(jax.jit(lambda s: filter_dgf(s, valid, objective, empty).value)(stacked))
            rgf = float(
                jax.jit(lambda s: filter_rgf(jax.random.key(1), s, valid, objective, empty).value)(
                    stacked
                )
            )
            row = _row(name, "filfl_brute", brute_n, t, t_forward, 2**brute_n - 1)
            row.update(
                value_opt=opt,
                ratio_dgf=(10 + dgf) / (10 + opt),
                ratio_rgf=(10 + rgf) / (10 + opt),
            )
            rows.append(row)
    info = machine_info()
    print(f"device: {info['device_kind']} ({info['backend']}), jax {info['jax_version']}")
    print_table(
        rows,
        [
            ("kernel", "kernel", "{}"),
            ("model", "model", "{}"),
            ("n", "n", "{}"),
            ("ms", "milliseconds", "{:.2f}"),
            ("1 fwd ms", "forward_ms", "{:.3f}"),
            ("floor passes", "floor_passes", "{}"),
            ("x floor", "ratio_to_floor", "{:.2f}"),
            ("ratio DGF", "ratio_dgf", "{:.4f}"),
            ("ratio RGF", "ratio_rgf", "{:.4f}"),
        ],
    )
    write_json_rows(out, [dict(r, device=info["device_kind"]) for r in rows])
    return rows


def _row(model, kernel, n, seconds, t_forward, passes) -> dict:
    return {
        "kernel": kernel,
        "model": model,
        "n": n,
        "milliseconds": seconds * 1e3,
        "forward_ms": t_forward * 1e3,
        "floor_passes": passes,
        "ratio_to_floor": seconds / (passes * t_forward),
    }
