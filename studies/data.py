"""Data the studies share: a stratified subsample of an image data set."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedjax_sel.data import loaders


def subsampled_npz(name: str, fraction: float, out: Path, data_dir=None) -> Path:
    """A Keras-layout ``name.npz`` under ``out`` holding a label-stratified ``fraction`` of the
    training images (all test images), drawn with a fixed generator. An existing file is
    reused only when it holds exactly that stratified subsample (its class counts match)."""
    path = out / f"{name}.npz"
    d = loaders.load_image_dataset(name, data_dir)
    classes = np.unique(d.y_train)
    want = {int(c): max(1, int(round(fraction * np.sum(d.y_train == c)))) for c in classes}
    if path.exists():
        with np.load(path) as z:
            have = dict(zip(*np.unique(z["y_train"], return_counts=True), strict=True))
        if {int(c): int(n) for c, n in have.items()} == want:
            return path
    rng = np.random.default_rng(0)
    keep = []
    for c in classes:
        idx = np.flatnonzero(d.y_train == c)
        keep.append(rng.choice(idx, want[int(c)], replace=False))
    keep = np.sort(np.concatenate(keep))
    out.mkdir(parents=True, exist_ok=True)
    np.savez(
        path, x_train=d.x_train[keep], y_train=d.y_train[keep], x_test=d.x_test, y_test=d.y_test
    )
    return path
