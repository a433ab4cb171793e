"""Model sketches: the fixed set of model coordinates a strategy tracks per client (FedCVR-Bolt
appendix C.2: "we confine the covariance computation to the parameters of the final fully
connected layer ... for CIFAR-10 we sample D = 300 weights"; FeSEM's code clusters one layer).

A sketch is ``part`` (``all`` parameters or the ``last_layer``) and ``dim`` (0: every coordinate
of the part; ``dim > 0``: a fixed random subset of that many, drawn once from a key). The last
layer is the last top-level entry of the initial parameter dictionary, in the order the model
built its layers (flax keeps creation order at ``init``: ``Dense_2`` of the MLP, ``Dense_1`` of
the CNN). Tree operations re-order dictionary keys, so the sketch is stored as indices into the
flattened parameter vector (``jax.tree.leaves`` order), which every later tree shares.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.base import Array, ConfigError, Params, PRNGKey
from fedjax_sel.tree import flatten_stacked

PARTS = ("all", "last_layer")


def check_sketch(part: str, dim: int) -> None:
    if part not in PARTS:
        raise ConfigError(f"sketch must be one of {PARTS}, got {part!r}")
    if int(dim) != dim or dim < 0:
        raise ConfigError(f"sketch_dim must be an integer >= 0 (0 = every coordinate), got {dim}")


def last_layer_name(params: Params) -> str:
    """The top-level key of the last layer the model built (see the module docstring)."""
    if not hasattr(params, "keys") or not list(params.keys()):
        raise ConfigError(
            "sketch='last_layer' needs a dictionary of layers as parameters; use sketch='all'"
        )
    return list(params.keys())[-1]


def sketch_coordinates(key: PRNGKey, params: Params, part: str, dim: int) -> Array:
    """int32[D]: the flattened-parameter indices the sketch keeps (sorted).

    ``params`` must be the model's initial parameters (their key order names the last layer).
    """
    check_sketch(part, dim)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    name = last_layer_name(params) if part == "last_layer" else None
    chosen, offset = [], 0
    for path, leaf in leaves:
        size = int(np.prod(leaf.shape))
        head = getattr(path[0], "key", None) if path else None
        if name is None or head == name:
            chosen.append(np.arange(offset, offset + size))
        offset += size
    idx = np.concatenate(chosen).astype(np.int32)
    if dim and dim < len(idx):
        pick = jax.random.choice(key, len(idx), (int(dim),), replace=False)
        return jnp.sort(jnp.asarray(idx)[pick])
    return jnp.asarray(idx)


def sketch_stacked(stacked: Params, coords: Array) -> Array:
    """float32[n, D] sketches of parameters stacked over a leading axis."""
    return flatten_stacked(stacked)[:, coords]


def sketch_one(params: Params, coords: Array) -> Array:
    """float32[D] sketch of one set of parameters."""
    return sketch_stacked(jax.tree.map(lambda x: x[None], params), coords)[0]
