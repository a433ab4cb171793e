"""FedBuff inside the compiled program against an event-driven NumPy simulation that handles
one arrival at a time (same arrival order, same model versions, same parameters)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability.trace import trace_replay
from fedjax_sel.base import (
    ConfigError,
    Selection,
    Strategy,
    init_empty_state,
    update_identity,
)
from fedjax_sel.data.client_data import from_client_arrays
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.fedbuff import FedBuff, fedbuff, from_spec
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.engine.system import SystemModel, SystemState, lognormal, model_kbit
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig, Parallel

K, D, NC = 12, 5, 3
STEPS, LR, BATCH = 3, 0.2, 16


def _dataset():
    rng = np.random.default_rng(3)
    sizes = rng.integers(3, 10, K)
    xs = [rng.normal(size=(n, D)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, NC, n).astype(np.int32) for n in sizes]
    train = from_client_arrays(xs, ys, layout="padded")
    ds = FederatedDataset(
        "planted",
        train,
        None,
        jnp.asarray(np.concatenate(xs)),
        jnp.asarray(np.concatenate(ys)),
        "classification",
        NC,
        (D,),
        "logreg",
        {},
    )
    return ds, xs, ys


def _fixed_system(ms: np.ndarray, kbps: np.ndarray) -> SystemModel:
    """Deterministic device speeds (no per-round noise)."""

    def init(key, num_clients):
        del key, num_clients
        return SystemState(jnp.asarray(ms, jnp.float32), jnp.asarray(kbps, jnp.float32))

    def step(state, key):
        del key
        return state.ms_per_example, state.bandwidth_kbps

    return SystemModel(init, step, "fixed", {})


def _priority(per_round: int) -> Strategy:
    """Deterministic candidates: the idle online clients of smallest ``(7 k + 3 t) mod K``."""

    def select(state, inputs, oracle, key):
        del oracle, key
        k = inputs.available.shape[0]
        prio = (jnp.arange(k) * 7 + inputs.round * 3) % k
        order = jnp.argsort(jnp.where(inputs.available, prio, k + jnp.arange(k)))[:per_round]
        mask = inputs.available[order]
        return Selection(order, mask, jnp.where(mask, 1.0 / per_round, 0.0)), state

    return Strategy(init_empty_state, select, update_identity, "priority", asynchronous=True)


def _gd(w, b, x, y):
    """Full-batch local SGD on softmax cross-entropy (the engine's local training here)."""
    onehot = np.eye(NC)[y]
    for _ in range(STEPS):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w, b = w - LR * x.T @ (p - onehot) / len(y), b - LR * (p - onehot).mean(0)
    return w, b


def _reference(xs, ys, w0, b0, dur, trace, concurrency, buffer, alpha, rounds):
    """FedBuff event by event (the semantics of fedjax_sel.engine.fedbuff's docstring)."""
    n_slots = concurrency
    client = np.zeros(n_slots, int)
    finish = np.full(n_slots, np.inf, np.float32)
    version = np.zeros(n_slots, int)
    start = [None] * n_slots
    theta = (w0.astype(np.float64), b0.astype(np.float64))
    buf_w, buf_b, count, v = 0.0, 0.0, 0, 0
    now = np.float32(0.0)
    logs = []
    for r in range(rounds):
        avail = trace[r % len(trace)]
        busy = np.zeros(K, bool)
        busy[client[np.isfinite(finish)]] = True
        prio = (np.arange(K) * 7 + r * 3) % K
        queue = [c for c in np.argsort(prio) if avail[c] and not busy[c]][:n_slots]
        for s in range(n_slots):
            if not np.isfinite(finish[s]) and queue:
                c = queue.pop(0)
                client[s], finish[s], version[s], start[s] = c, now + dur[c], v, theta
        arrivals = []
        while np.isfinite(finish).any():
            s = int(np.argmin(finish))
            t = finish[s]
            c = client[s]
            staleness = v - version[s]
            w, b = _gd(*start[s], xs[c], ys[c])
            weight = (1.0 + staleness) ** -alpha
            buf_w = buf_w + weight * (w - start[s][0])
            buf_b = buf_b + weight * (b - start[s][1])
            count += 1
            arrivals.append((int(c), int(staleness)))
            flushed = count == buffer
            if flushed:
                theta = (theta[0] + buf_w / buffer, theta[1] + buf_b / buffer)
                buf_w, buf_b, count, v = 0.0, 0.0, 0, v + 1
            if queue:
                c2 = queue.pop(0)
                client[s], finish[s], version[s], start[s] = c2, t + dur[c2], v, theta
            else:
                finish[s] = np.inf
            now = t
            if flushed:
                break
        logs.append((arrivals, now, v))
    return theta, logs


@pytest.mark.parametrize("availability", ["always", "trace"])
def test_fedbuff_matches_event_driven_numpy(availability):
    ds, xs, ys = _dataset()
    rng = np.random.default_rng(5)
    ms = rng.uniform(20.0, 400.0, K).astype(np.float32)
    kbps = np.full(K, 5e4, np.float32)
    trace = np.ones((1, K), bool)
    if availability == "trace":
        trace = rng.random((7, K)) < 0.55
    concurrency, buffer, alpha, rounds = 5, 3, 0.5, 14
    model = make_model("logreg", input_shape=(D,), num_classes=NC)
    spec = RoundSpec.create(
        ds,
        model,
        _priority(concurrency),
        local=LocalConfig(batch_size=BATCH, local_steps=STEPS),
        per_round=concurrency,
        availability=trace_replay(trace=trace),
        system=_fixed_system(ms, kbps),
        asynchronous=FedBuff(concurrency, buffer, alpha),
        parallel=Parallel("vmap"),
    )
    sim = Simulation(spec, ds, num_rounds=rounds, chunk_size=5)
    state = sim.init(0, hparams=HParams.of(LR))
    w0 = np.asarray(state.params["Dense_0"]["kernel"])
    b0 = np.asarray(state.params["Dense_0"]["bias"])
    state, log = sim.run_rounds(state, rounds)

    # the engine's durations, written out: 3 x samples x ms / 1000 + 2 x model kbit / kbps
    n = np.array([len(y) for y in ys])
    samples = np.float32(STEPS) * np.minimum(n, BATCH).astype(np.float32)
    compute = np.float32(3.0) * samples * ms / np.float32(1000.0)
    comm = np.float32(2.0 * model_kbit(state.params)) / kbps
    dur = (compute + comm).astype(np.float32)

    theta, ref = _reference(xs, ys, w0, b0, dur, trace, concurrency, buffer, alpha, rounds)
    for r, (arrivals, now, version) in enumerate(ref):
        got = log.clients[r][log.mask[r]].tolist()
        assert got == [c for c, _ in arrivals], f"round {r}"
        stale = np.array([s for _, s in arrivals], np.float64)
        np.testing.assert_allclose(
            log.weights[r][log.mask[r]], (1 + stale) ** -alpha / buffer, rtol=1e-6
        )
        # the clock to float32 rounding (XLA may fold the duration formula's constants)
        np.testing.assert_allclose(log.sim_time[r], now, rtol=1e-6, err_msg=f"round {r}")
        assert log.diagnostics["model_version"][r] == version
    if availability == "always":
        assert log.mask.all() and ref[-1][2] == rounds
        assert log.diagnostics["staleness_max"].max() >= 1  # staleness actually occurred
    np.testing.assert_allclose(state.params["Dense_0"]["kernel"], theta[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.params["Dense_0"]["bias"], theta[1], rtol=1e-4, atol=1e-5)


def test_fedbuff_with_uniform_keeps_clients_unique_and_is_reproducible():
    ds, _, _ = _dataset()
    model = make_model("logreg", input_shape=(D,), num_classes=NC)

    spec = RoundSpec.create(
        ds,
        model,
        make_strategy("uniform", 6),
        local=LocalConfig(batch_size=BATCH, local_steps=STEPS),
        per_round=6,
        system=lognormal(),
        asynchronous=fedbuff(6, 2),
        parallel=Parallel("vmap"),
    )
    sim = Simulation(spec, ds, num_rounds=10, chunk_size=10)

    def run():
        return sim.run_rounds(sim.init(1, hparams=HParams.of(LR)), 10)

    state, log = run()
    slots = state.async_state
    busy = np.asarray(slots.client)[np.isfinite(np.asarray(slots.finish))]
    assert len(busy) == 6 and len(set(busy.tolist())) == 6  # nobody in two slots
    assert log.mask.all() and int(slots.model_version) == 10
    for r in range(10):
        assert len(set(log.clients[r].tolist())) == 2
    assert np.all(np.diff(log.sim_time) >= 0) and log.sim_time[-1] > 0
    state2, log2 = run()
    np.testing.assert_array_equal(log.sim_time, log2.sim_time)
    np.testing.assert_array_equal(
        state.params["Dense_0"]["kernel"], state2.params["Dense_0"]["kernel"]
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(system=None), "needs device profiles"),
        (dict(deadline=5.0), "synchronous-round settings"),
        (dict(dropout=0.1), "synchronous-round settings"),
        (dict(strategy="fedcvr_bolt"), "cannot pick clients asynchronously"),
        (dict(mode=FedBuff(4, 5)), "buffer=5 must lie in"),
        (dict(mode=FedBuff(13, 2), per_round=12), "concurrency=13 must lie in"),
        (dict(per_round=3), "per_round \\(3\\) must equal it"),
    ],
)
def test_fedbuff_refuses_settings_that_cannot_work(kwargs, match):
    ds, _, _ = _dataset()
    per_round = kwargs.pop("per_round", 4)
    strategy = make_strategy(kwargs.pop("strategy", "uniform"), min(per_round, K))
    args = dict(system=lognormal(), asynchronous=kwargs.pop("mode", FedBuff(4, 2)))
    args.update(kwargs)
    with pytest.raises(ConfigError, match=match):
        RoundSpec.create(
            ds,
            make_model("logreg", input_shape=(D,), num_classes=NC),
            strategy,
            local=LocalConfig(batch_size=BATCH, local_steps=1),
            per_round=per_round,
            parallel=Parallel("vmap"),
            **args,
        )


def test_fedbuff_spec_defaults_concurrency_to_per_round():
    assert from_spec("fedbuff:buffer=3", 7) == FedBuff(7, 3, 0.5)
    assert from_spec("fedbuff:concurrency=9,buffer=3,alpha=1", 7) == FedBuff(9, 3, 1.0)
    with pytest.raises(ConfigError, match="buffer"):
        from_spec("fedbuff:buffer=0", 7)
    with pytest.raises(ConfigError):
        from_spec("fedbuff:size=3", 7)


def test_async_run_writes_simulated_time(tmp_path):
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment import run_experiment
    from fedjax_sel.experiment.outputs import read_metrics
    from fedjax_sel.experiment.resolve import resolve

    cfg = RunConfig(
        dataset="digits",
        model="logreg",
        num_clients=12,
        rounds=4,
        eval_every=2,
        local_steps=2,
        batch_size=8,
        asynchronous="fedbuff:concurrency=4,buffer=2",
        system="lognormal",
        parallel="vmap",
    )
    run_experiment(cfg, tmp_path, progress=False, echo=lambda *a, **k: None)
    # the resolved run has the concurrency in flight; the caller's configuration is unchanged
    written = json.loads((tmp_path / "config.json").read_text())["config"]
    assert written["per_round"] == 4 and cfg.per_round == 10
    rows = read_metrics(tmp_path / "metrics.jsonl")
    times = [r["sim_time_s"] for r in rows]
    assert len(rows) == 2 and 0 < times[0] < times[1]
    assert [r["diagnostics"]["model_version"] for r in rows] == [2, 4]  # one update per step
    with pytest.raises(ConfigError, match="--async needs device profiles"):
        resolve(RunConfig(asynchronous="fedbuff"))


def test_slots_hold_the_downloaded_model():
    """A slot dispatched after the update stores the new model, the others the old one."""
    ds, _, _ = _dataset()
    rng = np.random.default_rng(0)
    ms = rng.uniform(20.0, 400.0, K).astype(np.float32)
    spec = RoundSpec.create(
        ds,
        make_model("logreg", input_shape=(D,), num_classes=NC),
        _priority(4),
        local=LocalConfig(batch_size=BATCH, local_steps=STEPS),
        per_round=4,
        system=_fixed_system(ms, np.full(K, 5e4, np.float32)),
        asynchronous=FedBuff(4, 2),
        parallel=Parallel("vmap"),
    )
    sim = Simulation(spec, ds, num_rounds=3)
    state0 = sim.init(0, hparams=HParams.of(LR))
    state, _ = sim.run_rounds(state0, 1)
    slots = jax.tree.map(np.asarray, state.async_state)
    kernel = slots.start_params["Dense_0"]["kernel"]
    for s in range(4):
        expected = state.params if slots.version[s] == 1 else state0.params
        np.testing.assert_array_equal(kernel[s], expected["Dense_0"]["kernel"])
    assert (slots.version == 1).sum() == 1  # only the buffer-filling arrival's replacement
