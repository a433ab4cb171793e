"""Clustered MNIST and clustered CIFAR-100 (SP-CACW's data) on tiny fake files and real MNIST."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.data import load_dataset
from fedjax_sel.data.dataset_clustered_cifar100 import latent_cluster_proportions
from fedjax_sel.data.dataset_clustered_mnist import balanced_clusters, rotate_images


def fake_npz(path, shape, num_classes, n_train, n_test, seed=0):
    """A Keras-layout file whose image encodes its own pool index (pixel [0, 0] = label,
    pixel [0, 1..2] = index), so that the test can trace every example back."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    x = rng.integers(0, 256, (n, *shape)).astype(np.uint8)
    y = np.arange(n) % num_classes
    rng.shuffle(y)
    np.savez(path, x_train=x[:n_train], y_train=y[:n_train], x_test=x[n_train:], y_test=y[n_train:])
    return x, y


@pytest.fixture
def fake_mnist(tmp_path):
    x, y = fake_npz(tmp_path / "mnist.npz", (28, 28), 10, 3000, 1000)
    return tmp_path / "mnist.npz", x, y


def client_examples(ds, k):
    xtr, ytr = ds.train.client_arrays(k)
    xte, yte = ds.test.client_arrays(k)
    return np.concatenate([xtr, xte]), np.concatenate([ytr, yte])


def test_rotation_by_quarter_turns_is_exact():
    x = np.random.default_rng(0).integers(0, 255, (3, 28, 28, 1)).astype(np.uint8)
    for q in (1, 2, 3):
        np.testing.assert_array_equal(rotate_images(x, 90 * q), np.rot90(x, q, axes=(1, 2)))
    np.testing.assert_array_equal(rotate_images(x, 360), x)


def test_clusters_are_balanced():
    c = balanced_clusters(10, 3, np.random.default_rng(0))
    assert sorted(np.bincount(c).tolist()) == [3, 3, 4]
    with pytest.raises(ConfigError, match="num_clusters"):
        balanced_clusters(4, 5, np.random.default_rng(0))


def test_rotated_clusters_hold_rotated_pool_images(fake_mnist):
    path, x_pool, y_pool = fake_mnist
    ds = load_dataset(
        "clustered_mnist", num_clients=8, data_path=path, num_clusters=4, examples_per_client=40
    )
    cluster = np.asarray(ds.info["cluster"])
    assert np.bincount(cluster).tolist() == [2, 2, 2, 2]
    flat_pool = x_pool.reshape(len(x_pool), -1)
    seen = set()
    for k in range(8):
        xs, ys = client_examples(ds, k)
        assert len(ys) == 40 and ds.train.counts[k] == 32
        # undo the cluster's rotation and find each image in the pool
        imgs = np.rint(xs * 255).astype(np.uint8)
        back = np.rot90(imgs, -int(cluster[k]), axes=(1, 2)).reshape(len(imgs), -1)
        for img, label in zip(back, ys, strict=True):
            idx = np.flatnonzero((flat_pool == img).all(1))
            assert len(idx) == 1 and y_pool[idx[0]] == label  # labels untouched
            assert idx[0] not in seen  # no example shared between clients
            seen.add(idx[0])


def test_permuted_clusters_relabel_consistently(fake_mnist):
    path, x_pool, y_pool = fake_mnist
    ds = load_dataset(
        "clustered_mnist", num_clients=6, data_path=path, num_clusters=3, transform="permute",
        examples_per_client=50, seed=1,
    )  # fmt: skip
    perms = np.asarray(ds.info["label_permutations"])
    np.testing.assert_array_equal(perms[0], np.arange(10))
    flat_pool = x_pool.reshape(len(x_pool), -1)
    for k in range(6):
        c = ds.info["cluster"][k]
        xs, ys = client_examples(ds, k)
        imgs = np.rint(xs * 255).astype(np.uint8).reshape(len(xs), -1)
        for img, label in zip(imgs, ys, strict=True):
            idx = np.flatnonzero((flat_pool == img).all(1))[0]
            assert perms[c][y_pool[idx]] == label


def test_label_skew_follows_the_dirichlet_concentration(fake_mnist):
    path, _, _ = fake_mnist

    def mean_max_share(alpha):
        ds = load_dataset(
            "clustered_mnist", num_clients=20, data_path=path, examples_per_client=100,
            label_alpha=alpha,
        )  # fmt: skip
        shares = np.asarray(ds.train.label_counts(10)) + np.asarray(ds.test.label_counts(10))
        return np.mean(shares.max(1) / shares.sum(1))

    # E[max share] ~ 0.5+ for Dir(0.1) over 10 classes; ~ 0.17 for the uniform mix
    assert mean_max_share(0.1) > 0.45
    assert mean_max_share(float("inf")) < 0.25


def test_clustered_mnist_is_deterministic_and_checks_its_options(fake_mnist):
    path, _, _ = fake_mnist
    a = load_dataset("clustered_mnist", num_clients=4, data_path=path, examples_per_client=20)
    b = load_dataset("clustered_mnist", num_clients=4, data_path=path, examples_per_client=20)
    np.testing.assert_array_equal(np.asarray(a.train.x), np.asarray(b.train.x))
    assert a.info["cluster"] == b.info["cluster"]
    with pytest.raises(ConfigError, match="transform"):
        load_dataset("clustered_mnist", num_clients=4, data_path=path, transform="flip")
    with pytest.raises(ConfigError, match="ran out"):
        load_dataset("clustered_mnist", num_clients=50, data_path=path, examples_per_client=200)
    with pytest.raises(ConfigError, match="natural"):
        load_dataset("clustered_mnist", num_clients=4, data_path=path, partition="iid")


def test_latent_cluster_proportions_have_leakage_and_primary_mass():
    rng = np.random.default_rng(0)
    primary = np.array_split(rng.permutation(100), 5)
    cluster = np.arange(10) % 5
    p = latent_cluster_proportions(cluster, primary, 100, 0.5, 0.05, rng)
    np.testing.assert_allclose(p.sum(1), 1.0)
    for k in range(10):
        own = primary[cluster[k]]
        np.testing.assert_allclose(p[k, own].sum(), 0.95)
        others = np.setdiff1d(np.arange(100), own)
        np.testing.assert_allclose(p[k, others], 0.05 / 80)
    with pytest.raises(ConfigError, match="leakage"):
        latent_cluster_proportions(cluster, primary, 100, 0.5, 1.0, rng)


def test_clustered_cifar100_from_a_local_file(tmp_path):
    fake_npz(tmp_path / "cifar100.npz", (32, 32, 3), 100, 4000, 1000, seed=1)
    ds = load_dataset(
        "clustered_cifar100", num_clients=10, data_path=tmp_path, examples_per_client=60,
        num_clusters=5, leakage=0.0,
    )  # fmt: skip
    assert ds.num_classes == 100 and ds.input_shape == (32, 32, 3)
    primary = ds.info["primary_classes"]
    for k in range(10):
        _, ys = client_examples(ds, k)
        assert set(ys.tolist()) <= set(primary[ds.info["cluster"][k]])  # no leakage asked


def test_clustered_cifar100_offline_without_a_file_says_what_to_provide(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDJAX_SEL_DATA_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="cifar100"):
        load_dataset("clustered_cifar100", num_clients=10)


@pytest.mark.realdata
def test_clustered_mnist_from_the_real_file(data_dir):
    ds = load_dataset("clustered_mnist", num_clients=8, data_path=data_dir, num_clusters=2)
    assert ds.train.num_clients == 8 and ds.num_classes == 10
    assert np.asarray(ds.train.counts).tolist() == [160] * 8
    x, _ = ds.train.client_arrays(0)
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.mean() > 0.05
