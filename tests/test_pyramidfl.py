"""PyramidFL (Li et al., MobiCom 2022) as an extension of Oort: the inter-client ranking on a
planted case against a NumPy transcription of the artifact's ``getTopK`` scores (loss utility,
temporal bonus, speed penalty; and our gradient-utility variant in both of its forms), the
exploitLen cap of PyramidFL's Oort copy, the gradient utility and the intra-client plan
against a literal transcription of ``prune_client_tasks``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError, RoundFeedback, RoundInputs, Selection, SimSpec
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.hyperparams import init_with_hyperparams
from fedjax_sel.strategies.oort import TRACED as OORT_TRACED
from fedjax_sel.strategies.pyramidfl import plan_intra_client, slot_gradient_utility

K, P = 12, 6
N = np.full(K, 20)
SAMPLES = 10  # local_steps 2 x batch 5: |B_k| = min(20, 10)


# ----------------------------------------------------------------------------- NumPy references
def np_scores(reward, explored, time_stamp, duration, t, clip_bound, threshold, penalty):
    """The artifact's ``getTopK`` score of every explored (and feasible) client."""
    vals = sorted(r for r in reward if r > 0)
    clip = vals[min(int(len(vals) * clip_bound), len(vals) - 1)]
    low = vals[0] * 0.999
    span = max(vals[-1] - low, 1e-4)
    sd = sorted(duration)
    d_pref = sd[min(int(len(sd) * threshold / 100.0), len(sd) - 1)]
    out = {}
    for k in np.flatnonzero(explored):
        sc = (min(reward[k], clip) - low) / span + math.sqrt(0.1 * math.log(t) / time_stamp[k])
        if duration[k] > d_pref:
            sc *= (d_pref / max(1e-4, duration[k])) ** penalty
        out[int(k)] = sc
    return out


def np_prune(local, comm, grad, n, keep, u, batch, beta, low, high, dropout, adapt):
    """``prune_client_tasks`` steps 2-4 (liecn/PyramidFL training/param_server.py) and the
    learner's cap, over a list of picks; returns per pick (ratio, iters, dropout) and D."""
    times = [a + b for a, b in zip(local, comm, strict=True)]
    order = sorted(range(len(times)), key=lambda k: times[k])
    top = order[:keep]
    duration = times[top[-1]]
    rewards = [grad[k] for k in top]
    ranked = sorted(rewards, reverse=True)
    ranking = [ranked.index(r) for r in rewards]
    d = [0.0] * len(times)
    if dropout:
        inc = (high - low) / keep
        for j, k in enumerate(top):
            d[k] = low + ranking[j] * inc
            times[k] = local[k] + (1 - d[k]) * comm[k]
        duration = max(times[k] for k in top)
    ratio, iters = [0.0] * len(times), [0] * len(times)
    for k in top:
        r = (
            min(10, beta * math.floor((duration - times[k]) / (local[k] / u)) / u) + 1
            if adapt
            else 1
        )
        ratio[k] = r
        iters[k] = min(int(u * r), max(math.ceil(n[k] / batch) * 5, u))
    return ratio, iters, d, duration


# ----------------------------------------------------------------------------- the planted case
THETA = np.array([300.0, 0.0, 0.0])
# per explored client (|Delta|, |Delta - theta|) / 10 = (the "delta" and the "code" gradient
# utilities with |B| = 10): delta ranks {4, 5, 0} first, code {4, 5, 3}; client 1 is slow
NORMS = [
    (300.0, 40.0),
    (100.0, 200.0),
    (60.0, 240.0),
    (40.0, 330.0),
    (380.0, 480.0),
    (350.0, 460.0),
]
LOSS_UTILITY = np.array([40.0, 35.0, 30.0, 28.0, 4.0, 3.0])  # |B| sqrt(loss^2): {0, 2, 3}
DURATIONS = np.array([10.0, 80.0, 10.0, 10.0, 10.0, 10.0] + [10.0] * 6)  # D* = 10 (T = 50)


def planted_deltas():
    rows = []
    for p, q in NORMS:  # |Delta| = p, |Delta - (300, 0, 0)| = q
        a = (p * p - q * q + 300.0**2) / 600.0
        rows.append([a, math.sqrt(max(p * p - a * a, 0.0)), 0.0])
    return np.array(rows)


def spec(per_round=P):
    return SimSpec(K, per_round, 100, jnp.asarray(N, jnp.int32), {"w": jnp.zeros(3)}, 10, None)


def inputs(round_):
    return RoundInputs(
        jnp.int32(round_),
        jnp.ones(K, bool),
        {"w": jnp.asarray(THETA, jnp.float32)},
        jnp.asarray(N, jnp.int32),
        None,
        jnp.full((K,), 10.0),
        jnp.full((K,), 8.0),
        jnp.full((K,), 2.0),
    )


def after_first_round(strategy):
    """The strategy's state after clients 0..5 trained once (round 0) with the planted
    losses, updates and durations."""
    state = strategy.init(jax.random.key(0), spec())
    deltas = planted_deltas()
    sel = Selection(jnp.arange(P, dtype=jnp.int32), jnp.ones(P, bool), jnp.full(P, 1.0 / P))
    fb = RoundFeedback(
        round=jnp.int32(0),
        available=jnp.ones(K, bool),
        params={"w": jnp.asarray(THETA, jnp.float32)},
        new_params={"w": jnp.asarray(THETA, jnp.float32)},
        deltas={"w": jnp.asarray(deltas, jnp.float32)},
        train_loss=jnp.zeros(P),
        initial_loss=jnp.zeros(P),
        loss_sq=jnp.asarray(np.square(LOSS_UTILITY / SAMPLES), jnp.float32),
        update_norm=jnp.asarray(np.linalg.norm(deltas, axis=1), jnp.float32),
        num_examples=jnp.asarray(N[:P], jnp.int32),
        num_steps=jnp.full(P, 2, jnp.int32),
        requested=jnp.ones(P, bool),
        durations=jnp.asarray(DURATIONS[:P], jnp.float32),
    )
    return jax.jit(strategy.update)(state, sel, fb)


def planted_strategy(name="pyramidfl", **kw):
    args = dict(
        exploration_factor=0.5,  # decay 1: eps = 0.5, exploitLen = int(6 * 0.5) = 3
        exploration_decay=1.0,
        exploration_min=0.0,
        cut_off_util=1.1,
        round_threshold=50.0,
        warmup_rounds=0,
    )
    if name == "pyramidfl":
        args.update(local_steps=2, batch_size=5)
    else:
        args.update(samples_per_round=SAMPLES)
    args.update(kw)
    return make_strategy(name, P, **args)


def expected_utility(ranking, variant):
    if ranking == "loss":
        return LOSS_UTILITY
    return np.array([n[0] if variant == "delta" else n[1] for n in NORMS]) * SAMPLES / 100.0


@pytest.mark.parametrize(
    "ranking, variant, top",
    [
        ("loss", "code", {0, 2, 3}),
        ("gradient", "delta", {4, 5, 0}),
        ("gradient", "code", {4, 5, 3}),
    ],
)
def test_ranking_matches_numpy_on_planted_case(ranking, variant, top):
    """Exploitation takes exactly the top-3 scores (the cut-off keeps only them): the loss
    ranking (the artifact), or the gradient utility (ours) in either form; the speed penalty
    sinks client 1 (8x slower than D*) in every case."""
    strategy = planted_strategy(ranking=ranking, gradient_utility=variant)
    state = after_first_round(strategy)
    reward = np.concatenate([expected_utility(ranking, variant), np.full(K - P, 10.0)])
    np.testing.assert_allclose(np.asarray(state.oort.inner.reward), reward, rtol=1e-4)
    scores = np_scores(reward, np.arange(K) < P, np.ones(K), DURATIONS, 2, 0.98, 50.0, 2.0)
    ranked = sorted(scores, key=scores.get, reverse=True)
    # the planted case is deterministic: the cut-off (1.1 x the 4th score) keeps the top 3
    assert scores[ranked[2]] >= 1.1 * scores[ranked[3]] * 1.05
    assert set(ranked[:3]) == top and 1 not in top
    sel, new = jax.jit(strategy.select, static_argnums=2)(state, inputs(1), None, jax.random.key(3))
    exploit = set(np.flatnonzero(np.asarray(new.oort.inner.last_exploit)).tolist())
    assert exploit == top
    picks = np.asarray(sel.clients)[np.asarray(sel.mask)]
    assert len(set(picks.tolist())) == P and top <= set(picks.tolist())
    # the gradient utility is tracked for every variant
    g = expected_utility("gradient", variant)
    np.testing.assert_allclose(np.asarray(state.gradient)[:P], g, rtol=1e-4)


def test_exploit_len_is_capped_below_the_explored_count():
    """eps = 0 wants all 6 picks exploited; 6 clients are explored: PyramidFL's Oort copy
    exploits 5 (#explored - 1) and explores 1, the original Oort exploits 6."""
    kw = dict(exploration_factor=0.0, cut_off_util=0.0)
    pyr = planted_strategy(**kw)
    oort = planted_strategy("oort", **kw)
    s_pyr, s_oort = after_first_round(pyr), after_first_round(oort)
    _, new_pyr = jax.jit(pyr.select, static_argnums=2)(s_pyr, inputs(1), None, jax.random.key(1))
    _, new_oort = jax.jit(oort.select, static_argnums=2)(s_oort, inputs(1), None, jax.random.key(1))
    assert int(jnp.sum(new_pyr.oort.inner.last_exploit)) == 5
    assert int(jnp.sum(new_pyr.oort.inner.last_explore)) == 1
    assert int(jnp.sum(new_oort.inner.last_exploit)) == 6


def test_gradient_utility_matches_numpy():
    rng = np.random.default_rng(2)
    deltas = {"a": rng.normal(size=(4, 3, 2)), "b": rng.normal(size=(4, 5))}
    params = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=(5,))}
    bins = np.array([10.0, 3.0, 7.0, 1.0])
    flat_d = np.concatenate([deltas["a"].reshape(4, -1), deltas["b"]], axis=1)
    flat_p = np.concatenate([params["a"].ravel(), params["b"]])
    norm = np.linalg.norm(flat_d, axis=1)
    as_jax = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), (deltas, params))
    code = slot_gradient_utility(*as_jax, jnp.asarray(norm), jnp.asarray(bins), "code")
    delta = slot_gradient_utility(*as_jax, jnp.asarray(norm), jnp.asarray(bins), "delta")
    np.testing.assert_allclose(
        code, np.linalg.norm(flat_d - flat_p, axis=1) * bins / 100, rtol=1e-5
    )
    np.testing.assert_allclose(delta, norm * bins / 100, rtol=1e-5)


@pytest.mark.parametrize("dropout, adapt", [(True, True), (False, True), (True, False)])
def test_plan_matches_prune_client_tasks(dropout, adapt):
    """Eight picks, the five fastest kept; gradient utilities with a tie (shared rank)."""
    local = [4.3, 2.1, 9.7, 1.3, 6.1, 3.3, 12.5, 2.9]
    comm = [1.1, 3.7, 0.9, 2.3, 1.7, 0.7, 2.2, 5.3]
    grad = [5.0, 2.0, 7.0, 2.0, 9.0, 1.0, 3.0, 4.0]
    n = [25, 400, 60, 8, 100, 30, 70, 45]
    keep, u, batch, beta, low, high = 5, 4, 10, 0.5, 0.1, 0.6
    ratio, iters, d, duration = np_prune(
        local, comm, grad, n, keep, u, batch, beta, low, high, dropout, adapt
    )
    order = np.argsort(np.add(local, comm), kind="stable")
    kept = np.zeros(8, bool)
    kept[order[:keep]] = True
    plan = plan_intra_client(
        jnp.asarray(local),
        jnp.asarray(comm),
        jnp.asarray(grad),
        jnp.asarray(kept),
        jnp.asarray(n),
        local_steps=u,
        batch_size=batch,
        beta=beta,
        dropout_low=low,
        dropout_high=high,
        dropout=dropout,
        adapt=adapt,
    )
    np.testing.assert_allclose(np.asarray(plan.ratio), ratio, rtol=1e-6)
    assert np.asarray(plan.iters).tolist() == iters
    np.testing.assert_allclose(np.asarray(plan.dropout), d, rtol=1e-6)
    assert float(plan.duration) == pytest.approx(duration, rel=1e-6)
    assert max(iters) > u if adapt else max(iters) == u  # the slack buys fast clients steps


def test_plan_is_logged_and_traced_knobs_reach_oort():
    strategy = planted_strategy(keep=4)
    assert tuple(dict(strategy.hyperparams)) == OORT_TRACED
    state = init_with_hyperparams(strategy, jax.random.key(0), spec(), {"round_penalty": 1.5})
    assert float(state.oort.hyperparams["round_penalty"]) == 1.5
    sel, new = jax.jit(strategy.select, static_argnums=2)(state, inputs(0), None, jax.random.key(2))
    assert int(jnp.sum(new.plan_iters > 0)) == 4
    assert set(sel.diagnostics) >= {"pyramid_iters_ratio_mean", "pyramid_dropout_mean"}


def test_bad_arguments_and_missing_profiles():
    for bad in (dict(ranking="x"), dict(gradient_utility="x"), dict(dropout_low=0.7)):
        with pytest.raises(ConfigError):
            make_strategy("pyramidfl", 4, **bad)
    strategy = make_strategy("pyramidfl", 4)
    state = strategy.init(jax.random.key(0), spec(4))
    bare = RoundInputs(jnp.int32(0), jnp.ones(K, bool), {}, jnp.asarray(N), None, jnp.ones(K))
    with pytest.raises(ConfigError, match="device profiles"):
        strategy.select(state, bare, None, jax.random.key(0))
