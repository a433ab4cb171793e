"""CA-Fed's availability models: the paper's Markov population (the CLI's ``markov``),
spatially correlated clusters, and trace replay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import from_spec
from fedjax_sel.availability.clustered import markov_clustered, paper_cluster_params
from fedjax_sel.availability.markov_population import (
    CLASS_NAMES,
    LESS_CORRELATED,
    LESS_WEAK,
    MORE_CORRELATED,
    MORE_WEAK,
    ca_fed_population,
    code_class_counts,
    markov_population,
    population_classes,
)
from fedjax_sel.availability.trace import empirical_params, load_trace, trace_replay
from fedjax_sel.base import ConfigError


def _trajectory(model, k, t, seed=0):
    state = model.init(jax.random.key(seed), k)

    def body(s, key):
        a, s = model.step(s, key)
        return s, a

    final, traj = jax.lax.scan(body, state, jax.random.split(jax.random.key(seed + 1), t))
    return np.asarray(traj).astype(float), state, final


def _lag1_autocorrelation(x: np.ndarray) -> float:
    a = x - x.mean()
    return float((a[1:] * a[:-1]).mean() / a.var())


def test_population_classes_are_equal_contiguous_blocks():
    np.testing.assert_array_equal(population_classes(8), [0, 0, 1, 1, 2, 2, 3, 3])
    c = population_classes(101)  # odd sizes split as np.array_split does
    assert np.bincount(c).tolist() == [26, 25, 25, 25]
    assert np.all(np.diff(c) >= 0)
    assert len(CLASS_NAMES) == 4


def test_code_population_is_50_25_25_with_its_deterministic_split_and_shuffled_ids():
    """The reference code's joint matrix [[0, 1/2, 0], [1/4, 1/4, 0]]: no "more available,
    correlated" client; floor(K p) per type, then one more to each non-empty type in order."""
    for k, want in [
        (100, [0, 50, 25, 25]),
        (24, [0, 12, 6, 6]),
        (7, [0, 4, 2, 1]),
        (1, [0, 1, 0, 0]),
    ]:
        assert code_class_counts(k).tolist() == want
        assert np.bincount(population_classes(k, "code"), minlength=4).tolist() == want
    blocks = population_classes(100, "code")
    assert np.all(np.diff(blocks) >= 0)  # without id_seed: class blocks
    shuffled = population_classes(100, "code", id_seed=3)
    np.testing.assert_array_equal(shuffled, blocks[np.random.default_rng(3).permutation(100)])
    np.testing.assert_array_equal(shuffled, population_classes(100, "code", id_seed=3))
    assert not np.array_equal(shuffled, population_classes(100, "code", id_seed=4))
    paper = population_classes(100, "paper", id_seed=3)  # four equal classes, shuffled too
    assert np.bincount(paper).tolist() == [25] * 4 and np.any(np.diff(paper) < 0)
    # the model: pi and lambda follow the shuffled classes
    model = from_spec("markov:mix=code,id_seed=3")
    state = model.init(jax.random.key(0), 100)
    pi, lam = np.asarray(state.pi), np.asarray(state.lam)
    np.testing.assert_allclose(pi, np.where(shuffled == MORE_WEAK, 0.9, 0.1), rtol=1e-6)
    np.testing.assert_allclose(lam[shuffled == LESS_CORRELATED], 0.9)
    assert np.abs(lam[shuffled != LESS_CORRELATED]).max() < 0.05
    assert model.info["mix"] == "code" and model.info["id_seed"] == 3
    with pytest.raises(ConfigError, match="mix must be one of"):
        from_spec("markov:mix=uniform")
    with pytest.raises(ConfigError, match="either the population parameters"):
        from_spec("markov:mix=code,pi=0.5")


def test_population_parameters_follow_section_v_a():
    k = 4000
    pi, lam = ca_fed_population(jax.random.key(3), k, g=0.3, nu=0.8, eps=0.05)
    pi, lam, c = np.asarray(pi), np.asarray(lam), population_classes(k)
    np.testing.assert_allclose(pi[(c == MORE_CORRELATED) | (c == MORE_WEAK)], 0.8, rtol=1e-6)
    np.testing.assert_allclose(pi[(c == LESS_CORRELATED) | (c == LESS_WEAK)], 0.2, rtol=1e-6)
    np.testing.assert_allclose(lam[(c == MORE_CORRELATED) | (c == LESS_CORRELATED)], 0.8)
    weak = lam[(c == MORE_WEAK) | (c == LESS_WEAK)]  # N(0, eps^2): 2000 draws
    assert abs(weak.mean()) < 4 * 0.05 / np.sqrt(len(weak))
    assert abs(weak.std() / 0.05 - 1) < 0.1


def test_population_chain_availability_and_autocorrelation_match_pi_and_lambda():
    # two clients per class; eps = 0.2 so the weakly correlated lambdas differ visibly from 0
    model = markov_population(g=0.3, nu=0.9, eps=0.2)
    traj, state, _ = _trajectory(model, 8, 60000)
    truth = model.true_params(state)
    pi, lam = np.asarray(truth.pi), np.asarray(truth.lam)
    np.testing.assert_allclose(pi, [0.8] * 4 + [0.2] * 4, rtol=1e-6)
    np.testing.assert_allclose(traj.mean(0), pi, atol=0.03)
    for k in range(8):
        assert abs(_lag1_autocorrelation(traj[:, k]) - lam[k]) < 0.03, k


def test_markov_cli_spec_means_the_paper_population():
    model = from_spec("markov")
    assert model.info == {
        "population": "ca_fed",
        "g": 0.4,
        "nu": 0.9,
        "eps": 0.01,
        "mix": "paper",
        "id_seed": None,
    }
    state = model.init(jax.random.key(0), 100)
    np.testing.assert_allclose(np.asarray(state.pi)[:50], 0.9, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.pi)[50:], 0.1, rtol=1e-5)
    assert from_spec("markov:g=0.2,nu=0.5,eps=0.01").info["g"] == 0.2
    homogeneous = from_spec("markov:pi=0.3,lam=0.6")
    truth = homogeneous.true_params(homogeneous.init(jax.random.key(0), 5))
    np.testing.assert_allclose(np.asarray(truth.pi), 0.3)
    np.testing.assert_allclose(np.asarray(truth.lam), 0.6)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("markov:nu=-0.5", "nu=-0.5 is outside the valid range"),  # lo = 1 - 1/0.9 = -0.11
        ("markov:nu=1.5", "nu=1.5 is outside"),
        ("markov:g=0.5", "g must lie in [0, 0.5)"),
        ("markov:eps=-1", "eps must be >= 0"),
        ("markov:pi=0.9,lam=-5", "lam=-5.0 is outside its valid range"),
        ("markov:g=0.2,pi=0.5", "not both"),
        ("markov:sigma=1", "no option(s) ['sigma']"),
    ],
)
def test_markov_bad_parameters_give_clear_errors(spec, message):
    with pytest.raises(ConfigError) as e:
        from_spec(spec)
    assert message in str(e.value)


def test_clusters_move_together_with_their_chain_statistics():
    pi_c, lam_c = [0.7, 0.3, 0.5], [0.0, 0.8, 0.5]
    model = markov_clustered(cluster_pi=pi_c, cluster_lam=lam_c)
    traj, state, _ = _trajectory(model, 9, 40000)
    cluster = np.asarray(state.cluster)
    np.testing.assert_array_equal(cluster, [0, 0, 0, 1, 1, 1, 2, 2, 2])
    for c in range(3):
        members = traj[:, cluster == c]
        assert np.all(members == members[:, :1]), "a cluster's clients must move together"
        assert abs(members[:, 0].mean() - pi_c[c]) < 0.03
        assert abs(_lag1_autocorrelation(members[:, 0]) - lam_c[c]) < 0.03
    truth = model.true_params(state)
    np.testing.assert_allclose(np.asarray(truth.pi), np.repeat(pi_c, 3), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(truth.lam), np.repeat(lam_c, 3), rtol=1e-6)


def test_clustered_defaults_are_section_v_b_e():
    pi_c, lam_c = paper_cluster_params()
    np.testing.assert_allclose(pi_c, [0.9] * 5 + [0.1] * 5)
    np.testing.assert_allclose(lam_c, [0, 0, 0, 0, 0, 0.5, 0.6, 0.7, 0.8, 0.9])
    state = from_spec("markov_clustered").init(jax.random.key(0), 100)
    assert np.bincount(np.asarray(state.cluster)).tolist() == [10] * 10


def test_clustered_bad_parameters_give_clear_errors():
    with pytest.raises(ConfigError, match="clusters <= clients"):
        markov_clustered(clusters=10).init(jax.random.key(0), 5)
    with pytest.raises(ConfigError, match=r"outside the valid range .* clusters \[1\]"):
        markov_clustered(cluster_pi=[0.5, 0.9], cluster_lam=[0.0, -0.5])
    with pytest.raises(ConfigError, match="both"):
        markov_clustered(cluster_pi=[0.5])


def test_trace_replays_rows_cyclically_from_every_format(tmp_path):
    rng = np.random.default_rng(0)
    trace = rng.random((7, 5)) < 0.5
    np.save(tmp_path / "t.npy", trace.astype(np.int8))
    np.savez(tmp_path / "t.npz", availability=trace)
    np.savetxt(tmp_path / "t.csv", trace.astype(int), fmt="%d", delimiter=",")
    np.savetxt(tmp_path / "t.txt", trace.astype(int), fmt="%d")
    for name in ("t.npy", "t.npz", "t.csv", "t.txt"):
        np.testing.assert_array_equal(load_trace(tmp_path / name), trace)
    model = from_spec(f"trace:path={tmp_path / 't.csv'},start=3")
    traj, _, final = _trajectory(model, 5, 16)
    np.testing.assert_array_equal(traj, trace[(3 + np.arange(16)) % 7])
    assert int(final.cursor) == (3 + 16) % 7


def test_trace_true_parameters_are_its_empirical_ones():
    trace = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [1, 0, 1], [1, 0, 0]], bool)
    pi, lam = (np.asarray(a) for a in empirical_params(trace))
    np.testing.assert_allclose(pi, [0.8, 0.0, 0.6])
    # client 0: transitions 1->1, 1->0, 0->1, 1->1: p11 = 2/3, p00 = 0/1
    # client 2: 1->0, 0->1, 1->1, 1->0: p11 = 1/3, p00 = 0/2; client 1 never changes: 0
    np.testing.assert_allclose(lam, [2 / 3 - 1, 0.0, 1 / 3 - 1], atol=1e-6)


def test_trace_bad_input_gives_clear_errors(tmp_path):
    np.save(tmp_path / "bad.npy", np.array([[0, 2], [1, 0]]))
    np.save(tmp_path / "flat.npy", np.array([0, 1, 1]))
    with pytest.raises(ConfigError, match="only 0 and 1"):
        load_trace(tmp_path / "bad.npy")
    with pytest.raises(ConfigError, match="T x K"):
        load_trace(tmp_path / "flat.npy")
    with pytest.raises(ConfigError, match="does not exist"):
        from_spec(f"trace:path={tmp_path / 'missing.npy'}")
    with pytest.raises(ConfigError, match="has 3 clients .* simulation has 4"):
        trace_replay(trace=np.ones((2, 3))).init(jax.random.key(0), 4)


def test_availability_models_pass_true_parameters_to_strategies():
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.models import make_model
    from fedjax_sel.strategies import make_strategy
    from fedjax_sel.training import HParams, LocalConfig

    k = 8
    ds = load_dataset("digits", num_clients=k, partition="iid", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    availability = markov_population(g=0.25, nu=0.5, eps=0.1)
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy("unbiased", k, estimator="oracle"),
        local=LocalConfig(batch_size=8, local_steps=1),
        per_round=k,
        availability=availability,
    )
    sim = Simulation(spec, ds, num_rounds=2, chunk_size=1)
    state, logs = sim.run_rounds(sim.init(0, hparams=HParams.of(0.01)), 1)
    truth = availability.true_params(state.availability_state)
    # Unbiased weights the trained clients alpha / pi with the true pi (equal sizes here)
    mask, clients = logs.mask[0], logs.clients[0]
    alpha = np.asarray(ds.train.counts) / np.sum(np.asarray(ds.train.counts))
    np.testing.assert_allclose(
        logs.weights[0][mask], (alpha / np.asarray(truth.pi))[clients[mask]], rtol=1e-6
    )
    assert mask.any() and jnp.all(truth.pi > 0)
