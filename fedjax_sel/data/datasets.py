"""Named federated data sets: one call from a name to stacked on-device client data.

>>> ds = load_dataset("digits", num_clients=10, partition="dirichlet:0.5", seed=0)
>>> ds.train.num_clients, ds.num_classes
(10, 10)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import Array, ConfigError
from fedjax_sel.data import loaders, shakespeare, synthetic
from fedjax_sel.data import partition as partitioners
from fedjax_sel.data.client_data import ClientData, RowChunks, from_parts, from_row_chunks
from fedjax_sel.registry import Registry


@dataclasses.dataclass(frozen=True)
class FederatedDataset:
    """A federated data set on device.

    Attributes:
      name: registry name.
      train: the clients' training examples.
      test: per-client test splits (same K; clients may hold none), or ``None``.
      test_x, test_y: the central test set (the official test set where there is one, else the
        union of the per-client test splits).
      task: ``"classification"`` or ``"regression"``.
      num_classes: classes for classification, ``None`` for regression.
      input_shape: shape of one example's features.
      default_model: the model the papers use on it.
      info: provenance and generator parameters (goes into ``config.json``).
      server_x, server_y: a server-held data set (held out from every client before the
        partition; FilFL's filtering set), or ``None``.
    """

    name: str
    train: ClientData
    test: ClientData | None
    test_x: Array
    test_y: Array
    task: str
    num_classes: int | None
    input_shape: tuple[int, ...]
    default_model: str
    info: dict
    server_x: Array | None = None
    server_y: Array | None = None

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    @property
    def num_examples(self) -> Array:
        return self.train.counts


DATA_SET_FIXED = ("num_clients", "partition", "seed", "data_path", "test_fraction", "layout")

# every public module of fedjax_sel.data is imported the first time the registry is read: a
# module that registers a data set needs no particular name
DATASETS = Registry("data set", fixed=DATA_SET_FIXED, package="fedjax_sel.data")


def register_dataset(
    name: str,
    *,
    description: str,
    default_clients: int | None,
    default_partition: str,
    default_model: str,
    reference: str = "",
    replace: bool = False,
) -> Callable:
    """Decorator registering a builder ``fn(*, num_clients, partition, seed, data_path,
    test_fraction, layout, **options) -> FederatedDataset``; its keyword parameters with
    defaults are the data set's options (``--dataset-arg key=value``)."""
    return DATASETS.register(
        name,
        description=description,
        reference=reference,
        replace=replace,
        default_clients=default_clients,
        default_partition=default_partition,
        default_model=default_model,
    )


def load_dataset(
    name: str,
    *,
    num_clients: int | None = None,
    partition: str | None = None,
    seed: int = 0,
    data_path: str | os.PathLike | None = None,
    test_fraction: float | None = None,
    layout: str = "auto",
    server_fraction: float = 0.0,
    **options,
) -> FederatedDataset:
    """Builds the federated data set ``name``.

    Args:
      name: a key of :data:`DATASETS` (``fedjax-sel list`` shows them).
      num_clients: K (the data set's default when ``None``; for the natural data sets read
        from files, every client in them).
      partition: ``iid``, ``dirichlet:ALPHA``, ``shards:S`` or ``natural`` for pooled data sets.
      seed: seeds the partition and any generator.
      data_path: local file or folder for real data sets.
      test_fraction: fraction of each client's examples held out as its test split (the data
        set's default when ``None``).
      layout: ``auto``, ``padded`` or ``flat`` (see :mod:`fedjax_sel.data.client_data`).
      server_fraction: fraction of the training pool held out (stratified by label) as a
        server-held set before partitioning (``server_x``/``server_y``); no client sees it.
      **options: data-set specific options (see :data:`DATASETS` ``options``).
    """
    entry = DATASETS[name]
    # a default of None: every client the data set's files hold (natural partitions)
    k = entry.info["default_clients"] if num_clients is None else num_clients
    if k is not None and (isinstance(k, bool) or int(k) != k or k < 1):
        raise ConfigError(f"number of clients must be a positive integer, got {num_clients!r}")
    if not 0.0 <= server_fraction < 1.0:
        raise ConfigError(f"server_fraction must lie in [0, 1), got {server_fraction!r}")
    ds = DATASETS.build(
        name,
        num_clients=None if k is None else int(k),
        partition=partition or entry.info["default_partition"],
        seed=seed,
        data_path=data_path,
        test_fraction=test_fraction,
        layout=layout,
        **options,
    )
    if server_fraction > 0:
        ds = hold_out_server_set(ds, server_fraction, seed)
    return ds


def hold_out_server_set(ds: FederatedDataset, fraction: float, seed: int) -> FederatedDataset:
    """Moves a stratified ``fraction`` of every client's training examples to a server-held
    set (``server_x``/``server_y``): clients keep the rest, so the server set never leaks into
    client data, and it follows the pooled distribution of the federation."""
    rng = np.random.default_rng(seed + 7919)
    train = ds.train
    keep_x, keep_y, srv_x, srv_y = [], [], [], []
    # the stored values (integers where x_scale is set), copied to the host once: slicing the
    # device arrays client by client compiled one program per slice
    all_x, all_y = np.asarray(train.x), np.asarray(train.y)
    counts = np.asarray(train.counts)
    offsets = None if train.layout == "padded" else np.asarray(train.offsets)
    for k in range(train.num_clients):
        n = int(counts[k])
        if offsets is None:
            x, y = all_x[k, :n], all_y[k, :n]
        else:
            x, y = all_x[offsets[k] : offsets[k] + n], all_y[offsets[k] : offsets[k] + n]
        n_srv = min(int(round(fraction * len(y))), len(y) - 1)
        perm = rng.permutation(len(y))
        srv_x.append(x[perm[:n_srv]])
        srv_y.append(y[perm[:n_srv]])
        keep_x.append(x[perm[n_srv:]])
        keep_y.append(y[perm[n_srv:]])
    from fedjax_sel.data.client_data import from_client_arrays

    new_train = from_client_arrays(keep_x, keep_y, layout=train.layout, x_scale=train.x_scale)
    sx, sy = np.concatenate(srv_x), np.concatenate(srv_y)
    if len(sy) == 0:
        raise ConfigError(f"server_fraction={fraction} leaves the server set empty")
    sxj = jnp.asarray(sx)
    if train.x_scale is not None:
        sxj = sxj.astype(jnp.float32) * train.x_scale
    info = dict(ds.info, server_fraction=fraction, num_server_examples=int(len(sy)))
    info["num_train_examples"] = int(np.asarray(new_train.counts).sum())
    return dataclasses.replace(
        ds, train=new_train, server_x=sxj, server_y=jnp.asarray(sy), info=info
    )


def assemble(
    name: str,
    x: np.ndarray | RowChunks,
    y: np.ndarray | None,
    parts: Sequence[np.ndarray],
    *,
    rng: np.random.Generator,
    test_fraction: float,
    layout: str,
    task: str,
    num_classes: int | None,
    info: dict,
    default_model: str | None = None,
    x_scale: float | None = None,
    central_test: tuple[np.ndarray, np.ndarray] | None = None,
    temporal_split: bool = False,
) -> FederatedDataset:
    """The :class:`FederatedDataset` of a pool of examples ``x, y`` split among clients: what a
    data-set builder (:func:`register_dataset`) returns once it has its examples and its
    partition.

    Args:
      name: the data set's registry name.
      x, y: the pooled examples and labels. ``x`` may be a generator
        (:class:`~fedjax_sel.data.client_data.RowChunks`, ``y`` then ``None``): its rows are
        made once, written straight into the final arrays (:func:`from_row_chunks`), the same
        arrays as from the whole pool.
      parts: each client's row indices into the pool (:func:`partition_by_client`, or a
        partitioner of :mod:`fedjax_sel.data.partition`).
      rng: draws each client's test split.
      test_fraction: fraction of each client's examples held out as its test split.
      layout: the builder's ``layout`` (:mod:`fedjax_sel.data.client_data`).
      task, num_classes, info: the :class:`FederatedDataset` fields.
      default_model: the model the papers use on it (default: the one its registration
        names).
      x_scale: stored ``x`` times this is the feature (integer pixels kept small on device).
      central_test: the official test set ``(x, y)``; default: the union of the clients'
        test splits.
      temporal_split: hold out each client's last examples (overlapping windows of a text)
        instead of a random subset.
    """
    if temporal_split:  # overlapping windows: hold out each client's last examples
        train_parts, test_parts = [], []
        for p in parts:
            n_test = min(int(round(test_fraction * len(p))), len(p) - 1)
            train_parts.append(p[: len(p) - n_test])
            test_parts.append(p[len(p) - n_test :])
    else:  # no array object per client
        train_parts, test_parts = partitioners.split_train_test_flat(parts, test_fraction, rng)
        del parts
    idx = None
    if central_test is None:
        idx = np.zeros(0, np.int64)
        if test_fraction > 0:
            idx = (
                test_parts.rows
                if isinstance(test_parts, partitioners.FlatParts)
                else np.concatenate(test_parts)
            )
        if len(idx) == 0:
            raise ConfigError(
                f"{name}: no test examples (test_fraction={test_fraction}); use a test fraction > 0"
            )
    test = None
    if isinstance(x, RowChunks):  # a generator: every array filled in one pass, chunk by chunk
        sets = [(train_parts, False)] + ([(test_parts, True)] if test_fraction > 0 else [])
        built, rows = from_row_chunks(
            x, sets, [] if idx is None else [idx], layout=layout, x_scale=x_scale
        )
        train, test = built[0], built[1] if test_fraction > 0 else None
        tx, ty = rows[0] if idx is not None else central_test
    else:
        train = from_parts(x, y, train_parts, layout=layout, x_scale=x_scale)
        if test_fraction > 0:
            test = from_parts(x, y, test_parts, layout=layout, x_scale=x_scale, allow_empty=True)
        tx, ty = (x[idx], y[idx]) if idx is not None else central_test
    if x_scale is not None:  # on the host: the same float32 product, no eager programs
        tx = np.asarray(tx, np.float32) * np.float32(x_scale)
    tx = jnp.asarray(tx)
    sizes = np.asarray(train.counts)
    info = dict(
        info,
        num_train_examples=int(sizes.sum()),
        num_test_examples=int(len(ty)),
        client_size_min=int(sizes.min()),
        client_size_median=float(np.median(sizes)),
        client_size_max=int(sizes.max()),
        layout=train.layout,
    )
    return FederatedDataset(
        name=name,
        train=train,
        test=test,
        test_x=tx,
        test_y=jnp.asarray(ty),
        task=task,
        num_classes=num_classes,
        input_shape=tuple(train.feature_shape),
        default_model=default_model or registered_model(name),
        info=info,
    )


def registered_model(name: str) -> str:
    """The default model data set ``name`` was registered with (:func:`register_dataset`)."""
    return DATASETS[name].info["default_model"]


def _pooled_parts(spec: str, labels, num_clients, rng, groups=None):
    name, kwargs = partitioners.parse_partition(spec)
    return partitioners.partition(name, kwargs, labels, num_clients, rng, groups), spec


def _no_data_path(name: str, data_path) -> None:
    if data_path is not None:
        raise ConfigError(f"data set {name!r} is generated or embedded and takes no data path")


@register_dataset(
    "digits",
    description="scikit-learn 8x8 digits (1,797 images, 10 classes), embedded; the demo default",
    default_clients=20,
    default_partition="dirichlet:0.5",
    default_model="mlp",
)
def _digits(*, num_clients, partition, seed, data_path, test_fraction, layout):
    _no_data_path("digits", data_path)
    d = loaders.load_digits()
    rng = np.random.default_rng(seed)
    if partition.startswith("dirichlet") and "min_size" not in partition:
        partition = partition + ",min_size=5"
    parts, spec = _pooled_parts(partition, d.y_train, num_clients, rng)
    return assemble(
        "digits",
        d.x_train,
        d.y_train,
        parts,
        rng=rng,
        test_fraction=0.2 if test_fraction is None else test_fraction,
        layout=layout,
        task="classification",
        num_classes=10,
        info={"source": d.source, "partition": spec},
        x_scale=1.0 / 16.0,
    )


@register_dataset(
    "leaf_synthetic",
    description="LEAF/FedProx Synthetic(alpha, beta): 60 features, 10 classes, LogNormal sizes",
    default_clients=30,
    default_partition="natural",
    default_model="logreg",
)
def _leaf_synthetic(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    alpha: float = 1.0,
    beta: float = 1.0,
    iid: bool = False,
    dim: int = 60,
    num_classes: int = 10,
    max_examples: int | None = None,
    examples_per_client: int | None = None,
    personal_scale: float | None = None,
):
    _no_data_path("leaf_synthetic", data_path)
    if partition != "natural":
        raise ConfigError("leaf_synthetic generates its own clients; its partition is 'natural'")
    key = jax.random.key(seed)
    pool, sizes = synthetic.leaf_synthetic_rows(
        key,
        num_clients,
        float(alpha),
        float(beta),
        dim=int(dim),
        num_classes=int(num_classes),
        iid=bool(iid),
        max_examples=None if max_examples is None else int(max_examples),
        examples_per_client=None if examples_per_client is None else int(examples_per_client),
        personal_scale=None if personal_scale is None else float(personal_scale),
    )
    if np.any(sizes == 0):
        raise ConfigError(f"leaf_synthetic: max_examples={max_examples} leaves clients empty")
    return assemble(
        "leaf_synthetic",
        pool,
        None,
        # rows are grouped by client in client order (what partition_by_client finds)
        partitioners.FlatParts.ranges(sizes),
        rng=np.random.default_rng(seed),
        test_fraction=0.1 if test_fraction is None else test_fraction,
        layout=layout,
        task="classification",
        num_classes=int(num_classes),
        info={"source": "generated", "alpha": alpha, "beta": beta, "iid": bool(iid)}
        | ({} if personal_scale is None else {"personal_scale": float(personal_scale)}),
    )


@register_dataset(
    "regression",
    description="FedCVR-Bolt clustered linear regression (appendix C.3): J clusters",
    default_clients=100,
    default_partition="natural",
    default_model="linreg",
)
def _regression(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    num_clusters: int = 2,
    dim: int = 1,
    intercept: bool = False,
    examples_per_client: int = 100,
    theta_scale: float = 1.0,
):
    """``theta_scale`` (ours) multiplies the law of the regression vectors, so every MSE scales
    by its square (:func:`~fedjax_sel.data.synthetic.clustered_regression`)."""
    _no_data_path("regression", data_path)
    if partition != "natural":
        raise ConfigError("regression generates its own clients; its partition is 'natural'")
    x, y, client, cluster = synthetic.clustered_regression(
        jax.random.key(seed),
        num_clients,
        int(num_clusters),
        dim=int(dim),
        intercept=bool(intercept),
        examples_per_client=int(examples_per_client),
        theta_scale=float(theta_scale),
    )
    return assemble(
        "regression",
        x,
        y,
        partition_by_client(client, num_clients),
        rng=np.random.default_rng(seed),
        test_fraction=0.2 if test_fraction is None else test_fraction,
        layout=layout,
        task="regression",
        num_classes=None,
        info={
            "source": "generated",
            "num_clusters": int(num_clusters),
            "intercept": bool(intercept),
            "theta_scale": float(theta_scale),
            "cluster": cluster.tolist(),
        },
    )


def _image_builder(name: str):
    def build(*, num_clients, partition, seed, data_path, test_fraction, layout):
        d = loaders.load_image_dataset(name, data_path)
        rng = np.random.default_rng(seed)
        parts, spec = _pooled_parts(partition, d.y_train, num_clients, rng)
        return assemble(
            name,
            d.x_train,
            d.y_train,
            parts,
            rng=rng,
            test_fraction=0.0 if test_fraction is None else test_fraction,
            layout=layout,
            task="classification",
            num_classes=d.num_classes,
            info={"source": d.source, "partition": spec},
            x_scale=1.0 / 255.0,
            central_test=(d.x_test, d.y_test),
        )

    return build


for _name, _model, _desc in [
    ("mnist", "mlp", "MNIST 28x28 digits (local mnist.npz or tensorflow-datasets)"),
    ("fashion_mnist", "mlp", "Fashion-MNIST (local fashion_mnist.npz or tensorflow-datasets)"),
    ("emnist", "cnn", "EMNIST by-class, 62 classes (local emnist.npz or tensorflow-datasets)"),
    ("cifar10", "cnn", "CIFAR-10 (local cifar10.npz or tensorflow-datasets)"),
    ("cifar100", "cnn", "CIFAR-100 (local cifar100.npz or tensorflow-datasets)"),
]:
    register_dataset(
        _name,
        description=_desc,
        default_clients=100,
        default_partition="dirichlet:0.1",
        default_model=_model,
    )(_image_builder(_name))


@register_dataset(
    "shakespeare",
    description="LEAF-style Shakespeare: one client per speaking role, next-character prediction",
    default_clients=100,
    default_partition="natural",
    default_model="lstm",
)
def _shakespeare(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    seq_len: int = shakespeare.SEQ_LEN,
    stride: int = 1,
    max_examples: int | None = None,
    min_examples: int = 64,
):
    if partition != "natural":
        raise ConfigError("shakespeare clients are its speaking roles; its partition is 'natural'")
    seq_len, stride, min_examples = int(seq_len), int(stride), int(min_examples)
    if stride < 1 or seq_len < 1:
        raise ConfigError(f"shakespeare: seq_len and stride must be >= 1, got {seq_len}, {stride}")
    roles = []
    for role, text in shakespeare.load_roles(data_path):
        x, y = shakespeare.windows(shakespeare.encode(text), seq_len, stride)
        if len(y) >= min_examples:
            roles.append((role, x, y))
    if num_clients > len(roles):
        raise ConfigError(
            f"shakespeare has {len(roles)} roles with >= {min_examples} examples but "
            f"{num_clients} clients were asked"
        )
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(len(roles), num_clients, replace=False))
    xs, ys, parts, start = [], [], [], 0
    for i in chosen:
        _, x, y = roles[i]
        if max_examples is not None and len(y) > int(max_examples):  # keep a contiguous stretch
            s = int(rng.integers(0, len(y) - int(max_examples) + 1))
            x, y = x[s : s + int(max_examples)], y[s : s + int(max_examples)]
        xs.append(x)
        ys.append(y)
        parts.append(np.arange(start, start + len(y)))
        start += len(y)
    return assemble(
        "shakespeare",
        np.concatenate(xs),
        np.concatenate(ys),
        parts,
        rng=rng,
        test_fraction=0.2 if test_fraction is None else test_fraction,
        layout=layout,
        task="classification",
        num_classes=shakespeare.VOCAB_SIZE,
        info={"source": "gutenberg texts", "roles": [roles[i][0] for i in chosen]},
        temporal_split=True,
    )


def partition_by_client(client: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Index arrays of a generator's rows grouped by their client id."""
    return partitioners.natural(client, num_clients)
