"""Clustered Sampling (Fraboni et al. 2021): Algorithm 1 against a NumPy port of the reference
``get_clusters_with_alg1``, Algorithm 2's urns against a port of ``get_clusters_with_alg2``
(same clusters, the same within-cluster shuffle injected), the fixed-shape Ward against scipy's
``linkage`` with the reference's mass cut, the urn identities ``sum_k r_{k,i} = m p_i`` and
``sum_i r_{k,i} = 1`` (also for clients heavier than one urn), the sampler against the urns,
the planted clusters found by the strategy, and the unbiasedness and variance reduction of the
``1/m``-weighted aggregate, checked empirically."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage

from fedjax_sel.base import RoundInputs, SimSpec
from fedjax_sel.kernels.urns import (
    cluster_layout,
    dissimilarity,
    fast_arccos,
    sample_urns,
    size_layout,
    squared_row_distances,
    urn_matrix,
    ward_flat_clusters,
    ward_weight,
)
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.clustered_sampling import ClusteredSimilarityState

EPS = 10**10


# ------------------------------------------------------------------- NumPy ports of the reference
def reference_alg1(n_sampled: int, weights: np.ndarray) -> np.ndarray:
    """``py_func/clustering.py::get_clusters_with_alg1`` (Accenture/Labs-Federated-Learning,
    branch clustered_sampling), as written."""
    augmented = np.array([w * n_sampled * EPS for w in weights])
    order = np.flip(np.argsort(augmented, kind="stable"))
    r = np.zeros((n_sampled, len(weights))).astype(int)
    k = 0
    for client in order:
        while augmented[client] > 0:
            u = min(EPS - np.sum(r[k]), augmented[client])
            r[k, client] = u
            augmented[client] += -u
            if np.sum(r[k]) == EPS:
                k += 1
    r = r.astype(float)
    return r / r.sum(axis=1, keepdims=True)


def reference_alg2_urns(clusters, n_sampled, weights, shuffle) -> np.ndarray:
    """``get_clusters_with_alg2`` from its flat clusters (1-based labels) on, with its
    ``np.random.shuffle`` replaced by ``shuffle`` (and ``int(new_weight[0] * eps)``)."""
    n_clusters = len(set(clusters))
    ids = sorted(set(clusters))
    pop = np.zeros((n_clusters, 2)).astype(int)
    for i, c in enumerate(ids):
        pop[i, 0] = c
        for client in np.where(clusters == c)[0]:
            pop[i, 1] += int(weights[client] * EPS * n_sampled)
    pop = pop[pop[:, 1].argsort(kind="stable")]
    r = np.zeros((n_sampled, len(clusters))).astype(int)
    for idx, cluster in enumerate(pop[n_clusters - n_sampled :, 0]):
        for client in np.where(clusters == cluster)[0]:
            r[idx, client] = int(weights[client] * n_sampled * EPS)
    k = 0
    for j in pop[: n_clusters - n_sampled, 0]:
        for client in shuffle(np.where(clusters == j)[0]):
            w = int(weights[client] * EPS * n_sampled)
            while w > 0:
                u = min(EPS - np.sum(r[k]), w)
                r[k, client] = u
                w += -u
                if np.sum(r[k]) == EPS:
                    k += 1
    r = r.astype(float)
    return r / r.sum(axis=1, keepdims=True)


def reference_mass_cut(z: np.ndarray, weights: np.ndarray, n_sampled: int) -> np.ndarray:
    """The reference's cut: merge heights := the merged masses, ``fcluster`` at ``1/m``."""
    z = z.copy()
    mass = list(weights)
    for i in range(len(z)):
        new = mass[int(z[i, 0])] + mass[int(z[i, 1])]
        mass.append(new)
        z[i, 2] = int(new * EPS)
    return fcluster(z, int(EPS / n_sampled), criterion="distance")


def same_partition(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return all(
        len(set(b[a == x])) == 1 and len(set(a[b == b[np.flatnonzero(a == x)[0]]])) == 1
        for x in set(a)
    )


CIFAR_SIZES = np.repeat([100, 250, 500, 750, 1000], [10, 30, 30, 20, 10])


# --------------------------------------------------------------------------------- Algorithm 1
@pytest.mark.parametrize("m", [5, 10, 20])
@pytest.mark.parametrize("sizes", ["cifar", "shard"])
def test_alg1_equals_the_reference_code_on_the_papers_settings(m, sizes):
    n = CIFAR_SIZES if sizes == "cifar" else np.full(100, 500)
    n = np.random.default_rng(0).permutation(n)
    want = reference_alg1(m, n / n.sum())
    got = np.asarray(urn_matrix(size_layout(jnp.asarray(n, jnp.int32), m), len(n)))
    np.testing.assert_allclose(got, want, atol=2e-6)


def urn_identities(r, p, m, atol=2e-6):
    assert np.all(r >= -1e-7)
    np.testing.assert_allclose(r.sum(axis=1), 1.0, atol=atol)  # each urn a distribution
    np.testing.assert_allclose(r.sum(axis=0), m * p, atol=atol)  # sum_k r_ki = m p_i


@pytest.mark.parametrize("seed", range(4))
def test_alg1_urn_identities_with_heavy_and_unavailable_clients(seed):
    rng = np.random.default_rng(seed)
    k, m = 30, int(rng.integers(2, 9))
    n = rng.integers(1, 40, k)
    n[rng.random(k) < 0.3] = 0  # unavailable (or empty): never drawn
    n[:2] = [400, 250]  # m p_i > 1: these span several urns
    r = np.asarray(urn_matrix(size_layout(jnp.asarray(n, jnp.int32), m), k))
    urn_identities(r, n / n.sum(), m)
    assert r[:, 0].max() == pytest.approx(1.0)  # a heavy client fills whole urns
    # the closed form of comparators.md section 1(b)
    q = m * n / n.sum()
    order = np.flip(np.argsort(n, kind="stable"))
    c = np.concatenate([[0.0], np.cumsum(q[order])])
    closed = np.zeros((m, k))
    for j, i in enumerate(order):
        for u in range(m):
            closed[u, i] = max(0.0, min(c[j + 1], u + 1) - max(c[j], u))
    np.testing.assert_allclose(r, closed, atol=2e-6)


# --------------------------------------------------------------------------------- Algorithm 2
@pytest.mark.parametrize("seed", range(3))
def test_alg2_urns_equal_the_reference_pouring(seed):
    """The same flat clusters and the same within-cluster order: the same urns."""
    rng = np.random.default_rng(seed)
    k, m = 40, 5
    n = rng.integers(20, 400, k)
    n = n * 1000 + np.arange(k)  # distinct cluster masses: no tie in the sort of clusters
    labels = rng.integers(0, 11, k)  # 11 clusters, all lighter than 1/m, distinct masses
    key = jax.random.key(seed)
    layout = cluster_layout(jnp.asarray(n, jnp.int32), jnp.asarray(labels, jnp.int32), m, key)
    got = np.asarray(urn_matrix(layout, k))
    order_key = np.asarray(jax.random.uniform(key, (k,)))  # the kernel's shuffle
    want = reference_alg2_urns(
        labels + 1, m, n / n.sum(), lambda ids: ids[np.argsort(order_key[ids], kind="stable")]
    )
    np.testing.assert_allclose(got, want, atol=2e-6)


@pytest.mark.parametrize("seed", range(6))
def test_alg2_urn_identities_for_any_clusters(seed):
    """Any labels (few clusters, seeds heavier than one urn, unavailable clients): the urns
    still split every client's mass ``m p_i`` exactly (the reference breaks when a seed is
    heavier than ``1/m``)."""
    rng = np.random.default_rng(seed)
    k, m = 25, int(rng.integers(2, 8))
    n = rng.integers(1, 50, k)
    n[rng.random(k) < 0.25] = 0
    if seed % 2:
        n[3] = 2000  # one client heavier than several urns
    labels = rng.integers(0, int(rng.integers(1, 2 * m + 2)), k)
    layout = cluster_layout(jnp.asarray(n, jnp.int32), jnp.asarray(labels), m, jax.random.key(seed))
    urn_identities(np.asarray(urn_matrix(layout, k)), n / n.sum(), m)


def test_sampler_draws_each_urn_from_its_row():
    k, m, draws = 20, 4, 40000
    rng = np.random.default_rng(1)
    n = rng.integers(1, 30, k)
    n[5] = 150
    labels = rng.integers(0, 7, k)
    layout = cluster_layout(jnp.asarray(n, jnp.int32), jnp.asarray(labels), m, jax.random.key(0))
    r = np.asarray(urn_matrix(layout, k))
    picks, valid = jax.jit(jax.vmap(lambda key: sample_urns(layout, key)))(
        jax.random.split(jax.random.key(2), draws)
    )
    assert np.asarray(valid).all()
    picks = np.asarray(picks)
    for urn in range(m):
        freq = np.bincount(picks[:, urn], minlength=k) / draws
        np.testing.assert_allclose(freq, r[urn], atol=4 * np.sqrt(0.25 / draws))
        assert np.all(freq[r[urn] == 0] == 0)


# ------------------------------------------------------------------------------------ Ward
@pytest.mark.parametrize("seed", range(4))
def test_ward_and_mass_cut_match_scipy(seed):
    """Euclidean Ward on continuous random points: the same flat clusters as scipy's
    ``linkage(X, "ward")`` cut by the reference (merge heights := masses, ``t = 1/m``)."""
    rng = np.random.default_rng(seed)
    k, m = 30, 4
    x = rng.normal(size=(k, 5))
    n = rng.integers(1, 20, k)
    p = n / n.sum()
    want = reference_mass_cut(linkage(x, "ward"), p, m)
    sq = squared_row_distances(jnp.asarray(x, jnp.float32))
    labels, merges = ward_flat_clusters(
        sq, jnp.ones(k), jnp.asarray(n, jnp.float32), jnp.ones(k, bool), n.sum() / m * (1 + 1e-6)
    )
    assert int(merges) == k - 1
    assert same_partition(np.asarray(labels), want)


def test_ward_rows_of_the_square_matrix_like_the_reference():
    """The reference's ``linkage(D, "ward")`` on the square arccos matrix: Ward on its rows."""
    rng = np.random.default_rng(5)
    k, m = 24, 3
    g = rng.normal(size=(k, 8))
    d = np.asarray(dissimilarity(jnp.asarray(g), jnp.asarray(g), "arccos"), np.float64)
    n = rng.integers(1, 20, k)
    want = reference_mass_cut(linkage(d, "ward"), n / n.sum(), m)
    labels, _ = ward_flat_clusters(
        squared_row_distances(jnp.asarray(d, jnp.float32)),
        jnp.ones(k),
        jnp.asarray(n, jnp.float32),
        jnp.ones(k, bool),
        n.sum() / m * (1 + 1e-6),
    )
    assert same_partition(np.asarray(labels), want)


def test_ward_on_weighted_groups_is_ward_on_coincident_points():
    """The large-K path's groups (``s`` coincident points) agglomerate as scipy does on the
    expanded point set."""
    rng = np.random.default_rng(3)
    r, m = 12, 3
    x = rng.normal(size=(r, 4))
    s = rng.integers(1, 4, r)
    expanded = np.repeat(x, s, axis=0)
    owner = np.repeat(np.arange(r), s)
    mass = np.ones(len(expanded))  # one unit per point
    want = reference_mass_cut(linkage(expanded, "ward"), mass / mass.sum(), m)
    sq = ward_weight(jnp.asarray(s)) * squared_row_distances(jnp.asarray(x, jnp.float32))
    labels, _ = ward_flat_clusters(
        sq,
        jnp.asarray(s, jnp.float32),
        jnp.asarray(s, jnp.float32),
        jnp.ones(r, bool),
        s.sum() / m * (1 + 1e-6),
    )
    assert same_partition(np.asarray(labels)[owner], want)


def numpy_generic_ward(sq, sizes, masses, alive, limit):
    """The generic agglomerative loop, literally: each step merges the first row (by index)
    whose nearest distance is the smallest with that row's first nearest index, scipy's Ward
    update in squared form, the mass cut while merging; every row's neighbour recomputed."""
    r = len(sq)
    e = np.where(np.eye(r, dtype=bool) | ~(alive[:, None] & alive[None, :]), np.inf, sq)
    e = 0.5 * (e + e.T)
    s, mass, live = sizes.astype(np.float64), masses.astype(np.float64), alive.copy()
    lab = np.arange(r)
    for _ in range(r - 1):
        nn_d = e.min(axis=1)
        a0 = int(np.argmin(nn_d))
        if not np.isfinite(nn_d[a0]):
            break
        b0 = int(np.argmin(e[a0]))
        a, b = min(a0, b0), max(a0, b0)
        new = ((s + s[a]) * e[a] + (s + s[b]) * e[b] - s * e[a, b]) / (s + s[a] + s[b])
        keep = live & (np.arange(r) != a) & (np.arange(r) != b)
        new = np.where(keep, np.maximum(new, 0.0), np.inf)
        e[a, :], e[:, a], e[b, :], e[:, b] = new, new, np.inf, np.inf
        live[b] = False
        if mass[a] + mass[b] <= limit:
            lab[lab == lab[b]] = lab[a]
        s[a] += s[b]
        mass[a] += mass[b]
    return lab


@pytest.mark.parametrize("keep_ties", [True, False])
@pytest.mark.parametrize("nonzero", [0, 3, 20, 40])
def test_ward_with_tied_clients_matches_the_literal_loop(nonzero, keep_ties):
    """Clients never selected (G = 0) are all at arccos distance 0 from each other: with 60
    clients, most of them tied, the flat clusters are the literal generic loop's (every row's
    neighbour recomputed each step, ties to the lowest index), whether the kernel keeps the
    tied rows' neighbours (the default) or recomputes them (benchmarks/ward_ties.py times
    both)."""
    rng = np.random.default_rng(nonzero)
    k, m = 60, 6
    g = np.zeros((k, 5), np.float32)
    g[rng.permutation(k)[:nonzero]] = rng.normal(size=(nonzero, 5))
    d = dissimilarity(jnp.asarray(g), jnp.asarray(g), "arccos")
    sq = np.asarray(squared_row_distances(d), np.float64)
    n = rng.integers(1, 20, k).astype(np.float64)
    alive = rng.random(k) < 0.9
    limit = n[alive].sum() / m * (1 + 1e-6)
    want = numpy_generic_ward(np.asarray(sq, np.float32), np.ones(k), n, alive, limit)
    labels, merges = ward_flat_clusters(
        jnp.asarray(sq, jnp.float32),
        jnp.ones(k),
        jnp.asarray(n),
        jnp.asarray(alive),
        limit,
        keep_ties,
    )
    assert int(merges) == alive.sum() - 1
    np.testing.assert_array_equal(np.asarray(labels)[alive], want[alive])


def test_fast_arccos_is_float32_accurate():
    x = np.linspace(-1.0, 1.0, 100001).astype(np.float32)
    got = np.asarray(fast_arccos(jnp.asarray(x)), np.float64)
    np.testing.assert_allclose(got, np.arccos(x.astype(np.float64)), atol=1e-6)


def test_dissimilarities_follow_the_reference_definitions():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(6, 5)).astype(np.float32)
    g[2] = 0.0  # a client never drawn
    d = {
        m: np.asarray(dissimilarity(jnp.asarray(g), jnp.asarray(g), m))
        for m in ("arccos", "l2", "l1")
    }
    for i in range(6):
        for j in range(6):
            a, b = g[i], g[j]
            na, nb = np.linalg.norm(a), np.linalg.norm(b)
            cos = 0.0 if na == 0 or nb == 0 else np.arccos(np.clip(a @ b / (na * nb), -1, 1))
            assert d["arccos"][i, j] == pytest.approx(cos, abs=2e-3)
            assert d["l2"][i, j] == pytest.approx(np.sum((a - b) ** 2), rel=1e-4, abs=1e-4)
            assert d["l1"][i, j] == pytest.approx(np.sum(np.abs(a - b)), rel=1e-5)


# ---------------------------------------------------------------------- the strategy, planted
K, GROUPS = 40, 4


def planted_state(seed=0, d=16):
    """Four groups of ten clients, each group's updates around its own direction."""
    rng = np.random.default_rng(seed)
    centers = np.eye(d)[:GROUPS] * 3.0
    group = np.repeat(np.arange(GROUPS), K // GROUPS)
    rng.shuffle(group)
    grads = centers[group] + 0.2 * rng.normal(size=(K, d))
    state = ClusteredSimilarityState(jnp.asarray(grads, jnp.float32), jnp.arange(d))
    return state, group


def run_select(strategy, state, keys, available=None, sizes=None):
    available = jnp.ones(K, bool) if available is None else jnp.asarray(available)
    sizes = jnp.full(K, 10, jnp.int32) if sizes is None else jnp.asarray(sizes, jnp.int32)
    inputs = RoundInputs(jnp.int32(0), available, {}, sizes)
    select = jax.jit(jax.vmap(lambda k: strategy.select(state, inputs, None, k)[0]))
    return select(keys)


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"measure": "l2"},
        {"measure": "l1", "ward_input": "condensed"},
        {"measure": "arccos", "ward_input": "condensed"},
        {"pool": 16},
    ],
    ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()) or "defaults",
)
def test_planted_clusters_are_the_urns(args):
    """Equal sizes, four well-separated groups and m = 4: the flat clusters are the groups
    (mass exactly 1/m each), each seeds one urn, so every round draws one client per group."""
    state, group = planted_state()
    strategy = make_strategy("clustered_similarity", GROUPS, **args)
    sel = run_select(strategy, state, jax.random.split(jax.random.key(0), 64))
    assert np.all(np.asarray(sel.diagnostics["clusters"]) == GROUPS)
    clients, mask = np.asarray(sel.clients), np.asarray(sel.mask)
    assert mask.all()  # four different clients: no duplicate to merge
    for row in clients:
        assert sorted(group[row]) == list(range(GROUPS))
    np.testing.assert_allclose(np.asarray(sel.weights), 1.0 / GROUPS)


def test_update_records_the_selected_clients_updates():
    from fedjax_sel.base import RoundFeedback, Selection

    strategy = make_strategy("clustered_similarity", 3)
    spec = SimSpec(K, 3, 5, jnp.full(K, 10, jnp.int32), {"w": jnp.zeros((2, 3))})
    state = strategy.init(jax.random.key(0), spec)
    deltas = {"w": jnp.arange(18, dtype=jnp.float32).reshape(3, 2, 3)}
    sel = Selection(jnp.array([4, 7, 9]), jnp.array([True, False, True]), jnp.ones(3) / 3)
    z = jnp.zeros(3)
    fb = RoundFeedback(0, jnp.ones(K, bool), None, None, deltas, z, z, z, z, z, z)
    grads = np.asarray(strategy.update(state, sel, fb).grads)
    np.testing.assert_array_equal(grads[4], np.arange(6))
    np.testing.assert_array_equal(grads[9], np.arange(12, 18))
    assert not grads[7].any() and np.count_nonzero(grads.any(axis=1)) == 2


# ---------------------------------------------------------- unbiasedness and variance (empirical)
@pytest.mark.parametrize(
    "name, args",
    [("clustered_size", {}), ("clustered_similarity", {}), ("clustered_similarity", {"pool": 9})],
)
def test_weighted_aggregate_is_unbiased_with_less_variance_than_md(name, args):
    """``omega_i = sum of the weights of client i's slot`` over many rounds: mean ``p_i``
    (renormalised over the available clients), so the aggregate ``sum_i omega_i U_i`` has mean
    ``sum_i p_i U_i``; and ``sum_i Var[omega_i]`` below MD sampling's ``sum p_i (1 - p_i) / m``.
    A third of the clients were never selected (``G = 0``)."""
    rng = np.random.default_rng(4)
    m, rounds = 5, 12000
    sizes = rng.integers(5, 60, K)
    available = rng.random(K) < 0.8
    p = np.where(available, sizes, 0) / np.where(available, sizes, 0).sum()
    state, _ = planted_state(seed=1)
    state = state._replace(grads=state.grads.at[: K // 3].set(0.0))
    strategy = make_strategy(name, m, **args)
    if name == "clustered_size":
        state = strategy.init(jax.random.key(0), None)
    sel = run_select(strategy, state, jax.random.split(jax.random.key(1), rounds), available, sizes)
    clients, weights = np.asarray(sel.clients), np.asarray(sel.weights)
    assert np.all(available[clients[np.asarray(sel.mask)]])
    omega = np.zeros((rounds, K))
    np.add.at(omega, (np.repeat(np.arange(rounds), m), clients.ravel()), weights.ravel())
    np.testing.assert_allclose(omega.sum(axis=1), 1.0, atol=1e-5)
    se = np.sqrt(p * (1 - p) / m / rounds) + 1e-9
    assert np.all(np.abs(omega.mean(axis=0) - p) < 5 * se)
    u = rng.normal(size=(K, 3))
    agg = omega @ u
    agg_se = agg.std(axis=0) / np.sqrt(rounds)
    assert np.all(np.abs(agg.mean(axis=0) - p @ u) < 5 * agg_se + 1e-9)
    assert omega.var(axis=0).sum() < 0.9 * np.sum(p * (1 - p)) / m
