"""HeteRo-Select: every score component against a NumPy transcription of its equation
(``papers/hetero_select.txt`` eqs. 1-12), the selection law, Theorem III.3's exploration bound,
the metadata bookkeeping, and planted selections."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ClientOracle, ConfigError, RoundFeedback, RoundInputs, SimSpec
from fedjax_sel.data import load_dataset
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.oracle import client_oracle
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.kernels import hetero_select as hs
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.hetero_select import HeteroSelectState, compute_components
from fedjax_sel.training import HParams, LocalConfig

K, C = 16, 10


# ----------------------------------------------------------------------------- NumPy references
def np_js(p, q, base=2.0):
    """JS divergence, one pair of distributions, with explicit sums (0 log 0 = 0)."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]
    kl_p = sum(a * math.log(a / c) for a, c in zip(p, m, strict=True) if a > 0)
    kl_q = sum(b * math.log(b / c) for b, c in zip(q, m, strict=True) if b > 0)
    return (0.5 * kl_p + 0.5 * kl_q) / math.log(base)


def np_components(case, t=None, cfg=None):
    """Eqs. 3-11 client by client (oracle mode) for a :func:`random_case`."""
    cfg = cfg or CFG
    t = case["t"] if t is None else t
    loss_now, loss_prev, seen = case["loss_now"], case["loss_prev"], case["seen"]
    counts, h, last, avail = case["counts"], case["h"], case["last"], case["avail"]
    norm_sq, known = case["norm_sq"], case["known"]
    eta, gamma, alpha = cfg["eta"], cfg["gamma"], cfg["alpha"]
    av = [i for i in range(K) if avail[i]]
    lo, hi = min(loss_now[i] for i in av), max(loss_now[i] for i in av)
    dist = [c / c.sum() for c in counts]
    p_avg = sum(dist) / K
    h_max = max(h)
    known_ids = [j for j in range(K) if known[j]]
    avg_norm = sum(norm_sq[j] for j in known_ids) / len(known_ids) if known_ids else 0.0
    out = {n: np.zeros(K) for n in ("V", "D", "M", "F", "St", "N")}
    for k in range(K):
        out["V"][k] = (loss_now[k] - lo) / (hi - lo + 1e-8) if avail[k] else 0.0
        out["D"][k] = np_js(dist[k], p_avg) * (2 * (1 - 0.5 * min(t / 100, 1)))
        m = (loss_prev[k] - loss_now[k]) / loss_prev[k] if seen[k] else 0.0
        out["M"][k] = 2 / (1 + math.exp(-5 * m)) - 0.5
        out["F"][k] = (1 + eta * (h[k] / h_max if h_max > 0 else 0.0)) ** -2
        out["St"][k] = 1 + gamma * math.log(1 + min(t - last[k], 20))
        r = norm_sq[k] / avg_norm if known[k] else 0.0
        out["N"][k] = 1 - alpha * (2 / (1 + math.exp(-3 * r)) - 1)
    return out


def np_additive(c, w):
    return (
        w[0] * c["V"]
        + w[1] * c["D"]
        + w[2] * c["M"]
        + w[3] * (c["F"] - 1)
        + w[4] * (c["St"] - 1)
        + w[5] * (c["N"] - 1)
    )


def np_softmax(scores, tau, avail):
    z = np.where(avail, scores / tau, -np.inf)
    e = np.exp(z - z[avail].max())
    return e / e.sum()


# ----------------------------------------------------------------------------- fixtures
def random_case(seed, t=7):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 30, (K, C)).astype(np.float64)
    counts[:, 0] += 1  # every client holds data
    case = dict(
        counts=counts,
        loss_now=rng.uniform(0.2, 3.0, K),
        loss_prev=rng.uniform(0.2, 3.0, K),
        seen=rng.random(K) < 0.8,
        h=rng.integers(0, 9, K),
        last=rng.integers(0, t, K),
        norm_sq=rng.uniform(0.0, 5.0, K),
        known=rng.random(K) < 0.7,
        avail=rng.random(K) < 0.75,
        t=t,
    )
    case["avail"][:3] = True
    return case


def state_of(case):
    return HeteroSelectState(
        divergence=hs.client_divergences(jnp.asarray(case["counts"])),
        loss_last=jnp.asarray(case["loss_prev"], jnp.float32),
        loss_before=jnp.zeros((K,), jnp.float32),
        loss_seen=jnp.asarray(case["seen"], jnp.int32),
        participations=jnp.asarray(case["h"], jnp.int32),
        last_round=jnp.asarray(case["last"], jnp.int32),
        norm_sq=jnp.asarray(case["norm_sq"], jnp.float32),
        norm_known=jnp.asarray(case["known"]),
    )


def jax_components(case, t):
    """The module's components for a :func:`random_case` (oracle mode)."""
    return compute_components(
        state_of(case),
        jnp.int32(t),
        jnp.asarray(case["avail"]),
        jnp.asarray(case["loss_now"], jnp.float32),
        **CFG,
    )


def fake_oracle(losses):
    def unused(*a, **k):
        raise AssertionError("hetero_select must only call all_losses")

    return ClientOracle(
        loss=unused,
        batch_loss=unused,
        all_losses=lambda params: jnp.asarray(losses, jnp.float32),
        train=unused,
        train_key=jax.random.key(0),
    )


def spec_of(case, per_round=4):
    return SimSpec(
        num_clients=K,
        per_round=per_round,
        num_rounds=50,
        num_examples=jnp.asarray(case["counts"].sum(1), jnp.int32),
        params={"w": jnp.zeros((2,))},
        num_classes=C,
        label_counts=jnp.asarray(case["counts"], jnp.float32),
    )


CFG = dict(eta=0.3, gamma=0.7, alpha=0.5)


# ----------------------------------------------------------------------------- components
@pytest.mark.parametrize("seed", range(4))
def test_components_match_numpy_equations(seed):
    case = random_case(seed)
    ref = np_components(case)
    got = jax_components(case, case["t"])
    for name, field in zip(("V", "D", "M", "F", "St", "N"), got, strict=True):
        np.testing.assert_allclose(np.asarray(field), ref[name], rtol=2e-5, atol=2e-6, err_msg=name)


def test_component_ranges_and_limits():
    # eq. 4's weight goes 2 -> 1 over 100 rounds; JS in bits lies in [0, 1] (disjoint supports: 1)
    assert float(hs.diversity(jnp.float32(1.0), 0)) == pytest.approx(2.0)
    assert float(hs.diversity(jnp.float32(1.0), 50)) == pytest.approx(1.5)
    assert float(hs.diversity(jnp.float32(1.0), 400)) == pytest.approx(1.0)
    assert float(hs.js_divergence(jnp.array([1.0, 0]), jnp.array([0, 1.0]))) == pytest.approx(1.0)
    assert float(hs.js_divergence(jnp.array([0.3, 0.7]), jnp.array([0.3, 0.7]))) == 0.0
    # momentum (eq. 5) maps into (-0.5, 1.5); no change -> 0.5
    m = hs.momentum(jnp.array([1.0, 1.0, 1.0]), jnp.array([1.0, 0.0, 50.0]), jnp.ones(3, bool))
    np.testing.assert_allclose(
        m, [0.5, 2 / (1 + math.exp(-5)) - 0.5, 2 / (1 + math.exp(245)) - 0.5]
    )
    # staleness is capped at 20 rounds (eq. 7)
    st = hs.staleness_factor(100, jnp.array([99, 80, 79, 0]), 0.7)
    np.testing.assert_allclose(st, 1 + 0.7 * np.log1p([1, 20, 20, 20]), rtol=1e-6)
    # norm factor lies in (1 - alpha, 1]; fairness in [(1 + eta)^-2, 1]
    n = hs.norm_factor(jnp.array([0.0, 1.0, 1e6]), jnp.ones(3, bool), 0.4)
    assert float(n[0]) > float(n[1]) > float(n[2]) >= 0.6 - 1e-6
    f = hs.fairness_factor(jnp.array([0, 5, 10]), 0.3)
    np.testing.assert_allclose(f, [1.0, 1.15**-2, 1.3**-2], rtol=1e-6)
    # temperature (section III-B5)
    assert float(hs.temperature(0, 2.0)) == pytest.approx(2.0)
    assert float(hs.temperature(100, 2.0)) == pytest.approx(1.0)


def test_js_distance_option_is_sqrt_of_natural_log_divergence():
    rng = np.random.default_rng(3)
    counts = rng.integers(1, 20, (6, 4)).astype(np.float64)
    dist = counts / counts.sum(1, keepdims=True)
    p_avg = dist.mean(0)
    want = [math.sqrt(np_js(d, p_avg, base=math.e)) for d in dist]
    got = hs.client_divergences(jnp.asarray(counts), "js_distance")
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_additive_and_multiplicative_scores(seed):
    rng = np.random.default_rng(seed)
    c = hs.ScoreComponents(*(jnp.asarray(rng.uniform(0.1, 1.5, K), jnp.float32) for _ in range(6)))
    w = hs.ComponentWeights(*rng.uniform(0, 2, 6))
    ref = {
        n: np.asarray(x, np.float64)
        for n, x in zip(("V", "D", "M", "F", "St", "N"), c, strict=True)
    }
    np.testing.assert_allclose(hs.additive_score(c, w), np_additive(ref, w), rtol=1e-5)
    prod = ref["V"] * ref["D"] * ref["M"] * ref["F"] * ref["St"] * ref["N"]
    np.testing.assert_allclose(hs.multiplicative_score(c, hs.ComponentWeights()), prod, rtol=1e-5)
    no_div = hs.ComponentWeights(diversity=0.0)
    np.testing.assert_allclose(hs.multiplicative_score(c, no_div), prod / ref["D"], rtol=1e-5)


# ----------------------------------------------------------------------------- the strategy
@pytest.mark.parametrize("scoring", ["additive", "multiplicative"])
def test_select_probabilities_match_numpy_pipeline(scoring):
    case = random_case(11, t=31)
    strategy = make_strategy("hetero_select", 4, scoring=scoring, w_d=1.0, tau0=1.5, **CFG)
    state = strategy.init(jax.random.key(0), spec_of(case))
    state = state._replace(inner=state_of(case)._replace(divergence=state.inner.divergence))
    inputs = RoundInputs(jnp.int32(30), jnp.asarray(case["avail"]), {}, jnp.ones(K, jnp.int32))
    sel, new_state = strategy.select(
        state, inputs, fake_oracle(case["loss_now"]), jax.random.key(1)
    )
    ref = np_components(case, 31)
    if scoring == "additive":
        scores = np_additive(ref, [1.0] * 6)
    else:
        scores = ref["V"] * ref["D"] * ref["M"] * ref["F"] * ref["St"] * ref["N"]
    tau = 1.5 * (1 - 0.5 * min(31 / 100, 1))
    law = sel.diagnostics["law"]
    np.testing.assert_allclose(law, np_softmax(scores, tau, case["avail"]), atol=1e-6)
    assert float(sel.diagnostics["temperature"]) == pytest.approx(tau)
    avail = case["avail"]
    for name, key in (("V", "value"), ("F", "fairness"), ("St", "staleness"), ("N", "norm")):
        want = float(np.mean(np.asarray(ref[name])[avail]))
        assert float(sel.diagnostics[f"mean_{key}"]) == pytest.approx(want, rel=1e-5, abs=1e-6)
    chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
    assert len(set(chosen.tolist())) == 4 and case["avail"][chosen].all()
    np.testing.assert_allclose(sel.weights, 0.25)
    # the oracle's losses become the history: L(w_{t-1}) for available clients only
    np.testing.assert_allclose(
        new_state.inner.loss_last,
        np.where(case["avail"], case["loss_now"], case["loss_prev"]),
        rtol=1e-6,
    )


def test_first_draw_frequencies_follow_eq12():
    """The first slot is a draw from softmax(S / tau): empirical frequencies over many keys."""
    case = random_case(5, t=3)
    strategy = make_strategy("hetero_select", 3, tau0=0.5)
    state = state_of(case)
    inputs = RoundInputs(jnp.int32(2), jnp.asarray(case["avail"]), {}, jnp.ones(K, jnp.int32))
    oracle = fake_oracle(case["loss_now"])

    @jax.jit
    def first(key):
        sel, _ = strategy.select(state, inputs, oracle, key)
        return sel.clients[0], sel.diagnostics["law"]

    n = 20000
    firsts, probs = jax.vmap(first)(jax.random.split(jax.random.key(7), n))
    p = np.asarray(probs[0])
    freq = np.bincount(np.asarray(firsts), minlength=K) / n
    assert freq[~case["avail"]].sum() == 0
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9)


def test_update_bookkeeping_and_last_loss_source():
    case = random_case(2)
    strategy = make_strategy("hetero_select", 3, loss_source="last")
    state = strategy.init(jax.random.key(0), spec_of(case, 3))
    sel_clients = jnp.array([4, 9, 1], jnp.int32)
    mask = jnp.array([True, True, False])
    fb = RoundFeedback(
        round=jnp.int32(5),
        available=jnp.ones(K, bool),
        params={},
        new_params={},
        deltas={},
        train_loss=jnp.array([0.5, 0.6, 0.7]),
        initial_loss=jnp.array([1.5, 2.5, 3.5]),
        loss_sq=jnp.zeros(3),
        update_norm=jnp.array([2.0, 3.0, 4.0]),
        num_examples=jnp.array([10, 10, 0]),
        num_steps=jnp.array([5, 5, 0]),
    )
    from fedjax_sel.base import Selection

    st = strategy.update(state, Selection(sel_clients, mask, jnp.ones(3) / 2), fb).inner
    assert st.participations.tolist() == [1 if i in (4, 9) else 0 for i in range(K)]
    assert st.last_round.tolist() == [6 if i in (4, 9) else 0 for i in range(K)]
    np.testing.assert_allclose(st.norm_sq[jnp.array([4, 9])], [4.0, 9.0])
    assert st.norm_known.tolist() == [i in (4, 9) for i in range(K)]
    np.testing.assert_allclose(st.loss_last[jnp.array([4, 9])], [1.5, 2.5])  # initial_loss
    assert st.loss_seen.tolist() == [1 if i in (4, 9) else 0 for i in range(K)]
    # unseen clients get V' = 1; momentum is neutral until two losses are known
    comps = compute_components(st, jnp.int32(7), jnp.ones(K, bool), None, **CFG)
    v = np.asarray(comps.value)
    assert np.all(v[[i for i in range(K) if i not in (4, 9)]] == 1.0)
    assert v[4] == 0.0 and v[9] == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(comps.momentum, 0.5)


# ----------------------------------------------------------------------------- Theorem III.3
@pytest.mark.parametrize("seed", range(5))
def test_exploration_bound_holds(seed):
    """p_k(t) >= eps_k(t) of eq. 20 for every available client, with S_min/S_max the analytic
    bounds of the non-staleness score (Assumption A6)."""
    case = random_case(seed, t=int(np.random.default_rng(seed).integers(1, 150)))
    t, avail = case["t"], case["avail"]
    case["last"] = np.minimum(case["last"], t - 1)
    comps = jax_components(case, t)
    w = hs.ComponentWeights()
    scores = hs.additive_score(comps, w)
    tau = float(hs.temperature(t, 2.0))
    p = np.asarray(hs.selection_probabilities(scores, tau, jnp.asarray(avail)))
    s_min, s_max = hs.score_bounds(w, eta=CFG["eta"], alpha=CFG["alpha"], t=t)
    base = np.asarray(scores) - CFG["gamma"] * np.log1p(np.minimum(t - case["last"], 20))
    assert np.all(base[avail] >= s_min - 1e-5) and np.all(base[avail] <= s_max + 1e-5)
    bound = hs.exploration_bound(
        s_min, s_max, CFG["gamma"], t - case["last"], tau, int(avail.sum()) - 1
    )
    assert np.all(p[avail] >= np.asarray(bound)[avail] * (1 - 1e-5))
    assert np.all(np.asarray(bound) > 0)


def test_exploration_bound_and_probability_grow_with_staleness():
    stale = jnp.arange(1, 40)
    bound = np.asarray(hs.exploration_bound(-2.0, 4.0, 0.7, stale, 1.0, 9))
    assert np.all(np.diff(bound[:20]) > 0)  # strictly increasing up to the cap ...
    assert np.all(bound[19:] == bound[19])  # ... and flat beyond it (the score is capped too)

    # the strategy's own probability of a client, everything else fixed, rises with staleness
    case = random_case(4, t=60)
    case["avail"][:] = True
    probs = []
    for last in range(59, 20, -1):  # staleness 1 .. 39
        case["last"][0] = last
        comps = jax_components(case, 60)
        s = hs.additive_score(comps, hs.ComponentWeights())
        probs.append(float(hs.selection_probabilities(s, 1.4, jnp.ones(K, bool))[0]))
    probs = np.array(probs)
    assert np.all(np.diff(probs[:20]) > 0) and np.allclose(probs[19:], probs[19])


def np_eq20(s_min, s_max, gamma, staleness, tau, others, cap=20):
    """Theorem III.3's bound as written in eq. 20 (appendix A-B), transcribed independently."""
    a = (s_min + gamma * np.log(1 + min(staleness, cap))) / tau
    b = (s_max + gamma * np.log(1 + cap)) / tau
    return np.exp(a) / (np.exp(a) + others * np.exp(b))


def test_first_draw_probability_respects_theorem_iii3_where_it_bites():
    """A setting where eq. 20's bound is far from 0 and nearly tight: 4 available clients, a
    warm temperature, every client 20 rounds stale, client 0 at the bottom of every other
    component (lowest loss, loss rising, most participations, largest update, average labels)
    and the others at the top. The empirical first-draw frequency of client 0 stays above the
    bound, with a slack that is a small fraction of it. The components' ranges S_min and S_max
    are written out here from eqs. 3-11 (not taken from the module)."""
    k, t, tau0, eta, alpha, gamma = 4, 21, 10.0, 0.3, 0.5, 0.7
    counts = np.array([[10, 10, 10, 10], [40, 0, 0, 0], [0, 40, 0, 0], [0, 0, 40, 0]])
    state = HeteroSelectState(
        divergence=hs.client_divergences(jnp.asarray(counts, jnp.float32)),
        loss_last=jnp.asarray([0.1, 3.0, 3.0, 3.0], jnp.float32),
        loss_before=jnp.asarray([0.01, 30.0, 30.0, 30.0], jnp.float32),
        loss_seen=jnp.full((k,), 2, jnp.int32),
        participations=jnp.asarray([20, 0, 0, 0], jnp.int32),
        last_round=jnp.zeros((k,), jnp.int32),  # all 20 rounds stale at t = 21
        norm_sq=jnp.asarray([50.0, 0.01, 0.01, 0.01], jnp.float32),
        norm_known=jnp.ones((k,), bool),
    )
    strategy = make_strategy("hetero_select", 1, tau0=tau0, eta=eta, alpha=alpha, gamma=gamma)
    inputs = RoundInputs(jnp.int32(t - 1), jnp.ones(k, bool), {}, jnp.ones(k, jnp.int32))
    oracle = fake_oracle([0.1, 3.0, 3.0, 3.0])

    @jax.jit
    def first(key):
        sel, _ = strategy.select(state, inputs, oracle, key)
        return sel.clients[0]

    n = 20000
    freq = float(np.mean(np.asarray(jax.vmap(first)(jax.random.split(jax.random.key(3), n))) == 0))
    # eqs. 3-11 ranges with unit weights: V' in [0, 1], D in [0, 2 (1 - 0.5 min(t/100, 1))],
    # M in [-0.5, 1.5], F - 1 in [(1 + eta)^-2 - 1, 0], N - 1 in [-alpha, 0]
    s_min = -0.5 + ((1 + eta) ** -2 - 1) - alpha
    s_max = 1.0 + 2 * (1 - 0.5 * min(t / 100, 1)) + 1.5
    tau = tau0 * (1 - 0.5 * min(t / 100, 1))
    bound = np_eq20(s_min, s_max, gamma, staleness=t, tau=tau, others=k - 1)
    assert bound > 0.1  # the theorem says something here
    slack = 4 * np.sqrt(bound * (1 - bound) / n)
    assert slack < 0.1 * bound
    assert bound - slack <= freq < bound + 0.08  # above the bound, and the bound is nearly tight
    # the module's bound is the same formula
    got = float(hs.exploration_bound(s_min, s_max, gamma, t, tau, k - 1))
    assert got == pytest.approx(bound, rel=1e-5)


# ----------------------------------------------------------------------------- planted and runs
@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=12, partition="dirichlet:0.3", seed=0)


def _sim(ds, strategy, per_round=4, rounds=6):
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    local = LocalConfig(batch_size=16, local_steps=3, prox=True)
    spec = RoundSpec.create(ds, model, strategy, local=local, per_round=per_round)
    return Simulation(spec, ds, num_rounds=rounds, chunk_size=rounds)


def _hparams():
    return HParams.of(0.1, prox_mu=0.1)


def test_value_only_with_cold_temperature_is_top_loss(digits):
    """Planted: with only V' (eq. 3) weighted and tau0 -> 0 the draw is the top-m losses of
    the current global model (computed independently with the oracle)."""
    strategy = make_strategy(
        "hetero_select", 4, w_v=1, w_d=0, w_m=0, w_f=0, w_st=0, w_n=0, tau0=1e-4
    )
    sim = _sim(digits, strategy)
    state = sim.init(seed=1, hparams=_hparams())
    for _ in range(3):
        losses = np.asarray(client_oracle(sim.spec, sim.data, _hparams()).all_losses(state.params))
        new_state, logs = sim.run_rounds(state, 1)
        assert set(logs.clients[0].tolist()) == set(np.argsort(-losses)[:4].tolist())
        state = new_state


def test_run_is_deterministic_and_counts_add_up(digits):
    runs = []
    for _ in range(2):
        sim = _sim(digits, make_strategy("hetero_select", 4, scoring="multiplicative"))
        state, logs = sim.run_rounds(sim.init(seed=3, hparams=_hparams()), 6)
        runs.append((np.asarray(logs.clients), jax.tree.map(np.asarray, state.params)))
        st = state.strategy_state.inner
        np.testing.assert_array_equal(st.participations, state.selection_counts)
        assert int(st.participations.sum()) == 6 * 4
        assert np.isfinite(sim.evaluate(state)["test_loss"])
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    jax.tree.map(np.testing.assert_array_equal, runs[0][1], runs[1][1])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scoring="sum"), "scoring"),
        (dict(scoring="multiplicative", w_v=0.5), "multiplicative"),
        (dict(alpha=1.5), "alpha"),
        (dict(tau0=0.0), "tau0"),
        (dict(loss_source="cached"), "loss_source"),
        (dict(eta=-1.0), "eta"),
        (dict(w_m=float("nan")), "w_m"),
    ],
)
def test_bad_configuration_is_a_clear_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        make_strategy("hetero_select", 4, **kwargs)


def test_regression_data_needs_w_d_zero():
    spec = SimSpec(8, 2, 5, jnp.ones(8, jnp.int32), {}, None, None)
    with pytest.raises(ConfigError, match="w_d=0"):
        make_strategy("hetero_select", 2).init(jax.random.key(0), spec)
    state = make_strategy("hetero_select", 2, w_d=0).init(jax.random.key(0), spec)
    assert np.all(np.asarray(state.inner.divergence) == 0)
