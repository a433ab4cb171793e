"""Sampling kernels: Gumbel-top-k draws, uniform subsets, masked softmax."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.kernels import gumbel_top_k, masked_softmax, uniform_without_replacement
from fedjax_sel.kernels.sampling import uniform_subset


def test_gumbel_top_1_has_softmax_probabilities():
    logits = jnp.array([0.0, 1.0, 2.0, -1.0, 0.5])
    draw = jax.jit(jax.vmap(lambda k: gumbel_top_k(k, logits, 1)[0][0]))
    idx = np.asarray(draw(jax.random.split(jax.random.key(0), 40000)))
    freq = np.bincount(idx, minlength=5) / len(idx)
    p = np.exp(np.asarray(logits)) / np.exp(np.asarray(logits)).sum()
    np.testing.assert_allclose(freq, p, atol=0.01)


def test_second_draw_follows_sequential_sampling_without_replacement():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    draw = jax.jit(jax.vmap(lambda k: gumbel_top_k(k, jnp.asarray(logits), 2)[0]))
    pairs = np.asarray(draw(jax.random.split(jax.random.key(1), 40000)))
    p = np.exp(logits)
    # P(first = i, second = j) = p_i p_j / (1 - p_i)
    for i in range(3):
        for j in range(3):
            if i != j:
                emp = np.mean((pairs[:, 0] == i) & (pairs[:, 1] == j))
                assert abs(emp - p[i] * p[j] / (1 - p[i])) < 0.01


def test_masked_and_neg_inf_entries_are_never_drawn():
    logits = jnp.array([0.0, -jnp.inf, 0.0, 0.0, 0.0])
    mask = jnp.array([True, True, False, True, True])
    keys = jax.random.split(jax.random.key(2), 500)
    idx, valid = jax.vmap(lambda k: gumbel_top_k(k, logits, 4, mask))(keys)
    idx, valid = np.asarray(idx), np.asarray(valid)
    assert valid[:, :3].all() and not valid[:, 3].any()
    assert set(np.unique(idx[:, :3])) == {0, 3, 4}
    for row in idx[:, :3]:
        assert len(set(row)) == 3


def test_uniform_inclusion_frequency_is_k_over_n():
    eligible = jnp.array([True] * 8 + [False] * 4)
    keys = jax.random.split(jax.random.key(3), 20000)
    idx, valid = jax.jit(jax.vmap(lambda k: uniform_without_replacement(k, eligible, 3)))(keys)
    counts = np.bincount(np.asarray(idx)[np.asarray(valid)], minlength=12)
    np.testing.assert_allclose(counts[:8] / 20000, 3 / 8, atol=0.015)
    assert counts[8:].sum() == 0


def test_masked_softmax():
    p = masked_softmax(jnp.array([1.0, 1000.0, 2.0]), jnp.array([True, False, True]))
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(np.asarray(p), [e[0] / e.sum(), 0.0, e[1] / e.sum()], rtol=1e-6)
    assert np.asarray(masked_softmax(jnp.ones(3), jnp.zeros(3, bool))).sum() == 0


def test_uniform_subset_draws_every_subset_equally_often():
    # all C(7, 3) = 35 subsets: a chi-square test of uniformity over 35,000 draws (34 degrees
    # of freedom: the statistic's 99.9% quantile is 65.2), and every draw distinct and sorted
    draws = np.asarray(
        jax.jit(jax.vmap(lambda k: uniform_subset(k, 7, 3)))(
            jax.random.split(jax.random.key(4), 35000)
        )
    )
    assert (np.diff(draws, axis=1) > 0).all() and draws.min() >= 0 and draws.max() <= 6
    index = {c: i for i, c in enumerate(itertools.combinations(range(7), 3))}
    counts = np.bincount([index[tuple(row)] for row in draws], minlength=35)
    expected = 35000 / 35
    assert ((counts - expected) ** 2 / expected).sum() < 65.2


def test_uniform_subset_is_cheap_and_distinct_at_a_million():
    ids = np.asarray(jax.jit(lambda k: uniform_subset(k, 1_000_000, 2000))(jax.random.key(5)))
    assert len(np.unique(ids)) == 2000 and ids.min() >= 0 and ids.max() < 1_000_000
    # the whole range is reached: the m draws spread like a uniform sample's order statistics
    assert abs(np.mean(ids) - 500_000) < 4 * 1_000_000 / np.sqrt(12 * 2000)
    full = np.asarray(uniform_subset(jax.random.key(6), 5, 5))
    np.testing.assert_array_equal(full, np.arange(5))
    with pytest.raises(ConfigError, match="m=6, n=5"):
        uniform_subset(jax.random.key(0), 5, 6)
