"""Oort: each building block against a plain-Python transcription of the reference selector
(``reference/algorithms.md`` section 5), explored/unexplored bookkeeping, the pacer, no
duplicate picks, stragglers of the engine's over-commitment, and simulated time under the
shared device profiles."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError, RoundFeedback, RoundInputs, SimSpec
from fedjax_sel.data import load_dataset
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.kernels import oort as ok
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig

K = 20


# ----------------------------------------------------------------------------- Python references
def py_get_norm(values, clip_bound):
    values = sorted(values)
    clip = values[min(int(len(values) * clip_bound), len(values) - 1)]
    low = values[0] * 0.999
    return low, max(values[-1] - low, 1e-4), clip


def py_pacer(utilities, step, delta, threshold):
    """The reference ``pacer()`` called at rounds 1..len(utilities); returns T after each."""
    history, out = [], []
    for t, u in enumerate(utilities, start=1):
        history.append(u)
        if t >= 2 * step and t % step == 0:
            last = sum(history[-2 * step : -step])
            cur = sum(history[-step:])
            if abs(cur - last) <= last * 0.1:
                threshold = min(100.0, threshold + delta)
            elif abs(cur - last) >= last * 5:
                threshold = max(delta, threshold - delta)
        out.append(threshold)
    return out


def py_candidates(scores, exploit_len, cut_off_util, fedscale):
    """The exploitation candidate loop of both ``getTopK`` versions (cut-off rank clamped)."""
    ranked = sorted(scores, key=scores.get, reverse=True)
    # in float32 like the kernel (scores tied with the cut-off stay tied)
    cut = float(
        np.float32(scores[ranked[min(exploit_len, len(ranked) - 1)]]) * np.float32(cut_off_util)
    )
    picked = []
    for c in ranked:
        if scores[c] < cut and (not fedscale or len(picked) > 10.0 * exploit_len):
            break
        picked.append(c)
    return set(picked)


# ----------------------------------------------------------------------------- building blocks
@pytest.mark.parametrize("seed", range(5))
def test_reward_norm_matches_get_norm(seed):
    rng = np.random.default_rng(seed)
    reward = rng.exponential(50.0, K).astype(np.float32)
    reward[rng.random(K) < 0.2] = 0.0  # non-positive rewards are left out
    eligible = rng.random(K) < 0.7
    clip_bound = float(rng.choice([0.9, 0.95, 0.98]))
    values = [float(r) for r, e in zip(reward, eligible, strict=True) if e and r > 0]
    got = ok.reward_norm(jnp.asarray(reward), jnp.asarray(eligible), clip_bound)
    low, span, clip = py_get_norm(values, clip_bound)
    np.testing.assert_allclose([got.low, got.span, got.clip], [low, span, clip], rtol=1e-5)
    assert int(got.count) == len(values)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("fedscale", [False, True])
@pytest.mark.parametrize("size, max_len", [(K, K), (300, 6)])
def test_exploit_candidates_match_reference_loop(seed, fedscale, size, max_len):
    """Against the reference loop; (300, 6): a top_k much shallower than K, with ties."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0.0, 2.0, size).astype(np.float32)
    if size > K:
        scores = np.round(scores, 1)  # many equal scores: ties go to the lower id
    explored = rng.random(size) < 0.8
    n = int(explored.sum())
    lengths = (0, 1, 3, n - 1, n) if max_len >= n else (0, 1, 3, max_len)
    for exploit_len in lengths:  # n: the reference's IndexError case, clamped
        cut = 0.05 if fedscale else 0.7
        want = py_candidates(
            {i: float(scores[i]) for i in range(size) if explored[i]}, exploit_len, cut, fedscale
        )
        got = ok.exploit_candidates(
            jnp.asarray(scores),
            jnp.asarray(explored),
            jnp.int32(exploit_len),
            cut,
            10.0 if fedscale else 0.0,
            max_len,
        )
        assert set(np.flatnonzero(np.asarray(got)).tolist()) == want
        assert len(want) >= min(exploit_len, n)


def test_top_ranked_is_a_stable_ranking():
    rng = np.random.default_rng(0)
    values = np.round(rng.uniform(0, 1, 200), 1).astype(np.float32)
    eligible = rng.random(200) < 0.5
    ids = [i for i in range(200) if eligible[i]]
    ranked = sorted(ids, key=lambda i: -values[i])  # Python's sort is stable
    for count in (0, 1, 7, 30):
        got = ok.top_ranked(jnp.asarray(values), jnp.asarray(eligible), jnp.int32(count), 30)
        assert set(np.flatnonzero(np.asarray(got)).tolist()) == set(ranked[:count])


def test_pacer_matches_reference_and_moves_as_specified():
    step, delta = 5, 5.0
    rng = np.random.default_rng(0)
    # flat stretches (T relaxes), sharp jumps (T tightens) and noise (T stays)
    utilities = (
        list(rng.uniform(10, 11, 30)) + [1.0] * 10 + [100.0] * 10 + list(rng.uniform(1, 50, 30))
    )
    want = py_pacer(utilities, step, delta, 30.0)
    hist = jnp.zeros(2 * step)
    threshold = jnp.float32(30.0)
    got = []
    for t, u in enumerate(utilities, start=1):
        hist = ok.push_history(hist, u)  # what the update of round t - 1 appended
        threshold = ok.pacer(threshold, hist, jnp.int32(t), step, delta)
        got.append(float(threshold))
    np.testing.assert_allclose(got, want)
    moves = np.diff([30.0] + want)
    assert set(np.unique(moves)) <= {-delta, 0.0, delta}
    assert all(t % step == 0 and t >= 2 * step for t in np.flatnonzero(moves) + 1)
    assert want[9] == 35.0  # flat first two windows: relaxed at t = 2W
    assert (np.diff(want[38:55]) < 0).any()  # the 10x jump tightens it


def test_preferred_duration_and_penalty():
    d = jnp.asarray(np.random.default_rng(1).permutation(np.arange(1.0, 21.0)), jnp.float32)
    for threshold in (5.0, 10.0, 30.0, 99.0):
        ranked = sorted(np.asarray(d).tolist())
        want = ranked[min(int(K * threshold / 100.0), K - 1)]
        assert float(ok.preferred_duration(d, jnp.float32(threshold))) == want
    assert float(ok.preferred_duration(d, jnp.float32(100.0))) == math.inf
    pen = ok.duration_penalty(jnp.array([1.0, 4.0, 8.0]), jnp.float32(4.0), 2.0)
    np.testing.assert_allclose(pen, [1.0, 1.0, 0.25])


def test_presets_follow_table_5_4():
    o, f = ok.PRESETS["original"], ok.PRESETS["fedscale"]
    assert (o.exploration_decay, o.exploration_min, o.cut_off_util) == (0.95, 0.2, 0.7)
    assert (f.exploration_decay, f.exploration_min, f.cut_off_util) == (0.98, 0.3, 0.05)
    assert (o.clip_bound, o.round_threshold) == (0.98, 10.0)
    assert (f.clip_bound, f.round_threshold) == (0.9, 30.0)
    assert ok.PRESET_OVERCOMMIT == {"original": 1.1, "fedscale": 1.3}  # the engine applies it
    for p in (o, f):
        assert (p.exploration_factor, p.round_penalty, p.pacer_step) == (0.9, 2.0, 20)
        assert (p.pacer_delta, p.sample_window, p.blacklist_rounds) == (5.0, 5.0, -1)


def test_blacklist_caps_the_most_used():
    count = jnp.array([5, 9, 1, 9, 7, 0, 6, 2, 8, 3])
    black = np.asarray(ok.blacklist(count, 4, 0.3))  # cap int(0.3 * 10) = 3
    assert np.flatnonzero(black).tolist() == [1, 3, 8]


# ----------------------------------------------------------------------------- the strategy
def spec(per_round=4, num_examples=None):
    n = jnp.arange(10, 10 + K, dtype=jnp.int32) if num_examples is None else num_examples
    return SimSpec(K, per_round, 100, n, {"w": jnp.zeros((50,))}, 10, None)


def explored_state(strategy, seed, explored_fraction=0.6, per_round=4):
    """A state in the middle of a run: some clients explored with random rewards (Oort's own
    state, inside the one that carries its traced hyperparameters)."""
    rng = np.random.default_rng(seed)
    state = strategy.init(jax.random.key(seed), spec(per_round)).inner
    explored = rng.random(K) < explored_fraction
    return state._replace(
        reward=jnp.where(
            explored, jnp.asarray(rng.exponential(30.0, K), jnp.float32), state.reward
        ),
        count=jnp.asarray(np.where(explored, rng.integers(1, 5, K), 0), jnp.int32),
        time_stamp=jnp.asarray(np.where(explored, rng.integers(1, 9, K), 0), jnp.int32),
        epsilon=jnp.float32(0.5),
    ), explored


DURATIONS = jnp.asarray(np.random.default_rng(9).lognormal(3.0, 0.8, K), jnp.float32)


@functools.cache
def _jitted_select(strategy):
    def select(state, available, key, round_):
        inputs = RoundInputs(round_, available, {}, jnp.ones(K, jnp.int32), None, DURATIONS)
        return strategy.select(state, inputs, None, key)

    return jax.jit(select)


def run_select(strategy, state, available, key, round_=9):
    """``strategy.select`` at 0-based round ``round_`` (jitted once per strategy), from Oort's
    own state (run at the values the strategy was built with) to the selection and Oort's own
    new state."""
    sel, new = _jitted_select(strategy)(state, jnp.asarray(available), key, jnp.int32(round_))
    return sel, new.inner


@pytest.mark.parametrize("preset", ["original", "fedscale"])
def test_exploit_explore_split(preset):
    kp = 10  # the picks (the engine's over-committed slots)
    strategy = make_strategy("oort", kp, preset=preset, round_threshold=100.0)
    for seed in range(4):
        state, explored = explored_state(strategy, seed, per_round=kp)
        available = np.random.default_rng(100 + seed).random(K) < 0.9
        sel, new = run_select(strategy, state, available, jax.random.key(seed))
        eps = max(
            0.5 * (0.95 if preset == "original" else 0.98), 0.2 if preset == "original" else 0.3
        )
        n_explored = int((explored & available).sum())
        n_unexplored = int((~explored & available).sum())
        want = int(kp * (1 - eps)) if preset == "original" else kp - int(kp * eps)
        exploit = np.asarray(new.last_exploit)
        explore = np.asarray(new.last_explore)
        assert exploit.sum() == min(want, n_explored)
        assert explore.sum() == min(n_unexplored, kp - exploit.sum())
        assert not (exploit & ~explored).any() and not (explore & explored).any()
        assert not ((exploit | explore) & ~available).any()
        clients = np.asarray(sel.clients)[np.asarray(sel.mask)]
        assert len(set(clients.tolist())) == len(clients) == min(kp, int(available.sum()))
        # unexplored clients take the device profile's duration as their known duration
        np.testing.assert_allclose(
            np.asarray(new.duration)[~explored], np.asarray(DURATIONS)[~explored]
        )


def test_no_duplicates_and_only_available_over_many_keys():
    strategy = make_strategy("oort", 6, preset="fedscale")
    state, _ = explored_state(strategy, 3)
    available = np.random.default_rng(0).random(K) < 0.6

    @jax.jit
    def picks(key):
        sel, _ = run_select(strategy, state, available, key)
        return sel.clients, sel.mask

    clients, mask = jax.vmap(picks)(jax.random.split(jax.random.key(0), 300))
    for c, m in zip(np.asarray(clients), np.asarray(mask), strict=True):
        chosen = c[m]
        assert len(set(chosen.tolist())) == len(chosen) == min(6, available.sum())
        assert available[chosen].all()


def test_single_exploit_draw_is_proportional_to_score():
    """K' = 1, nothing left to explore, eps = 0, cut-off 0: one draw with p ∝ score."""
    strategy = make_strategy(
        "oort",
        1,
        exploration_factor=0.0,
        exploration_min=0.0,
        cut_off_util=0.0,
        round_threshold=100.0,
    )
    state, _ = explored_state(strategy, 5, explored_fraction=1.1)
    state = state._replace(epsilon=jnp.float32(0.0))
    t = 10
    norm = ok.reward_norm(state.reward, jnp.ones(K, bool), 0.98)
    scores = np.asarray(ok.explored_scores(state.reward, state.time_stamp, t, norm, 1.0))
    p = scores / scores.sum()

    @jax.jit
    def first(key):
        return run_select(strategy, state, np.ones(K, bool), key)[0].clients[0]

    n = 20000
    freq = (
        np.bincount(
            np.asarray(jax.vmap(first)(jax.random.split(jax.random.key(1), n))), minlength=K
        )
        / n
    )
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9)


def test_update_bookkeeping_explored_unexplored():
    """Six picks; the engine keeps three (over-commitment) and reports every pick's duration:
    the kept ones report their utility, the others get the round's mean utility (Oort's rule
    for stragglers), and all six take their realized durations."""
    kp = 6
    strategy = make_strategy("oort", kp, samples_per_round=15)
    state = strategy.init(jax.random.key(0), spec(kp)).inner
    n = np.arange(10, 10 + K)
    np.testing.assert_allclose(state.reward, np.minimum(n, 15))  # the size prior |B_i|
    assert not np.asarray(state.count).any()
    sel, state = run_select(strategy, state, np.ones(K, bool), jax.random.key(2), round_=4)
    picks = np.asarray(sel.clients)
    kept_mask = np.array([True, False, True, False, True, False])
    clients, stragglers = picks[kept_mask], picks[~kept_mask]
    realized = np.linspace(5.0, 30.0, kp).astype(np.float32)
    sel = sel._replace(mask=jnp.asarray(kept_mask))
    loss_sq_slots = np.zeros(kp)
    loss_sq_slots[kept_mask] = [0.25, 1.0, 4.0]
    fb = RoundFeedback(
        round=jnp.int32(4),
        available=jnp.ones(K, bool),
        params={},
        new_params={},
        deltas={},
        train_loss=jnp.zeros(kp),
        initial_loss=jnp.zeros(kp),
        loss_sq=jnp.asarray(loss_sq_slots),
        update_norm=jnp.zeros(kp),
        num_examples=jnp.asarray(np.where(kept_mask, n[picks], 0)),
        num_steps=jnp.ones(kp),
        requested=jnp.ones(kp, bool),
        durations=jnp.asarray(realized),
    )
    new = strategy.update(state, sel, fb).inner
    utility = np.minimum(n[clients], 15) * np.sqrt([0.25, 1.0, 4.0])
    np.testing.assert_allclose(np.asarray(new.reward)[clients], utility, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new.reward)[stragglers], utility.mean(), rtol=1e-6)
    touched = np.zeros(K, bool)
    touched[clients] = touched[stragglers] = True
    assert np.asarray(new.count).tolist() == touched.astype(int).tolist()
    assert np.asarray(new.time_stamp).tolist() == np.where(touched, 5, 0).tolist()
    np.testing.assert_allclose(np.asarray(new.duration)[picks], realized)
    np.testing.assert_allclose(np.asarray(new.reward)[~touched], np.minimum(n, 15)[~touched])
    # the pacer history gets the mean reward of last round's exploitation picks (none yet)
    assert float(new.exploit_history[-1]) == 0.0


def test_pacer_inside_strategy_and_warmup():
    strategy = make_strategy("oort", 4, pacer_step=5, pacer_delta=5, round_threshold=30)
    state, _ = explored_state(strategy, 1)
    flat = state._replace(exploit_history=jnp.full((10,), 7.0))
    sharp = state._replace(exploit_history=jnp.array([1.0] * 5 + [10.0] * 5))
    key = jax.random.key(0)
    assert float(run_select(strategy, flat, np.ones(K, bool), key, 9)[1].round_threshold) == 35
    assert float(run_select(strategy, sharp, np.ones(K, bool), key, 9)[1].round_threshold) == 25
    assert float(run_select(strategy, flat, np.ones(K, bool), key, 10)[1].round_threshold) == 30
    # the warm-up round is uniform and leaves eps and T alone
    _, warm = run_select(strategy, flat, np.ones(K, bool), key, 0)
    assert float(warm.epsilon) == 0.5 and not np.asarray(warm.last_exploit).any()


@pytest.mark.parametrize("preset", ["original", "fedscale"])
def test_exploration_factor_decay_floor_and_reset(preset):
    decay, floor = (0.95, 0.2) if preset == "original" else (0.98, 0.3)
    strategy = make_strategy("oort", 4, preset=preset)
    avail = np.ones(K, bool)
    key = jax.random.key(0)
    state, _ = explored_state(strategy, 2, explored_fraction=0.5)
    _, new = run_select(strategy, state._replace(epsilon=jnp.float32(0.9)), avail, key)
    assert float(new.epsilon) == pytest.approx(0.9 * decay)  # decayed before use
    _, new = run_select(strategy, state._replace(epsilon=jnp.float32(floor)), avail, key)
    assert float(new.epsilon) == pytest.approx(floor)  # ... down to the floor
    # everybody explored: the original resets eps = eps_min = 0, FedScale keeps decaying
    state, _ = explored_state(strategy, 2, explored_fraction=1.1)
    _, new = run_select(strategy, state._replace(epsilon=jnp.float32(0.9)), avail, key)
    if preset == "original":
        assert float(new.epsilon) == 0.0 and float(new.epsilon_min) == 0.0
    else:
        assert float(new.epsilon) == pytest.approx(0.9 * decay)
        assert float(new.epsilon_min) == pytest.approx(floor)


def test_oort_saves_simulated_time_against_uniform():
    """Planted heterogeneity in device speed (the engine's shared log-normal profile, wide
    spread): Oort's rounds (over-committed, durations penalised above the pacer's percentile)
    take less simulated time than uniform picks under the same profiles; the clock is the sum
    of the rounds' durations, each the slowest kept client's."""
    from fedjax_sel.engine.system import lognormal

    ds = load_dataset("digits", num_clients=24, partition="dirichlet:0.5", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    local = LocalConfig(batch_size=16, local_steps=2)
    times = {}
    for name in ("oort", "uniform"):
        spec = RoundSpec.create(
            ds,
            model,
            make_strategy(name, 5),
            local=local,
            per_round=4,
            system=lognormal(sigma=1.2),
            overcommit=1.3,
        )
        sim = Simulation(spec, ds, num_rounds=30, chunk_size=30)
        state, logs = sim.run_rounds(sim.init(seed=0, hparams=HParams.of(0.1)), 30)
        times[name] = float(state.sim_time)
        assert times[name] == pytest.approx(float(np.sum(logs.duration)), rel=1e-5)
        assert np.all(logs.num_selected == 4)  # 5 picks, the first 4 finishers kept
    assert times["oort"] < 0.8 * times["uniform"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(preset="fast"), "preset"),
        (dict(exploration_factor=1.5), "exploration_factor"),
        (dict(exploit_rule="mine"), "exploit_rule"),
        (dict(zero_exploration="maybe"), "zero_exploration"),
        (dict(weighting="median"), "weighting"),
    ],
)
def test_bad_configuration_is_a_clear_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make_strategy("oort", 4, **kwargs)


def test_cli_style_string_arguments_are_coerced():
    strategy = make_strategy("oort", 4, preset="fedscale", cut_off_util="0.5", pacer_step="7")
    state = strategy.init(jax.random.key(0), spec())
    assert state.inner.exploit_history.shape == (14,)


def np_oort_explored_scores(
    reward, time_stamp, duration, feasible, t, clip_bound, threshold, round_penalty
):
    """Oort's ``getTopK`` score of every explored client, transcribed from the reference code
    (``get_norm`` over the positive rewards of feasible clients, the UCB staleness bonus, the
    duration penalty beyond the preferred duration ``D*``)."""
    moving = sorted(r for r, f in zip(reward, feasible, strict=True) if f and r > 0)
    clip_value = moving[min(int(len(moving) * clip_bound), len(moving) - 1)]
    max_r, min_r = moving[-1], moving[0] * 0.999
    range_r = max(max_r - min_r, 1e-4)
    ordered = sorted(duration)
    d_pref = ordered[min(int(len(duration) * threshold / 100.0), len(duration) - 1)]
    out = []
    for r, ts, d in zip(reward, time_stamp, duration, strict=True):
        sc = (min(r, clip_value) - min_r) / range_r + math.sqrt(0.1 * math.log(t) / ts)
        if d > d_pref:
            sc *= (d_pref / max(1e-4, d)) ** round_penalty
        out.append(sc)
    return np.array(out)


def test_explored_scores_match_the_reference_transcription():
    rng = np.random.default_rng(4)
    k, t = 30, 17
    reward = rng.lognormal(1.0, 1.0, k)
    reward[[3, 8]] = 0.0  # clients without a positive reward stay out of the norm
    time_stamp = rng.integers(1, t, k)
    duration = rng.lognormal(3.0, 0.8, k)
    feasible = rng.random(k) > 0.2
    for clip_bound, threshold, penalty in ((0.95, 30.0, 2.0), (0.98, 10.0, 1.0)):
        norm = ok.reward_norm(jnp.asarray(reward, jnp.float32), jnp.asarray(feasible), clip_bound)
        d_pref = ok.preferred_duration(jnp.asarray(duration, jnp.float32), jnp.float32(threshold))
        pen = ok.duration_penalty(jnp.asarray(duration, jnp.float32), d_pref, penalty)
        got = ok.explored_scores(
            jnp.asarray(reward, jnp.float32), jnp.asarray(time_stamp), t, norm, pen
        )
        want = np_oort_explored_scores(
            reward, time_stamp, duration, feasible, t, clip_bound, threshold, penalty
        )
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-6)
