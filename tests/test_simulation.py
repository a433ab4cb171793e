"""The round and the run: aggregation, determinism, outputs, divergence."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import bernoulli
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data import load_dataset
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.experiment import finished_result, run_experiment
from fedjax_sel.experiment.outputs import TIMING_KEYS
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig, parse_parallel

LR = HParams.of(0.2)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=12, partition="dirichlet:0.5", seed=0)


def _sim(ds, strategy="uniform", per_round=4, chunk_size=10, **kw):
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    kw.setdefault("local", LocalConfig(batch_size=16, local_steps=3))
    strategy = make_strategy(strategy, per_round)
    spec = RoundSpec.create(ds, model, strategy, per_round=per_round, **kw)
    return Simulation(spec, ds, num_rounds=20, chunk_size=chunk_size)


@pytest.mark.parametrize("parallel", ["vmap", "map"])
def test_round_is_weighted_average_of_independent_client_updates(digits, parallel):
    """The new model is the size-weighted mean of the clients' updates, each trained alone;
    under ``map`` the trainer adds them up as it trains (the P models are never stacked) and
    the log's mean update norm is still that of the clients' own updates."""
    from fedjax_sel.engine.phases import streams_aggregate

    sim = _sim(digits, chunk_size=1, parallel=parse_parallel(parallel))
    assert streams_aggregate(sim.spec) == (parallel == "map")
    state = sim.init(seed=3, hparams=LR)
    new_state, log = sim.run_rounds(state, 1)
    clients, mask = log.clients[0], log.mask[0]
    assert mask.all() and len(set(clients.tolist())) == 4
    # recompute each selected client's update on its own with the round's training key
    k_train = jax.random.fold_in(jax.random.fold_in(state.key, 0), 2)
    counts = np.asarray(digits.train.counts)
    expected = jax.tree.map(lambda p: np.zeros(p.shape, np.float64), state.params)
    norms = []
    for c in clients:
        res = sim.spec.trainer.train(
            state.params, digits.train, jnp.array([c]), jnp.ones(1, bool), k_train, hparams=LR
        )
        w = counts[c] / counts[clients].sum()
        expected = jax.tree.map(
            lambda e, p, g, w=w: e + w * (np.asarray(p[0], np.float64) - np.asarray(g)),
            expected,
            res.params,
            state.params,
        )
        sq = jax.tree.map(
            lambda p, g: np.sum((np.asarray(p[0], np.float64) - np.asarray(g)) ** 2),
            res.params,
            state.params,
        )
        norms.append(np.sqrt(sum(jax.tree.leaves(sq))))
    np.testing.assert_allclose(float(log.update_norm[0]), np.mean(norms), rtol=1e-5)
    for got, p0, e in zip(
        jax.tree.leaves(new_state.params),
        jax.tree.leaves(state.params),
        jax.tree.leaves(expected),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(got), np.asarray(p0) + e, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        np.asarray(new_state.selection_counts), np.bincount(clients, minlength=12)
    )


def test_same_seed_same_results_bit_for_bit_whatever_the_chunk_size(digits):
    outs = []
    for chunk in (1, 4, 10, 10):
        sim = _sim(digits, chunk_size=chunk, availability=bernoulli(0.7))
        state, log = sim.run_rounds(sim.init(seed=5, hparams=LR), 10)
        outs.append((state, log))
    ref_state, ref_log = outs[0]
    for state, log in outs[1:]:
        for a, b in zip(
            jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params), strict=True
        ):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_array_equal(ref_log.clients, log.clients)
        np.testing.assert_array_equal(ref_log.train_loss, log.train_loss)
    other, _ = _sim(digits).run_rounds(_sim(digits).init(seed=6, hparams=LR), 2)
    first = jax.tree.leaves(outs[0][0].params)[0]
    assert not np.array_equal(np.asarray(first), np.asarray(jax.tree.leaves(other.params)[0]))


def test_profiled_round_agrees_with_the_compiled_one(digits):
    sim = _sim(digits, chunk_size=3)
    state, log = sim.run_rounds(sim.init(seed=1, hparams=LR), 3)
    state_p, log_p, seconds = sim.run_rounds_profiled(sim.init(seed=1, hparams=LR), 3)
    assert set(seconds) == {"select", "train", "aggregate"}
    np.testing.assert_array_equal(log.clients, log_p.clients)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(state_p.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_donated_rounds_give_the_same_results_and_consume_their_input(digits, host_leaves):
    """``donate=True`` (what the experiment driver and ``bench scale`` use) reuses the state's
    buffers: the same state and logs bit for bit, in the fused and the profiled rounds, and
    the donated input can no longer be read (XLA:CPU honours the donation)."""
    sim = _sim(digits, strategy="fedcvr_bolt", chunk_size=2)
    state, log = sim.run_rounds(sim.init(seed=4, hparams=LR), 4)
    given = sim.init(seed=4, hparams=LR)
    donated, log_d = sim.run_rounds(given, 4, donate=True)
    for a, b in zip(host_leaves(state), host_leaves(donated), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(log.clients, log_d.clients)
    assert jax.tree.leaves(given.params)[0].is_deleted()
    kept, _, _ = sim.run_rounds_profiled(sim.init(seed=4, hparams=LR), 2)
    given = sim.init(seed=4, hparams=LR)
    profiled, _, _ = sim.run_rounds_profiled(given, 2, donate=True)
    for a, b in zip(host_leaves(kept), host_leaves(profiled), strict=True):
        np.testing.assert_array_equal(a, b)
    assert jax.tree.leaves(given.params)[0].is_deleted()
    # a state holding one buffer in two fields (CA-Fed's init does) is donated once: the
    # second field gets a copy
    from fedjax_sel.engine.simulation import distinct_buffers

    x = jnp.arange(6.0)
    tree = distinct_buffers({"a": x, "b": x, "c": jnp.ones(2)})
    assert tree["a"] is x and tree["b"] is not x
    np.testing.assert_array_equal(np.asarray(tree["b"]), np.asarray(x))
    out = jax.jit(lambda t: jax.tree.map(lambda v: v + 1, t), donate_argnums=0)(tree)
    np.testing.assert_array_equal(np.asarray(out["b"]), np.arange(6.0) + 1)
    y = jnp.arange(3.0)  # without it, the donated call refuses the shared buffer
    with pytest.raises(Exception, match="donate the same buffer twice"):
        jax.jit(lambda t: jax.tree.map(lambda v: v + 1, t), donate_argnums=0)({"a": y, "b": y})


def test_evaluate_matches_direct_computation(digits):
    sim = _sim(digits)
    state, _ = sim.run_rounds(sim.init(seed=0, hparams=LR), 5)
    scores = sim.evaluate(state)
    logits = np.asarray(sim.spec.model.apply(state.params, digits.test_x))
    acc = np.mean(logits.argmax(1) == np.asarray(digits.test_y))
    assert scores["test_accuracy"] == pytest.approx(acc, abs=1e-6)
    z = logits - logits.max(1, keepdims=True)
    ce = -(z[np.arange(len(z)), np.asarray(digits.test_y)] - np.log(np.exp(z).sum(1)))
    assert scores["test_loss"] == pytest.approx(ce.mean(), rel=1e-5)
    assert 0 <= scores["client_test_accuracy_mean"] <= 1


def planted_logreg(rng, train_sizes, test_sizes, layout: str = "auto"):
    """A logistic model's one-round simulation (uniform, 2 slots) on planted clients of 6
    features and 3 classes, with test splits of their own (size 0: none), drawn from ``rng``;
    returns it with the parameters to evaluate (the init plus 0.3) and the test arrays."""
    from fedjax_sel.data import from_client_arrays
    from fedjax_sel.data.datasets import FederatedDataset

    def arrays(sizes):
        xs = [rng.normal(size=(n, 6)).astype(np.float32) for n in sizes]
        return xs, [rng.integers(0, 3, n).astype(np.int32) for n in sizes]

    (txs, tys), (vxs, vys) = arrays(train_sizes), arrays(test_sizes)
    train = from_client_arrays(txs, tys, layout=layout)
    test = from_client_arrays(vxs, vys, layout=layout, allow_empty=True)
    ds = FederatedDataset(
        "planted",
        train,
        test,
        jnp.asarray(np.concatenate(vxs)),
        jnp.asarray(np.concatenate(vys)),
        "classification",
        3,
        (6,),
        "logreg",
        {},
    )
    model = make_model("logreg", input_shape=(6,), num_classes=3)
    spec = RoundSpec.create(
        ds, model, make_strategy("uniform", 2), local=LocalConfig(batch_size=4), per_round=2
    )
    sim = Simulation(spec, ds, num_rounds=1)
    params = jax.tree.map(lambda a: a + 0.3, model.init(jax.random.key(1)))
    return sim, params, vxs, vys


@pytest.mark.parametrize("layout", ["padded", "flat"])
def test_per_client_test_means_match_numpy(layout):
    """``client_test_accuracy_mean`` / ``client_test_loss_mean`` (FedCVR-Bolt's Tables 1-2 and
    IFCA/FeSEM's metric): each client's mean over its own test examples, then the plain mean
    over the clients that hold test data; padded rows and test-less clients do not count."""
    rng = np.random.default_rng(0)
    train_sizes, test_sizes = [5, 9, 4, 6], [3, 0, 7, 1]  # client 1 has no test data
    sim, params, vxs, vys = planted_logreg(rng, train_sizes, test_sizes, layout)
    state = sim.init(0, params=params, hparams=LR)
    scores = sim.evaluate(state)
    w = np.asarray(state.params["Dense_0"]["kernel"])
    b = np.asarray(state.params["Dense_0"]["bias"])
    accs, losses = [], []
    for x, y in zip(vxs, vys, strict=True):
        if len(y) == 0:
            continue
        z = x @ w + b
        z = z - z.max(1, keepdims=True)
        losses.append(np.mean(-(z[np.arange(len(y)), y] - np.log(np.exp(z).sum(1)))))
        accs.append(np.mean(z.argmax(1) == y))
    assert scores["client_test_accuracy_mean"] == pytest.approx(np.mean(accs), abs=1e-6)
    assert scores["client_test_loss_mean"] == pytest.approx(np.mean(losses), rel=1e-5)
    # the pooled (example-weighted) accuracy differs: the per-client mean is its own metric
    pooled = np.mean(
        np.concatenate(
            [
                (np.asarray(x @ w + b).argmax(1) == y)
                for x, y in zip(vxs, vys, strict=True)
                if len(y)
            ]
        )
    )
    assert scores["test_accuracy"] == pytest.approx(pooled, abs=1e-6)


def test_fedavg_learns_digits(digits):
    sim = _sim(digits, strategy="full", per_round=12)
    state, _ = sim.run_rounds(sim.init(seed=0, hparams=LR), 30)
    assert sim.evaluate(state)["test_accuracy"] > 0.85


def test_persistent_client_state_runs_and_differs(digits):
    local = LocalConfig(batch_size=16, local_steps=3, momentum=0.9)
    a = _sim(digits, local=local, persistent_client_state=True)
    b = _sim(digits, local=local, persistent_client_state=False)
    sa, _ = a.run_rounds(a.init(0, hparams=HParams.of(0.1)), 6)
    sb, _ = b.run_rounds(b.init(0, hparams=HParams.of(0.1)), 6)
    la, lb = jax.tree.leaves(sa.params)[0], jax.tree.leaves(sb.params)[0]
    assert np.all(np.isfinite(np.asarray(la))) and not np.allclose(la, lb)


def test_simulation_rejects_impossible_settings(digits):
    with pytest.raises(ConfigError, match="per_round=13"):
        _sim(digits, per_round=13)
    with pytest.raises(ConfigError, match="regression"):
        RoundSpec.create(
            digits,
            make_model("linreg", input_shape=(64,), num_classes=None),
            make_strategy("uniform", 2),
            local=LocalConfig(),
            per_round=2,
        )
    with pytest.raises(ConfigError, match="num_rounds must be >= 1"):
        Simulation(_sim(digits).spec, digits, num_rounds=0)
    with pytest.raises(ConfigError, match="prox_mu=0.5 needs a simulation built with prox_mu"):
        _sim(digits).init(0, hparams=HParams.of(0.1, prox_mu=0.5))


def test_run_experiment_writes_the_output_contract(tmp_path):
    cfg = RunConfig(
        dataset="digits", num_clients=10, per_round=3, rounds=6, eval_every=3, lr=0.1, seed=0
    )
    res = run_experiment(cfg, tmp_path, progress=False)
    for name in ("config.json", "metrics.jsonl", "summary.json", "timings.json", "curves.png"):
        assert (tmp_path / name).exists(), name
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [3, 6]
    for r in lines:
        assert {"test_accuracy", "test_loss", "train_loss", "selected"} <= set(r)
        assert "seconds" not in r  # wall-clock time lives in timings.json only
        assert len(r["selected"]) == 3 and all(len(s) == 3 for s in r["selected"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "final_accuracy",
        "peak_accuracy",
        "stable_accuracy",
        "stability_drop",
        "jain_fairness",
    ):
        assert key in summary, key
    assert not set(summary) & TIMING_KEYS
    # the timings: per evaluation the phase seconds, and the run's totals; a folder read back
    # gives the fresh result's
    timings = json.loads((tmp_path / "timings.json").read_text())
    assert [e["round"] for e in timings["evaluations"]] == [3, 6]
    assert all(e["seconds"]["eval"] > 0 for e in timings["evaluations"])
    for key in ("wall_seconds", "rounds_per_second", "client_updates_per_second"):
        assert timings[key] > 0, key
    assert res.timings == timings
    assert finished_result(resolve(cfg).config, tmp_path).timings == res.timings
    assert summary["final_accuracy"] == pytest.approx(lines[-1]["test_accuracy"])
    assert sum(summary["selection_counts"]) == 18
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["config"]["per_round"] == 3 and config["dataset"]["name"] == "digits"
    again = run_experiment(cfg, None, progress=False)
    assert again.evals[-1]["test_accuracy"] == res.evals[-1]["test_accuracy"]


def test_diverging_run_stops_cleanly_and_keeps_its_metrics(tmp_path):
    cfg = RunConfig(
        dataset="regression",
        num_clients=10,
        per_round=5,
        rounds=40,
        eval_every=2,
        lr=50.0,
        seed=0,
        dataset_args={"num_clusters": 2},
    )
    res = run_experiment(cfg, tmp_path, progress=False, echo=lambda m: None)
    s = res.summary
    assert s["diverged"] and s["rounds_completed"] < 40
    assert "diverged at round" in s["message"] and "lr=50.0" in s["message"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["diverged"] and saved["diverged_at_round"] == s["diverged_at_round"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(res.evals) >= 1
    # diverged is a state, not a number: what describes the model at the end is null
    assert saved["final_test_loss"] is None and saved["stable_test_loss"] is None
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["round"] == s["rounds_completed"] and last["test_loss"] is None


@pytest.mark.parametrize(
    "server, kwargs",
    [("sgd", {"weight_decay": 0.1}), ("momentum", {}), ("adam", {"weight_decay": 0.01})],
)
def test_a_round_without_training_leaves_the_model_unchanged(digits, server, kwargs):
    """Momentum, Adam and weight decay must not move the model in a round nobody trained in
    (round 2 of this trace has no client online)."""
    from fedjax_sel.availability.trace import trace_replay
    from fedjax_sel.training import server_optimizer

    trace = np.ones((4, 12), bool)
    trace[2] = False
    spec = RoundSpec.create(
        digits,
        make_model("logreg", input_shape=digits.input_shape, num_classes=10),
        make_strategy("uniform", 4),
        local=LocalConfig(batch_size=16, local_steps=2),
        per_round=4,
        availability=trace_replay(trace=trace),
        server_tx=server_optimizer(server, 0.5, **kwargs),
    )
    sim = Simulation(spec, digits, num_rounds=4, chunk_size=1)
    state, _ = sim.run_rounds(sim.init(0, hparams=HParams.of(0.1)), 2)
    before = state
    state, log = sim.run_rounds(state, 1)
    assert int(log.num_selected[0]) == 0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before.params), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(
        jax.tree.leaves(state.server_opt_state),
        jax.tree.leaves(before.server_opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
    state, log = sim.run_rounds(state, 1)  # and the next round trains again
    assert int(log.num_selected[0]) == 4
    assert not np.array_equal(jax.tree.leaves(state.params)[0], jax.tree.leaves(before.params)[0])
