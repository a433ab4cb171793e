"""MNIST with clustered heterogeneity (SP-CACW's MNIST setting; IFCA's rotated MNIST).

Registers ``clustered_mnist``: K clients in C latent clusters (balanced, in a random order).
Each cluster applies one transformation to all its clients' examples:

* ``transform="rotate"``: images rotated by ``360 * c / C`` degrees (cluster 0 upright; C = 4
  gives IFCA's 0/90/180/270 degrees), nearest-neighbour about the image centre (exact for
  multiples of 90 degrees);
* ``transform="permute"``: labels relabelled by a random permutation per cluster (cluster 0 the
  identity), so clusters disagree on the concept itself and a single global model cannot fit
  them all.

Within a cluster clients are not identical (intra-cluster label skew): each client draws class
proportions ``q ~ Dir(label_alpha * 1_10)`` and ``examples_per_client`` examples with those
proportions, without replacement from the MNIST pool (train and test images together: the
per-client test split, ``test_fraction``, is drawn from the client's own distribution, which is
what a personalized model is evaluated on). ``info["cluster"]`` holds every client's cluster.
"""

from __future__ import annotations

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data import loaders
from fedjax_sel.data.datasets import FederatedDataset, assemble, register_dataset

TRANSFORMS = ("rotate", "permute")


def image_pool(name: str, data_path) -> loaders.ArrayDataset:
    """The data set's train and test images pooled into ``x_train``/``y_train`` (clients draw
    their own train and test examples from one pool)."""
    d = loaders.load_image_dataset(name, data_path)
    if d.x_test is None:
        return d
    x, y = np.concatenate([d.x_train, d.x_test]), np.concatenate([d.y_train, d.y_test])
    return d._replace(x_train=x, y_train=y, x_test=None, y_test=None)


def balanced_clusters(num_clients: int, num_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """int64[K] cluster ids, ``K / C`` (+-1) clients per cluster, in a random order."""
    if not 1 <= num_clusters <= num_clients:
        raise ConfigError(
            f"num_clusters must lie in [1, number of clients = {num_clients}], got {num_clusters}"
        )
    return rng.permutation(np.arange(num_clients) % num_clusters).astype(np.int64)


def rotate_images(x: np.ndarray, degrees: float) -> np.ndarray:
    """Rotates ``[N, H, W, C]`` images counter-clockwise by ``degrees`` about the centre
    (nearest neighbour; pixels from outside the frame are 0). Exact for multiples of 90."""
    if degrees % 360 == 0:
        return x
    _, h, w, _ = x.shape
    t = np.deg2rad(degrees)
    ci, cj = (h - 1) / 2.0, (w - 1) / 2.0
    ii, jj = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    # Inverse map: the source of output pixel (i, j) (row i points down, so the sign of sin flips).
    si = ci + (ii - ci) * np.cos(t) + (jj - cj) * np.sin(t)
    sj = cj - (ii - ci) * np.sin(t) + (jj - cj) * np.cos(t)
    si, sj = np.rint(si).astype(np.int64), np.rint(sj).astype(np.int64)
    inside = (si >= 0) & (si < h) & (sj >= 0) & (sj < w)
    out = x[:, np.clip(si, 0, h - 1), np.clip(sj, 0, w - 1), :]
    return np.where(inside[None, :, :, None], out, 0).astype(x.dtype)


def sample_by_proportions(
    labels: np.ndarray,
    proportions: np.ndarray,
    sizes: np.ndarray,
    rng: np.random.Generator,
    name: str,
) -> list[np.ndarray]:
    """Draws, for each client ``k``, ``sizes[k]`` pool indices with class proportions
    ``proportions[k]`` (a multinomial count per class), without replacement across clients.

    Raises :class:`ConfigError` when a class runs out of examples.
    """
    num_classes = proportions.shape[1]
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(num_classes)]
    parts = []
    for k, n in enumerate(sizes):
        counts = rng.multinomial(int(n), proportions[k])
        idx = []
        for c, m in enumerate(counts):
            if m > len(pools[c]):
                raise ConfigError(
                    f"{name}: class {c} ran out of examples at client {k}; lower the number of "
                    f"clients or examples_per_client"
                )
            idx.extend(pools[c][:m])
            del pools[c][:m]
        parts.append(np.sort(np.asarray(idx, np.int64)))
    return parts


def dirichlet_proportions(
    num_clients: int, num_classes: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """float64[K, classes] label proportions ``Dir(alpha * 1)`` per client; uniform when
    ``alpha`` is ``inf`` (no intra-cluster label skew)."""
    if not alpha > 0:
        raise ConfigError(f"label_alpha must be > 0 (inf: no label skew), got {alpha!r}")
    if np.isinf(alpha):
        return np.full((num_clients, num_classes), 1.0 / num_classes)
    return rng.dirichlet(np.full(num_classes, float(alpha)), size=num_clients)


@register_dataset(
    "clustered_mnist",
    description="MNIST in C latent clusters (rotated images or permuted labels) with "
    "intra-cluster Dirichlet label skew (SP-CACW, IFCA)",
    default_clients=40,
    default_partition="natural",
    default_model="mlp",
)
def _clustered_mnist(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    num_clusters: int = 4,
    transform: str = "rotate",
    examples_per_client: int = 200,
    label_alpha: float = 1.0,
) -> FederatedDataset:
    if partition != "natural":
        raise ConfigError("clustered_mnist builds its own clusters; its partition is 'natural'")
    if transform not in TRANSFORMS:
        raise ConfigError(
            f"clustered_mnist: transform must be one of {TRANSFORMS}, got {transform!r}"
        )
    num_clusters, n = int(num_clusters), int(examples_per_client)
    if n < 2:
        raise ConfigError(f"clustered_mnist: examples_per_client must be >= 2, got {n}")
    d = image_pool("mnist", data_path)
    x_pool, y_pool = d.x_train, d.y_train
    rng = np.random.default_rng(seed)
    cluster = balanced_clusters(num_clients, num_clusters, rng)
    props = dirichlet_proportions(num_clients, d.num_classes, float(label_alpha), rng)
    parts = sample_by_proportions(y_pool, props, np.full(num_clients, n), rng, "clustered_mnist")
    perms = [np.arange(d.num_classes)] + [
        rng.permutation(d.num_classes) for _ in range(num_clusters - 1)
    ]
    xs, ys = [], []
    for k, p in enumerate(parts):
        c = int(cluster[k])
        x, y = x_pool[p], y_pool[p]
        if transform == "rotate":
            x = rotate_images(x, 360.0 * c / num_clusters)
        else:
            y = perms[c][y]
        xs.append(x)
        ys.append(y.astype(np.int32))
    starts = np.concatenate([[0], np.cumsum([len(y) for y in ys])[:-1]])
    client_parts = [np.arange(s, s + len(y)) for s, y in zip(starts, ys, strict=True)]
    info = {
        "source": d.source,
        "num_clusters": num_clusters,
        "transform": transform,
        "label_alpha": float(label_alpha),
        "examples_per_client": n,
        "cluster": cluster.tolist(),
    }
    if transform == "permute":
        info["label_permutations"] = [q.tolist() for q in perms]
    else:
        info["angles"] = [360.0 * c / num_clusters for c in range(num_clusters)]
    return assemble(
        "clustered_mnist",
        np.concatenate(xs),
        np.concatenate(ys),
        client_parts,
        rng=rng,
        test_fraction=0.2 if test_fraction is None else test_fraction,
        layout=layout,
        task="classification",
        num_classes=d.num_classes,
        info=info,
        x_scale=1.0 / 255.0,
    )
