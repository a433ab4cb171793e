"""Real-data loaders: embedded digits, local Keras-layout ``.npz`` files, tensorflow-datasets.

Where each image data set comes from, in order:

1. an explicit ``path`` (a ``.npz`` file, or a folder holding ``<name>.npz``);
2. ``$FEDJAX_SEL_DATA_DIR/<name>.npz``;
3. tensorflow-datasets (the ``tfds`` extra), which downloads when online.

With none of these, the loader raises :class:`~fedjax_sel.base.ConfigError` saying what to
provide. Local files use the Keras layout: ``x_train [N, H, W(, C)] uint8``, ``y_train [N]``,
``x_test``, ``y_test``.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedjax_sel import input_checks
from fedjax_sel.base import ConfigError

DATA_DIR_ENV = "FEDJAX_SEL_DATA_DIR"

# name -> (tfds name, number of classes, image shape)
IMAGE_DATASETS = {
    "mnist": ("mnist", 10, (28, 28, 1)),
    "fashion_mnist": ("fashion_mnist", 10, (28, 28, 1)),
    "emnist": ("emnist/byclass", 62, (28, 28, 1)),
    "cifar10": ("cifar10", 10, (32, 32, 3)),
    "cifar100": ("cifar100", 100, (32, 32, 3)),
}


class ArrayDataset(NamedTuple):
    """A centralised data set: uint8 images (or features) and int labels."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    num_classes: int
    source: str


def load_digits() -> ArrayDataset:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes), shipped inside the package.

    Pixel values are 0..16. There is no separate test set: callers split per client.
    """
    ref = importlib.resources.files("fedjax_sel.data") / "assets" / "digits.npz"
    with importlib.resources.as_file(ref) as path, np.load(path) as f:
        x, y = f["x"], f["y"].astype(np.int32)
    return ArrayDataset(x[..., None], y, None, None, 10, "embedded sklearn digits")


def resolve_local_file(name: str, path: str | os.PathLike | None) -> Path | None:
    """The local ``.npz`` for ``name``: ``path`` (file or folder), else the data-dir variable."""
    if path is not None:
        p = Path(path).expanduser()
        if p.is_dir():
            p = p / f"{name}.npz"
        if not p.exists():
            raise ConfigError(f"{name}: data file {str(p)!r} does not exist")
        return p
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        p = Path(env).expanduser() / f"{name}.npz"
        if p.exists():
            return p
    return None


def load_npz(path: Path, name: str, num_classes: int, image_shape: tuple[int, ...]) -> ArrayDataset:
    """Reads and checks a Keras-layout ``.npz`` (every array's header against the free memory
    before it is read); any problem is a :class:`ConfigError`."""
    keys = ["x_train", "y_train", "x_test", "y_test"]
    arrays = input_checks.load_npz(path, f"{name} data file", keys)
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise ConfigError(
            f"{name}: {str(path)!r} lacks the array(s) {missing}; expected the Keras layout "
            "x_train, y_train, x_test, y_test"
        )
    for key, a in arrays.items():  # pixels and labels: whole numbers, read without rounding
        if a.dtype.kind not in "buif" or (
            a.dtype.kind == "f" and a.size and not np.all(np.isfinite(a) & (a == np.rint(a)))
        ):
            raise ConfigError(
                f"{name}: {key} in {str(path)!r} must hold whole numbers (uint8 pixels, integer "
                f"labels), got dtype {a.dtype} with values such as {a.ravel()[:3]}"
            )
    out = {}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"].reshape(-1)
        if x.ndim == len(image_shape) and image_shape[-1] == 1:  # [N, H, W] grayscale
            x = x[..., None]
        if x.shape[1:] != image_shape:
            raise ConfigError(
                f"{name}: x_{split} in {str(path)!r} has shape {x.shape}, expected [N, "
                f"{', '.join(map(str, image_shape))}]"
            )
        if len(x) != len(y):
            raise ConfigError(f"{name}: x_{split} has {len(x)} rows but y_{split} has {len(y)}")
        if x.size and (x.min() < 0 or x.max() > 255):
            raise ConfigError(
                f"{name}: x_{split} in {str(path)!r} must hold pixels 0..255, got "
                f"{x.min()}..{x.max()}"
            )
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ConfigError(
                f"{name}: y_{split} in {str(path)!r} has labels outside 0..{num_classes - 1}"
            )
        out[split] = (np.asarray(x, np.uint8), np.asarray(y, np.int32))
    return ArrayDataset(*out["train"], *out["test"], num_classes, str(path))


def load_tfds(name: str, data_dir: str | None = None) -> ArrayDataset:
    """Loads an image data set through tensorflow-datasets (downloads when online)."""
    tfds_name, num_classes, image_shape = IMAGE_DATASETS[name]
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ConfigError(_missing_message(name)) from None
    try:
        splits = tfds.as_numpy(
            tfds.load(
                tfds_name,
                split=["train", "test"],
                batch_size=-1,
                as_supervised=True,
                data_dir=data_dir,
            )
        )
    except Exception as e:  # noqa: BLE001 - offline, missing checksum, ...
        raise ConfigError(f"{_missing_message(name)}\n(tensorflow-datasets failed: {e})") from None
    (xtr, ytr), (xte, yte) = splits
    xtr, xte = np.asarray(xtr, np.uint8), np.asarray(xte, np.uint8)
    if xtr.shape[1:] != image_shape:
        raise ConfigError(f"{name}: tensorflow-datasets gave images of shape {xtr.shape[1:]}")
    return ArrayDataset(
        xtr, np.asarray(ytr, np.int32), xte, np.asarray(yte, np.int32), num_classes, "tfds"
    )


def load_image_dataset(name: str, path: str | os.PathLike | None = None) -> ArrayDataset:
    """Loads ``name`` (one of :data:`IMAGE_DATASETS`) from a local file or tensorflow-datasets."""
    if name not in IMAGE_DATASETS:
        raise ConfigError(f"unknown image data set {name!r}; known: {sorted(IMAGE_DATASETS)}")
    _, num_classes, image_shape = IMAGE_DATASETS[name]
    local = resolve_local_file(name, path)
    if local is not None:
        return load_npz(local, name, num_classes, image_shape)
    return load_tfds(name)


def _missing_message(name: str) -> str:
    return (
        f"{name} is not available offline: pass a path to a Keras-layout {name}.npz "
        f"(--data-dir FILE_OR_FOLDER, or data_path= in Python), or set {DATA_DIR_ENV} to a "
        f"folder holding {name}.npz, or install the tfds extra (pip install "
        f"'fedjax_sel[tfds]') and run online"
    )
