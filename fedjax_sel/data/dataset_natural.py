"""The field's federated data sets with their natural clients, read from the published files
(:mod:`fedjax_sel.data.federated_files`): one client per writer, speaking role or user, with
the published per-client train/test split and client sizes exactly as the files have them.

* ``femnist``: LEAF JSON (``train/``, ``test/``), one client per writer;
* ``shakespeare_leaf``: LEAF JSON, one per speaking role (80 characters -> the next one);
* ``synthetic_leaf``: LEAF JSON, LEAF's Synthetic users;
* ``emnist_writers``: TFF's ``fed_emnist_{train,test}.h5`` (``only_digits``: the digits-only
  files), one client per writer (3,400);
* ``cifar100_tff``: TFF's ``fed_cifar100_{train,test}.h5``, 500 clients by the Pachinko
  allocation, fine or coarse labels (its test clients are others: a central test set only);
* ``shakespeare_tff``: TFF's ``shakespeare_{train,test}.h5``, 715 roles, each snippet cut into
  80-character windows.

Stack Overflow (TFF's ``stackoverflow_{train,test}.h5``, next-word prediction) is
:mod:`fedjax_sel.data.dataset_stackoverflow`, built with :func:`finish_natural`.

The three TFF data sets also read FedJAX's SQLite copies of the same clients
(``--dataset-arg format=fedjax``: ``federated_emnist_{train,test}.sqlite``,
``federated_cifar100_{train,test}.sqlite``, ``shakespeare_{train,test}.sqlite``).

``--clients N`` takes a seeded subset of the clients (``config.json`` says so: ``info``'s
``clients_subsampled``); by default every client in the files is one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data import shakespeare
from fedjax_sel.data.client_data import ClientData, from_client_arrays
from fedjax_sel.data.datasets import FederatedDataset, register_dataset, registered_model
from fedjax_sel.data.federated_files import (
    ClientExamples,
    compact_pixels,
    fedjax_client_ids,
    find_file,
    iter_fedjax_clients,
    iter_tff_clients,
    read_leaf,
    subsample,
    tff_client_ids,
)
from fedjax_sel.input_checks import check_finite


def natural_dataset(name: str, *, description: str, default_model: str, reference: str):
    """Registers a builder of a data set read from published files: every client in the files
    by default, the natural partition only, the published test split (no test fraction)."""

    def wrap(build: Callable[..., FederatedDataset]) -> Callable[..., FederatedDataset]:
        @functools.wraps(build)
        def checked(*, partition, test_fraction, **kwargs):
            if partition != "natural":
                raise ConfigError(
                    f"{name}'s clients are those of its files; its partition is 'natural'"
                )
            if test_fraction is not None:
                raise ConfigError(
                    f"{name} keeps the published train/test split; test_fraction does not "
                    f"apply (got {test_fraction})"
                )
            return build(partition=partition, test_fraction=test_fraction, **kwargs)

        return register_dataset(
            name,
            description=description,
            default_clients=None,
            default_partition="natural",
            default_model=default_model,
            reference=reference,
        )(checked)

    return wrap


def assemble_natural(
    name: str,
    ids: list[str],
    train: dict[str, ClientExamples],
    test: dict[str, ClientExamples] | None,
    *,
    layout: str,
    num_classes: int,
    info: dict[str, Any],
    default_model: str | None = None,
    x_scale: float | None = None,
    central_test: ClientExamples | None = None,
) -> FederatedDataset:
    """A :class:`FederatedDataset` of clients ``ids`` (in that order) with their examples as
    read; per-client test splits from ``test`` (a client without one holds none), and the
    central test set their union unless ``central_test`` is given."""
    empty = [c for c in ids if len(train[c].y) == 0]
    if empty:
        raise ConfigError(
            f"{name}: {len(empty)} client(s) have no training examples in the files "
            f"(first: {empty[0]!r})"
        )
    xs, ys = [train[c].x for c in ids], [train[c].y for c in ids]
    train_data = from_client_arrays(xs, ys, layout=layout, x_scale=x_scale)
    test_data = None
    if test is not None:
        shape, dtype = xs[0].shape[1:], xs[0].dtype
        blank = ClientExamples(np.zeros((0, *shape), dtype), np.zeros((0,), ys[0].dtype))
        tests = [test.get(c, blank) for c in ids]
        test_data = from_client_arrays(
            [t.x for t in tests], [t.y for t in tests], layout=layout, x_scale=x_scale,
            allow_empty=True,
        )  # fmt: skip
        if central_test is None:
            central_test = ClientExamples(
                np.concatenate([t.x for t in tests]), np.concatenate([t.y for t in tests])
            )
    return finish_natural(
        name, ids, train_data, test_data, central_test, num_classes=num_classes,
        default_model=default_model, info=info, x_scale=x_scale,
    )  # fmt: skip


def finish_natural(
    name: str,
    ids: list[str],
    train_data: ClientData,
    test_data: ClientData | None,
    central_test: ClientExamples | None,
    *,
    num_classes: int,
    info: dict[str, Any],
    default_model: str | None = None,
    x_scale: float | None = None,
) -> FederatedDataset:
    """The :class:`FederatedDataset` of clients ``ids`` stored as ``train_data`` (and
    ``test_data``), with the central test set ``central_test`` and the provenance and size
    figures every natural data set records in ``info`` (``default_model``: the registered one
    unless given)."""
    if central_test is None or len(central_test.y) == 0:
        raise ConfigError(f"{name}: the files hold no test examples for these clients")
    tx = jnp.asarray(central_test.x)
    if x_scale is not None:
        tx = tx.astype(jnp.float32) * x_scale
    sizes = np.asarray(train_data.counts)
    info = dict(
        info,
        partition="natural",
        num_train_examples=int(sizes.sum()),
        num_test_examples=int(len(central_test.y)),
        client_size_min=int(sizes.min()),
        client_size_median=float(np.median(sizes)),
        client_size_max=int(sizes.max()),
        layout=train_data.layout,
        clients=list(ids) if len(ids) <= 5000 else f"{len(ids)} clients",
    )
    return FederatedDataset(
        name=name,
        train=train_data,
        test=test_data,
        test_x=tx,
        test_y=jnp.asarray(central_test.y),
        task="classification",
        num_classes=num_classes,
        input_shape=tuple(train_data.feature_shape),
        default_model=default_model or registered_model(name),
        info=info,
    )


def _one_storage(train: dict, test: dict, scales: set) -> tuple[dict, dict, float | None]:
    """Every client stored alike: uint8 with scale 1/255 where all clients' pixels allow it,
    else float32 for all (a file mixing exact and inexact pixel values)."""
    if len(scales) <= 1:
        return train, test, next(iter(scales), None)
    return ({k: _as_float(v) for k, v in train.items()},
            {k: _as_float(v) for k, v in test.items()}, None)  # fmt: skip


def _labels(y: Any, where: str, num_classes: int) -> np.ndarray:
    out = np.asarray(y) if len(y) else np.zeros((0,), np.int32)
    if out.ndim != 1 or not np.issubdtype(out.dtype, np.integer):
        raise ConfigError(f"{where}: labels must be integers, got {out.dtype} {out.shape}")
    if out.size and (out.min() < 0 or out.max() >= num_classes):
        raise ConfigError(
            f"{where}: labels must lie in [0, {num_classes}), got {out.min()}..{out.max()}"
        )
    return out.astype(np.int32)


# ----------------------------------------------------------------------------- LEAF JSON
@natural_dataset(
    "femnist",
    description="Federated EMNIST by writer, LEAF's JSON files (62 classes, 28x28)",
    default_model="cnn",
    reference="Caldas et al. 2018, LEAF: leaf/data/femnist",
)
def _femnist(*, num_clients, partition, seed, data_path, test_fraction, layout):
    scales: set = set()

    def convert(x: list, y: list, where: str) -> ClientExamples:
        a = np.asarray(x, np.float32).reshape(len(x), -1) if len(x) else np.zeros((0, 784))
        if a.shape[1] != 784:
            raise ConfigError(f"{where}: FEMNIST examples are 784 pixel values, got {a.shape}")
        pixels, scale = compact_pixels(a.reshape(-1, 28, 28, 1))
        scales.add(scale)
        return ClientExamples(pixels, _labels(y, where, 62))

    train, test, folder = read_leaf("femnist", data_path, convert)
    train, test, scale = _one_storage(train, test, scales)
    ids, sub = subsample(sorted(train), num_clients, seed, "femnist")
    return assemble_natural(
        "femnist", ids, train, test, layout=layout, num_classes=62,
        info={"source": f"LEAF JSON {folder}", **sub}, x_scale=scale,
    )  # fmt: skip


def _as_float(c: ClientExamples) -> ClientExamples:
    if c.x.dtype == np.uint8:
        return ClientExamples(c.x.astype(np.float32) / 255.0, c.y)
    return c


@natural_dataset(
    "shakespeare_leaf",
    description="Shakespeare by speaking role, LEAF's JSON files (80 characters -> next one)",
    default_model="lstm",
    reference="Caldas et al. 2018, LEAF: leaf/data/shakespeare",
)
def _shakespeare_leaf(*, num_clients, partition, seed, data_path, test_fraction, layout):

    def convert(x: list, y: list, where: str) -> ClientExamples:
        if not all(isinstance(s, str) and len(s) == shakespeare.SEQ_LEN for s in x):
            raise ConfigError(
                f"{where}: Shakespeare examples are strings of {shakespeare.SEQ_LEN} characters"
            )
        if not all(isinstance(c, str) and len(c) == 1 for c in y):
            raise ConfigError(f"{where}: Shakespeare targets are single characters")
        xs = shakespeare.encode("".join(x)).reshape(len(x), shakespeare.SEQ_LEN)
        return ClientExamples(xs, shakespeare.encode("".join(y)).astype(np.int32))

    train, test, folder = read_leaf("shakespeare_leaf", data_path, convert)
    ids, sub = subsample(sorted(train), num_clients, seed, "shakespeare_leaf")
    return assemble_natural(
        "shakespeare_leaf", ids, train, test, layout=layout, num_classes=shakespeare.VOCAB_SIZE,
        info={"source": f"LEAF JSON {folder}", **sub},
    )  # fmt: skip


@natural_dataset(
    "synthetic_leaf",
    description="LEAF's Synthetic as published in its JSON files (the users as written)",
    default_model="logreg",
    reference="Caldas et al. 2018, LEAF: leaf/data/synthetic",
)
def _synthetic_leaf(
    *, num_clients, partition, seed, data_path, test_fraction, layout, num_classes: int = 10
):
    dims: set = set()

    def convert(x: list, y: list, where: str) -> ClientExamples:
        a = np.asarray(x, np.float32).reshape(len(x), -1) if len(x) else None
        if a is None:
            return ClientExamples(np.zeros((0, max(dims, default=1)), np.float32), np.zeros(0, int))
        if a.ndim != 2:
            raise ConfigError(f"{where}: Synthetic examples are feature vectors, got {a.shape}")
        dims.add(a.shape[1])
        if len(dims) > 1:
            raise ConfigError(f"{where}: feature vectors of {sorted(dims)} lengths in one set")
        return ClientExamples(a, _labels(y, where, int(num_classes)))

    train, test, folder = read_leaf("synthetic_leaf", data_path, convert)
    ids, sub = subsample(sorted(train), num_clients, seed, "synthetic_leaf")
    return assemble_natural(
        "synthetic_leaf", ids, train, test, layout=layout, num_classes=int(num_classes),
        info={"source": f"LEAF JSON {folder}", **sub},
    )  # fmt: skip


# ----------------------------------------------------------------------------- TFF HDF5
# format -> (client ids of a file, client-by-client reader, file suffix, what it is)
FORMATS: dict[str, tuple[Callable, Callable, str, str]] = {
    "tff": (tff_client_ids, iter_tff_clients, ".h5", "TFF HDF5"),
    "fedjax": (fedjax_client_ids, iter_fedjax_clients, ".sqlite", "FedJAX SQLite"),
}


class _Files(NamedTuple):
    """A TFF data set's two files in one format, and how to read them."""

    train: Path
    test: Path
    ids: Callable[[Path], list[str]]
    read: Callable
    source: str


def _files(name: str, data_path, file_format: str, tff_stem: str, fedjax_stem: str) -> _Files:
    """The train and test files of ``name`` in ``file_format`` (``tff``: ``{tff_stem}_train.h5``;
    ``fedjax``: ``{fedjax_stem}_train.sqlite``)."""
    if file_format not in FORMATS:
        raise ConfigError(f"{name}: format must be one of {sorted(FORMATS)}, got {file_format!r}")
    ids, read, suffix, label = FORMATS[file_format]
    stem = tff_stem if file_format == "tff" else fedjax_stem
    train = find_file(name, data_path, f"{stem}_train{suffix}")
    test = find_file(name, data_path, f"{stem}_test{suffix}")
    return _Files(train, test, ids, read, f"{label} {train.parent}")


def _tff_split(
    name: str,
    files: _Files,
    path: Path,
    ids: list[str] | None,
    features: tuple[str, ...],
    convert: Callable[[dict, str], ClientExamples],
) -> dict[str, ClientExamples]:
    """client id -> examples of the clients ``ids`` (default: all) of one file (non-finite
    values refused, naming the file and the client)."""
    out = {}
    for cid, arrays in files.read(path, features, ids):
        where = f"{name} {path.name}, client {cid!r}"
        out[cid] = examples = convert(arrays, where)
        check_finite(examples.x, f"{where}: {features[0]}")
        check_finite(examples.y, f"{where}: targets")
    return out


@natural_dataset(
    "emnist_writers",
    description="Federated EMNIST by writer, TFF's HDF5 files (62 classes, or digits only)",
    default_model="cnn",
    reference="TensorFlow Federated, tff.simulation.datasets.emnist",
)
def _emnist_writers(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    only_digits: bool = False,
    format: str = "tff",  # noqa: A002 (the option's name)
):
    digits = "_digitsonly" if only_digits else ""
    classes = 10 if only_digits else 62
    files = _files(
        "emnist_writers", data_path, format, f"fed_emnist{digits}", f"federated_emnist{digits}"
    )
    scales: set = set()

    def convert(arrays: dict, where: str) -> ClientExamples:
        x = np.asarray(arrays["pixels"])
        if x.ndim != 3 or x.shape[1:] != (28, 28):
            raise ConfigError(f"{where}: pixels must be [n, 28, 28], got {x.shape}")
        pixels, scale = compact_pixels(x[..., None])
        scales.add(scale)
        return ClientExamples(pixels, _labels(arrays["label"], where, classes))

    features = ("pixels", "label")
    ids, sub = subsample(files.ids(files.train), num_clients, seed, "emnist_writers")
    train = _tff_split("emnist_writers", files, files.train, ids, features, convert)
    have = set(files.ids(files.test))
    test_ids = [c for c in ids if c in have]
    test = _tff_split("emnist_writers", files, files.test, test_ids, features, convert)
    train, test, scale = _one_storage(train, test, scales)
    return assemble_natural(
        "emnist_writers", ids, train, test, layout=layout, num_classes=classes,
        x_scale=scale,
        info={"source": files.source, "only_digits": bool(only_digits), **sub},
    )  # fmt: skip


@natural_dataset(
    "cifar100_tff",
    description="CIFAR-100 over 500 clients by TFF's Pachinko allocation (HDF5 files)",
    default_model="cnn",
    reference="Reddi et al. 2021; tff.simulation.datasets.cifar100",
)
def _cifar100_tff(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    label: str = "fine",
    format: str = "tff",  # noqa: A002 (the option's name)
):
    if label not in ("fine", "coarse"):
        raise ConfigError(f"cifar100_tff: label must be 'fine' or 'coarse', got {label!r}")
    key, classes = ("label", 100) if label == "fine" else ("coarse_label", 20)
    files = _files("cifar100_tff", data_path, format, "fed_cifar100", "federated_cifar100")

    def convert(arrays: dict, where: str) -> ClientExamples:
        x = np.asarray(arrays["image"])
        if x.ndim != 4 or x.shape[1:] != (32, 32, 3) or x.dtype != np.uint8:
            raise ConfigError(
                f"{where}: image must be uint8 [n, 32, 32, 3], got {x.dtype} {x.shape}"
            )
        return ClientExamples(x, _labels(arrays[key], where, classes))

    features = ("image", key)
    ids, sub = subsample(files.ids(files.train), num_clients, seed, "cifar100_tff")
    train = _tff_split("cifar100_tff", files, files.train, ids, features, convert)
    # TFF's test clients are others than its training clients: the central test set only
    test = _tff_split("cifar100_tff", files, files.test, None, features, convert)
    central = ClientExamples(
        np.concatenate([t.x for t in test.values()]), np.concatenate([t.y for t in test.values()])
    )
    return assemble_natural(
        "cifar100_tff", ids, train, None, layout=layout, num_classes=classes,
        x_scale=1.0 / 255.0, central_test=central,
        info={"source": files.source, "label": label, **sub},
    )  # fmt: skip


@natural_dataset(
    "shakespeare_tff",
    description="Shakespeare by speaking role, TFF's HDF5 snippets (80 characters -> next one)",
    default_model="lstm",
    reference="TensorFlow Federated, tff.simulation.datasets.shakespeare",
)
def _shakespeare_tff(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    stride: int = 1,
    format: str = "tff",  # noqa: A002 (the option's name)
):
    if int(stride) < 1:
        raise ConfigError(f"shakespeare_tff: stride must be >= 1, got {stride}")
    files = _files("shakespeare_tff", data_path, format, "shakespeare", "shakespeare")

    def convert(arrays: dict, where: str) -> ClientExamples:
        snippets = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)
                    for s in np.asarray(arrays["snippets"]).reshape(-1)]  # fmt: skip
        xs, ys = [], []
        for text in snippets:  # windows within a snippet, never across two
            x, y = shakespeare.windows(shakespeare.encode(text), shakespeare.SEQ_LEN, int(stride))
            xs.append(x)
            ys.append(y)
        x = np.concatenate(xs) if xs else np.zeros((0, shakespeare.SEQ_LEN), np.uint8)
        y = np.concatenate(ys) if ys else np.zeros((0,), np.int32)
        return ClientExamples(x, y)

    features = ("snippets",)
    all_ids = files.ids(files.train)
    train = _tff_split("shakespeare_tff", files, files.train, all_ids, features, convert)
    usable = [c for c in all_ids if len(train[c].y) > 0]  # roles whose lines are all short
    ids, sub = subsample(usable, num_clients, seed, "shakespeare_tff")
    have = set(files.ids(files.test))
    test_ids = [c for c in ids if c in have]
    test = _tff_split("shakespeare_tff", files, files.test, test_ids, features, convert)
    sub["clients_without_a_full_window"] = len(all_ids) - len(usable)
    return assemble_natural(
        "shakespeare_tff", ids, train, test, layout=layout, num_classes=shakespeare.VOCAB_SIZE,
        info={"source": files.source, **sub},
    )  # fmt: skip
