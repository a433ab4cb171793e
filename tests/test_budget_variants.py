"""Budget variants of the all-available strategies (``candidates="uniform"``; issue 54, "Tracks";
docs/ca_fed.md): Unbiased, AdaFed, More-available and CA-Fed draw ``m = min(per_round, |A_t|)``
available clients uniformly, apply their paper's rule to the drawn set only and scale the
unnormalised weights by ``|A_t| / m``.

References: a NumPy transcription of each rule on the drawn set (CA-Fed's exclusions by a dense
float64 transcription of Algorithm 1 over every client) on a planted case; the empirical mean of
the aggregate weights over many draws against the all-available weights; the rule as it was
before the variants (a top-``per_round`` cut by weight) for ``candidates="all"``, bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ca_fed import fake_oracle

from fedjax_sel.availability import estimators as est
from fedjax_sel.availability.markov_population import (
    LESS_CORRELATED,
    ca_fed_population,
    markov_population,
    population_classes,
)
from fedjax_sel.base import (
    ConfigError,
    RoundInputs,
    Selection,
    SimSpec,
    Strategy,
    update_identity,
)
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.kernels.ca_fed import ca_fed_exclusions
from fedjax_sel.strategies import STRATEGIES, make_strategy
from fedjax_sel.strategies import _ca_fed_common as common
from fedjax_sel.strategies.ca_fed import CAFedState, ca_fed, update_loss_estimates
from fedjax_sel.strategies.hyperparams import inject_hyperparams

K = 16
NAMES = ("unbiased", "adafed", "more_available", "ca_fed")
# CA-Fed on the planted case: losses known exactly (the training losses, F^* = 0), oracle pi
CA_FED_ARGS = {"kappa2": 0.01, "optimum": "zero", "loss_source": "train", "estimator": "oracle"}


def _spec(per_round):
    return SimSpec(K, per_round, 10, jnp.full((K,), 10, jnp.int32), {"w": jnp.zeros(1)})


def _planted():
    """The paper's four classes of 4 (oracle pi, lambda), sizes 3..48, losses that make the
    less-available correlated clients the ones CA-Fed excludes, and an availability mask of 11
    clients (every class present)."""
    truth = ca_fed_population(jax.random.key(0), K)
    classes = population_classes(K)
    losses = np.where(classes == LESS_CORRELATED, 1.0, 0.2 + 0.001 * np.arange(K))
    sizes = 3 * np.arange(1, K + 1)
    available = np.ones(K, bool)
    available[[0, 5, 9, 13, 14]] = False
    return truth, classes, losses.astype(np.float32), sizes, available


def _inputs(available, truth, sizes):
    return RoundInputs(
        jnp.int32(0),
        jnp.asarray(available),
        {"w": jnp.zeros(1)},
        jnp.asarray(sizes, jnp.int32),
        truth,
    )


def _strategy(name, per_round, candidates):
    kw = CA_FED_ARGS if name == "ca_fed" else {"estimator": "oracle"}
    return make_strategy(name, per_round, candidates=candidates, **kw)


def _select(strategy, per_round, inputs, oracle, key):
    return strategy.select(strategy.init(jax.random.key(0), _spec(per_round)), inputs, oracle, key)


def _weight_vector(selection):
    """float[K]: each client's aggregation weight this round (0 when not trained)."""
    w = np.zeros(K)
    clients, mask = np.asarray(selection.clients), np.asarray(selection.mask)
    np.add.at(w, clients[mask], np.asarray(selection.weights, np.float64)[mask])
    return w


def np_ca_fed_kept(alpha, gap, pi, lam, kappa2, tau=0.0):
    """Algorithm 1, lines 5-7 and 13-22, in float64 and dense over every client: ``q = alpha /
    pi``, get() by descending lambda, then by ascending pi; eq. 20 with eq. 4's ``p``."""
    alpha = alpha / alpha.sum()
    gamma = gap.max()

    def eps(q):
        p = pi * q / np.sum(pi * q)
        return np.sum(gap * p) + 4 * kappa2 * (0.5 * np.abs(alpha - p).sum()) ** 2 * gamma

    q = alpha / pi
    for rho in (lam, -pi):
        e = eps(q)
        for k in np.argsort(-rho, kind="stable"):
            if q[k] == 0 or np.sum(q > 0) <= 1:
                continue
            trial = q.copy()
            trial[k] = 0.0
            if e - eps(trial) >= tau:
                q, e = trial, eps(trial)
    return q > 0


def np_rule(name, alpha, pi, candidates, n_available, m, kept=None):
    """The drawn-set rule in NumPy: ``(selected bool[K], q float64[K])`` given the candidate
    mask (the drawn clients), ``|A_t|`` and ``m``."""
    scale = n_available / m
    if name == "unbiased":
        return candidates, alpha / pi * scale
    if name == "adafed":
        raw = np.where(candidates, alpha / pi, 0.0)
        return candidates, raw / raw.sum()
    if name == "more_available":
        return candidates & (pi >= 0.5), alpha / pi * scale
    return candidates & kept, alpha / pi * scale


# ----------------------------------------------------------------------------- the drawn-set rule


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("per_round", [5, 12])  # 12 > |A_t| = 11: every available one drawn
def test_drawn_set_rule_against_numpy_on_a_planted_case(name, per_round):
    truth, classes, losses, sizes, available = _planted()
    pi, lam = np.asarray(truth.pi, np.float64), np.asarray(truth.lam, np.float64)
    alpha = sizes / sizes.sum()
    kept = np_ca_fed_kept(alpha, losses.astype(np.float64), pi, lam, CA_FED_ARGS["kappa2"])
    np.testing.assert_array_equal(kept, classes != LESS_CORRELATED)  # the planted exclusion
    strategy = _strategy(name, per_round, "uniform")
    inputs = _inputs(available, truth, sizes)
    m = min(per_round, int(available.sum()))
    dropped = 0
    for seed in range(6):
        key = jax.random.key(seed)
        sel, _ = _select(strategy, per_round, inputs, fake_oracle(losses), key)
        # the draw: the uniform strategy's, with the select key
        d_clients, d_mask = uniform_without_replacement(key, jnp.asarray(available), per_round)
        drawn = np.zeros(K, bool)
        drawn[np.asarray(d_clients)[np.asarray(d_mask)]] = True
        assert drawn.sum() == m and not np.any(drawn & ~available)
        want_sel, want_q = np_rule(name, alpha, pi, drawn, available.sum(), m, kept)
        clients, mask = np.asarray(sel.clients), np.asarray(sel.mask)
        chosen = clients[mask]
        assert len(clients) == per_round and len(set(chosen.tolist())) == len(chosen)
        assert set(chosen.tolist()) <= set(np.flatnonzero(drawn).tolist())
        assert set(chosen.tolist()) == set(np.flatnonzero(want_sel).tolist()), (name, seed)
        np.testing.assert_allclose(np.asarray(sel.weights)[mask], want_q[chosen], rtol=2e-6)
        dropped += m - len(chosen)
    if name in ("more_available", "ca_fed") and per_round == 5:
        assert dropped > 0  # some draws hold clients the rule excludes: their slots stay empty


def test_the_draw_is_the_uniform_strategys_so_comparisons_are_paired():
    truth, _, losses, sizes, available = _planted()
    inputs = _inputs(available, truth, sizes)
    uniform = make_strategy("uniform", 5)
    for seed in range(4):
        key = jax.random.key(seed)
        want, _ = uniform.select(uniform.init(key, _spec(5)), inputs, None, key)
        want = set(np.asarray(want.clients)[np.asarray(want.mask)].tolist())
        for name in ("unbiased", "adafed"):  # every drawn client trains
            sel, _ = _select(_strategy(name, 5, "uniform"), 5, inputs, fake_oracle(losses), key)
            assert set(np.asarray(sel.clients)[np.asarray(sel.mask)].tolist()) == want


def test_fewer_available_than_slots_gives_the_all_available_selection():
    truth, _, losses, sizes, available = _planted()
    inputs = _inputs(available, truth, sizes)  # 11 available, 12 slots
    for name in NAMES:
        key = jax.random.key(2)
        uni, _ = _select(_strategy(name, 12, "uniform"), 12, inputs, fake_oracle(losses), key)
        every, _ = _select(_strategy(name, 12, "all"), 12, inputs, fake_oracle(losses), None)
        np.testing.assert_array_equal(_weight_vector(uni), _weight_vector(every))


# ----------------------------------------------------------------------------- unbiasedness


def _mean_weights(strategy, per_round, inputs, oracle, draws):
    """The mean over ``draws`` select keys of the K-sized aggregate weight vector."""
    state = strategy.init(jax.random.key(0), _spec(per_round))

    def weights(key):
        sel, _ = strategy.select(state, inputs, oracle, key)
        return common.slot_weights(sel.clients, sel.mask, sel.weights, K)

    keys = jax.random.split(jax.random.key(7), draws)
    return np.asarray(jax.jit(jax.vmap(weights))(keys), np.float64).mean(axis=0)


@pytest.mark.parametrize("name", ["unbiased", "more_available", "ca_fed"])
def test_uniform_draw_is_unbiased_for_the_all_available_weights(name):
    """E[q_k |A_t|/m 1{k drawn} | A_t] = q_k 1{k in A_t}: the mean over many draws matches the
    all-available rule's weights (Unbiased's: alpha/pi on A_t) within 5 standard errors."""
    truth, _, losses, sizes, available = _planted()
    inputs, oracle = _inputs(available, truth, sizes), fake_oracle(losses)
    draws, per_round = 4000, 4
    mean = _mean_weights(_strategy(name, per_round, "uniform"), per_round, inputs, oracle, draws)
    target, _ = _select(_strategy(name, K, "all"), K, inputs, oracle, None)
    target = _weight_vector(target)
    if name == "unbiased":
        pi = np.asarray(truth.pi, np.float64)
        np.testing.assert_allclose(target, np.where(available, sizes / sizes.sum() / pi, 0.0))
    p = per_round / available.sum()  # each available client's chance to be drawn
    stderr = target / p * np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(mean - target) <= 5 * stderr + 1e-6), (mean, target, stderr)
    assert np.all(mean[~available] == 0)


def test_adafed_budget_weights_sum_to_one():
    truth, _, losses, sizes, available = _planted()
    oracle = fake_oracle(losses)
    for mask, per_round in [(available, 4), (available, 12), (np.arange(K) < 2, 4)]:
        strategy = _strategy("adafed", per_round, "uniform")
        state = strategy.init(jax.random.key(0), _spec(per_round))
        inputs = _inputs(mask, truth, sizes)

        def total(key, strategy=strategy, state=state, inputs=inputs):
            return jnp.sum(strategy.select(state, inputs, oracle, key)[0].weights)

        sums = jax.vmap(total)(jax.random.split(jax.random.key(3), 64))
        np.testing.assert_allclose(np.asarray(sums), 1.0, rtol=1e-6)


# ----------------------------------------------------------------------------- "all" unchanged


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("per_round", [K, 4])
def test_candidates_all_is_the_previous_top_weight_cut(name, per_round):
    """``all`` (the default): the rule on every available client, the ``per_round`` selected of
    largest weight in slots (ties by id), weights alpha/pi (AdaFed: normalised)."""
    truth, classes, losses, sizes, available = _planted()
    inputs = _inputs(available, truth, sizes)
    pi = np.asarray(truth.pi, np.float32)
    alpha = np.float32(sizes) / np.float32(sizes.sum())
    q = alpha / pi
    selected = available.copy()
    if name == "more_available":
        selected &= pi >= 0.5
    elif name == "ca_fed":
        selected &= classes != LESS_CORRELATED
    elif name == "adafed":
        q = q / np.sum(q[available], dtype=np.float32)
    order = np.argsort(-np.where(selected, q, -np.inf), kind="stable")[:per_round]
    for strategy in (
        _strategy(name, per_round, "all"),
        make_strategy(
            name, per_round, **(CA_FED_ARGS if name == "ca_fed" else {"estimator": "oracle"})
        ),
    ):
        sel, _ = _select(strategy, per_round, inputs, fake_oracle(losses), jax.random.key(1))
        mask = np.asarray(sel.mask)
        np.testing.assert_array_equal(np.asarray(sel.clients), order)
        np.testing.assert_array_equal(mask, selected[order])
        want = np.where(selected[order], q[order], 0.0)
        # XLA may round alpha / pi differently from NumPy by an ulp: the slots are exact, the
        # weights bit for bit in the engine test below
        np.testing.assert_allclose(np.asarray(sel.weights), want, rtol=1e-6)


def legacy_ca_fed(per_round, kappa2):
    """CA-Fed's select as it was before the budget variants, transcribed from its parts:
    batch losses, eq. 17, the greedy over every client, then the ``per_round`` kept available
    clients of largest ``q = alpha / pi_hat`` (``lax.top_k``), weights ``q``."""

    def build(kappa2, beta, prior_rounds):
        def init(key, spec):
            k = spec.num_clients
            return CAFedState(
                est.init_counts(k),
                jnp.zeros((k,), jnp.float32),
                jnp.full((k,), jnp.inf, jnp.float32),
                jnp.zeros((), bool),
            )

        def select(state, inputs, oracle, key):
            k = inputs.available.shape[0]
            pi_hat, lam_hat, counts = common.availability_estimates(
                state.counts, inputs, estimator="auto", prior="flat", prior_rounds=prior_rounds
            )
            every = jnp.arange(k, dtype=jnp.int32)
            loss = oracle.batch_loss(inputs.params, every, key, 32).astype(jnp.float32)
            loss_est, loss_min, started = update_loss_estimates(
                state.loss_est, state.loss_min, state.started, loss, inputs.available, beta
            )
            gap = jnp.where(started, loss_est - loss_min, 0.0)
            n = inputs.num_examples.astype(jnp.float32)
            alpha = n / jnp.sum(n)
            kept, gamma = ca_fed_exclusions(alpha, gap, pi_hat, lam_hat, kappa2=kappa2, tau=0.0)
            kept = kept | (gamma <= 0)
            q = alpha / pi_hat
            score = jnp.where(kept & inputs.available, q, -jnp.inf)
            _, clients = jax.lax.top_k(score, per_round)
            clients = clients.astype(jnp.int32)
            mask = (kept & inputs.available)[clients]
            selection = Selection(clients, mask, jnp.where(mask, q[clients], 0.0))
            return selection, CAFedState(counts, loss_est, loss_min, started)

        return Strategy(init, select, update_identity, reads_deltas=False)

    return inject_hyperparams(build, kappa2=kappa2, beta=1.0, prior_rounds=2.0)


def test_candidates_all_runs_like_the_previous_ca_fed_in_the_engine():
    """A small digits run (Markov availability, 4 slots of 12 clients, batch losses): the same
    slots, weights and final model, bit for bit, as CA-Fed before the budget variants."""
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.models import make_model
    from fedjax_sel.training import HParams, LocalConfig

    k, per_round, rounds = 12, 4, 4
    ds = load_dataset("digits", num_clients=k, partition="dirichlet:0.5", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    runs = []
    for strategy in (
        make_strategy("ca_fed", per_round, kappa2=0.05, candidates="all"),
        legacy_ca_fed(per_round, 0.05),
    ):
        spec = RoundSpec.create(
            ds,
            model,
            strategy,
            local=LocalConfig(batch_size=16, local_steps=2),
            per_round=per_round,
            availability=markov_population(),
        )
        sim = Simulation(spec, ds, num_rounds=rounds, chunk_size=rounds)
        runs.append(sim.run_rounds(sim.init(1, hparams=HParams.of(0.1)), rounds))
    (new_state, new), (old_state, old) = runs
    np.testing.assert_array_equal(np.asarray(new.clients), np.asarray(old.clients))
    np.testing.assert_array_equal(np.asarray(new.weights), np.asarray(old.weights))
    assert np.any(np.asarray(old.num_available) > per_round)  # the cut was exercised
    for a, b in zip(
        jax.tree.leaves(new_state.params), jax.tree.leaves(old_state.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- reachability


@pytest.mark.parametrize("name", NAMES)
def test_bad_candidates_value_is_a_config_error_naming_it(name):
    with pytest.raises(ConfigError, match="candidates='some'"):
        make_strategy(name, 4, candidates="some")
    with pytest.raises(ConfigError, match="candidates='some'"):
        STRATEGIES[name].factory(per_round=4, candidates="some")


def test_direct_factory_call_checks_candidates():
    with pytest.raises(ConfigError, match=r"ca_fed candidates='top' is not a valid choice"):
        ca_fed(per_round=4, candidates="top")


def test_option_is_listed_and_read_from_a_configuration():
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment.resolve import resolve

    for name in NAMES:
        assert "candidates='all'" in STRATEGIES.describe(name)
        config = RunConfig(strategy=name, strategy_args={"candidates": "uniform"}, per_round=3)
        resolved = resolve(config.validate())
        assert resolved.config.strategy_args == {"candidates": "uniform"}
    with pytest.raises(ConfigError, match="candidates='uniformly'"):
        resolve(RunConfig(strategy="unbiased", strategy_args={"candidates": "uniformly"}))
