"""Pytree helpers shared by the engine and the strategies.

Parameters of many clients are pytrees whose leaves carry a leading *slot* axis (one model per
slot); these functions reduce or combine them without flattening the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, Params, PyTree


def sq_norm(tree: Params) -> Array:
    """``||tree||^2`` over every leaf (float32 scalar)."""
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def stacked_norms(stacked: Params) -> Array:
    """float32[n]: the L2 norm of each of the ``n`` models stacked on axis 0."""
    sq = sum(
        jnp.sum(jnp.square(d).reshape(d.shape[0], -1), axis=1) for d in jax.tree.leaves(stacked)
    )
    return jnp.sqrt(sq)


def weighted_sum(weights: Array, stacked: Params) -> Params:
    """``sum_i weights[i] * stacked[i]`` over axis 0 of every leaf (``weights`` float32[n])."""
    w = weights.astype(jnp.float32)
    return jax.tree.map(lambda x: jnp.tensordot(w, x.astype(jnp.float32), axes=1), stacked)


def flatten_stacked(stacked: Params) -> Array:
    """A pytree stacked over slots -> float32[slots, D] (leaves concatenated)."""
    leaves = jax.tree.leaves(stacked)
    n = leaves[0].shape[0]
    return jnp.concatenate([x.reshape(n, -1).astype(jnp.float32) for x in leaves], axis=1)


def row_mask(mask: Array, x: Array) -> Array:
    """``mask[i]`` over the leading (slot) axis of ``x``, broadcastable to ``x``."""
    return mask.reshape((-1,) + (1,) * (x.ndim - 1))


def masked_rows(mask: Array, new: Params, old: Params) -> Params:
    """Leaf-wise ``where(mask[i], new[i], old[i])`` over the slot axis (``old`` may hold a
    single model with a leading axis of 1, broadcast to every slot)."""
    return jax.tree.map(lambda a, b: jnp.where(row_mask(mask, a), a, b), new, old)


def masked_deltas(mask: Array, new: Params, starts: Params) -> Params:
    """Leaf-wise ``new[i] - starts[i]`` where ``mask[i]``, zero elsewhere (``starts`` may hold
    one model with a leading axis of 1)."""
    return jax.tree.map(lambda a, b: jnp.where(row_mask(mask, a), a - b, 0.0), new, starts)


def nbytes(tree: PyTree) -> int:
    """Bytes of a pytree's arrays (or of their ``jax.ShapeDtypeStruct``s: sizes only, e.g. from
    ``jax.eval_shape``); typed PRNG keys, whose size is the implementation's, count nothing."""
    return sum(
        x.size * x.dtype.itemsize
        for x in jax.tree.leaves(tree)
        if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    )
