"""The cost axes (fedjax_sel/engine/cost.py): per round, the client updates received, the bytes
uploaded and the clients' FLOPs, with the strategies' oracle work charged, against closed forms
from the model's shapes and the logged slots; and the oracle work's seconds on the clock."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientWork, client_work
from fedjax_sel.data import load_dataset
from fedjax_sel.engine.cost import round_cost, work_seconds
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.system import lognormal
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig

ROUNDS, PER_ROUND, BATCH, STEPS = 3, 4, 8, 3


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=12, partition="dirichlet:0.5", seed=0)


def _mlp_forward_flops(params) -> float:
    """One example's forward FLOPs from the kernels' shapes alone: 2 * in * out per layer."""
    kernels = [x for p, x in jax.tree_util.tree_leaves_with_path(params) if "kernel" in str(p)]
    return float(sum(2 * k.shape[0] * k.shape[1] for k in kernels))


def _run(ds, strategy: str, system=None, **options):
    model = make_model("mlp", input_shape=ds.input_shape, num_classes=10)
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy(strategy, PER_ROUND, **options),
        local=LocalConfig(batch_size=BATCH, local_steps=STEPS),
        per_round=PER_ROUND,
        system=system,
    )
    sim = Simulation(spec, ds, num_rounds=ROUNDS)
    state = sim.init(0, hparams=HParams.of(0.1))
    _, logs = sim.run_rounds(state, ROUNDS)
    return spec, jax.tree.map(np.asarray, logs), model.init(jax.random.key(0))


def _training_flops(ds, logs, forward: float) -> np.ndarray:
    counts = np.asarray(ds.train.counts)
    per_round = []
    for clients, mask in zip(logs.clients, logs.mask, strict=True):
        examples = STEPS * np.minimum(counts[clients[mask]], BATCH)
        per_round.append(3.0 * forward * examples.sum())
    return np.asarray(per_round)


def test_uniform_costs_are_the_closed_form(digits):
    spec, logs, params = _run(digits, "uniform")
    forward = _mlp_forward_flops(params)
    assert spec.example_flops == pytest.approx(forward)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    np.testing.assert_array_equal(logs.client_updates, logs.mask.sum(axis=1))
    np.testing.assert_allclose(logs.uplink_bytes, logs.mask.sum(axis=1) * 4.0 * n_params)
    np.testing.assert_allclose(logs.client_flops, _training_flops(digits, logs, forward), rtol=1e-6)


@pytest.mark.parametrize("variant", ["pow", "cpow"])
def test_power_of_choice_pays_its_candidates_loss_queries(digits, variant):
    d = 8
    options = {"batch_size": 32} if variant == "cpow" else {}
    spec, logs, params = _run(digits, "power_of_choice", d=d, variant=variant, **options)
    forward = _mlp_forward_flops(params)
    training = _training_flops(digits, logs, forward)
    queries = (logs.client_flops - training) / forward  # examples passed forward
    counts = np.asarray(digits.train.counts)
    # d candidates drawn without replacement by size: between the d smallest and largest sets
    per_candidate = counts if variant == "pow" else np.minimum(counts, 32)
    low, high = np.sort(per_candidate)[:d].sum(), np.sort(per_candidate)[-d:].sum()
    assert np.all(queries >= low - 1e-3) and np.all(queries <= high + 1e-3)
    assert np.all(logs.client_flops > training)
    np.testing.assert_array_equal(logs.client_updates, logs.mask.sum(axis=1))


def test_work_seconds_is_the_slowest_asked_client():
    k = 5
    counts = jnp.array([10, 20, 30, 40, 50])
    compute = jnp.array([3.0, 6.0, 9.0, 12.0, 15.0])  # seconds of the round's training work
    comm = jnp.array([2.0, 2.0, 4.0, 4.0, 8.0])
    work = client_work(k, jnp.array([0, 2]), forward_examples=jnp.array([10.0, 30.0]))
    spec = _tiny_spec(batch=8, steps=2)
    seconds = float(work_seconds(spec, work, counts, compute, comm))
    # per training example: compute / samples (samples = steps * min(batch, n) = 16)
    per_example = np.asarray(compute) / 16.0
    expect = max(per_example[i] * n / 3.0 + 0.5 * float(comm[i]) for i, n in ((0, 10), (2, 30)))
    assert seconds == pytest.approx(expect)
    extra = ClientWork(*(jnp.zeros(k) for _ in range(3)))._replace(
        train_steps=jnp.array([0.0, 0.0, 0.0, 0.0, 2.0]), uploads=jnp.array([0, 0, 0, 0, 1.0])
    )
    seconds = float(work_seconds(spec, extra, counts, compute, comm))
    assert seconds == pytest.approx(per_example[4] * 2 * 8 + 0.5 * 8.0 * 2)


def test_round_cost_charges_work_steps_and_uploads():
    spec = _tiny_spec(batch=8, steps=2, example_flops=10.0, kbit=8.0)
    counts = jnp.array([4, 20, 30])
    work = client_work(3, jnp.array([1, 2]), train_steps=jnp.array([2.0, 1.0]), uploads=1.0)
    cost = round_cost(
        spec, counts, jnp.array([0, 1]), jnp.array([True, False]), jnp.array([2, 2]), work
    )
    # slot 0: 2 steps of min(8, 4) examples; work: client 1 2 steps of 8, client 2 1 step of 8
    assert float(cost.client_flops) == pytest.approx(3 * 10.0 * (2 * 4 + 2 * 8 + 1 * 8))
    assert int(cost.client_updates) == 3
    assert float(cost.uplink_bytes) == pytest.approx(3 * 1000.0)


def _tiny_spec(batch: int, steps: int, example_flops: float = 1.0, kbit: float = 0.0):
    class Local:
        batch_size, local_steps, local_epochs = batch, steps, None

    class Spec:
        pass

    spec = Spec()
    spec.local, spec.example_flops, spec.kbit = Local(), example_flops, kbit
    return spec


def test_oracle_work_lengthens_the_round_on_the_clock(digits):
    from fedjax_sel.base import Selection
    from fedjax_sel.engine.phases import apply_timing, client_durations
    from fedjax_sel.engine.state import SimData

    model = make_model("mlp", input_shape=digits.input_shape, num_classes=10)
    spec = RoundSpec.create(
        digits,
        model,
        make_strategy("uniform", PER_ROUND),
        local=LocalConfig(batch_size=BATCH, local_steps=STEPS),
        per_round=PER_ROUND,
        system=lognormal(),
    )
    state = Simulation(spec, digits, num_rounds=ROUNDS).init(0, hparams=HParams.of(0.1))
    data = SimData.of(digits)
    system = client_durations(spec, state, data)
    clients = jnp.arange(PER_ROUND, dtype=jnp.int32)
    plain = Selection(clients, jnp.ones(PER_ROUND, bool), jnp.full(PER_ROUND, 0.25))
    asked = client_work(12, jnp.array([5, 9]), forward_examples=jnp.array([40.0, 7.0]))
    counts = data.train.counts
    _, t0 = apply_timing(spec, state, plain, system, counts)
    _, t1 = apply_timing(spec, state, plain._replace(work=asked), system, counts)
    extra = float(work_seconds(spec, asked, counts, system[0], system[1]))
    assert extra > 0
    assert float(t1.duration) == pytest.approx(float(t0.duration) + extra, rel=1e-6)


def test_records_keep_running_totals(tmp_path):
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment.run import run_experiment

    config = RunConfig(
        dataset="digits",
        num_clients=12,
        per_round=3,
        rounds=4,
        eval_every=2,
        local_steps=2,
        strategy="power_of_choice",
        seed=1,
    )
    run_experiment(config, out_dir=tmp_path / "run", progress=False)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("client_updates", "uplink_bytes", "client_flops"):
        values = [r[key] for r in records]
        assert values == sorted(values) and values[0] > 0
    assert records[-1]["client_updates"] == 4 * 3
