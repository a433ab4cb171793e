"""Diurnal, lognormal on/off and data-correlated availability against their written rules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import from_spec
from fedjax_sel.availability.correlated import correlated, data_availability
from fedjax_sel.availability.dynamic import diurnal, onoff
from fedjax_sel.base import ConfigError, SimSpec


def _trajectory(model, k, t, seed=0, spec=None):
    key = jax.random.key(seed)
    state = model.init(key, k) if spec is None else model.init(key, k, spec)

    def body(s, key):
        a, s = model.step(s, key)
        return s, a

    _, traj = jax.lax.scan(body, state, jax.random.split(jax.random.key(seed + 1), t))
    return np.asarray(traj), state


def test_diurnal_on_rate_follows_the_sinusoid():
    k, t = 20000, 30
    traj, _ = _trajectory(diurnal(mean=0.5, amplitude=0.4, period=12, phases="same"), k, t)
    rate = 0.5 + 0.4 * np.sin(2 * np.pi * np.arange(t) / 12)
    tol = 4 * np.sqrt(rate * (1 - rate) / k) + 1e-3
    assert np.all(np.abs(traj.mean(1) - rate) < tol)
    # random phases: the population's on-rate is flat at the mean, each client still cycles
    traj, state = _trajectory(diurnal(mean=0.5, amplitude=0.4, period=12), k, t)
    assert np.all(np.abs(traj.mean(1) - 0.5) < 4 * np.sqrt(0.25 / k) + 0.01)
    phase = np.asarray(state.phase)
    expected = 0.5 + 0.4 * np.sin(2 * np.pi * (np.arange(t)[:, None] / 12 + phase[None]))
    # clients at their daily peak are online far more than those in their trough
    assert traj[expected > 0.85].mean() > 0.85 and traj[expected < 0.15].mean() < 0.15


def test_onoff_without_noise_alternates_exact_spells():
    traj, _ = _trajectory(onoff(on_mean=3, off_mean=2, sigma=0.0), 50, 40)
    for col in traj.T:
        runs = np.diff(np.flatnonzero(np.diff(col.astype(int)) != 0))
        # complete spells (between two changes) alternate 3 on, 2 off
        starts = np.flatnonzero(np.diff(col.astype(int)) != 0) + 1
        values = col[starts[:-1]]
        assert np.all(np.where(values, runs == 3, runs == 2))


def test_onoff_lognormal_spell_means_and_stationary_share():
    k, t = 3000, 400
    traj, _ = _trajectory(onoff(on_mean=4.0, off_mean=12.0, sigma=0.8), k, t, seed=3)
    assert traj.mean() == pytest.approx(0.25, abs=0.01)
    on_spells, off_spells = [], []
    for col in traj.T.astype(int):
        change = np.flatnonzero(np.diff(col) != 0) + 1
        for a, b in zip(change[:-1], change[1:], strict=True):
            (on_spells if col[a] else off_spells).append(b - a)
    # rounds per spell: a lognormal length L covers ceil(L - fractional carry) rounds, whose
    # mean is L's mean
    assert np.mean(on_spells) == pytest.approx(4.0, rel=0.05)
    assert np.mean(off_spells) == pytest.approx(12.0, rel=0.05)


def test_correlated_availability_follows_size_ranks_and_mean_labels():
    sizes = np.array([5, 50, 20, 20, 8])
    pi = data_availability("size", 0.1, 0.9, sizes, None)
    # ranks 0, 4, 2.5 (tie of 2 and 3), 2.5, 1 over K - 1 = 4
    np.testing.assert_allclose(pi, 0.1 + 0.8 * np.array([0, 4, 2.5, 2.5, 1]) / 4)
    counts = np.array([[4, 0, 0], [0, 0, 2], [1, 1, 0], [0, 3, 1], [1, 1, 1]], float)
    mean_label = (counts * np.arange(3)).sum(1) / counts.sum(1)
    np.testing.assert_allclose(
        data_availability("label", 0.2, 0.8, sizes, counts), 0.2 + 0.6 * mean_label / 2
    )


def test_correlated_availability_inside_a_simulation_spec():
    rng = np.random.default_rng(0)
    k = 400
    sizes = rng.integers(1, 100, k)
    spec = SimSpec(k, 5, 10, jnp.asarray(sizes), None, None, None)
    traj, state = _trajectory(correlated(by="size", low=0.1, high=0.9, lam=0.6), k, 600, spec=spec)
    expected = data_availability("size", 0.1, 0.9, sizes, None)
    np.testing.assert_allclose(np.asarray(state.pi), expected, rtol=1e-6)
    # each client's long-run on-rate is its pi; the chain has lag-1 autocorrelation lam
    assert np.abs(traj.mean(0) - expected).max() < 0.2
    assert np.corrcoef(traj.mean(0), sizes)[0, 1] > 0.8
    x = traj - traj.mean(0)
    lag1 = (x[1:] * x[:-1]).mean() / (x * x).mean()
    assert lag1 == pytest.approx(0.6, abs=0.05)
    with pytest.raises(ConfigError, match="needs label counts: a classification data set"):
        correlated(by="label").init(jax.random.key(0), k, spec)


@pytest.mark.parametrize(
    "spec, match",
    [
        ("diurnal:mean=0.5,amplitude=0.6", "amplitude=0.6"),
        ("diurnal:period=0", "period"),
        ("diurnal:phases=east", "phases"),
        ("onoff:on_mean=0", "on_mean"),
        ("onoff:sigma=-1", "sigma"),
        ("correlated:by=colour", "by"),
        ("correlated:low=1.5", "low"),
        ("correlated:lam=-5", "lam=-5"),
    ],
)
def test_bad_availability_specs_are_named(spec, match):
    with pytest.raises(ConfigError, match=match):
        from_spec(spec)
