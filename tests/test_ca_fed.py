"""CA-Fed's get() against a brute-force NumPy Algorithm 1, its strategy (loss filter,
exclusions of correlated rarely-available clients, reduction to Unbiased) and the baselines
Unbiased, AdaFed, More-available and F3AST against NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import bernoulli
from fedjax_sel.availability import estimators as est
from fedjax_sel.availability.markov_population import (
    LESS_CORRELATED,
    ca_fed_population,
    markov_population,
    population_classes,
)
from fedjax_sel.base import AvailabilityParams, ClientOracle, ConfigError, RoundInputs, SimSpec
from fedjax_sel.kernels.ca_fed import (
    ca_fed_exclusions,
    ca_fed_get,
    ca_fed_objective,
    descending_order,
)
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.ca_fed import update_loss_estimates

# ----------------------------------------------------------------------------- references


def dense_error(q, alpha, gap, gamma, pi, kappa2):
    """eps_hat of eq. 20 from the vectors: p = pi * q normalised, TV distance."""
    p = pi * q / np.sum(pi * q)
    tv = 0.5 * np.abs(alpha - p).sum()
    return float(gap @ p + 4 * kappa2 * tv**2 * gamma)


def dense_get(q, alpha, gap, gamma, pi, rho, kappa2, tau):
    """Algorithm 1's get() (lines 13-22) literally, O(K^2): Python's stable sort by descending
    rho; stop before excluding the last client (the reference code's ``sum == 0`` break)."""
    order = sorted(range(len(q)), key=lambda k: rho[k], reverse=True)
    q = q.copy()
    eps = dense_error(q, alpha, gap, gamma, pi, kappa2)
    margin = np.inf  # closest call |eps - eps+ - tau| among the tried exclusions
    for k in order:
        q_plus = q.copy()
        q_plus[k] = 0.0
        if q_plus.sum() == 0:
            break
        eps_plus = dense_error(q_plus, alpha, gap, gamma, pi, kappa2)
        if q[k] > 0:
            margin = min(margin, abs(eps - eps_plus - tau))
        if eps - eps_plus >= tau:
            eps, q = eps_plus, q_plus
    return q, margin


def dense_two_passes(alpha, gap, pi, lam, kappa2, tau, lambda_order="signed"):
    gamma = gap.max()
    rho = np.abs(lam) if lambda_order == "abs" else lam
    q, m1 = dense_get(alpha / pi, alpha, gap, gamma, pi, rho, kappa2, tau)
    q, m2 = dense_get(q, alpha, gap, gamma, pi, -pi, kappa2, tau)
    return q > 0, min(m1, m2)


def random_case(rng, trial):
    k = int(rng.integers(1, 40))
    alpha = rng.dirichlet(np.ones(k)) if trial % 2 else np.full(k, 1.0 / k)
    if trial % 3 == 0:  # the paper's discrete parameters: many ties in both orders
        pi = rng.choice([0.1, 0.9], k)
        lam = rng.choice([0.0, 0.9], k)
    else:
        pi = rng.uniform(0.05, 1.0, k)
        lam = rng.uniform(-0.1, 0.95, k)
    gap = rng.uniform(0, 1, k) * (rng.random(k) < 0.8)  # some zero gaps
    if trial % 7 == 0:
        gap[:] = 0.0  # a flat proxy: every exclusion ties
    kappa2 = [0.01, 0.1, 1.0, 10.0, 100.0][trial % 5]
    tau = [0.0, 0.0, 1e-3, 1e-2][trial % 4]
    return alpha, gap, pi, lam, kappa2, tau


# ----------------------------------------------------------------------------- get()


PAD = 40  # every random case is padded to this size, so the jitted kernel compiles once


def padded_exclusions(alpha, gap, pi, lam, kappa2, tau, order="signed", dtype=jnp.float32):
    """ca_fed_exclusions on a case padded with ineligible clients of zero importance."""
    k = len(alpha)

    def pad(x, fill):
        return jnp.asarray(np.concatenate([x, np.full(PAD - k, fill)]), dtype)

    eligible = jnp.asarray(np.arange(PAD) < k)
    kept, gamma = ca_fed_exclusions(
        pad(alpha, 0.0),
        pad(gap, 0.0),
        pad(pi, 0.5),
        pad(lam, 0.0),
        kappa2=kappa2,
        tau=tau,
        lambda_order=order,
        eligible=eligible,
    )
    kept = np.asarray(kept)
    assert not kept[k:].any(), "a padded client was kept"
    return kept[:k], gamma


def test_get_equals_brute_force_algorithm_1_in_float64():
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for trial in range(150):
            alpha, gap, pi, lam, kappa2, tau = random_case(rng, trial)
            order = "abs" if trial % 5 == 4 else "signed"
            want, _ = dense_two_passes(alpha, gap, pi, lam, kappa2, tau, order)
            got, gamma = padded_exclusions(alpha, gap, pi, lam, kappa2, tau, order, jnp.float64)
            np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
            assert float(gamma) == gap.max()


def test_get_in_float32_agrees_wherever_the_decisions_are_not_near_ties():
    rng = np.random.default_rng(1)
    compared = 0
    for trial in range(200):
        alpha, gap, pi, lam, kappa2, tau = random_case(rng, trial)
        want, margin = dense_two_passes(alpha, gap, pi, lam, kappa2, tau)
        if 0 < margin < 1e-4:  # float32 rounding may flip a decision this close
            continue
        got, _ = padded_exclusions(alpha, gap, pi, lam, kappa2, tau)
        np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}")
        compared += 1
    assert compared >= 150


def test_descending_order_is_a_stable_descending_argsort():
    rng = np.random.default_rng(4)
    special = [-1.5, -0.0, 0.0, 0.3, np.inf, -np.inf, 2.0]
    x = np.concatenate([rng.choice(special, 60), rng.normal(size=60)]).astype(np.float32)
    # Python's stable sort by descending value, -0.0 == 0.0, ties by id
    want = sorted(range(len(x)), key=lambda k: -float(x[k]))
    np.testing.assert_array_equal(np.asarray(descending_order(jnp.asarray(x))), want)


def test_unrolled_scan_gives_the_same_exclusions():
    rng = np.random.default_rng(6)
    alpha, gap, pi, lam, kappa2, tau = random_case(rng, 1)
    args = [jnp.asarray(a, jnp.float32) for a in (alpha, gap, pi, lam)]
    plain, _ = ca_fed_exclusions(*args, kappa2=kappa2, tau=tau, unroll=1)
    for unroll in (8, 32, None):  # None: the backend's default (32 on a GPU)
        unrolled, _ = ca_fed_exclusions(*args, kappa2=kappa2, tau=tau, unroll=unroll)
        np.testing.assert_array_equal(np.asarray(plain), np.asarray(unrolled))


def test_single_pass_with_ties_and_a_partial_kept_set():
    alpha = np.full(6, 1 / 6)
    gap = np.array([0.9, 0.1, 0.9, 0.5, 0.9, 0.2])
    rho = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])  # ties: visited in id order within a key
    kept = np.array([True, True, True, True, False, True])
    pi = np.full(6, 0.5)
    q0 = np.where(kept, alpha / pi, 0.0)
    want, _ = dense_get(q0, alpha, gap, gap.max(), pi, rho, 0.05, 0.0)
    got = ca_fed_get(*map(jnp.asarray, (alpha, gap, gap.max(), rho, kept)), kappa2=0.05)
    np.testing.assert_array_equal(np.asarray(got), want > 0)
    assert not got[4], "an excluded client stays excluded"


def test_flat_proxy_never_excludes_everybody():
    # every g = 0: eps_hat is 0 for every allocation and line 19 (0 >= 0) accepts each
    # exclusion until one client is left: the last one in the lambda order
    lam = jnp.array([0.5, 0.9, -0.2, 0.1])
    kept, gamma = ca_fed_exclusions(jnp.full(4, 0.25), jnp.zeros(4), jnp.full(4, 0.5), lam)
    np.testing.assert_array_equal(np.asarray(kept), [False, False, True, False])
    assert float(gamma) == 0.0


def test_closed_form_objective_equals_eq_20_on_random_kept_sets():
    rng = np.random.default_rng(2)
    for _ in range(50):
        k = int(rng.integers(2, 30))
        alpha, pi, gap = rng.dirichlet(np.ones(k)), rng.uniform(0.05, 1, k), rng.uniform(0, 2, k)
        kept = rng.random(k) < 0.6
        kept[rng.integers(k)] = True
        q = np.where(kept, alpha / pi, 0.0)
        want = dense_error(q, alpha, gap, gap.max(), pi, 0.7)
        got = ca_fed_objective(*map(jnp.asarray, (alpha, gap, gap.max(), kept)), 0.7)
        np.testing.assert_allclose(float(got), want, rtol=2e-5)


def test_get_is_exact_for_a_million_clients_with_compensated_sums():
    # uniform alpha = 1e-6 summed a million times: plain float32 running sums drift by ~1e-4,
    # the compensated ones must reproduce the float64 decisions on a planted instance
    k = 10**6
    rng = np.random.default_rng(3)
    gap = rng.uniform(0, 1, k).astype(np.float32)
    lam = rng.uniform(-0.1, 0.9, k).astype(np.float32)
    pi = rng.uniform(0.05, 1, k).astype(np.float32)
    alpha = np.full(k, 1.0 / k, np.float32)
    kept32, _ = ca_fed_exclusions(*map(jnp.asarray, (alpha, gap, pi, lam)), kappa2=1.0)
    with jax.enable_x64(True):
        kept64, _ = ca_fed_exclusions(
            *(jnp.asarray(a, jnp.float64) for a in (alpha, gap, pi, lam)), kappa2=1.0
        )
    differ = int(np.sum(np.asarray(kept32) != np.asarray(kept64)))
    assert differ <= 10, differ  # isolated near-ties at most
    assert 0 < int(np.sum(~np.asarray(kept64))) < k


# ----------------------------------------------------------------------------- the strategy


def fake_oracle(losses):
    """A ClientOracle whose every loss function returns the planted ``losses``."""

    def loss(params, clients, key=None, *a):
        return jnp.asarray(losses)[clients]

    def unused(*a, **kw):
        raise AssertionError("not used by these strategies")

    return ClientOracle(
        loss=loss,
        batch_loss=loss,
        all_losses=lambda params: jnp.asarray(losses),
        train=unused,
        train_key=jax.random.key(0),
        server_loss=None,
        client_test_loss=lambda params, clients: jnp.asarray(losses)[clients],
    )


def _spec(k, per_round, rounds=10):
    return SimSpec(k, per_round, rounds, jnp.full((k,), 10, jnp.int32), {"w": jnp.zeros(1)})


def _inputs(available, truth=None, num_examples=None, t=0):
    k = len(available)
    n = jnp.full((k,), 10, jnp.int32) if num_examples is None else jnp.asarray(num_examples)
    return RoundInputs(jnp.int32(t), jnp.asarray(available), {"w": jnp.zeros(1)}, n, truth)


def _planted_population(k=16):
    truth = ca_fed_population(jax.random.key(0), k)
    classes = population_classes(k)
    losses = np.where(classes == LESS_CORRELATED, 1.0, 0.2 + 0.001 * np.arange(k))
    return truth, classes, losses.astype(np.float32)


def test_small_kappa_excludes_the_correlated_rarely_available_clients():
    k = 16
    truth, classes, losses = _planted_population(k)
    strategy = make_strategy(
        "ca_fed",
        k,
        kappa2=0.01,
        optimum="zero",
        loss_source="train",
        estimator="oracle",
        trace=True,
    )
    state = strategy.init(jax.random.key(0), _spec(k, k))
    sel, state = strategy.select(
        state, _inputs(np.ones(k, bool), truth), fake_oracle(losses), jax.random.key(1)
    )
    kept = np.asarray(sel.diagnostics["kept"]) > 0
    np.testing.assert_array_equal(kept, classes != LESS_CORRELATED)
    chosen = np.asarray(sel.clients)[np.asarray(sel.mask)]
    assert set(chosen.tolist()) == set(np.flatnonzero(classes != LESS_CORRELATED).tolist())


@pytest.mark.parametrize("estimator", ["oracle", "bayes"])
def test_large_kappa_reduces_to_unbiased_with_the_same_weights(estimator):
    k = 16
    truth, _, losses = _planted_population(k)
    rng = np.random.default_rng(0)
    sizes = rng.integers(5, 50, k)
    kw = {"estimator": estimator}
    ca = make_strategy("ca_fed", k, kappa2=100.0, loss_source="train", optimum="zero", **kw)
    ub = make_strategy("unbiased", k, **kw)
    s_ca, s_ub = ca.init(jax.random.key(0), _spec(k, k)), ub.init(jax.random.key(0), _spec(k, k))
    for t in range(5):
        inputs = _inputs(rng.random(k) < 0.5, truth, sizes, t)
        sel_ca, s_ca = ca.select(s_ca, inputs, fake_oracle(losses), jax.random.key(t))
        sel_ub, s_ub = ub.select(s_ub, inputs, fake_oracle(losses), jax.random.key(t))
        assert int(sel_ca.diagnostics["excluded"]) == 0
        for a, b in zip(sel_ca[:3], sel_ub[:3], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        alpha = sizes / sizes.sum()
        chosen = np.asarray(sel_ub.clients)[np.asarray(sel_ub.mask)]
        pi_hat = (
            np.asarray(truth.pi)
            if estimator == "oracle"
            else np.asarray(est.estimate(s_ub.inner.counts, prior_rounds=2.0)[0])
        )
        np.testing.assert_allclose(
            np.asarray(sel_ub.weights)[np.asarray(sel_ub.mask)],
            alpha[chosen] / pi_hat[chosen],
            rtol=1e-5,
        )
        assert set(chosen.tolist()) == set(np.flatnonzero(inputs.available).tolist())


def test_flat_first_round_keeps_everybody_unless_literal():
    k = 8
    truth = ca_fed_population(jax.random.key(0), k)
    inputs = _inputs(np.ones(k, bool), truth)
    oracle = fake_oracle(np.linspace(0.5, 1.0, k).astype(np.float32))
    for literal in (False, True):
        strategy = make_strategy("ca_fed", k, loss_source="train", keep_all_when_flat=not literal)
        state = strategy.init(jax.random.key(0), _spec(k, k))
        sel, state = strategy.select(state, inputs, oracle, jax.random.key(1))
        assert float(sel.diagnostics["gamma"]) == 0.0  # F_hat^* = F_hat after one report
        assert k - int(sel.diagnostics["excluded"]) == (1 if literal else k)


def test_loss_filter_eq_17_and_running_minimum():
    beta = 0.3
    est_ = jnp.zeros(4)
    low = jnp.full(4, jnp.inf)
    started = jnp.zeros((), bool)
    rounds = [
        (np.array([2.0, 4.0, 0.0, 0.0]), np.array([1, 1, 0, 0], bool)),
        (np.array([1.0, 9.0, 5.0, 0.0]), np.array([1, 0, 1, 0], bool)),
        (np.array([3.0, 1.0, 1.0, 7.0]), np.array([1, 1, 0, 1], bool)),
    ]
    ref = np.array([2.0, 4.0, 3.0, 3.0])  # first reports; the others get their mean
    ref_min = ref.copy()
    for t, (loss, avail) in enumerate(rounds):
        est_, low, started = update_loss_estimates(
            est_, low, started, jnp.asarray(loss), jnp.asarray(avail), beta
        )
        if t > 0:
            ref = np.where(avail, (1 - beta) * ref + beta * loss, ref)
            ref_min = np.minimum(ref_min, ref)
        np.testing.assert_allclose(np.asarray(est_), ref, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(low), ref_min, rtol=1e-6)


def test_ca_fed_in_a_simulation_excludes_rarely_available_correlated_clients():
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.models import make_model
    from fedjax_sel.training import HParams, LocalConfig

    k = 16
    ds = load_dataset("digits", num_clients=k, partition="dirichlet:0.3", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    runs = {}
    for name, kw in [
        ("ca_fed", {"kappa2": 0.01, "loss_source": "train"}),
        ("ca_fed_big", {"kappa2": 1e4, "loss_source": "train"}),
        ("unbiased", {}),
    ]:
        spec = RoundSpec.create(
            ds,
            model,
            make_strategy(name.replace("_big", ""), k, **kw),
            local=LocalConfig(batch_size=16, local_steps=3),
            per_round=k,
            availability=markov_population(),
        )
        sim = Simulation(spec, ds, num_rounds=6, chunk_size=6)
        state, logs = sim.run_rounds(sim.init(3, hparams=HParams.of(0.1)), 6)
        runs[name] = (state, logs)
    state, logs = runs["ca_fed"]
    assert np.any(np.asarray(logs.diagnostics["excluded"]) > 0)
    # same seed, same availability: CA-Fed trains a subset of the available clients Unbiased
    # trains, strictly fewer in some round
    ub_logs = runs["unbiased"][1]
    assert np.all(np.asarray(logs.num_available) == np.asarray(ub_logs.num_available))
    assert np.all(np.asarray(logs.num_selected) <= np.asarray(ub_logs.num_selected))
    assert np.any(np.asarray(logs.num_selected) < np.asarray(ub_logs.num_selected))
    # kappa2 = 1e4: the same slots, weights and final model as Unbiased
    big, ub = runs["ca_fed_big"], runs["unbiased"]
    np.testing.assert_array_equal(big[1].weights, ub[1].weights)
    np.testing.assert_array_equal(big[1].clients, ub[1].clients)
    for a, b in zip(jax.tree.leaves(big[0].params), jax.tree.leaves(ub[0].params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- baselines


def test_unbiased_adafed_and_more_available_weights():
    k = 12
    truth = AvailabilityParams(
        jnp.asarray(np.linspace(0.1, 0.9, k), jnp.float32), jnp.zeros(k, jnp.float32)
    )
    sizes = np.arange(1, k + 1) * 3
    alpha = sizes / sizes.sum()
    available = np.random.default_rng(0).random(k) < 0.6
    inputs = _inputs(available, truth, sizes)
    pi = np.asarray(truth.pi)
    expected = {
        "unbiased": (available, alpha / pi),
        "adafed": (available, alpha / pi / np.sum((alpha / pi)[available])),
        "more_available": (available & (pi >= 0.5), alpha / pi),
    }
    for name, (want_sel, want_q) in expected.items():
        strategy = make_strategy(name, k, estimator="oracle")
        sel, _ = strategy.select(
            strategy.init(jax.random.key(0), _spec(k, k)), inputs, None, jax.random.key(0)
        )
        mask, clients = np.asarray(sel.mask), np.asarray(sel.clients)
        assert set(clients[mask].tolist()) == set(np.flatnonzero(want_sel).tolist()), name
        np.testing.assert_allclose(np.asarray(sel.weights)[mask], want_q[clients[mask]], rtol=1e-5)
    adafed = make_strategy("adafed", k, estimator="oracle")
    sel, _ = adafed.select(adafed.init(None, _spec(k, k)), inputs, None, jax.random.key(0))
    np.testing.assert_allclose(float(jnp.sum(sel.weights)), 1.0, rtol=1e-6)


def test_fewer_slots_keep_the_largest_weights():
    k = 10
    truth = AvailabilityParams(jnp.linspace(0.1, 0.9, k), jnp.zeros(k))
    strategy = make_strategy("unbiased", 3, estimator="oracle", weighting="uniform")
    sel, _ = strategy.select(
        strategy.init(None, _spec(k, 3)), _inputs(np.ones(k, bool), truth), None, None
    )
    np.testing.assert_array_equal(np.asarray(sel.clients), [0, 1, 2])  # smallest pi


def _f3ast_reference(avail_seq, alpha, m, beta, pi=None):
    """F3AST from its definition: top-m available by alpha^2 / r^2 (stable, ties by id),
    weights alpha / r; r is the selection EMA from m/K, or (1-beta) pi + beta."""
    k = len(alpha)
    r = np.full(k, m / k)
    out = []
    for avail in avail_seq:
        rate = r if pi is None else (1 - beta) * pi + beta
        score = np.where(avail, alpha**2 / rate**2, -np.inf)
        order = np.argsort(-score, kind="stable")[:m]
        chosen = order[avail[order]]
        out.append((set(chosen.tolist()), {int(c): alpha[c] / rate[c] for c in chosen}))
        if pi is None:
            picked = np.zeros(k)
            picked[chosen] = 1
            r = (1 - beta) * r + beta * picked
    return out


@pytest.mark.parametrize("variant", ["paper", "reference"])
def test_f3ast_against_its_definition(variant):
    k, m, rounds = 10, 3, 12
    rng = np.random.default_rng(5)
    sizes = rng.integers(5, 40, k)
    alpha = sizes / sizes.sum()
    pi = rng.uniform(0.2, 0.9, k).astype(np.float32)
    truth = AvailabilityParams(jnp.asarray(pi), jnp.zeros(k))
    avail_seq = rng.random((rounds, k)) < pi
    beta = 0.2
    strategy = make_strategy("f3ast", 5, budget=m, beta=beta, variant=variant, estimator="oracle")
    state = strategy.init(None, _spec(k, 5, rounds))
    want = _f3ast_reference(avail_seq, alpha, m, beta, pi if variant == "reference" else None)
    for t in range(rounds):
        sel, state = strategy.select(state, _inputs(avail_seq[t], truth, sizes, t), None, None)
        mask = np.asarray(sel.mask)
        chosen = np.asarray(sel.clients)[mask]
        assert set(chosen.tolist()) == want[t][0], t
        got_w = dict(zip(chosen.tolist(), np.asarray(sel.weights)[mask].tolist(), strict=True))
        for c, w in want[t][1].items():
            np.testing.assert_allclose(got_w[c], w, rtol=1e-4)
        assert not mask[m:].any()


def test_f3ast_favours_rarely_selected_clients():
    k, m = 8, 2
    truth = AvailabilityParams(jnp.full(k, 0.5), jnp.zeros(k))
    strategy = make_strategy("f3ast", m, beta=0.3, estimator="oracle")
    state = strategy.init(None, _spec(k, m))
    counts = np.zeros(k)
    for t in range(40):
        sel, state = strategy.select(state, _inputs(np.ones(k, bool), truth, t=t), None, None)
        counts[np.asarray(sel.clients)[np.asarray(sel.mask)]] += 1
    assert counts.max() - counts.min() <= 1  # equal alpha: round-robin-like fairness


def test_bayes_mode_estimates_from_the_observed_masks():
    k = 6
    rng = np.random.default_rng(0)
    masks = rng.random((9, k)) < 0.5
    strategy = make_strategy("unbiased", k, estimator="bayes", prior_rounds=4.0)
    state = strategy.init(None, _spec(k, k))
    counts = est.init_counts(k)
    for t, avail in enumerate(masks):
        sel, state = strategy.select(state, _inputs(avail, t=t), None, None)
        counts = est.update_counts(counts, jnp.asarray(avail))
    pi_hat, _ = est.estimate(counts, prior_rounds=4.0)
    want = (masks.sum(0) + 2.0) / (len(masks) + 4.0)
    np.testing.assert_allclose(np.asarray(pi_hat), want, rtol=1e-6)
    # the last round's weights are alpha / pi_hat (alpha = 1/k: equal sizes)
    mask, clients = np.asarray(sel.mask), np.asarray(sel.clients)
    np.testing.assert_allclose(
        np.asarray(sel.weights)[mask], (1.0 / k) / want[clients[mask]], rtol=1e-5
    )


def test_oracle_without_true_parameters_and_bad_hyperparameters_give_clear_errors():
    k = 4
    strategy = make_strategy("ca_fed", k, estimator="oracle")
    state = strategy.init(None, _spec(k, k))
    with pytest.raises(ConfigError, match="does not expose them"):
        strategy.select(state, _inputs(np.ones(k, bool)), fake_oracle(np.ones(k)), None)
    assert bernoulli(0.5).true_params is None
    for name, kw, message in [
        ("ca_fed", {"kappa2": -1.0}, "kappa2 must be >= 0"),
        ("ca_fed", {"beta": 0.0}, "beta (eq. 17) must lie in (0, 1]"),
        ("ca_fed", {"optimum": "fit"}, "optimum='fit' is not a valid choice (one of 'running_min'"),
        ("ca_fed", {"optimum": "given"}, "optimum_values (one F_k^* per client)"),
        ("ca_fed", {"optimum_values": (0.1,) * 4}, "go with optimum='given'"),
        ("ca_fed", {"loss_source": "test"}, "loss_source='test' is not a valid choice"),
        ("ca_fed", {"lambda_order": "up"}, "lambda_order='up' is not a valid choice"),
        ("unbiased", {"estimator": "mle"}, "estimator='mle' is not a valid choice"),
        ("adafed", {"prior": "jeffreys"}, "prior='jeffreys' is not a valid choice"),
        ("more_available", {"threshold": 2.0}, "threshold must lie in [0, 1]"),
        ("f3ast", {"budget": 9}, "budget must lie in [1, per_round=4]"),
        (
            "f3ast",
            {"variant": "x"},
            "variant='x' is not a valid choice (one of 'paper', 'reference')",
        ),
        ("unbiased", {"prior_rounds": 0.0}, "prior_rounds"),
    ]:
        with pytest.raises(ConfigError) as e:
            make_strategy(name, k, **kw)
        assert message in str(e.value), (name, kw, str(e.value))


# ----------------------------------------------------------------------------- reference code


def reference_sample(alpha, pi, lam, loss_est, optimum, bias_const, tolerance=0.0):
    """A transcription of the reference code's ``MarkovianClientsSampler`` allocation
    (``clients_sampler.py``: ``__init_allocation_vec``, ``_estimate_optimization_objective``,
    ``_truncate_clients``, the two ``sorted`` orders of ``sample``): the bias term is
    ``bias_const * max(F - F^*) * TV^2``, without eq. 20's factor 4."""
    ids = list(range(len(alpha)))

    def objective(allocation):
        weights = pi * allocation
        weights = weights / weights.sum()
        optimization_term = (loss_est - optimum) @ weights
        dissimilarity = np.max(loss_est - optimum)
        tv_value = np.square(0.5 * np.abs(alpha - weights).sum())
        return optimization_term + dissimilarity * tv_value * bias_const

    def truncate(allocation, ordered_ids):
        running, current = allocation.copy(), allocation.copy()
        running_objective = objective(running)
        for client_id in ordered_ids:
            current[client_id] = 0
            if current.sum() == 0:
                break
            current_objective = objective(current)
            if running_objective - current_objective >= tolerance:
                running = current.copy()
                running_objective = current_objective
            else:
                current = running.copy()
        return running

    allocation = alpha / pi
    allocation = truncate(allocation, sorted(ids, key=lambda i: abs(lam[i]), reverse=True))
    allocation = truncate(allocation, sorted(ids, key=lambda i: pi[i], reverse=False))
    return allocation > 1e-10


def test_code_bias_const_1_is_kappa2_a_quarter():
    """The code's bias_const c is eq. 20's 4 kappa2: c = 1 (every script) is kappa2 = 0.25.
    Random populations with the code's discrete pi/lambda (many ties) and gaps of both signs
    (a fixed fitted F^* can exceed the validation loss)."""
    rng = np.random.default_rng(7)
    agree_quarter, agree_one = 0, 0
    with jax.enable_x64(True):
        for trial in range(60):
            k = int(rng.integers(4, 30))
            alpha = rng.dirichlet(np.ones(k)) if trial % 2 else np.full(k, 1.0 / k)
            pi = rng.choice([0.1, 0.9], k)
            lam = np.where(rng.random(k) < 0.4, 0.9, rng.normal(0.005, 0.005, k))
            loss = rng.uniform(0.2, 2.5, k)
            optimum = rng.uniform(0.0, 0.6, k)
            for c in (0.1, 1.0, 10.0):
                want = reference_sample(alpha, pi, lam, loss, optimum, c)
                got, _ = padded_exclusions(
                    alpha, loss - optimum, pi, lam, c / 4, 0.0, "abs", jnp.float64
                )
                np.testing.assert_array_equal(got, want, err_msg=f"trial {trial}, c={c}")
                agree_quarter += 1
            # kappa2 = c (no factor 4) differs from the code on some of these cases
            got_one, _ = padded_exclusions(
                alpha, loss - optimum, pi, lam, 1.0, 0.0, "abs", jnp.float64
            )
            agree_one += int(
                np.array_equal(got_one, reference_sample(alpha, pi, lam, loss, optimum, 1.0))
            )
    assert agree_quarter == 180 and agree_one < 60


def test_strategy_with_validation_loss_and_fitted_optima_against_numpy(tmp_path):
    """``loss_source="validation"`` and ``optimum="given"`` (the code's signal): after one
    round on a tiny Synthetic federation with every client online, the gap is the NumPy
    cross-entropy of the current model on each client's held-out split minus its fitted
    F_k^*, Gamma' its maximum, and the kept set the reference code's allocation."""
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec, SimData, sim_spec
    from fedjax_sel.engine.oracle import client_oracle
    from fedjax_sel.models import make_model
    from fedjax_sel.strategies._ca_fed_common import fit_local_optima
    from fedjax_sel.training import HParams, LocalConfig

    k = 6
    ds = load_dataset(
        "leaf_synthetic",
        num_clients=k,
        seed=1,
        test_fraction=0.5,
        alpha=0.5,
        beta=0.5,
        dim=5,
        num_classes=3,
        examples_per_client=24,
    )
    optima = fit_local_optima(ds)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=3)
    truth = ca_fed_population(jax.random.key(0), k, mix="code", id_seed=1)
    strategy = make_strategy(
        "ca_fed",
        k,
        kappa2=0.25,
        loss_source="validation",
        optimum="given",
        optimum_values=optima,
        lambda_order="abs",
        estimator="oracle",
        keep_all_when_flat=False,
        trace=True,
    )
    spec = RoundSpec.create(ds, model, strategy, local=LocalConfig(), per_round=k)
    params = model.init(jax.random.key(3))
    params = jax.tree.map(lambda p: p + 0.5 * jax.random.normal(jax.random.key(4), p.shape), params)
    inputs = RoundInputs(jnp.int32(0), jnp.ones(k, bool), params, ds.train.counts, truth)
    oracle = client_oracle(spec, SimData.of(ds), HParams.of(0.01))
    start = strategy.init(None, sim_spec(ds, params, per_round=k, num_rounds=1))
    sel, state = strategy.select(start, inputs, oracle, jax.random.key(5))
    w = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["Dense_0"]["bias"], np.float64)
    val = []
    for c in range(k):
        x, y = ds.test.client_arrays(c)
        logits = x.astype(np.float64) @ w + b
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        val.append(-logp[np.arange(len(y)), y].mean())
    val = np.array(val)
    np.testing.assert_allclose(np.asarray(state.inner.loss_est), val, rtol=1e-5)
    gap = val - np.asarray(optima)
    np.testing.assert_allclose(float(sel.diagnostics["gamma"]), gap.max(), rtol=1e-5)
    alpha = np.asarray(ds.train.counts) / np.sum(np.asarray(ds.train.counts))
    want = reference_sample(alpha, np.asarray(truth.pi), np.asarray(truth.lam), val, optima, 1.0)
    np.testing.assert_array_equal(np.asarray(sel.diagnostics["kept"]) > 0, want)


def test_fitted_optimum_is_the_penalised_logistic_regression_minimum():
    """F_k^* of the code (scikit-learn's multinomial logistic regression, C = 1): the fitted
    parameters zero a finite-difference gradient of c * sum CE + ||W||^2 / 2, nothing nearby
    is lower, and F_k^* is the mean training log-loss there; one class only gives 0."""
    from fedjax_sel.strategies._ca_fed_common import fit_local_optimum

    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 3))
    y = np.array([0, 2, 5] * 10)  # labels need not be 0..C-1
    f_star, w, b, classes = fit_local_optimum(x, y, c=1.0)
    assert classes.tolist() == [0, 2, 5]
    y_idx = np.searchsorted(classes, y)

    def penalised(theta):
        ww, bb = theta[:9].reshape(3, 3), theta[9:]
        z = x @ ww + bb
        ce = np.log(np.exp(z).sum(1)) - z[np.arange(30), y_idx]
        return ce.sum() + 0.5 * np.sum(ww**2)

    theta = np.concatenate([w.ravel(), b])
    grad = np.array(
        [(penalised(theta + h) - penalised(theta - h)) / 2e-5 for h in 1e-5 * np.eye(12)]
    )
    assert np.abs(grad).max() < 1e-3
    for _ in range(20):
        assert penalised(theta + 0.05 * rng.normal(size=12)) > penalised(theta)
    z = x @ w + b
    mean_ce = np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(30), y_idx])
    assert f_star == pytest.approx(mean_ce, rel=1e-9) and 0 < f_star < np.log(3)
    assert fit_local_optimum(x, np.full(30, 4))[0] == 0.0  # scikit-learn raises: the code's 0


def test_diagnostics_on_a_planted_round_against_numpy():
    """Weight sums, the law and the per-group counts of CA-Fed and the baselines on a planted
    round: 16 clients of the paper's four classes, half of them online."""
    k = 16
    truth, classes, losses = _planted_population(k)
    rng = np.random.default_rng(1)
    sizes = rng.integers(5, 60, k)
    alpha = sizes / sizes.sum()
    available = rng.random(k) < 0.6
    inputs = _inputs(available, truth, sizes)
    pi = np.asarray(truth.pi)
    for name, kw in [
        ("ca_fed", {"kappa2": 0.01, "optimum": "zero", "loss_source": "train"}),
        ("unbiased", {}),
        ("adafed", {}),
        ("more_available", {}),
        ("f3ast", {"budget": 5, "variant": "reference"}),
    ]:
        strategy = make_strategy(name, k, estimator="oracle", **kw)
        sel, _ = strategy.select(
            strategy.init(None, _spec(k, k)), inputs, fake_oracle(losses), jax.random.key(0)
        )
        d = {key: np.asarray(v) for key, v in sel.diagnostics.items()}
        mask, clients = np.asarray(sel.mask), np.asarray(sel.clients)
        w = np.zeros(k)
        w[clients[mask]] = np.asarray(sel.weights)[mask]
        trained = w > 0
        np.testing.assert_allclose(d["q_sum"], w.sum(), rtol=1e-5)
        np.testing.assert_allclose(d["q_sum_sq"], w.sum() ** 2, rtol=1e-5)
        np.testing.assert_allclose(d["q_max"], w.max(), rtol=1e-6)
        np.testing.assert_allclose(d["law"], w / w.sum(), rtol=1e-5)
        np.testing.assert_array_equal(d["group_size"], [4, 4, 4, 4])
        np.testing.assert_array_equal(
            d["trained_by_group"], np.bincount(classes[trained], minlength=4)
        )
        np.testing.assert_allclose(
            d["weight_by_group"], np.bincount(classes, weights=w, minlength=4), rtol=1e-5
        )
        if name == "ca_fed":  # kept: Algorithm 1 literally (F^* = 0; first reports)
            f_hat = np.where(available, losses, losses[available].mean())
            kept, _ = dense_two_passes(alpha, f_hat, pi, np.asarray(truth.lam), 0.01, 0.0)
            assert not kept[classes == 2].any()  # the planted high-gap class is dropped
            np.testing.assert_array_equal(
                d["kept_by_group"], np.bincount(classes[kept], minlength=4)
            )
            assert int(d["excluded"]) == int((~kept).sum())
            assert int(d["excluded_available"]) == int((~kept & available).sum())
            np.testing.assert_array_equal(trained, kept & available)
            assert "kept" not in d and "available" not in d  # no K-sized masks without trace
        elif name == "more_available":
            np.testing.assert_array_equal(d["kept_by_group"], [4, 4, 0, 0])
            np.testing.assert_allclose(w[trained], (alpha / pi)[trained], rtol=1e-5)
        elif name == "f3ast":
            assert trained.sum() == min(5, available.sum())
