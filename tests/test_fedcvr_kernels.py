"""FedCVR-Bolt kernels against independent NumPy references: affinities (eq. 4, appendix B.1),
the normalised-Laplacian embedding (dense ``numpy.linalg.eigh``), k-means (brute force), the
streaming value vector (explicit ``C^d`` matrices, eqs. 5, 6, 11) and the Boltzmann draw (eq. 8).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.kernels.affinity import affinity_matrix, kernel_values, normalize_rows
from fedjax_sel.kernels.boltzmann import coalition_probabilities, sample_per_coalition
from fedjax_sel.kernels.covariance import covariance_update, init_covariance, value_vector
from fedjax_sel.kernels.kmeans import adjusted_rand_index, kmeans
from fedjax_sel.kernels.spectral import (
    CoalitionConfig,
    coalition_embedding,
    kernel_spectral_embedding,
    landmark_spectral_embedding,
    spectral_clustering,
    spectral_embedding,
)


def planted(rng: np.random.Generator, sizes, dim=6, spread=0.05):
    """Unit-norm points around ``len(sizes)`` well separated directions, and their labels."""
    centers = np.linalg.qr(rng.normal(size=(dim, len(sizes))))[0].T  # orthonormal directions
    x = np.concatenate(
        [c + spread * rng.normal(size=(n, dim)) for c, n in zip(centers, sizes, strict=True)]
    )
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return x.astype(np.float32), labels


def ari_numpy(a, b):
    """Adjusted Rand index by explicit pair counting (Hubert and Arabie 1985)."""
    n = len(a)
    pairs = list(itertools.combinations(range(n), 2))
    same_a = np.array([a[i] == a[j] for i, j in pairs])
    same_b = np.array([b[i] == b[j] for i, j in pairs])
    index = np.sum(same_a & same_b)
    expected = same_a.sum() * same_b.sum() / len(pairs)
    max_index = 0.5 * (same_a.sum() + same_b.sum())
    return 1.0 if max_index == expected else (index - expected) / (max_index - expected)


def dense_normalized_adjacency(w):
    s = np.maximum(0.5 * (w + w.T), 0.0)
    d = s.sum(1)
    inv = np.where(d > 0, 1.0 / np.sqrt(np.where(d > 0, d, 1.0)), 0.0)
    return inv[:, None] * s * inv[None, :], inv


def projector(u):
    q, _ = np.linalg.qr(np.asarray(u, np.float64))
    return q @ q.T


# ---------------------------------------------------------------- affinities (eq. 4, B.1)


def test_affinities_match_numpy_formulas():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 4)).astype(np.float32)
    d2 = ((x[:, None] - x[None]) ** 2).sum(-1)
    d1 = np.abs(x[:, None] - x[None]).sum(-1)
    ip = x @ x.T
    nrm = np.linalg.norm(x, axis=1)
    g = 0.3
    rbf = np.exp(-g * d2)
    expected = {
        "rbf": rbf / rbf.sum(1, keepdims=True),  # eq. 4, row-normalised
        "cosine": ip / np.outer(nrm, nrm),
        "laplacian": np.exp(-g * d1),
        "sigmoid": np.tanh(g * ip + 0.5),
    }
    for kind, ref in expected.items():
        got = affinity_matrix(jnp.asarray(x), kind, gamma=g, coef0=0.5)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-4, atol=2e-5, err_msg=kind)
    plain = kernel_values(jnp.asarray(x), jnp.asarray(x), "rbf", gamma=g)
    np.testing.assert_allclose(np.asarray(plain), rbf, rtol=2e-4, atol=2e-6)
    # gamma = 0: one over the mean squared distance
    auto = affinity_matrix(jnp.asarray(x), "rbf", gamma=0.0, row_normalize=False)
    np.testing.assert_allclose(np.asarray(auto), np.exp(-d2 / d2.mean()), rtol=2e-4, atol=2e-6)


def test_eq4_rows_sum_to_one_without_underflow():
    x = jnp.asarray([[0.0], [10.0], [20.0]])
    w = np.asarray(affinity_matrix(x, "rbf", gamma=50.0))  # exp(-5000) underflows naively
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.diag(w), 1.0, rtol=1e-6)


def test_affinity_bad_input_errors():
    x = jnp.ones((3, 2))
    with pytest.raises(ConfigError, match="poly"):
        affinity_matrix(x, "poly")
    with pytest.raises(ConfigError, match="-1"):
        affinity_matrix(x, "rbf", gamma=-1.0)


# ---------------------------------------------------------------- spectral embedding


@pytest.mark.parametrize("kind", ["rbf", "cosine", "laplacian", "sigmoid"])
def test_exact_embedding_matches_dense_eigh(kind):
    rng = np.random.default_rng(1)
    x, _ = planted(rng, [8, 10, 7], spread=0.15)
    x = np.asarray(normalize_rows(jnp.asarray(x)))
    p = 3
    w = np.asarray(affinity_matrix(jnp.asarray(x), kind, gamma=2.0), np.float64)
    m, inv = dense_normalized_adjacency(w)
    vals, vecs = np.linalg.eigh(m)
    top_vals, top_vecs = vals[::-1][:p], vecs[:, ::-1][:, :p]
    # dense eigh is exact; block Krylov is iterative (laplacian's gap ratio 0.95 / 0.55 is the
    # slowest case here)
    solvers = (
        (("eigh", 1e-4), ("krylov", 5e-3)) if kind in ("rbf", "laplacian") else (("eigh", 1e-4),)
    )
    for solver, tol in solvers:
        emb = kernel_spectral_embedding(
            jnp.asarray(x),
            p,
            jax.random.key(0),
            kind=kind,
            gamma=2.0,
            scaling="none",
            solver=solver,
            steps=8,
        )
        np.testing.assert_allclose(np.asarray(emb.eigenvalues), top_vals, atol=tol)
        np.testing.assert_allclose(projector(emb.points), projector(top_vecs), atol=2 * tol)
    # from the affinity matrix itself, with scikit-learn's degree scaling
    emb = spectral_embedding(jnp.asarray(w, jnp.float32), p, scaling="degree")
    np.testing.assert_allclose(projector(emb.points), projector(top_vecs * inv[:, None]), atol=2e-3)


def test_landmark_embedding_with_all_landmarks_is_exact():
    rng = np.random.default_rng(2)
    x, _ = planted(rng, [6, 9, 5], spread=0.2)
    k, p = len(x), 3
    for kind in ("rbf", "laplacian"):
        exact = kernel_spectral_embedding(jnp.asarray(x), p, kind=kind, gamma=1.5, solver="eigh")
        land = landmark_spectral_embedding(
            jnp.asarray(x),
            p,
            jax.random.key(3),
            num_landmarks=k,
            kind=kind,
            gamma=1.5,
            landmarks=jnp.arange(k),
        )
        np.testing.assert_allclose(
            np.asarray(land.eigenvalues), np.asarray(exact.eigenvalues), atol=1e-3
        )
        np.testing.assert_allclose(
            projector(land.points), projector(exact.points), atol=5e-3, err_msg=kind
        )


def test_coalition_embedding_is_what_spectral_clustering_clusters():
    """Exact path: the normalised adjacency's top eigenvalues (dense NumPy eigh of eq. 4's
    row-normalised RBF affinity); landmark path with every client a landmark: the same
    spectrum; and the coalitions are k-means on exactly this embedding (with the key split as
    spectral_clustering splits it)."""
    rng = np.random.default_rng(6)
    x, _ = planted(rng, [9, 7, 8], spread=0.1)
    p = 3
    m, _ = dense_normalized_adjacency(
        np.asarray(affinity_matrix(jnp.asarray(x), "rbf"), np.float64)
    )
    top = np.linalg.eigvalsh(m)[::-1][:p]
    key = jax.random.key(7)
    for config in (
        CoalitionConfig(method="exact"),
        CoalitionConfig(method="landmark", landmarks=24),
    ):
        emb = coalition_embedding(jnp.asarray(x), p, key, config)
        np.testing.assert_allclose(
            np.asarray(emb.eigenvalues), top, atol=1e-3, err_msg=config.method
        )
        k_embed, k_means = jax.random.split(key)
        points = coalition_embedding(jnp.asarray(x), p, k_embed, config).points
        expected = kmeans(k_means, points, p, n_init=config.n_init, max_iter=config.max_iter).labels
        np.testing.assert_array_equal(spectral_clustering(jnp.asarray(x), p, key, config), expected)


@pytest.mark.parametrize("method", ["exact", "landmark"])
def test_spectral_clustering_recovers_planted_coalitions(method):
    rng = np.random.default_rng(4)
    sizes = [30, 20, 25, 15]
    x, truth = planted(rng, sizes, dim=8)
    perm = rng.permutation(len(x))
    x, truth = x[perm], truth[perm]
    config = CoalitionConfig(method=method, landmarks=24, gamma=1.0, n_init=2)
    labels = np.asarray(spectral_clustering(jnp.asarray(x), 4, jax.random.key(5), config))
    assert ari_numpy(labels, truth) > 0.99
    assert sorted(np.bincount(labels, minlength=4)) == sorted(sizes)


# ---------------------------------------------------------------- k-means


def test_kmeans_finds_brute_force_optimum():
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.normal(0, 0.3, (4, 2)), rng.normal(3, 0.3, (5, 2))]).astype(np.float32)
    best = np.inf
    for assign in itertools.product(range(2), repeat=len(x)):
        a = np.array(assign)
        if len(set(assign)) < 2:
            continue
        best = min(best, sum(((x[a == c] - x[a == c].mean(0)) ** 2).sum() for c in range(2)))
    res = kmeans(jax.random.key(0), jnp.asarray(x), 2, n_init=3)
    assert float(res.inertia) == pytest.approx(best, rel=1e-4)
    a = np.asarray(res.labels)
    inertia = sum(((x[a == c] - x[a == c].mean(0)) ** 2).sum() for c in range(2))
    assert inertia == pytest.approx(best, rel=1e-4)


def test_kmeans_degenerate_points_and_empty_clusters():
    # 3 distinct positions, 5 clusters: every label valid, no NaN centers, zero inertia
    x = jnp.asarray(np.repeat(np.eye(3, dtype=np.float32), 4, axis=0))
    res = kmeans(jax.random.key(1), x, 5, max_iter=20, n_init=1)
    labels = np.asarray(res.labels)
    assert labels.min() >= 0 and labels.max() < 5
    assert np.all(np.isfinite(np.asarray(res.centers)))
    assert float(res.inertia) == pytest.approx(0.0, abs=1e-6)
    # identical points
    same = kmeans(jax.random.key(2), jnp.ones((6, 2)), 3, n_init=1)
    assert np.all(np.isfinite(np.asarray(same.centers)))
    with pytest.raises(ConfigError, match="k=7"):
        kmeans(jax.random.key(0), jnp.ones((6, 2)), 7)


def test_kmeans_relocates_an_empty_cluster():
    from fedjax_sel.kernels.kmeans import lloyd

    x = jnp.asarray([[0.0], [0.1], [5.0], [5.1], [10.0]])
    # the third center starts far from every point: it must be moved onto a point
    res = lloyd(x, jnp.asarray([[0.05], [5.05], [100.0]]), max_iter=10)
    assert sorted(np.bincount(np.asarray(res.labels), minlength=3)) == [1, 2, 2]


def test_kmeans_fitted_on_a_sample_stays_close_to_the_full_fit():
    # 12 planted clusters of unequal size in 12-D (3,000 points); fitting on 20 points per
    # cluster, then one Lloyd step on every point: separated clusters (centers 3 sigma apart
    # per coordinate) come out exactly as the full fit's; overlapping ones (2 sigma) within 2%
    # of its inertia and 0.02 of its ARI against the truth
    rng = np.random.default_rng(11)
    sizes = rng.multinomial(3000 - 12 * 40, np.full(12, 1 / 12)) + 40
    truth = np.repeat(np.arange(12), sizes)
    noise = rng.normal(size=(3000, 12))
    directions = rng.normal(size=(12, 12))
    for separation, inertia_bound, ari_gap in ((3.0, 1.0 + 1e-5, 0.0), (2.0, 1.02, 0.02)):
        x = (separation * directions[truth] + noise).astype(np.float32)
        full = kmeans(jax.random.key(0), jnp.asarray(x), 12, n_init=4)
        sampled = kmeans(jax.random.key(0), jnp.asarray(x), 12, n_init=4, sample=240)
        labels = np.asarray(sampled.labels)
        centers = np.asarray(sampled.centers)
        # every point sits at its nearest center, each center is its members' mean, and the
        # inertia is over all 3,000 points (NumPy)
        d2 = ((x[:, None, :] - centers[None]) ** 2).sum(-1)
        np.testing.assert_array_equal(labels, d2.argmin(1))
        assert float(sampled.inertia) == pytest.approx(d2.min(1).sum(), rel=1e-4)
        assert float(sampled.inertia) <= inertia_bound * float(full.inertia)
        full_ari = ari_numpy(np.asarray(full.labels), truth)
        assert ari_numpy(labels, truth) >= full_ari - ari_gap - 1e-6
    np.testing.assert_allclose(
        centers[labels[0]], x[labels == labels[0]].mean(0), rtol=1e-4, atol=1e-5
    )
    with pytest.raises(ConfigError, match="sample"):
        kmeans(jax.random.key(0), jnp.asarray(x), 12, sample=5)


def test_kmeans_in_blocks_equals_one_pass(monkeypatch):
    """Above ``BLOCK_ELEMENTS`` point-center pairs the assignment runs over blocks of rows (the
    last block overlapping the one before it) and the recentering sums by segment: the same
    labels as one pass, the same distances and centers up to float rounding. Planted: 1,003
    points in 7 clusters, blocks of 100 rows (11 blocks, the last one starting at row 903)."""
    from fedjax_sel.kernels import kmeans as kmeans_lib

    rng = np.random.default_rng(5)
    truth = rng.integers(0, 7, 1003)
    x = 4.0 * rng.normal(size=(7, 5))[truth] + rng.normal(size=(1003, 5))
    x = jnp.asarray(x, jnp.float32)
    centers = x[:7] + 0.5
    one_labels, one_near = kmeans_lib._assign(x, centers)
    one_centers = kmeans_lib._recenter(x, one_labels, one_near, 7)
    monkeypatch.setattr(kmeans_lib, "BLOCK_ELEMENTS", 7 * 100)
    assert kmeans_lib._block_rows(1003, 7) == 100
    labels, near = kmeans_lib._assign(x, centers)
    np.testing.assert_array_equal(np.asarray(labels), np.asarray(one_labels))
    np.testing.assert_allclose(np.asarray(near), np.asarray(one_near), rtol=1e-5, atol=1e-5)
    blocked = np.asarray(kmeans_lib._recenter(x, labels, near, 7))
    np.testing.assert_allclose(blocked, np.asarray(one_centers), rtol=1e-5, atol=1e-6)
    # NumPy: each point's nearest center, each center its members' mean
    xs = np.asarray(x)
    d2 = ((xs[:, None] - np.asarray(centers)[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(np.asarray(labels), d2.argmin(1))
    for c in range(7):
        want = xs[np.asarray(labels) == c].mean(0)
        np.testing.assert_allclose(blocked[c], want, rtol=1e-5, atol=1e-5)
    # an empty cluster is still moved onto one of the points in the blocked path
    far = jnp.concatenate([centers[:6], jnp.full((1, 5), 1e3, jnp.float32)])
    lab, nr = kmeans_lib._assign(x, far)
    moved = kmeans_lib._recenter(x, lab, nr, 7)
    assert int(jnp.sum(lab == 6)) == 0
    assert bool(jnp.any(jnp.all(moved[6][None] == x, axis=1)))


def test_coalition_config_samples_kmeans_only_on_the_landmark_path_by_default():
    auto = CoalitionConfig()
    assert auto.kmeans_rows(1_000, 10) == 0  # exact path: every client
    assert auto.kmeans_rows(100_000, 10) == 200  # landmark path: 20 per coalition
    assert auto.kmeans_rows(150, 10) == 0  # a sample larger than K is every client
    assert CoalitionConfig(kmeans_sample=0).kmeans_rows(10**6, 10) == 0
    assert CoalitionConfig(kmeans_sample=500).kmeans_rows(1_000, 10) == 500
    with pytest.raises(ConfigError, match="kmeans_sample=5"):
        CoalitionConfig(kmeans_sample=5).kmeans_rows(1_000, 10)
    with pytest.raises(ConfigError, match="kmeans_sample"):
        CoalitionConfig(kmeans_sample=-2).validate()


def test_adjusted_rand_index_matches_pair_counting():
    rng = np.random.default_rng(7)
    for _ in range(5):
        a, b = rng.integers(0, 3, 15), rng.integers(0, 4, 15)
        got = float(adjusted_rand_index(jnp.asarray(a), jnp.asarray(b), 3, 4))
        assert got == pytest.approx(ari_numpy(a, b), abs=1e-5)
    perm = np.array([2, 0, 1])
    assert float(adjusted_rand_index(jnp.asarray(a), jnp.asarray(perm[a]), 3, 3)) == 1.0


def test_contingency_counts_equal_numpy():
    from fedjax_sel.kernels.kmeans import contingency

    rng = np.random.default_rng(8)
    a, b = rng.integers(0, 5, 2000), rng.integers(0, 3, 2000)
    want, _, _ = np.histogram2d(a, b, bins=(np.arange(6) - 0.5, np.arange(4) - 0.5))
    got = np.asarray(contingency(jnp.asarray(a), jnp.asarray(b), 5, 3))
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- value vector (eqs. 5, 6, 11)


def test_streaming_value_vector_equals_dense_covariances():
    rng = np.random.default_rng(8)
    k, d, steps = 6, 3, 5
    n = rng.integers(5, 50, k).astype(np.float64)
    alpha = n / n.sum()
    cov = [np.eye(k) * 0.7 for _ in range(d)]  # C^d(1) = 0.7 I
    state = init_covariance(jnp.asarray(alpha, jnp.float32), d, scale=0.7)
    for t in range(1, steps + 1):
        u = rng.normal(size=(k, d))
        gamma = 1.0 / t
        cov = [(1 - gamma) * c + gamma * np.outer(u[:, j], u[:, j]) for j, c in enumerate(cov)]
        state = covariance_update(state, jnp.asarray(u, jnp.float32), jnp.asarray(alpha))
        # v_k = sum_d (C^d alpha)_k^2 / C^d_kk with the explicit K x K matrices
        v_dense = sum((c @ alpha) ** 2 / np.diag(c) for c in cov)
        got = np.asarray(value_vector(state.c_alpha, state.c_diag))
        np.testing.assert_allclose(got, v_dense, rtol=1e-4)
    assert int(state.count) == steps


def test_value_vector_zero_variance_is_zero_not_nan():
    c_alpha = jnp.asarray([[0.0, 1.0], [0.0, 0.0]])
    c_diag = jnp.asarray([[0.0, 2.0], [0.0, 0.0]])
    v = np.asarray(value_vector(c_alpha, c_diag))
    np.testing.assert_allclose(v, [0.5, 0.0])
    # identical residuals everywhere: zero diagonal after gamma = 1
    state = init_covariance(jnp.full((4,), 0.25), 3)
    state = covariance_update(state, jnp.zeros((4, 3)), jnp.full((4,), 0.25))
    assert np.all(np.asarray(value_vector(state.c_alpha, state.c_diag)) == 0.0)


# ---------------------------------------------------------------- Boltzmann (eq. 8)


def test_coalition_probabilities_are_softmax_per_coalition():
    rng = np.random.default_rng(9)
    v = rng.normal(size=12).astype(np.float32) * 3
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 3, 0, 1, 2])  # coalition 3 has one client
    beta = 0.7
    probs = np.asarray(coalition_probabilities(jnp.asarray(v), jnp.asarray(labels), 4, beta))
    for c in range(4):
        members = labels == c
        e = np.exp(beta * v[members])
        np.testing.assert_allclose(probs[members], e / e.sum(), rtol=1e-5)
    assert probs[8] == pytest.approx(1.0)
    # with a mask: ineligible clients get 0, the rest renormalise
    mask = np.ones(12, bool)
    mask[[0, 3]] = False
    probs = np.asarray(
        coalition_probabilities(jnp.asarray(v), jnp.asarray(labels), 4, beta, jnp.asarray(mask))
    )
    assert probs[0] == probs[3] == 0.0
    e = np.exp(beta * v[[6, 9]])
    np.testing.assert_allclose(probs[[6, 9]], e / e.sum(), rtol=1e-5)


def test_large_values_give_no_nan():
    v = jnp.asarray([1e30, 3e38, np.inf, 5.0, np.nan, -np.inf])
    labels = jnp.asarray([0, 0, 0, 1, 1, 1])
    probs = np.asarray(coalition_probabilities(v, labels, 2, 10.0))
    assert np.all(np.isfinite(probs))
    np.testing.assert_allclose([probs[:3].sum(), probs[3:].sum()], 1.0, rtol=1e-6)
    assert probs[3] == pytest.approx(1.0)  # NaN is ineligible, -inf has probability 0
    clients, ok = sample_per_coalition(jax.random.key(0), v, labels, 2, 10.0)
    assert np.all(np.asarray(ok))
    assert int(clients[1]) == 3 and int(clients[0]) in (1, 2)


def test_sampling_frequencies_follow_eq8():
    v = jnp.asarray([0.0, 1.0, 2.0, -1.0, 0.5, 0.0, 3.0])
    labels = jnp.asarray([0, 0, 0, 1, 1, 2, 1])
    mask = jnp.asarray([True, True, True, True, True, False, True])
    probs = np.asarray(coalition_probabilities(v, labels, 3, 1.0, mask))
    n = 20000
    keys = jax.random.split(jax.random.key(1), n)
    draw = jax.jit(jax.vmap(lambda k: sample_per_coalition(k, v, labels, 3, 1.0, mask)))
    clients, ok = draw(keys)
    clients, ok = np.asarray(clients), np.asarray(ok)
    assert ok[:, :2].all() and not ok[:, 2].any()  # coalition 2's only member is offline
    for slot, members in ((0, [0, 1, 2]), (1, [3, 4, 6])):
        freq = np.bincount(clients[:, slot], minlength=7)[members] / n
        # 5 binomial standard deviations
        tol = 5 * np.sqrt(probs[members] * (1 - probs[members]) / n)
        assert np.all(np.abs(freq - probs[members]) <= tol + 1e-9)
