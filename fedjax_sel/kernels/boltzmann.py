"""Boltzmann (softmax) selection of one client per coalition (``papers/fedcvr_bolt.txt`` eq. 8,
Algorithm 1 lines 7-8), with fixed shapes and no ``K x P`` arrays.

Within coalition ``p`` the probability of client ``k`` is

    pi_p(k) = exp(beta v_k) / sum_{j in C_p} exp(beta v_j),

restricted to the eligible (available) members. Sampling uses the Gumbel-max trick per coalition
(``argmax_k beta v_k + G_k`` over its members, by segment reductions), which draws exactly from
``pi_p`` and never exponentiates, so a huge ``v`` cannot overflow; the probabilities themselves
subtract each coalition's maximum before ``exp``. Non-finite values are sanitised: NaN counts as
ineligible, ``+inf`` as the largest float.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, PRNGKey


def boltzmann_logits(values: Array, beta: float = 1.0, mask: Array | None = None) -> Array:
    """``beta * v`` made safe for sampling: ``+-inf`` clipped to the float range, NaN and
    ineligible entries ``-inf``."""
    big = jnp.finfo(jnp.float32).max
    values = jnp.asarray(values, jnp.float32)
    z = jnp.clip(jnp.asarray(beta, jnp.float32) * jnp.clip(values, -big, big), -big, big)
    z = jnp.where(jnp.isnan(values), -jnp.inf, z)
    return z if mask is None else jnp.where(mask, z, -jnp.inf)


@functools.partial(jax.jit, static_argnames=("num_coalitions",))
def coalition_probabilities(
    values: Array,
    labels: Array,
    num_coalitions: int,
    beta: float = 1.0,
    mask: Array | None = None,
) -> Array:
    """``pi_{labels[k]}(k)`` for every client (eq. 8), float32[K]; 0 for ineligible clients and
    in coalitions without an eligible member. Each non-empty coalition's entries sum to one."""
    chex.assert_equal_shape([values, labels])
    z = boltzmann_logits(values, beta, mask)
    top = jax.ops.segment_max(z, labels, num_coalitions)
    shift = jnp.where(jnp.isfinite(top), top, 0.0)[labels]
    e = jnp.where(jnp.isfinite(z), jnp.exp(z - shift), 0.0)
    total = jax.ops.segment_sum(e, labels, num_coalitions)[labels]
    return jnp.where(total > 0, e / jnp.where(total > 0, total, 1.0), 0.0)


@functools.partial(jax.jit, static_argnames=("num_coalitions",))
def sample_per_coalition(
    key: PRNGKey,
    values: Array,
    labels: Array,
    num_coalitions: int,
    beta: float = 1.0,
    mask: Array | None = None,
) -> tuple[Array, Array]:
    """One client per coalition drawn from eq. 8 (Gumbel-max).

    Returns:
      ``(clients int32[P], valid bool[P])``: slot ``p`` holds coalition ``p``'s draw; ``valid``
      is False for a coalition with no eligible member.
    """
    chex.assert_equal_shape([values, labels])
    k = values.shape[0]
    z = boltzmann_logits(values, beta, mask)
    g = jnp.where(jnp.isfinite(z), z + jax.random.gumbel(key, z.shape, jnp.float32), -jnp.inf)
    best = jax.ops.segment_max(g, labels, num_coalitions)
    hit = jnp.isfinite(g) & (g == best[labels])
    winner = jax.ops.segment_min(jnp.where(hit, jnp.arange(k), k), labels, num_coalitions)
    valid = winner < k
    return jnp.where(valid, winner, 0).astype(jnp.int32), valid


def fill_slots(
    primary: Array, primary_ok: Array, backup: Array, backup_ok: Array, size: int
) -> tuple[Array, Array]:
    """``size`` slots: the valid ``primary`` entries (in order), then valid ``backup`` entries.

    The caller makes ``backup`` disjoint from the valid ``primary`` entries. Returns
    ``(ids int32[size], valid bool[size])``.
    """
    ids = jnp.concatenate([primary, backup]).astype(jnp.int32)
    ok = jnp.concatenate([primary_ok, backup_ok])
    order = jnp.argsort(~ok, stable=True)[:size]
    return ids[order], ok[order]
