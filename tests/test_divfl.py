"""DivFL (Balakrishnan et al. 2022): the facility-location greedy against a NumPy greedy and
brute force, planted clusters, the stale-update table and the warm start."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel import engine
from fedjax_sel.availability import bernoulli
from fedjax_sel.base import ConfigError, RoundInputs, SimSpec
from fedjax_sel.data import load_dataset
from fedjax_sel.engine.phases import round_keys, select_phase
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.divfl import (
    DivFLState,
    facility_location_greedy,
    flatten_stacked,
    pairwise_distances,
)
from fedjax_sel.training import HParams, LocalConfig, Parallel


def cost(dist, cover, s):
    """G(S) = sum_{i in cover} min_{j in S} d_ij."""
    return dist[np.ix_(cover, list(s))].min(axis=1).sum()


def numpy_greedy(dist, candidates, cover, k, priority):
    chosen = []
    cover_idx = np.flatnonzero(cover)
    for _ in range(k):
        best, best_key = None, None
        for j in np.flatnonzero(candidates):
            if j in chosen:
                continue
            key = (-cost(dist, cover_idx, chosen + [j]), priority[j])
            if best is None or key > best_key:
                best, best_key = j, key
        if best is None:
            break
        chosen.append(int(best))
    return chosen


def test_greedy_matches_numpy_and_approximates_the_optimum():
    rng = np.random.default_rng(0)
    run = jax.jit(facility_location_greedy, static_argnums=3)
    for trial in range(8):
        k_count, k = 10, 3
        x = rng.normal(size=(k_count, 4)).astype(np.float32)
        dist = np.asarray(pairwise_distances(jnp.asarray(x)))
        ref = np.linalg.norm(x[:, None] - x[None], axis=-1)
        np.testing.assert_allclose(dist, ref, atol=2e-3)
        candidates = rng.uniform(size=k_count) < 0.8
        cover = candidates if trial % 2 else np.ones(k_count, bool)
        priority = rng.uniform(size=k_count).astype(np.float32)
        picks, ok = run(
            jnp.asarray(dist), jnp.asarray(candidates), jnp.asarray(cover), k, jnp.asarray(priority)
        )
        got = np.asarray(picks)[np.asarray(ok)].tolist()
        assert got == numpy_greedy(dist, candidates, cover, k, priority)
        # facility location F(S) = sum_i (C - min_j d_ij) is monotone submodular: greedy gets
        # at least (1 - 1/e) of the best F over |S| = k
        c = dist[np.ix_(cover, candidates)].max()
        cov = np.flatnonzero(cover)
        f = lambda s: (c - dist[np.ix_(cov, list(s))].min(axis=1)).sum()
        best = max(f(s) for s in itertools.combinations(np.flatnonzero(candidates), k))
        assert f(got) >= (1 - 1 / np.e) * best - 1e-4


def test_fewer_candidates_than_picks_and_ties():
    dist = jnp.zeros((5, 5))  # every client identical: all gains tie
    cands = jnp.array([True, False, True, False, False])
    prio = jnp.array([0.1, 0.9, 0.7, 0.3, 0.2])
    picks, ok = facility_location_greedy(dist, cands, cands, 4, prio)
    assert np.asarray(ok).tolist() == [True, True, False, False]
    assert np.asarray(picks)[:2].tolist() == [2, 0]  # ties by priority


def _spec(k, per_round, params):
    return SimSpec(k, per_round, 5, jnp.full((k,), 10, jnp.int32), params)


def test_planted_clusters_one_pick_each_medoid_first():
    """Three clusters of update directions: DivFL represents each cluster once. With an outlier
    added, DivFL's first pick is the medoid of the largest cluster, while the FilFL
    repository's inverted objective (maximising the cost) would pick the outlier first."""
    rng = np.random.default_rng(1)
    centers = np.array([[5, 0, 0], [0, 5, 0], [0, 0, 5]], np.float32)
    sizes = [5, 4, 2]
    rows = [c + 0.1 * rng.normal(size=(s, 3)) for c, s in zip(centers, sizes, strict=True)]
    rows.append(np.array([[40.0, 40.0, 40.0]]))  # outlier, the last client
    updates = np.concatenate(rows).astype(np.float32)
    label = np.repeat(np.arange(4), sizes + [1])
    k_count = len(updates)
    strat = make_strategy("divfl", 3, warm_start=False)
    state = strat.init(jax.random.key(0), _spec(k_count, 3, {"w": jnp.zeros(3)}))
    state = state._replace(updates=jnp.asarray(updates), known=jnp.ones(k_count, bool))
    dist = np.asarray(pairwise_distances(jnp.asarray(updates)))
    for s in range(5):
        for with_outlier in (False, True):
            available = np.ones(k_count, bool)
            available[-1] = with_outlier
            inputs = RoundInputs(
                jnp.int32(1), jnp.asarray(available), {"w": jnp.zeros(3)}, jnp.full((k_count,), 10)
            )
            sel, _ = strat.select(state, inputs, None, jax.random.key(s))
            picked = np.asarray(sel.clients)[np.asarray(sel.mask)]
            # the logged facility-location cost per covered client, against NumPy
            cov = np.flatnonzero(available)
            np.testing.assert_allclose(
                float(sel.diagnostics["cover_cost"]),
                cost(dist, cov, picked) / cov.size,
                rtol=1e-4,
                atol=1e-4,
            )
            assert float(sel.diagnostics["cover_size"]) == cov.size
            if with_outlier:
                medoid = int(np.argmin(dist.sum(axis=0)))
                assert picked[0] == medoid and label[medoid] == 0
            else:
                assert sorted(label[picked].tolist()) == [0, 1, 2]
    inverted_first = int(np.argmax(dist.sum(axis=0)))  # argmax of the facility-location cost
    assert label[inverted_first] == 3


def test_sketch_coordinates_and_config_errors():
    params = {"a": jnp.zeros((4, 5)), "b": jnp.zeros(7)}
    state = make_strategy("divfl", 2, sketch_dim=6).init(jax.random.key(0), _spec(4, 2, params))
    coords = np.asarray(state.coords)
    assert coords.shape == (6,) and len(set(coords.tolist())) == 6 and coords.max() < 27
    assert state.updates.shape == (4, 6)
    full = make_strategy("divfl", 2).init(jax.random.key(0), _spec(4, 2, params))
    assert full.updates.shape == (4, 27)
    flat = flatten_stacked({"a": jnp.ones((3, 4, 5)), "b": 2 * jnp.ones((3, 7))})
    assert flat.shape == (3, 27) and float(flat[0, -1]) == 2.0
    with pytest.raises(ConfigError, match="cover"):
        make_strategy("divfl", 2, cover="all")
    with pytest.raises(ConfigError, match="sketch_dim"):
        make_strategy("divfl", 2, sketch_dim=-1)


def divfl_digits(k_count, *, data_seed, num_rounds, chunk_size, **strategy_args):
    """DivFL (3 per round) on ``k_count`` digits clients, logistic regression, 2 local steps,
    Bernoulli(0.7) availability."""
    ds = load_dataset("digits", num_clients=k_count, seed=data_seed, test_fraction=0.2)
    spec = engine.RoundSpec.create(
        ds,
        make_model("logreg", input_shape=ds.input_shape, num_classes=10),
        make_strategy("divfl", 3, **strategy_args),
        local=LocalConfig(local_steps=2),
        per_round=3,
        availability=bernoulli(0.7),
        parallel=Parallel("vmap"),
    )
    return Simulation(spec, ds, num_rounds=num_rounds, chunk_size=chunk_size)


def test_warm_start_table_and_pretrained_slots():
    k_count = 8
    sim = divfl_digits(k_count, data_seed=0, num_rounds=4, chunk_size=1)
    state = sim.init(seed=0, hparams=HParams.of(0.1))

    @jax.jit
    def step(state, data):
        _, sel, available = select_phase(sim.spec, state, data)
        _, _, k_train = round_keys(state)
        everyone = jnp.arange(k_count, dtype=jnp.int32)
        all_trained = sim.spec.trainer.train(
            state.params, data.train, everyone, available, k_train, hparams=state.hparams
        )
        new_state, _ = engine.round_fn(sim.spec, state, data)
        return sel, available, all_trained, new_state

    sel, available, all_trained, state1 = step(state, sim.data)
    available = np.asarray(available)
    deltas = flatten_stacked(
        jax.tree.map(lambda p, g: p - g[None], all_trained.params, state.params)
    )
    table: DivFLState = state1.strategy_state
    np.testing.assert_array_equal(np.asarray(table.known), available)
    np.testing.assert_allclose(
        np.asarray(table.updates)[available], np.asarray(deltas)[available], atol=1e-5
    )
    mask = np.asarray(sel.mask)
    chosen = np.asarray(sel.clients)[mask]
    np.testing.assert_allclose(
        np.asarray(sel.train_result.params["Dense_0"]["kernel"])[mask],
        np.asarray(all_trained.params["Dense_0"]["kernel"])[chosen],
        atol=1e-6,
    )
    # later rounds: the table changes only in the rows of the selected clients
    sel2, _, all2, state2 = step(state1, sim.data)
    mask2 = np.asarray(sel2.mask)
    chosen2 = np.asarray(sel2.clients)[mask2]
    changed = np.flatnonzero(
        np.any(np.asarray(state2.strategy_state.updates) != np.asarray(table.updates), axis=1)
    )
    assert set(changed.tolist()) <= set(chosen2.tolist())
    d2 = flatten_stacked(jax.tree.map(lambda p, g: p - g[None], all2.params, state1.params))
    np.testing.assert_allclose(
        np.asarray(state2.strategy_state.updates)[chosen2], np.asarray(d2)[chosen2], atol=1e-5
    )


def test_warm_start_in_chunks_equals_all_at_once():
    """``warm_chunk`` below K (11 clients in chunks of 4, the last one padded): the warm-start
    round records the same table, picks the same clients and hands the round the same trained
    parameters as training everyone at once; so does every later round."""

    def rounds(warm_chunk):
        sim = divfl_digits(11, data_seed=1, num_rounds=3, chunk_size=3, warm_chunk=warm_chunk)
        return sim.run_rounds(sim.init(seed=2, hparams=HParams.of(0.1)), 3)

    chunked, log_chunked = rounds(4)
    whole, log_whole = rounds(0)
    assert np.asarray(log_whole.clients).shape == (3, 3) and np.all(log_whole.mask)
    np.testing.assert_array_equal(log_chunked.clients, log_whole.clients)
    np.testing.assert_array_equal(log_chunked.mask, log_whole.mask)
    np.testing.assert_allclose(log_chunked.train_loss, log_whole.train_loss, rtol=1e-6)
    np.testing.assert_array_equal(chunked.strategy_state.known, whole.strategy_state.known)
    np.testing.assert_allclose(
        chunked.strategy_state.updates, whole.strategy_state.updates, atol=1e-6
    )
    for a, b in zip(jax.tree.leaves(chunked.params), jax.tree.leaves(whole.params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    with pytest.raises(ConfigError, match="warm_chunk must be >= 0, got -1"):
        make_strategy("divfl", 3, warm_chunk=-1)


def test_pool_approximates_the_full_greedy_on_planted_clusters():
    """The large-K path (``pool``): on 600 clients in 8 planted clusters of directions, a pool
    of 150 per round picks 8 clients whose facility-location cost over all 600 is within 5% of
    the full greedy's (NumPy), one per cluster; a pool of at least K is the full greedy."""
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(8, 16)) * 4.0
    label = rng.integers(0, 8, 600)
    updates = (centers[label] + rng.normal(size=(600, 16))).astype(np.float32)
    dist = np.linalg.norm(updates[:, None] - updates[None], axis=-1)
    everyone = np.arange(600)
    inputs = RoundInputs(
        jnp.int32(1), jnp.ones(600, bool), {"w": jnp.zeros(16)}, jnp.full((600,), 10)
    )

    def picks(strat, key):
        state = strat.init(jax.random.key(0), _spec(600, 8, {"w": jnp.zeros(16)}))
        state = state._replace(updates=jnp.asarray(updates), known=jnp.ones(600, bool))
        sel, _ = jax.jit(strat.select)(state, inputs, None, key)
        return np.asarray(sel.clients)[np.asarray(sel.mask)], sel

    full, _ = picks(make_strategy("divfl", 8, warm_start=False), jax.random.key(5))
    full_cost = cost(dist, everyone, full)
    for s in range(4):
        pooled, sel = picks(
            make_strategy("divfl", 8, warm_start=False, pool=150), jax.random.key(s)
        )
        assert len(set(pooled.tolist())) == 8
        assert cost(dist, everyone, pooled) <= 1.05 * full_cost
        assert sorted(label[pooled].tolist()) == list(range(8))
        assert float(sel.diagnostics["cover_size"]) == 150  # the pool's cost is the one logged
    same, _ = picks(make_strategy("divfl", 8, warm_start=False, pool=600), jax.random.key(5))
    np.testing.assert_array_equal(same, full)
    with pytest.raises(ConfigError, match="pool"):
        make_strategy("divfl", 8, pool=4)
