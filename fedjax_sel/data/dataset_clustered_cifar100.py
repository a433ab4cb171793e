"""CIFAR-100 in latent clusters (SP-CACW, appendix "Algorithm 3: CIFAR-100 Partitioning").

Registers ``clustered_cifar100``. The 100 classes are dealt at random into C disjoint groups of
*primary* classes, one per cluster; clients are spread evenly over the clusters. A client of
cluster c draws its class proportions as

    q = (1 - leakage) * Dir(label_alpha) over the primary classes of c
        + leakage * uniform over every other class,

which gives the paper's two properties: *intra-cluster heterogeneity* (the Dirichlet draw varies
the primary classes' distribution from client to client) and *inter-cluster leakage* (a small,
non-zero probability of classes outside the cluster, "background noise"). Each client then
draws ``examples_per_client`` images with those proportions, without replacement from the
CIFAR-100 pool (train and test together; each client's test split follows its own
distribution). The paper's listing is truncated in our copy; the recipe above follows its
description, and its defaults (C = 5, leakage 0.05, Dirichlet 0.5) are ours.

CIFAR-100 comes from a local Keras-layout ``cifar100.npz`` or tensorflow-datasets (see
:mod:`fedjax_sel.data.loaders`); offline without the file this raises a ConfigError saying so.
"""

from __future__ import annotations

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data.dataset_clustered_mnist import (
    balanced_clusters,
    dirichlet_proportions,
    image_pool,
    sample_by_proportions,
)
from fedjax_sel.data.datasets import FederatedDataset, assemble, register_dataset


def latent_cluster_proportions(
    cluster: np.ndarray,
    primary: list[np.ndarray],
    num_classes: int,
    label_alpha: float,
    leakage: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """float64[K, classes]: each client's class proportions (see the module docstring)."""
    if not 0.0 <= leakage < 1.0:
        raise ConfigError(f"leakage must lie in [0, 1), got {leakage!r}")
    props = np.zeros((len(cluster), num_classes))
    for k, c in enumerate(cluster):
        own = primary[int(c)]
        props[k, own] = (1.0 - leakage) * dirichlet_proportions(1, len(own), label_alpha, rng)[0]
        others = np.setdiff1d(np.arange(num_classes), own)
        if len(others):
            props[k, others] += leakage / len(others)
        else:
            props[k, own] += leakage / len(own)
    return props


@register_dataset(
    "clustered_cifar100",
    description="CIFAR-100 in C latent clusters of primary classes with intra-cluster skew and "
    "inter-cluster leakage (SP-CACW Algorithm 3; local cifar100.npz or tensorflow-datasets)",
    default_clients=50,
    default_partition="natural",
    default_model="cnn",
)
def _clustered_cifar100(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    num_clusters: int = 5,
    examples_per_client: int = 250,
    label_alpha: float = 0.5,
    leakage: float = 0.05,
) -> FederatedDataset:
    if partition != "natural":
        raise ConfigError("clustered_cifar100 builds its own clusters; its partition is 'natural'")
    num_clusters, n = int(num_clusters), int(examples_per_client)
    if n < 2:
        raise ConfigError(f"clustered_cifar100: examples_per_client must be >= 2, got {n}")
    d = image_pool("cifar100", data_path)
    x_pool, y_pool = d.x_train, d.y_train
    if num_clusters > d.num_classes:
        raise ConfigError(f"clustered_cifar100: num_clusters={num_clusters} exceeds 100 classes")
    rng = np.random.default_rng(seed)
    cluster = balanced_clusters(num_clients, num_clusters, rng)
    primary = np.array_split(rng.permutation(d.num_classes), num_clusters)
    props = latent_cluster_proportions(
        cluster, primary, d.num_classes, float(label_alpha), float(leakage), rng
    )
    parts = sample_by_proportions(y_pool, props, np.full(num_clients, n), rng, "clustered_cifar100")
    return assemble(
        "clustered_cifar100",
        x_pool,
        y_pool,
        parts,
        rng=rng,
        test_fraction=0.2 if test_fraction is None else test_fraction,
        layout=layout,
        task="classification",
        num_classes=d.num_classes,
        info={
            "source": d.source,
            "num_clusters": num_clusters,
            "label_alpha": float(label_alpha),
            "leakage": float(leakage),
            "examples_per_client": n,
            "primary_classes": [p.tolist() for p in primary],
            "cluster": cluster.tolist(),
        },
        x_scale=1.0 / 255.0,
    )
