"""Local training against a NumPy reference of the same SGD, and the engine's invariances."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.data import from_client_arrays
from fedjax_sel.models import make_model
from fedjax_sel.training import (
    HParams,
    LocalConfig,
    Parallel,
    make_trainer,
    parse_parallel,
    server_optimizer,
    server_step,
    weighted_delta,
)
from fedjax_sel.training.local import epoch_positions, step_positions

D, C = 5, 3


def _clients(sizes, seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, D)).astype(np.float32) for n in sizes]
    ys = [rng.integers(0, C, n).astype(np.int32) for n in sizes]
    return xs, ys


def _np_logreg_gd(w, b, x, y, steps, lr, momentum=0.0, wd=0.0, mu=0.0, ridge=0.0, v=None):
    """Full-batch gradient descent on mean softmax cross-entropy (PyTorch SGD semantics)."""
    w, b = w.astype(np.float64).copy(), b.astype(np.float64).copy()
    w0, b0 = w.copy(), b.copy()
    vw, vb = (np.zeros_like(w), np.zeros_like(b)) if v is None else v
    onehot = np.eye(C)[y]
    for _ in range(steps):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        gw = x.T @ (p - onehot) / len(y) + ridge * w + mu * (w - w0) + wd * w
        gb = (p - onehot).mean(0) + mu * (b - b0) + wd * b
        vw, vb = momentum * vw + gw, momentum * vb + gb
        w, b = w - lr * vw, b - lr * vb
    return w, b, (vw, vb)


def _params(model, seed=1):
    p = model.init(jax.random.key(seed))
    return jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(seed + 1), a.shape), p)


@pytest.mark.parametrize("mode", ["vmap", "map", "chunked:2"])
@pytest.mark.parametrize(
    "opts",
    [
        dict(),
        dict(momentum=0.9),
        dict(weight_decay=0.01, momentum=0.5),
        dict(prox_mu=0.3),
    ],
)
def test_full_batch_local_steps_match_numpy(mode, opts):
    sizes = [4, 7, 6]
    xs, ys = _clients(sizes)
    data = from_client_arrays(xs, ys, layout="padded")
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params = _params(model)
    mu = opts.get("prox_mu", 0.0)
    static = {k: v for k, v in opts.items() if k != "prox_mu"}
    cfg = LocalConfig(batch_size=8, local_steps=5, prox=mu > 0, **static)
    train = jax.jit(make_trainer(model, cfg, data.n_max, parallel=parse_parallel(mode)).train)
    hparams = HParams.of(0.3, prox_mu=mu)
    res = train(
        params, data, jnp.array([2, 0, 1]), jnp.ones(3, bool), jax.random.key(0), hparams=hparams
    )
    w, b = np.asarray(params["Dense_0"]["kernel"]), np.asarray(params["Dense_0"]["bias"])
    for slot, c in enumerate([2, 0, 1]):
        rw, rb, _ = _np_logreg_gd(
            w,
            b,
            xs[c],
            ys[c],
            5,
            0.3,
            opts.get("momentum", 0.0),
            opts.get("weight_decay", 0.0),
            opts.get("prox_mu", 0.0),
        )
        np.testing.assert_allclose(res.params["Dense_0"]["kernel"][slot], rw, rtol=2e-4, atol=2e-6)
        np.testing.assert_allclose(res.params["Dense_0"]["bias"][slot], rb, rtol=2e-4, atol=2e-6)
    np.testing.assert_array_equal(res.num_steps, [5, 5, 5])


def test_streamed_aggregation_is_the_weighted_sum_of_the_stacked_updates():
    """``map`` with the aggregation weights: the running sum equals the weighted sum of the
    stacked run's deltas (an inactive slot adds nothing, whatever its weight; a step limit
    cuts a slot), each slot's norm is its delta's, the metrics and the persistent optimizer
    states are the stacked run's; other modes refuse the weights."""
    from fedjax_sel.training import client_optimizer

    sizes = [4, 7, 6, 9]
    xs, ys = _clients(sizes)
    data = from_client_arrays(xs, ys, layout="padded")
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params = _params(model)
    cfg = LocalConfig(batch_size=4, local_steps=4, momentum=0.9)
    hparams = HParams.of(0.3)
    clients, active = jnp.array([2, 0, 3, 1]), jnp.array([True, True, False, True])
    weights = jnp.array([0.5, 0.2, 0.7, 0.3])
    limit = jnp.array([4, 2, 4, 3])
    trainer = make_trainer(model, cfg, data.n_max, parallel=Parallel("map"), persistent_state=True)
    assert trainer.streams
    one = client_optimizer(cfg, hparams.lr).init(params)
    states = jax.tree.map(lambda a: jnp.stack([a] * 4), one)
    args = (params, data, clients, active, jax.random.key(2))
    kwargs = dict(opt_states=states, step_limit=limit, hparams=hparams)
    stacked = trainer.train(*args, **kwargs)
    streamed = trainer.train(*args, **kwargs, aggregate_weights=weights)
    assert streamed.params is None
    w = np.where(np.asarray(active), np.asarray(weights), 0.0)
    sq = np.zeros(4)
    for name in ("kernel", "bias"):
        delta = np.asarray(stacked.params["Dense_0"][name]) - np.asarray(params["Dense_0"][name])
        want = np.tensordot(w, delta, axes=1)
        got = np.asarray(streamed.weighted_delta["Dense_0"][name])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        sq += np.sum(delta.reshape(4, -1) ** 2, axis=1)
    np.testing.assert_allclose(np.asarray(streamed.update_norm), np.sqrt(sq), rtol=1e-5)
    assert float(streamed.update_norm[2]) == 0.0
    np.testing.assert_array_equal(np.asarray(streamed.num_steps), [4, 2, 0, 3])
    for field in ("loss", "initial_loss", "loss_sq", "num_steps"):
        np.testing.assert_array_equal(getattr(streamed, field), getattr(stacked, field))
    for a, b in zip(
        jax.tree.leaves(streamed.opt_states), jax.tree.leaves(stacked.opt_states), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    vmapped = make_trainer(model, cfg, data.n_max, parallel=Parallel("vmap"))
    assert not vmapped.streams
    with pytest.raises(ValueError, match="map mode"):
        vmapped.train(*args, hparams=hparams, aggregate_weights=weights)


def test_active_slots_loop_runs_only_active_slots_alone_or_vmapped():
    """Only the active slots run the step, in slot order (the carry sees them in that order),
    each output lands at its own slot and the inactive slots keep the given outputs; vmapped
    over members whose masks differ, each member gets what it gets alone."""
    from fedjax_sel.training.local import active_slots_loop

    x = jnp.arange(6.0) + 1.0

    def step(carry, xi):
        return carry * 10 + xi, xi**2

    def run(active):
        return active_slots_loop(step, jnp.float32(0), jnp.full((6,), -1.0), (x,), active)

    active = jnp.array([True, False, True, True, False, True])
    carry, outs = run(active)
    assert float(carry) == 1346.0  # slots 0, 2, 3, 5 in order: ((1*10+3)*10+4)*10+6
    np.testing.assert_array_equal(outs, [1.0, -1.0, 9.0, 16.0, -1.0, 36.0])
    masks = jnp.stack([active, jnp.array([False, True, False, False, False, False])])
    carries, batched = jax.vmap(run)(masks)
    for m in range(2):
        c, o = run(masks[m])
        assert float(carries[m]) == float(c)
        np.testing.assert_array_equal(batched[m], o)
    assert float(run(jnp.zeros(6, bool))[0]) == 0.0


def test_ridge_enters_the_gradient():
    xs, ys = _clients([6])
    data = from_client_arrays(xs, ys)
    model = make_model("logreg", input_shape=(D,), num_classes=C, ridge=0.2)
    params = _params(model)
    cfg = LocalConfig(batch_size=8, local_steps=3)
    res = make_trainer(model, cfg, data.n_max, parallel=Parallel("vmap")).train(
        params, data, jnp.array([0]), jnp.ones(1, bool), jax.random.key(0), hparams=HParams.of(0.5)
    )
    rw, _, _ = _np_logreg_gd(
        np.asarray(params["Dense_0"]["kernel"]),
        np.asarray(params["Dense_0"]["bias"]),
        xs[0],
        ys[0],
        3,
        0.5,
        ridge=0.2,
    )
    np.testing.assert_allclose(res.params["Dense_0"]["kernel"][0], rw, rtol=2e-4, atol=2e-6)


def test_epochs_with_batch_covering_the_client_are_full_batch_steps():
    xs, ys = _clients([5, 9])
    data = from_client_arrays(xs, ys, layout="flat")
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params = _params(model)
    cfg = LocalConfig(batch_size=16, local_steps=None, local_epochs=3)
    res = make_trainer(model, cfg, data.n_max, parallel=Parallel("vmap")).train(
        params,
        data,
        jnp.array([0, 1]),
        jnp.ones(2, bool),
        jax.random.key(3),
        hparams=HParams.of(0.2),
    )
    for c in range(2):
        rw, _, _ = _np_logreg_gd(
            np.asarray(params["Dense_0"]["kernel"]),
            np.asarray(params["Dense_0"]["bias"]),
            xs[c],
            ys[c],
            3,
            0.2,
        )
        np.testing.assert_allclose(res.params["Dense_0"]["kernel"][c], rw, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("mode", ["vmap", "map"])
def test_epoch_step_counts_follow_client_sizes(mode):
    xs, ys = _clients([3, 10, 25])
    data = from_client_arrays(xs, ys, layout="flat")
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    cfg = LocalConfig(batch_size=4, local_steps=None, local_epochs=2)
    res = make_trainer(model, cfg, data.n_max, parallel=Parallel(mode)).train(
        _params(model),
        data,
        jnp.array([0, 1, 2]),
        jnp.ones(3, bool),
        jax.random.key(0),
        hparams=HParams.of(0.1),
    )
    np.testing.assert_array_equal(res.num_steps, [2 * 1, 2 * 3, 2 * 7])


def test_epoch_positions_are_a_permutation_per_epoch():
    for count in (1, 7, 12, 13):
        rows = np.asarray(epoch_positions(jax.random.key(count), jnp.int32(count), 13, 4))
        assert rows.shape == (4, 4)
        used = rows.reshape(-1)[: -(-count // 4) * 4]
        valid = used[used < count]
        assert sorted(valid.tolist()) == list(range(count))
        assert np.all(rows.reshape(-1)[-(-count // 4) * 4 :] >= count)


def test_step_positions():
    np.testing.assert_array_equal(step_positions(jax.random.key(0), jnp.int32(3), 5), np.arange(5))
    pos = np.concatenate(
        [np.asarray(step_positions(jax.random.key(i), jnp.int32(20), 8)) for i in range(500)]
    )
    assert pos.min() >= 0 and pos.max() < 20
    np.testing.assert_allclose(np.bincount(pos, minlength=20) / len(pos), 1 / 20, atol=0.012)


def test_results_do_not_depend_on_slot_position_or_mode():
    xs, ys = _clients([40, 33, 50, 21], seed=4)
    data = from_client_arrays(xs, ys)
    model = make_model("mlp", input_shape=(D,), num_classes=C, hidden=(8,))
    params = model.init(jax.random.key(0))
    cfg = LocalConfig(batch_size=8, local_steps=4)
    key, hparams = jax.random.key(7), HParams.of(0.1)
    out = {}
    for mode in ("vmap", "map", "chunked:2"):
        tr = jax.jit(make_trainer(model, cfg, data.n_max, parallel=parse_parallel(mode)).train)
        for order, clients in enumerate(([0, 1, 2, 3], [3, 2, 1, 0])):
            out[mode, order] = tr(
                params, data, jnp.array(clients), jnp.ones(4, bool), key, hparams=hparams
            )
    ref = out["vmap", 0].params
    for (_mode, order), res in out.items():
        perm = [0, 1, 2, 3] if order == 0 else [3, 2, 1, 0]
        for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(res.params), strict=True):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a)[perm], rtol=1e-5, atol=1e-6)


def test_inactive_slots_return_start_params_and_zero_metrics():
    xs, ys = _clients([6, 6])
    data = from_client_arrays(xs, ys)
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params = _params(model)
    for mode in ("vmap", "map"):
        trainer = make_trainer(
            model, LocalConfig(local_steps=2), data.n_max, parallel=Parallel(mode)
        )
        res = trainer.train(
            params,
            data,
            jnp.array([0, 1]),
            jnp.array([True, False]),
            jax.random.key(0),
            hparams=HParams.of(0.5),
        )
        np.testing.assert_array_equal(
            res.params["Dense_0"]["kernel"][1], params["Dense_0"]["kernel"]
        )
        assert not np.allclose(res.params["Dense_0"]["kernel"][0], params["Dense_0"]["kernel"])
        assert float(res.loss[1]) == 0.0 and int(res.num_steps[1]) == 0 and res.loss[0] > 0


def test_per_slot_start_params():
    xs, ys = _clients([5, 5])
    data = from_client_arrays(xs, ys)
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    p0, p1 = _params(model, 1), _params(model, 5)
    stacked = jax.tree.map(lambda a, b: jnp.stack([a, b]), p0, p1)
    cfg = LocalConfig(batch_size=8, local_steps=2)
    tr = make_trainer(model, cfg, data.n_max, parallel=Parallel("vmap"))
    res = tr.train(
        stacked,
        data,
        jnp.array([0, 1]),
        jnp.ones(2, bool),
        jax.random.key(0),
        per_slot=True,
        hparams=HParams.of(0.3),
    )
    for slot, p in enumerate([p0, p1]):
        rw, _, _ = _np_logreg_gd(
            np.asarray(p["Dense_0"]["kernel"]),
            np.asarray(p["Dense_0"]["bias"]),
            xs[slot],
            ys[slot],
            2,
            0.3,
        )
        np.testing.assert_allclose(res.params["Dense_0"]["kernel"][slot], rw, rtol=2e-4, atol=2e-6)


def test_persistent_client_momentum_carries_over():
    xs, ys = _clients([6])
    data = from_client_arrays(xs, ys)
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params = _params(model)
    cfg = LocalConfig(batch_size=8, local_steps=2, momentum=0.9)
    hp = HParams.of(0.2)
    tr = make_trainer(model, cfg, data.n_max, parallel=Parallel("map"), persistent_state=True)
    from fedjax_sel.training import client_optimizer

    states = jax.tree.map(lambda a: a[None], client_optimizer(cfg, hp.lr).init(params))
    one = (jnp.array([0]), jnp.ones(1, bool))
    r1 = tr.train(params, data, *one, jax.random.key(0), opt_states=states, hparams=hp)
    p1 = jax.tree.map(lambda a: a[0], r1.params)
    r2 = tr.train(p1, data, *one, jax.random.key(1), opt_states=r1.opt_states, hparams=hp)
    w, b = np.asarray(params["Dense_0"]["kernel"]), np.asarray(params["Dense_0"]["bias"])
    w1, b1, v = _np_logreg_gd(w, b, xs[0], ys[0], 2, 0.2, momentum=0.9)
    w2, _, _ = _np_logreg_gd(w1, b1, xs[0], ys[0], 2, 0.2, momentum=0.9, v=v)
    np.testing.assert_allclose(r2.params["Dense_0"]["kernel"][0], w2, rtol=3e-4, atol=3e-6)
    w2_reset, _, _ = _np_logreg_gd(w1, b1, xs[0], ys[0], 2, 0.2, momentum=0.9)
    assert not np.allclose(w2, w2_reset, atol=1e-4)


def test_server_fedavg_and_momentum():
    params = {"w": jnp.array([1.0, 2.0])}
    deltas = {"w": jnp.array([[1.0, 0.0], [0.0, 2.0], [5.0, 5.0]])}
    weights = jnp.array([0.25, 0.75, 10.0])
    mask = jnp.array([True, True, False])
    delta = weighted_delta(deltas, weights, mask)
    np.testing.assert_allclose(delta["w"], [0.25, 1.5])
    tx = server_optimizer("sgd", 1.0)
    new, _ = server_step(tx, params, tx.init(params), delta)
    np.testing.assert_allclose(new["w"], [1.25, 3.5])
    tx = server_optimizer("momentum", 0.5, momentum=0.9)
    s = tx.init(params)
    p1, s = server_step(tx, params, s, delta)
    p2, s = server_step(tx, p1, s, delta)
    # heavy ball on the pseudo-gradient -delta: v1 = -d, v2 = -d - 0.9 d
    np.testing.assert_allclose(
        p2["w"], np.array([1.0, 2.0]) + 0.5 * (1 + 1.9) * np.array([0.25, 1.5]), rtol=1e-6
    )


def test_config_validation_messages():
    with pytest.raises(ConfigError, match="exactly one of local_steps and local_epochs"):
        LocalConfig(local_steps=5, local_epochs=2).validate()
    with pytest.raises(ConfigError, match="learning rate must be a positive number, got -1.0"):
        HParams.of(-1.0)
    with pytest.raises(ConfigError, match="server learning rate"):
        HParams.of(0.1, server_lr=float("nan"))
    with pytest.raises(ConfigError, match="FedProx mu must be >= 0"):
        HParams.of(0.1, prox_mu=-0.5)
    with pytest.raises(ConfigError, match="momentum"):
        LocalConfig(momentum=1.5).validate()
    with pytest.raises(ConfigError, match="chunked:C"):
        parse_parallel("pmap")
    with pytest.raises(ConfigError, match="chunk size"):
        parse_parallel("chunked:0")
    with pytest.raises(ConfigError, match="server optimizer"):
        server_optimizer("lamb")
    with pytest.raises(ConfigError, match="server learning rate must be a positive number"):
        server_optimizer("sgd", 0.0)


@pytest.mark.parametrize(
    "spec, parts",
    [
        ("map", ("map", None, None)),
        ("chunked:4", ("chunked", 4, None)),
        ("vmap:conv=xla", ("vmap", None, "xla")),
        ("map:conv=xla_nhwc", ("map", None, "xla_nhwc")),
        ("chunked:4,conv=patches", ("chunked", 4, "patches")),
    ],
)
def test_parallel_specs_round_trip(spec, parts):
    # the mode a run records (Trainer.parallel.text(), bench throughput's "mode") is a setting
    # --parallel / --mode accept as written
    assert parse_parallel(spec) == parts
    assert Parallel(*parts).text() == spec


def test_bad_parallel_specs_name_the_value():
    with pytest.raises(ConfigError, match=r"'map,conv=xla'.*map:conv=xla"):
        parse_parallel("map,conv=xla")
    with pytest.raises(ConfigError, match=r"conv must be one of .* got 'fft'"):
        parse_parallel("map:conv=fft")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['chunk'\]"):
        parse_parallel("map:chunk=4")
    with pytest.raises(ConfigError, match="chunked:C"):
        parse_parallel("pmap:conv=xla")
    with pytest.raises(ConfigError, match="takes no argument"):
        parse_parallel("vmap:3")
    assert parse_parallel(" AUTO ") == Parallel("auto", None, None)
    assert parse_parallel("auto:conv=xla") == Parallel("auto", None, "xla")


def test_trainer_records_the_parallelism_it_runs():
    """``auto`` resolves by the backend's rule (on the CPU a model's ``cpu_parallel``), and
    the recorded setting names the convolution the trainer runs."""
    data = from_client_arrays(*_clients([4, 5]))
    logreg = make_model("logreg", input_shape=(D,), num_classes=C)
    trainer = make_trainer(logreg, LocalConfig(), data.n_max)
    assert trainer.parallel == Parallel("vmap", None, None) and not trainer.streams
    assert make_trainer(logreg, LocalConfig(), data.n_max, parallel=Parallel("map")).streams
    cnn = make_model("cnn", input_shape=(8, 8, 1), num_classes=C)
    chosen = make_trainer(cnn, LocalConfig(), data.n_max, parallel=parse_parallel("chunked:4"))
    assert chosen.parallel == Parallel("chunked", 4, cnn.conv_impl)
    xla = make_trainer(cnn, LocalConfig(), data.n_max, parallel=parse_parallel("map:conv=xla"))
    assert xla.parallel.text() == "map:conv=xla"


def _np_minibatch_sgd(w, b, x, y, batches, lr, momentum=0.0):
    """SGD on mean softmax cross-entropy over the given minibatches of example indices (each a
    list of positions into the client's data; positions past its size are padding)."""
    w, b = w.astype(np.float64).copy(), b.astype(np.float64).copy()
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for pos in batches:
        pos = np.asarray(pos)
        pos = pos[pos < len(y)]
        xb, yb = x[pos], y[pos]
        z = xb @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = p - np.eye(C)[yb]
        vw, vb = momentum * vw + xb.T @ g / len(yb), momentum * vb + g.mean(0)
        w, b = w - lr * vw, b - lr * vb
    return w, b


@pytest.mark.parametrize("work", ["steps", "epochs"])
def test_minibatches_smaller_than_the_client_match_numpy(work):
    """Minibatch SGD with batches smaller than the clients (fixed steps with replacement, and
    epochs of a permutation with a partial last batch) against NumPy on the same positions
    (drawn with the documented per-client keys)."""
    sizes, bsz = [11, 7, 18], 4
    xs, ys = _clients(sizes, seed=3)
    data = from_client_arrays(xs, ys, layout="flat")
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params = _params(model)
    kwargs = {"local_steps": 5} if work == "steps" else {"local_steps": None, "local_epochs": 2}
    cfg = LocalConfig(batch_size=bsz, momentum=0.5, **kwargs)
    key = jax.random.key(9)
    clients = [2, 0, 1]
    res = make_trainer(model, cfg, data.n_max, parallel=Parallel("vmap")).train(
        params, data, jnp.array(clients), jnp.ones(3, bool), key, hparams=HParams.of(0.2)
    )
    w, b = np.asarray(params["Dense_0"]["kernel"]), np.asarray(params["Dense_0"]["bias"])
    for slot, c in enumerate(clients):
        kc = jax.random.fold_in(key, c)
        n = sizes[c]
        if work == "steps":
            batches = [
                step_positions(jax.random.fold_in(kc, s), jnp.int32(n), bsz) for s in range(5)
            ]
        else:
            batches = []
            for e in range(2):
                rows = np.asarray(
                    epoch_positions(jax.random.fold_in(kc, e), jnp.int32(n), data.n_max, bsz)
                )
                batches += list(rows[: -(-n // bsz)])
        assert all(len(np.asarray(p)[np.asarray(p) < n]) <= bsz < n for p in batches)
        rw, rb = _np_minibatch_sgd(w, b, xs[c], ys[c], batches, 0.2, momentum=0.5)
        np.testing.assert_allclose(res.params["Dense_0"]["kernel"][slot], rw, rtol=2e-4, atol=2e-6)
        np.testing.assert_allclose(res.params["Dense_0"]["bias"][slot], rb, rtol=2e-4, atol=2e-6)
        assert int(res.num_steps[slot]) == len(batches)


def test_persistent_client_state_is_stored_and_restored_by_client_id():
    """A simulation with persistent client momentum, replayed in NumPy: each round's selected
    clients continue from their own stored momentum (by client id, whatever their slot), the
    others' states stay untouched, and the server applies the FedAvg average."""
    from fedjax_sel.data.datasets import FederatedDataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.strategies import make_strategy

    sizes = [5, 6, 4, 7]
    xs, ys = _clients(sizes, seed=5)
    train = from_client_arrays(xs, ys, layout="padded")
    ds = FederatedDataset(
        "planted",
        train,
        None,
        jnp.asarray(xs[0]),
        jnp.asarray(ys[0]),
        "classification",
        C,
        (D,),
        "logreg",
        {},
    )
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    cfg = LocalConfig(batch_size=8, local_steps=2, momentum=0.9)  # full-batch steps
    spec = RoundSpec.create(
        ds, model, make_strategy("uniform", 2), local=cfg, per_round=2, persistent_client_state=True
    )
    sim = Simulation(spec, ds, num_rounds=4, chunk_size=1)
    state = sim.init(0, params=_params(model), hparams=HParams.of(0.2))
    w = np.asarray(state.params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(state.params["Dense_0"]["bias"], np.float64)
    moms = {c: (np.zeros_like(w), np.zeros_like(b)) for c in range(4)}
    for _ in range(4):
        state, log = sim.run_rounds(state, 1)
        picked = log.clients[0][log.mask[0]].tolist()
        new = {}
        for c in picked:
            rw, rb, moms[c] = _np_logreg_gd(w, b, xs[c], ys[c], 2, 0.2, momentum=0.9, v=moms[c])
            new[c] = (rw, rb)
        total = sum(sizes[c] for c in picked)
        w = w + sum(sizes[c] / total * (new[c][0] - w) for c in picked)
        b = b + sum(sizes[c] / total * (new[c][1] - b) for c in picked)
        stored = jax.tree.leaves(state.client_opt_states)  # momentum traces, per client
        kernel_trace = next(x for x in stored if x.ndim == 3)
        for c in range(4):
            np.testing.assert_allclose(kernel_trace[c], moms[c][0], rtol=3e-4, atol=3e-6)
    np.testing.assert_allclose(state.params["Dense_0"]["kernel"], w, rtol=3e-4, atol=3e-6)
    assert len({c for c in range(4) if np.any(moms[c][0])}) >= 3  # several clients carried state


def _logreg_numpy(model):
    """The model's parameters and NumPy's per-row cross-entropy and argmax under them."""
    params = _params(model)
    w, b = np.asarray(params["Dense_0"]["kernel"]), np.asarray(params["Dense_0"]["bias"])

    def rows(x, y):
        z = x @ w + b
        z = z - z.max(1, keepdims=True)
        return np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y], z.argmax(1)

    return params, rows


def test_client_losses_in_size_groups_match_numpy():
    """Whole-data losses of 13 listed clients (sorted into groups of 4 by size, some ids
    repeated) in the order given, against the mean cross-entropy written out in NumPy."""
    from fedjax_sel.training.evaluate import client_losses

    sizes = [3, 40, 7, 1, 25, 9, 60, 2, 11]
    xs, ys = _clients(sizes)
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params, numpy_rows = _logreg_numpy(model)
    listed = np.array([6, 0, 3, 1, 8, 2, 6, 4, 5, 7, 1, 0, 3])
    for layout in ("padded", "flat"):
        data = from_client_arrays(xs, ys, layout=layout)
        got = client_losses(model, params, data, jnp.asarray(listed), batch_size=8, group=4)
        for i, c in enumerate(listed):
            ref = np.mean(numpy_rows(xs[c], ys[c])[0])
            np.testing.assert_allclose(got[i], ref, rtol=2e-5, err_msg=f"{layout} slot {i}")


def test_client_batch_losses_in_chunks_match_numpy():
    """One random minibatch loss per client (CA-Fed's signal): computed 4 clients at a time
    (the chunked path of 10^5-10^6 clients, 13 clients padded to 16) it equals the one-chunk
    result to float32 rounding, and each equals NumPy's mean cross-entropy on the rows the draw
    names (the whole data of a client smaller than the batch)."""
    from fedjax_sel.training.evaluate import client_batch_losses

    sizes = [3, 40, 7, 1, 25, 9, 60, 2, 11]
    xs, ys = _clients(sizes)
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params, numpy_rows = _logreg_numpy(model)
    listed = jnp.asarray([6, 0, 3, 1, 8, 2, 6, 4, 5, 7, 1, 0, 3])
    key = jax.random.key(4)
    data = from_client_arrays(xs, ys, layout="padded")
    whole = np.asarray(client_batch_losses(model, params, data, listed, key, 8))
    chunked = np.asarray(client_batch_losses(model, params, data, listed, key, 8, chunk=4))
    # equal up to the reduction order, which follows the batch shape: the last bit differs on
    # an H200 and on an AVX2-only CPU (AMD EPYC family 25 model 1), not on an AVX-512 one
    np.testing.assert_allclose(chunked, whole, rtol=1e-6)
    for i, c in enumerate(np.asarray(listed)):
        n = sizes[c]
        if n <= 8:
            rows = np.arange(n)
        else:
            rows = np.asarray(jax.random.randint(jax.random.fold_in(key, int(c)), (8,), 0, n))
        ref = np.mean(numpy_rows(xs[c][rows], ys[c][rows])[0])
        np.testing.assert_allclose(whole[i], ref, rtol=2e-5, err_msg=f"slot {i}")
    # chunks of small clients only skip the draws (none would be used): the same losses as
    # the slots of the same clients above, computed in chunks that drew
    small = jnp.asarray([3, 7, 0, 2, 3])
    skipped = np.asarray(client_batch_losses(model, params, data, small, key, 8, chunk=2))
    drawn = {int(c): whole[i] for i, c in enumerate(np.asarray(listed))}
    expected = np.asarray([drawn[int(c)] for c in np.asarray(small)])
    np.testing.assert_allclose(skipped, expected, rtol=1e-6)  # chunk sizes differ: as above


def test_all_client_sums_of_a_padded_layout_match_numpy():
    """Every client's mean loss, accuracy and count (the padded layout's chunks of whole
    clients, where the last chunk overlaps the one before whenever the chunk does not divide
    K; an empty client gets NaN) against NumPy, and against the flat layout's segment sums."""
    from fedjax_sel.training.evaluate import evaluate_all_clients

    sizes = [3, 40, 7, 0, 25, 9, 60, 2, 11, 1, 5]
    xs, ys = _clients(sizes)
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params, numpy_rows = _logreg_numpy(model)
    want_loss, want_acc = [], []
    for x, y in zip(xs, ys, strict=True):
        loss, predicted = numpy_rows(x, y) if len(y) else (np.array([np.nan]), None)
        want_loss.append(np.mean(loss))
        want_acc.append(np.mean(predicted == y) if len(y) else np.nan)
    padded = from_client_arrays(xs, ys, layout="padded", allow_empty=True)
    flat = from_client_arrays(xs, ys, layout="flat", allow_empty=True)
    segments = evaluate_all_clients(model, params, flat, 64)
    # 1, 3, 4 (overlap of 1) and all 11 clients per chunk
    for batch in (60, 180, 240, 4096):
        loss, acc, count = evaluate_all_clients(model, params, padded, batch)
        np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=2e-5, err_msg=str(batch))
        np.testing.assert_allclose(np.asarray(acc), want_acc, rtol=1e-6, err_msg=str(batch))
        np.testing.assert_array_equal(np.asarray(count), sizes)
        for got, ref in zip((loss, acc, count), segments, strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5)


def test_batch_losses_of_clients_smaller_than_a_minibatch_are_whole_data_losses():
    """Where no client holds more than a minibatch (static: the padded layout's width, the
    flat layout's ``n_max``), only the largest client's positions are read and nothing is
    drawn: each loss is its client's whole-data mean loss (NumPy), chunked or not."""
    from fedjax_sel.training.evaluate import client_batch_losses

    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params, numpy_rows = _logreg_numpy(model)
    key = jax.random.key(5)
    sizes = [3, 7, 1, 2, 8, 5, 6]
    xs, ys = _clients(sizes)
    listed = jnp.asarray([4, 0, 6, 2, 2, 1, 5, 3])
    want = [np.mean(numpy_rows(xs[c], ys[c])[0]) for c in np.asarray(listed)]
    for layout in ("padded", "flat"):
        data = from_client_arrays(xs, ys, layout=layout)
        assert (data.x.shape[1] if layout == "padded" else data.n_max) == 8
        for chunk in (3, 8192):
            got = client_batch_losses(model, params, data, listed, key, 8, chunk=chunk)
            np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, err_msg=layout)


def test_eval_rows_take_more_rows_only_for_small_activations():
    """An all-client pass takes ``batch_size`` rows, or as many rows as fit the activation
    budget: logistic regression's forward holds at least its logits and at most a few copies
    of them per row; the CNN's first convolution alone (32 maps of 26 x 26) exceeds the budget
    at 1,024 rows, so it keeps the batch."""
    from fedjax_sel.training.evaluate import (
        EVAL_PASS_BYTES,
        activation_bytes_per_row,
        eval_rows,
    )

    logreg = make_model("logreg", input_shape=(D,), num_classes=C)
    data = from_client_arrays(*_clients([3, 5]))
    params = logreg.init(jax.random.key(0))
    per_row = activation_bytes_per_row(logreg, params, data)
    assert 4 * C <= per_row <= 4 * 4 * C
    assert eval_rows(logreg, params, data, 64) == EVAL_PASS_BYTES // per_row
    assert eval_rows(logreg, params, data, 10**8) == 10**8
    cnn = make_model("cnn", input_shape=(28, 28, 1), num_classes=10)
    images = from_client_arrays([np.zeros((2, 28, 28, 1), np.float32)], [np.zeros(2, np.int32)])
    cnn_params = cnn.init(jax.random.key(0))
    assert activation_bytes_per_row(cnn, cnn_params, images) >= 32 * 26 * 26 * 4
    assert eval_rows(cnn, cnn_params, images, 1024) == 1024


def test_segment_sums_in_any_batch_size_match_numpy():
    """Per-segment loss, correct and count sums over 997 rows (some invalid) in batches that
    divide the rows or not (the last batch slices back over counted rows, which must not count
    twice), against NumPy."""
    from fedjax_sel.training.evaluate import segment_sums

    rng = np.random.default_rng(8)
    n = 997
    x = rng.normal(size=(n, D)).astype(np.float32)
    y = rng.integers(0, C, n).astype(np.int32)
    seg = rng.integers(0, 13, n).astype(np.int32)
    valid = rng.uniform(size=n) < 0.9
    model = make_model("logreg", input_shape=(D,), num_classes=C)
    params, numpy_rows = _logreg_numpy(model)
    row_loss, predicted = numpy_rows(x, y)
    row_correct = (predicted == y).astype(np.float64)
    want = [
        np.bincount(seg, weights=v * valid, minlength=13)
        for v in (row_loss, row_correct, np.ones(n))
    ]
    args = (jnp.asarray(x), jnp.asarray(y), jnp.asarray(seg), jnp.asarray(valid), 13)
    for batch in (7, 100, 997, 1024):
        got = segment_sums(model, params, *args, batch_size=batch)
        for g, ref, name in zip(got, want, ("loss", "correct", "count"), strict=True):
            np.testing.assert_allclose(np.asarray(g), ref, rtol=2e-5, atol=1e-4, err_msg=name)


def test_radix_argsort_matches_a_stable_argsort_with_ties():
    """The LSD radix argsort behind the epoch permutation against NumPy's stable argsort, on
    keys with many ties (two and three passes), and the epoch positions against the plain
    argsort of the uniform keys they replaced."""
    from fedjax_sel.training.local import stable_argsort_uint

    rng = np.random.default_rng(0)
    for n, hi in ((1, 2), (300, 7), (20000, 2**23 + 1), (1 << 21, 2**24)):
        keys = rng.integers(0, hi, n).astype(np.uint32)
        got = np.asarray(stable_argsort_uint(jnp.asarray(keys), key_bits=24))
        np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))
    key, n_max = jax.random.key(3), 1000
    for count in (0, 1, 999, 1000):
        u = np.asarray(jax.random.uniform(key, (n_max,)))
        u = np.where(np.arange(n_max) < count, u, 2.0)
        want = np.pad(np.argsort(u, kind="stable"), (0, 8), constant_values=n_max)
        got = np.asarray(epoch_positions(key, jnp.int32(count), n_max, 16)).reshape(-1)
        np.testing.assert_array_equal(got, want)
