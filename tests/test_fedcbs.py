"""Fed-CBS (fedjax_sel.strategies.fedcbs, fedjax_sel.kernels.fedcbs) against NumPy
transcriptions of the reference codes (FedProphet's ``FedCBS_Selector.select``, FedXplore's
first pick): QCID, the per-pick probabilities, the law of a whole sequential draw, the paper's
Fig. 3 example, and cohorts more class-balanced than uniform sampling's on one-class clients."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError, RoundInputs, SimSpec
from fedjax_sel.kernels import fedcbs as kc
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.fedcbs import FedCBSState

FIG3 = np.array(
    [[5, 5, 5, 5, 5, 5], [6, 6, 6, 6, 6, 0], [0, 0, 0, 10, 10, 10], [10, 10, 10, 0, 0, 0]],
    np.float64,
)


def np_qcid(counts, group):
    """The references' pairwise form: sum_{i,j in S} <c_i, c_j> / (sum_S n)^2 - 1/B."""
    s = counts @ counts.T
    g = list(group)
    return s[np.ix_(g, g)].sum() / counts[g].sum() ** 2 - 1.0 / counts.shape[1]


def np_next_probs(counts, chosen, candidates, beta, floor=1e-3):
    """FedProphet, picks i >= 1: P(k) ~ Q(C)^beta_last / max(Q(C + k)^beta, floor)
    (the numerator cancels; Q clamped at 0 against float64 rounding)."""
    den = np.array(
        [max(max(np_qcid(counts, chosen + [k]), 0.0) ** beta, floor) for k in candidates]
    )
    w = 1.0 / den
    return w / w.sum()


def np_first_scores(counts, candidates, beta, lam, t, pulls):
    """FedXplore / FedProphet, pick 1: 1 / Q({k})^beta + lam sqrt(3 ln(t+1) / (2 T_k))."""
    return np.array(
        [
            1.0 / np_qcid(counts, [k]) ** beta + lam * np.sqrt(3 * np.log(t + 1) / (2 * pulls[k]))
            for k in candidates
        ]
    )


def np_betas(m, b0, b1):
    return [b0 + (b1 - b0) * j / (m - 1) for j in range(m)]


def test_qcid_matches_the_pairwise_form():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 40, (15, 7)).astype(np.float64)
    for size in (1, 3, 6):
        group = rng.choice(15, size, replace=False)
        mask = np.zeros(15, bool)
        mask[group] = True
        got = float(kc.qcid(jnp.asarray(counts), jnp.asarray(mask)))
        np.testing.assert_allclose(got, np_qcid(counts, group), rtol=1e-5, atol=1e-7)
        # every candidate added to the group at once, from its running sums
        v = jnp.asarray(counts[group].sum(axis=0), jnp.float32)
        cand = np.asarray(kc.candidate_qcid(jnp.asarray(counts), v, jnp.sum(v)))
        want = [np_qcid(counts, list(group) + [k]) for k in range(15)]  # k in S counts twice
        np.testing.assert_allclose(cand, want, rtol=1e-5, atol=5e-7)
    single = np.asarray(kc.client_qcid(jnp.asarray(counts)))
    np.testing.assert_allclose(single, [np_qcid(counts, [k]) for k in range(15)], rtol=1e-5)
    # the paper's Fig. 3 example: {1, 3, 4} (0-based {0, 2, 3}) is exactly balanced
    fig = jnp.asarray(FIG3)
    assert float(kc.qcid(fig, jnp.array([1, 0, 1, 1]))) == 0.0
    np.testing.assert_allclose(float(kc.qcid(fig, jnp.array([1, 1, 1, 0]))), 120 / 8100, rtol=1e-5)


@pytest.mark.parametrize("counts", [FIG3, "random"], ids=["fig3", "random"])
def test_pick_probabilities_match_numpy(counts):
    """Per-pick laws for a planted prefix: the softmax of the later-pick logits over the open
    clients is FedProphet's normalised ratio, the first pick's is FedXplore's score."""
    if isinstance(counts, str):
        counts = np.random.default_rng(1).integers(0, 30, (9, 5)).astype(np.float64)
    k = counts.shape[0]
    m = min(k, 4)
    betas = np_betas(m, 1.0, 10.0)
    for prefix in ([0], [0, 2], [1, 3][: m - 1]):
        j = len(prefix)
        open_ = np.ones(k, bool)
        open_[prefix] = False
        v = jnp.asarray(counts[prefix].sum(axis=0), jnp.float32)
        q = kc.candidate_qcid(jnp.asarray(counts), v, jnp.sum(v))
        logits = kc.next_logits(q, betas[j], 1e-3)
        got = np.asarray(jax.nn.softmax(jnp.where(jnp.asarray(open_), logits, -jnp.inf)))
        want = np_next_probs(counts, prefix, np.flatnonzero(open_), betas[j])
        np.testing.assert_allclose(got[open_], want, rtol=2e-4, atol=1e-7)
        assert np.all(got[~open_] == 0)
    # first pick: t = 4, T_k = 1..k, lam = 2 (no client exactly balanced here but FIG3's first)
    pulls = np.arange(1, k + 1, dtype=np.float64)
    q = kc.client_qcid(jnp.asarray(counts))
    logits = kc.first_logits(q, 1.0, 2.0, jnp.int32(4), jnp.asarray(pulls))
    if np.all(np.asarray(q) > 0):
        want = np_first_scores(counts, range(k), 1.0, 2.0, 4, pulls)
        np.testing.assert_allclose(np.asarray(jax.nn.softmax(logits)), want / want.sum(), rtol=2e-4)
    else:  # FIG3: client 0 is balanced, an infinite score in the references: the argmax
        assert int(jnp.argmax(logits)) == 0


def test_sequential_draw_law_matches_numpy_enumeration():
    """A whole draw (first pick sampled, one repeat) on 5 clients, m = 3: the frequency of each
    cohort over 20000 draws of the strategy is the sum over its orderings of the product of the
    NumPy per-pick probabilities (FedXplore's first pick with lam, FedProphet's later ones)."""
    rng = np.random.default_rng(2)
    counts = rng.integers(0, 20, (5, 4)).astype(np.float64) + np.eye(5, 4) * 15
    k, m, lam, t = 5, 3, 0.5, 3
    pulls = np.array([1.0, 2.0, 1.0, 4.0, 3.0])
    betas = np_betas(m, 1.0, 3.0)
    law = {}
    for order in itertools.permutations(range(k), m):
        s = np_first_scores(counts, range(k), betas[0], lam, t, pulls)
        prob = s[order[0]] / s.sum()
        for j in range(1, m):
            cand = [c for c in range(k) if c not in order[:j]]
            pj = np_next_probs(counts, list(order[:j]), cand, betas[j])
            prob *= pj[cand.index(order[j])]
        key = frozenset(order)
        law[key] = law.get(key, 0.0) + prob
    strategy = make_strategy(
        "fedcbs", m, first="sample", repeats=1, lam=lam, beta_init=1.0, beta_final=3.0
    )
    state = FedCBSState(jnp.asarray(counts, jnp.float32), jnp.asarray(pulls, jnp.float32))
    inputs = RoundInputs(jnp.int32(t), jnp.ones(k, bool), None, jnp.full(k, 10, jnp.int32))
    _assert_cohort_law(strategy, state, inputs, law)


@pytest.mark.parametrize("repeats", [1, 6])
def test_fig3_example_picks_the_balanced_cohort(repeats):
    """The paper's Fig. 3 (four clients, m = 3), FedProphet's settings. Pick 1 is the balanced
    client 0 (argmax); every later candidate's QCID^beta lies below the floor 1e-3 (beta =
    5.5, then 10), so picks 2 and 3 are uniform: one draw returns the exactly balanced {0, 2, 3}
    (the paper's {1, 3, 4}) with probability 2/3 * 1/2 = 1/3, the lowest-QCID of six with
    1 - (2/3)^6 = 0.912. A deterministic greedy on QCID would stop at {0, 1, 2} (QCID 0.015)."""
    strategy = make_strategy("fedcbs", 3, repeats=repeats)
    n = jnp.asarray(FIG3.sum(axis=1), jnp.int32)
    state = strategy.init(jax.random.key(0), SimSpec(4, 3, 10, n, None, 6, jnp.asarray(FIG3)))
    inputs = RoundInputs(jnp.int32(0), jnp.ones(4, bool), None, n)

    def pick(key):
        sel, _ = strategy.select(state, inputs, None, key)
        return sel.clients, sel.diagnostics["qcid"]

    draws = 4000
    clients, q = jax.jit(jax.vmap(pick))(jax.random.split(jax.random.key(1), draws))
    clients = np.asarray(clients)
    assert np.all(clients[:, 0] == 0)
    hit = np.array([set(c.tolist()) == {0, 2, 3} for c in clients])
    want = 1 / 3 if repeats == 1 else 1 - (2 / 3) ** 6
    assert abs(hit.mean() - want) <= 4 * np.sqrt(want * (1 - want) / draws), hit.mean()
    assert np.all(np.asarray(q)[hit] == 0.0)
    assert np.all(np.asarray(q)[~hit] > 0.01)


def test_cohorts_more_balanced_than_uniform():
    """20 clients holding one class each (4 classes, five clients per class, sizes 20-60, 90%
    available): the mean QCID of Fed-CBS's cohorts of 4 is well below uniform sampling's, with
    the defaults (FedProphet's: 0.05 against 0.17) and with FedXplore's lam, betas, sampled
    first pick and single draw (0.10)."""
    rng = np.random.default_rng(3)
    k, b, m = 20, 4, 4
    counts = np.zeros((k, b))
    counts[np.arange(k), np.arange(k) % b] = rng.integers(20, 61, k)
    n = jnp.asarray(counts.sum(axis=1), jnp.int32)
    spec = SimSpec(k, m, 10, n, None, b, jnp.asarray(counts, jnp.float32))
    avail = jnp.asarray(rng.random(k) < 0.9)
    keys = jax.random.split(jax.random.key(4), 300)
    inputs = RoundInputs(jnp.int32(5), avail, None, n)

    def mean_qcid(strategy):
        state = strategy.init(jax.random.key(0), spec)

        def pick(key):
            sel, _ = strategy.select(state, inputs, None, key)
            member = jnp.zeros(k).at[sel.clients].add(sel.mask)
            return kc.qcid(jnp.asarray(counts), member), sel.clients, sel.mask

        q, clients, mask = jax.jit(jax.vmap(pick))(keys)
        assert np.asarray(avail)[np.asarray(clients)[np.asarray(mask)]].all()
        return float(np.mean(q))

    def uniform_pick(key):
        clients, mask = uniform_without_replacement(key, avail, m)
        return kc.qcid(jnp.asarray(counts), jnp.zeros(k).at[clients].add(mask))

    uniform = float(np.mean(jax.jit(jax.vmap(uniform_pick))(keys)))
    defaults = mean_qcid(make_strategy("fedcbs", m))
    xplore = mean_qcid(
        make_strategy("fedcbs", m, lam=10.0, beta_final=m, first="sample", repeats=1)
    )
    assert defaults < 0.4 * uniform and xplore < 0.75 * uniform, (defaults, xplore, uniform)


def test_exploration_and_pull_counts():
    """The update adds one pull per selected client; with identical histograms the first pick
    goes to the least-pulled client (the bonus) once t > 0, and a data set without label
    histograms is refused."""
    k = 6
    counts = jnp.ones((k, 3)) * jnp.array([4.0, 3.0, 3.0])
    strategy = make_strategy("fedcbs", 2, lam=1.0)
    n = jnp.full((k,), 10, jnp.int32)
    state = strategy.init(jax.random.key(0), SimSpec(k, 2, 10, n, None, 3, counts)).inner
    state = state._replace(pulls=jnp.array([3.0, 2.0, 5.0, 1.0, 2.0, 4.0]))
    sel, _ = strategy.select(
        state, RoundInputs(jnp.int32(3), jnp.ones(k, bool), None, n), None, jax.random.key(1)
    )
    assert int(sel.clients[0]) == 3
    new = strategy.update(state, sel, None).inner
    want = np.array([3.0, 2.0, 5.0, 1.0, 2.0, 4.0])
    want[np.asarray(sel.clients)] += 1
    np.testing.assert_array_equal(np.asarray(new.pulls), want)
    with pytest.raises(ConfigError, match="class histograms"):
        strategy.init(jax.random.key(0), SimSpec(k, 2, 10, n, None))


def test_traced_values_run_as_built():
    """A strategy built with the defaults and initialised at other lam / betas / floor
    (``init_with_hyperparams``, a grid member) selects exactly as one built with them, and the
    values act."""
    from fedjax_sel.strategies.hyperparams import init_with_hyperparams

    rng = np.random.default_rng(6)
    k, m = 16, 4
    counts = jnp.asarray(rng.integers(0, 30, (k, 5)), jnp.float32)
    n = jnp.asarray(counts.sum(axis=1), jnp.int32)
    spec = SimSpec(k, m, 10, n, None, 5, counts)
    other = {"lam": 3.0, "beta_init": 2.0, "beta_final": 4.0, "floor": 1e-8}
    built = make_strategy("fedcbs", m, first="sample")
    target = make_strategy("fedcbs", m, first="sample", **other)

    def run(strategy, state):
        def step(state, xs):
            t, key = xs
            sel, state = strategy.select(
                state, RoundInputs(t, jnp.ones(k, bool), None, n), None, key
            )
            return strategy.update(state, sel, None), sel.clients

        xs = (jnp.arange(6, dtype=jnp.int32), jax.random.split(jax.random.key(1), 6))
        return jax.jit(lambda s: jax.lax.scan(step, s, xs))(state)

    a = run(built, init_with_hyperparams(built, jax.random.key(0), spec, other))
    b = run(target, target.init(jax.random.key(0), spec))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    default = run(built, built.init(jax.random.key(0), spec))
    assert not np.array_equal(np.asarray(default[1]), np.asarray(a[1]))


# ----------------------------------------------------------------------------- candidate pool
def planted_spec(seed=7, k=12, b=4):
    """One-class-heavy clients (a dominant class each plus noise), sizes 20-80."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 6, (k, b)).astype(np.float64)
    counts[np.arange(k), np.arange(k) % b] += rng.integers(20, 80, k)
    n = jnp.asarray(counts.sum(axis=1), jnp.int32)
    return counts, n, SimSpec(k, 3, 10, n, None, b, jnp.asarray(counts, jnp.float32))


@pytest.mark.parametrize(
    "args", [{}, {"first": "sample", "repeats": 1, "lam": 2.0}], ids=["defaults", "sampled"]
)
def test_pool_covering_every_client_is_the_exact_rule(args):
    """``pool >= K`` runs the exact rule: over six rounds (pulls updated, some clients
    unavailable) the cohorts, masks, weights and QCIDs equal the default's, bit for bit."""
    counts, n, spec = planted_spec()
    k, m = counts.shape[0], 3
    avail = jnp.asarray(np.arange(k) % 5 != 2)

    def run(strategy):
        def step(state, xs):
            t, key = xs
            sel, state = strategy.select(state, RoundInputs(t, avail, None, n), None, key)
            out = (sel.clients, sel.mask, sel.weights, sel.diagnostics["qcid"])
            return strategy.update(state, sel, None), out

        xs = (jnp.arange(6, dtype=jnp.int32), jax.random.split(jax.random.key(3), 6))
        return jax.jit(lambda s: jax.lax.scan(step, s, xs))(strategy.init(None, spec))

    exact = run(make_strategy("fedcbs", m, **args))
    for pool in (k, 2 * k):
        got = run(make_strategy("fedcbs", m, pool=pool, **args))
        for x, y in zip(jax.tree.leaves(exact), jax.tree.leaves(got), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_pool_picks_only_pooled_available_clients():
    """With a pool, the strategy's cohort is :func:`pooled_best_of_draws`'s for the round's key,
    whose valid picks are distinct members of the pool, and the pool's valid members are
    distinct available clients (with fewer available than m, only they are picked)."""
    from fedjax_sel.strategies.fedcbs import pooled_best_of_draws

    rng = np.random.default_rng(8)
    k, m, pool = 40, 4, 9
    counts = jnp.asarray(rng.integers(0, 30, (k, 5)), jnp.float32)
    n = jnp.asarray(counts.sum(axis=1), jnp.int32)
    strategy = make_strategy("fedcbs", m, pool=pool)
    state = strategy.init(None, SimSpec(k, m, 10, n, None, 5, counts))
    betas = kc.beta_schedule(m, 1.0, 10.0)
    for avail_np in (rng.random(k) < 0.6, np.isin(np.arange(k), [4, 17, 30])):
        avail = jnp.asarray(avail_np)
        inputs = RoundInputs(jnp.int32(2), avail, None, n)

        def both(key, inputs=inputs, avail=avail):
            sel, _ = strategy.select(state, inputs, None, key)
            ref = pooled_best_of_draws(
                key, counts, avail, pool, m, 6, betas, 1.0, 1e-3, inputs.round,
                state.inner.pulls, "argmax",
            )  # fmt: skip
            return sel.clients, sel.mask, ref

        clients, mask, (rc, rv, _, members, ok) = map(
            lambda t: jax.tree.map(np.asarray, t),
            jax.jit(jax.vmap(both))(jax.random.split(jax.random.key(5), 200)),
        )
        np.testing.assert_array_equal(clients, rc)
        np.testing.assert_array_equal(mask, rv)
        for c, v, mem, o in zip(clients, mask, members, ok, strict=True):
            pooled = set(mem[o].tolist())
            assert len(pooled) == o.sum() == min(pool, avail_np.sum())
            assert pooled <= set(np.flatnonzero(avail_np).tolist())
            assert set(c[v].tolist()) <= pooled and len(set(c[v].tolist())) == v.sum()
            assert v.sum() == min(m, avail_np.sum())


def np_draw_law(counts, cands, m, betas, lam, t, pulls, first):
    """The law of one sequential draw over ``cands`` (NumPy, FedProphet's later picks; the
    first pick FedXplore's sampled score, or FedProphet's argmax, ties to the earliest
    candidate): {frozenset cohort: probability}."""
    law = {}
    s = np_first_scores(counts, cands, betas[0], lam, t, pulls)
    p1 = s / s.sum() if first == "sample" else (np.arange(len(cands)) == np.argmax(s)) * 1.0
    for order in itertools.permutations(cands, m):
        prob = p1[cands.index(order[0])]
        for j in range(1, m):
            rest = [c for c in cands if c not in order[:j]]
            prob *= np_next_probs(counts, list(order[:j]), rest, betas[j])[rest.index(order[j])]
        law[frozenset(order)] = law.get(frozenset(order), 0.0) + prob
    return law


@pytest.mark.parametrize("first,repeats", [("sample", 1), ("argmax", 2)])
def test_pooled_cohort_law_matches_numpy(first, repeats):
    """The pooled rule's law (8 clients, one unavailable, pool 5, m = 3), transcribed in NumPy:
    the average over the 21 equally likely pools of the exact rule's law on the pool; with
    ``repeats = 2`` the lower-QCID of two draws from the same pool, ``P(best = S) = (p_S +
    G_S)^2 - G_S^2`` with ``G_S`` the probability of a draw of higher QCID (the QCIDs are
    distinct). Checked against 20000 rounds of the strategy."""
    rng = np.random.default_rng(9)
    k, m, pool, lam, t = 8, 3, 5, 4.0, 3
    counts = rng.integers(0, 20, (k, 4)).astype(np.float64) + np.eye(k, 4) * 15
    pulls = np.array([1.0, 9.0, 2.0, 6.0, 1.0, 4.0, 3.0, 8.0])  # the bonus moves pick 1
    avail = np.arange(k) != 6
    betas = np_betas(m, 1.0, 3.0)
    pools = list(itertools.combinations(np.flatnonzero(avail).tolist(), pool))
    law = {}
    for members in pools:
        one = np_draw_law(counts, list(members), m, betas, lam, t, pulls, first)
        if repeats == 2:
            q = {s: np_qcid(counts, s) for s in one}
            assert len(set(np.round(list(q.values()), 12))) == len(q)
            higher = {s: sum(p for r, p in one.items() if q[r] > q[s]) for s in one}
            one = {s: (p + higher[s]) ** 2 - higher[s] ** 2 for s, p in one.items()}
        for s, p in one.items():
            law[s] = law.get(s, 0.0) + p / len(pools)
    assert sum(law.values()) == pytest.approx(1.0)
    strategy = make_strategy(
        "fedcbs", m, first=first, repeats=repeats, lam=lam, beta_final=3.0, pool=pool
    )
    state = FedCBSState(jnp.asarray(counts, jnp.float32), jnp.asarray(pulls, jnp.float32))
    inputs = RoundInputs(jnp.int32(t), jnp.asarray(avail), None, jnp.full(k, 10, jnp.int32))
    freq = _assert_cohort_law(strategy, state, inputs, law)
    assert set(freq) <= set(law)


def test_pool_must_hold_a_cohort():
    with pytest.raises(ConfigError, match="pool must be 0 or >= per_round"):
        make_strategy("fedcbs", 5, pool=3)
    with pytest.raises(ConfigError, match="pool"):
        make_strategy("fedcbs", 5, pool=-1)


def _assert_cohort_law(strategy, state, inputs, law, draws: int = 20000) -> dict:
    """The cohorts of ``draws`` selections against ``law`` (cohort -> probability), each
    within 5 standard errors; returns the cohorts' counts."""

    def pick(key):
        sel, _ = strategy.select(state, inputs, None, key)
        return sel.clients, sel.mask

    clients, mask = map(
        np.asarray, jax.jit(jax.vmap(pick))(jax.random.split(jax.random.key(0), draws))
    )
    assert mask.all()
    freq: dict = {}
    for row in clients:
        key = frozenset(row.tolist())
        freq[key] = freq.get(key, 0) + 1
    for key, p in law.items():
        se = np.sqrt(p * (1 - p) / draws)
        assert abs(freq.get(key, 0) / draws - p) <= 5 * se + 1e-4, (sorted(key), freq.get(key), p)
    return freq
