"""Boltzmann (softmax) selection of one client per coalition (FedCVR-Bolt, arXiv:2506.02897,
eq. 8, Algorithm 1 lines 7-8), with fixed shapes and no ``K x P`` arrays.

Within coalition ``p`` the probability of client ``k`` is

    pi_p(k) = exp(beta v_k) / sum_{j in C_p} exp(beta v_j),

restricted to the eligible (available) members. Sampling uses the Gumbel-max trick per coalition
(``argmax_k beta v_k + G_k`` over its members, by segment reductions), which draws exactly from
``pi_p`` and never exponentiates, so a huge ``v`` cannot overflow; the probabilities themselves
subtract each coalition's maximum before ``exp``. Non-finite values are sanitised: NaN counts as
ineligible, ``+inf`` as the largest float.

Two additions that are ours, not the paper's:

* :func:`standardize_within` rescales the values of each coalition to mean 0 and standard
  deviation 1 over its eligible members, so ``beta`` no longer depends on the units of ``v``
  (squared parameters, which vary by orders of magnitude with the model and the data scale);
* :func:`coalition_law_stats` measures how far each coalition's law is from uniform (entropy
  ratio, largest probability over uniform), the diagnostic that tells a Boltzmann draw from a
  uniform one.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

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


def _eligible(values: Array, mask: Array | None) -> Array:
    ok = ~jnp.isnan(values)
    return ok if mask is None else ok & mask


@functools.partial(jax.jit, static_argnames=("num_coalitions",))
def standardize_within(
    values: Array, labels: Array, num_coalitions: int, mask: Array | None = None
) -> Array:
    """``z_k = (v_k - mean_p) / std_p`` over the eligible members of ``k``'s coalition ``p``
    (population standard deviation), float32[K]: the scale-free values (ours, module
    docstring). A coalition whose eligible values are all equal (or that has one eligible
    member) gets ``z = 0``: a uniform law. Ineligible entries keep their (unused) value's place
    with ``z = 0``, NaN stays NaN (ineligible for the draw)."""
    chex.assert_equal_shape([values, labels])
    big = jnp.finfo(jnp.float32).max
    v = jnp.clip(jnp.asarray(values, jnp.float32), -big, big)
    ok = _eligible(v, mask)
    w = ok.astype(jnp.float32)
    count = jax.ops.segment_sum(w, labels, num_coalitions)
    safe = jnp.maximum(count, 1.0)
    vz = jnp.where(ok, v, 0.0)
    # subtract the coalition's maximum first: squared deviations of huge values stay finite
    top = jax.ops.segment_max(jnp.where(ok, v, -jnp.inf), labels, num_coalitions)
    top = jnp.where(jnp.isfinite(top), top, 0.0)[labels]
    u = jnp.where(ok, vz - top, 0.0)
    mean = (jax.ops.segment_sum(u, labels, num_coalitions) / safe)[labels]
    dev = jnp.where(ok, u - mean, 0.0)
    var = (jax.ops.segment_sum(dev * dev, labels, num_coalitions) / safe)[labels]
    std = jnp.sqrt(var)
    z = jnp.where(std > 0, dev / jnp.where(std > 0, std, 1.0), 0.0)
    return jnp.where(jnp.isnan(values), jnp.nan, z)


class CoalitionLaw(NamedTuple):
    """Per-coalition statistics of eq. 8's laws (float32[P] each).

    Attributes:
      size: eligible members.
      entropy: the law's entropy (nats).
      entropy_ratio: entropy over ``log(size)`` (1 = uniform; 1 for a coalition of <= 1).
      max_over_uniform: the largest probability times ``size`` (1 = uniform; 0 when empty).
    """

    size: Array
    entropy: Array
    entropy_ratio: Array
    max_over_uniform: Array


@functools.partial(jax.jit, static_argnames=("num_coalitions",))
def coalition_law_stats(
    probs: Array, labels: Array, num_coalitions: int, mask: Array | None = None
) -> CoalitionLaw:
    """How far each coalition's law ``probs`` (:func:`coalition_probabilities`) is from the
    uniform law on its eligible members."""
    chex.assert_equal_shape([probs, labels])
    ok = jnp.ones(probs.shape, bool) if mask is None else mask
    p = jnp.where(ok, probs, 0.0)
    size = jax.ops.segment_sum(ok.astype(jnp.float32), labels, num_coalitions)
    plogp = jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0)
    entropy = -jax.ops.segment_sum(plogp, labels, num_coalitions)
    log_size = jnp.log(jnp.maximum(size, 1.0))
    ratio = jnp.where(size > 1, entropy / jnp.where(size > 1, log_size, 1.0), 1.0)
    top = jax.ops.segment_max(p, labels, num_coalitions)
    return CoalitionLaw(size, entropy, ratio, jnp.where(size > 0, top * size, 0.0))


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
