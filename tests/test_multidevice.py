"""The same run on 1 and 8 (fake CPU) devices gives the same results (design section 5)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_sel.availability import bernoulli
    from fedjax_sel.data import load_dataset
    from fedjax_sel.models import make_model
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.oracle import evaluate
    from fedjax_sel.engine.simulation import Simulation, default_mesh
    from fedjax_sel.strategies import make_strategy
    from fedjax_sel.training import HParams, LocalConfig, parse_parallel

    mode, out = sys.argv[1], sys.argv[2]
    ds = load_dataset("digits", num_clients=16, partition="iid", seed=0, layout="padded")
    model = make_model("mlp", input_shape=ds.input_shape, num_classes=10, hidden=(16,))
    mesh = default_mesh()
    round_spec = RoundSpec.create(ds, model, make_strategy("uniform", 8), per_round=8,
                                  local=LocalConfig(batch_size=8, local_steps=3),
                                  availability=bernoulli(0.8), parallel=parse_parallel(mode),
                                  mesh=mesh)
    sim = Simulation(round_spec, ds, num_rounds=4, mesh=mesh)
    hparams = HParams.of(0.1)
    state, log = sim.run_rounds(sim.init(seed=0, hparams=hparams), 4)
    leaves = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    scores = sim.evaluate(state)

    # what each device computes: XLA's cost analysis of the partitioned (per-device) program
    def flops(fn, *args):
        cost = jax.jit(fn).lower(*args).compile().cost_analysis()
        return (cost[0] if isinstance(cost, list) else cost)["flops"]

    def train(params, data):
        return round_spec.trainer.train(params, data.train, jnp.arange(8), jnp.ones(8, bool),
                                        jax.random.key(0), hparams=hparams)

    trained = jax.jit(train)(state.params, sim.data)
    spec = getattr(jax.tree.leaves(trained.params)[0].sharding, "spec", None)
    spec = "unsharded" if not spec else str(spec[0])
    train_flops = flops(train, state.params, sim.data)
    eval_flops = flops(
        lambda p, d: evaluate(round_spec, p, None, d, mesh), state.params, sim.data
    )
    np.savez(out, clients=log.clients, mask=log.mask, n_dev=len(jax.devices()),
             train_flops=train_flops, eval_flops=eval_flops, spec=spec,
             test_accuracy=scores["test_accuracy"], test_loss=scores["test_loss"],
             **{f"p{i}": x for i, x in enumerate(leaves)})
    """
)


def _run(tmp_path, devices, mode):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out_{devices}_{mode.replace(':', '_')}.npz"
    env = dict(
        os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
        + os.environ.get("FEDJAX_SEL_TEST_XLA_FLAGS", ""),
        JAX_PLATFORMS="cpu",
    )
    r = subprocess.run(
        [sys.executable, str(script), mode, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return np.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["vmap", "map"])
def test_one_and_eight_devices_agree(tmp_path, mode):
    one = _run(tmp_path, 1, mode)
    eight = _run(tmp_path, 8, mode)
    assert int(one["n_dev"]) == 1 and int(eight["n_dev"]) == 8
    np.testing.assert_array_equal(one["clients"], eight["clients"])
    np.testing.assert_array_equal(one["mask"], eight["mask"])
    keys = [k for k in one.files if k.startswith("p") and k[1:].isdigit()]
    for k in keys:
        np.testing.assert_allclose(one[k], eight[k], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one["test_accuracy"], eight["test_accuracy"], atol=1e-6)
    np.testing.assert_allclose(one["test_loss"], eight["test_loss"], rtol=1e-5)
    # the slot axis and the evaluation really are split: each device's program does about
    # an eighth of the work (replicated bookkeeping and the collectives add a little)
    assert str(eight["spec"]) == "clients"  # the trained slots' leading axis is sharded
    assert eight["eval_flops"] < 0.2 * one["eval_flops"]
    if mode == "vmap":  # (cost analysis counts a lax.map body once, whatever its trip count)
        assert eight["train_flops"] < 0.2 * one["train_flops"]
