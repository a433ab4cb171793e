"""Double greedy over a set of clients (FilFL's chi-GF, Fourati et al. 2024, Algorithm 2) and
exhaustive search for its optimum, on device with fixed shapes.

The set function is FilFL's filtering objective (eq. 3)::

    R(S) = -F_V( (1/|S|) sum_{k in S} w^k )

the negated loss, on a filtering set V, of the uniform average of the local models in S.
Algorithm 2 walks the n candidates once, keeping X (starts empty) and Y (starts full); at step
i it compares the two marginal gains (eq. 4)::

    a_i = R(X_{i-1} + {u_i}) - R(X_{i-1}),    b_i = R(Y_{i-1} - {u_i}) - R(Y_{i-1})

and adds u_i to X with probability p_i (else removes it from Y):

* DGF (deterministic): ``p_i = 1{a_i > b_i}`` (ties remove, as the paper writes it; the
  reference code adds on ties: ``ties="add"``);
* RGF (randomised): ``p_i = a'_i / (a'_i + b'_i)`` with ``a' = max(a, 0)``, ``b' = max(b, 0)``,
  and ``p_i = 1`` when ``a'_i = b'_i = 0`` (so ``a' = b' > 0`` gives 1/2; the reference code
  reuses the previous step's p there).

After the last step ``X_n == Y_n`` (the filtered-in set). Each step averages in O(D) from
running parameter sums of X and Y and evaluates both candidate sets in one vmapped pair of
forward passes, so a filtering pass costs ``2n + 1`` forward passes over V (``+1`` for the
empty set's value when the caller computes it).

``R`` of the empty set has no average to evaluate; the caller passes it (``value_empty``).
FilFL uses ``-F_V(w_t)``, the loss of the current global model: aggregating no client leaves
the server model unchanged. The reference code's ``f = 10 - F_V`` with ``f(empty) = 0`` is
``value_empty = -10``.

A non-finite value (a diverged local model, NaN loss) is clamped to :data:`VALUE_FLOOR`, so such
a set loses every comparison instead of poisoning the gains with NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Params, PRNGKey
from fedjax_sel.tree import weighted_sum

VARIANTS = ("dgf", "rgf")
TIES = ("remove", "add")
VALUE_FLOOR = -1e30  # any set with a non-finite or worse value scores this
MAX_BRUTE_FORCE = 16  # 2^16 - 1 subsets


class GreedyResult(NamedTuple):
    """One pass of the double greedy over n slots.

    Attributes:
      keep: bool[n], the filtered-in set ``X_n`` (equal to ``Y_n``); False on invalid slots.
      value: R(X_n).
      value_y: R(Y_n) as tracked along the removals (equal to ``value`` up to rounding).
      value_full: R(Y_0), the value of keeping every valid slot (no filtering).
      gain_add: float32[n], a_i (eq. 4); 0 on invalid slots.
      gain_remove: float32[n], b_i (eq. 4); 0 on invalid slots.
      prob_add: float32[n], p_i; 0 on invalid slots.
    """

    keep: Array
    value: Array
    value_y: Array
    value_full: Array
    gain_add: Array
    gain_remove: Array
    prob_add: Array


class BruteForceResult(NamedTuple):
    """Exhaustive maximisation of R over the non-empty subsets of the valid slots.

    Attributes:
      keep: bool[n], an optimal subset (all False when no slot is valid).
      value: R(OPT) (``value_empty`` when no slot is valid).
      values: float32[2^n - 1], R of subset ``s`` (bit i of ``s + 1`` set = slot i in the
        subset); :data:`VALUE_FLOOR` for subsets holding an invalid slot.
    """

    keep: Array
    value: Array
    values: Array


def check_variant(variant: str, ties: str = "remove") -> None:
    if variant not in VARIANTS:
        raise ConfigError(f"double greedy variant must be one of {VARIANTS}, got {variant!r}")
    if ties not in TIES:
        raise ConfigError(f"double greedy ties must be one of {TIES}, got {ties!r}")


def clamp_value(value: Array) -> Array:
    """Non-finite or very negative values -> :data:`VALUE_FLOOR` (a losing, finite score)."""
    value = jnp.asarray(value, jnp.float32)
    return jnp.where(jnp.isnan(value), VALUE_FLOOR, jnp.clip(value, VALUE_FLOOR, -VALUE_FLOOR))


def greedy_uniforms(key: PRNGKey, n: int) -> Array:
    """The uniforms RGF compares with p_i: ``u_i = uniform(fold_in(key, i))``, float32[n].

    Exposed so that an independent implementation can replay the same coin flips.
    """
    return jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(key, i)))(jnp.arange(n))


def add_probability(a: Array, b: Array, variant: str, ties: str = "remove") -> Array:
    """p_i of Algorithm 2 from the gains ``a`` (adding) and ``b`` (removing)."""
    if variant == "dgf":
        add = a >= b if ties == "add" else a > b
        return add.astype(jnp.float32)
    ap, bp = jnp.maximum(a, 0.0), jnp.maximum(b, 0.0)
    total = ap + bp
    return jnp.where(total > 0, ap / jnp.where(total > 0, total, 1.0), 1.0)


def double_greedy(
    propose: Callable[[Any, Array], tuple[Any, Any, Array, Array]],
    carry: Any,
    value_x: Array,
    value_y: Array,
    valid: Array,
    *,
    variant: str,
    key: PRNGKey | None = None,
    ties: str = "remove",
) -> tuple[GreedyResult, Any]:
    """Algorithm 2 over ``n = valid.shape[0]`` slots for any set function.

    Args:
      propose: ``(carry, i) -> (carry_add, carry_remove, R(X + {u_i}), R(Y - {u_i}))``; the
        carry is whatever the set function needs to represent X and Y (running sums, masks).
      carry: the representation of ``X_0 = {}`` and ``Y_0 = {valid slots}``.
      value_x: R(X_0) (R of the empty set).
      value_y: R(Y_0).
      valid: bool[n]; invalid slots are skipped (never in X, never in Y).
      variant: ``"dgf"`` or ``"rgf"``.
      key: PRNG key of RGF's coin flips (``greedy_uniforms``); unused by DGF.
      ties: DGF's rule when ``a_i == b_i``: ``"remove"`` (paper) or ``"add"`` (reference code).

    Returns:
      ``(result, final carry)``.
    """
    check_variant(variant, ties)
    chex.assert_rank(valid, 1)
    n = valid.shape[0]
    if variant == "rgf" and key is None:
        raise ConfigError("double greedy variant 'rgf' needs a PRNG key")
    uniforms = greedy_uniforms(key, n) if variant == "rgf" else jnp.zeros((n,), jnp.float32)

    def step(state, inputs):
        c, r_x, r_y = state
        i, ok, u = inputs
        c_add, c_remove, r_add, r_remove = propose(c, i)
        r_add, r_remove = clamp_value(r_add), clamp_value(r_remove)
        a, b = r_add - r_x, r_remove - r_y
        p = add_probability(a, b, variant, ties)
        add = ok & (u < p)
        remove = ok & ~add
        c = jax.tree.map(
            lambda xa, xr, x0: jnp.where(add, xa, jnp.where(remove, xr, x0)), c_add, c_remove, c
        )
        r_x = jnp.where(add, r_add, r_x)
        r_y = jnp.where(remove, r_remove, r_y)
        zero = jnp.zeros((), jnp.float32)
        out = (add, jnp.where(ok, a, zero), jnp.where(ok, b, zero), jnp.where(ok, p, zero))
        return (c, r_x, r_y), out

    value_full = clamp_value(value_y)
    init = (carry, clamp_value(value_x), value_full)
    xs = (jnp.arange(n), valid.astype(bool), uniforms)
    (carry, r_x, r_y), (keep, a, b, p) = jax.lax.scan(step, init, xs)
    return GreedyResult(keep, r_x, r_y, value_full, a, b, p), carry


def _tree_index(tree: Params, i: Array) -> Params:
    return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), tree)


def _check_stacked(params: Params, valid: Array) -> int:
    chex.assert_rank(valid, 1)
    n = valid.shape[0]
    for leaf in jax.tree.leaves(params):
        if leaf.shape[:1] != (n,):
            raise ConfigError(
                f"stacked client parameters must have a leading axis of {n} slots (the length of "
                f"valid), got a leaf of shape {leaf.shape}"
            )
    return n


def filter_clients(
    params: Params,
    valid: Array,
    objective: Callable[[Params], Array],
    value_empty: Array,
    *,
    variant: str,
    key: PRNGKey | None = None,
    ties: str = "remove",
) -> GreedyResult:
    """chi-GF (Algorithm 2) on the objective ``R(S) = objective(mean of params over S)`` (eq. 3).

    Args:
      params: the n candidates' local models, a pytree stacked on a leading axis of n.
      valid: bool[n], which slots hold a candidate (the shuffled available clients).
      objective: ``params -> R`` for one model, e.g. ``-F_V(params)``; vmapped over a pair.
      value_empty: R of the empty set (FilFL: ``-F_V(w_t)``).
      variant: ``"dgf"`` or ``"rgf"``.
      key: RGF's coin flips.
      ties: DGF's tie rule (``"remove"``, the paper; ``"add"``, the reference code).

    Returns:
      a :class:`GreedyResult`; ``keep`` is the filtered-in set.
    """
    _check_stacked(params, valid)
    weights = valid.astype(jnp.float32)
    total = weighted_sum(weights, params)
    count = jnp.sum(weights)
    value_empty = jnp.asarray(value_empty, jnp.float32)
    full = jax.tree.map(lambda s: s / jnp.maximum(count, 1.0), total)
    value_full = jnp.where(count > 0, clamp_value(objective(full)), value_empty)
    zeros = jax.tree.map(jnp.zeros_like, total)
    pair_objective = jax.vmap(objective)

    def propose(carry, i):
        sum_x, n_x, sum_y, n_y = carry
        w_i = _tree_index(params, i)
        sum_add = jax.tree.map(lambda s, w: s + w, sum_x, w_i)
        sum_remove = jax.tree.map(lambda s, w: s - w, sum_y, w_i)
        # both candidate averages in one batched forward pass
        pair = jax.tree.map(
            lambda sa, sr: jnp.stack([sa / (n_x + 1.0), sr / jnp.maximum(n_y - 1.0, 1.0)]),
            sum_add,
            sum_remove,
        )
        r = pair_objective(pair)
        r_remove = jnp.where(n_y > 1.0, r[1], value_empty)
        return (sum_add, n_x + 1.0, sum_y, n_y), (sum_x, n_x, sum_remove, n_y - 1.0), r[0], r_remove

    carry = (zeros, jnp.zeros((), jnp.float32), total, count)
    result, _ = double_greedy(
        propose, carry, value_empty, value_full, valid, variant=variant, key=key, ties=ties
    )
    return result


def filter_dgf(
    params: Params,
    valid: Array,
    objective: Callable[[Params], Array],
    value_empty: Array,
    *,
    ties: str = "remove",
) -> GreedyResult:
    """Deterministic greedy filtering (DGF): :func:`filter_clients` with ``p_i = 1{a_i > b_i}``."""
    return filter_clients(params, valid, objective, value_empty, variant="dgf", ties=ties)


def filter_rgf(
    key: PRNGKey,
    params: Params,
    valid: Array,
    objective: Callable[[Params], Array],
    value_empty: Array,
) -> GreedyResult:
    """Randomised greedy filtering (RGF): :func:`filter_clients` with
    ``p_i = a'_i / (a'_i + b'_i)`` (1 when both are 0)."""
    return filter_clients(params, valid, objective, value_empty, variant="rgf", key=key)


def subset_masks(n: int) -> Array:
    """bool[2^n - 1, n]: row ``s`` is the subset whose bitmask is ``s + 1``."""
    codes = jnp.arange(1, 2**n, dtype=jnp.int32)
    return ((codes[:, None] >> jnp.arange(n, dtype=jnp.int32)[None, :]) & 1).astype(bool)


def brute_force_filter(
    params: Params,
    valid: Array,
    objective: Callable[[Params], Array],
    value_empty: Array | float = VALUE_FLOOR,
    *,
    chunk: int = 64,
) -> BruteForceResult:
    """The optimum of eq. (3) over all ``2^n - 1`` non-empty subsets (Fig. 11's OPT).

    The subsets' averages are formed ``chunk`` at a time (a matrix product of the chunk's
    averaging weights with the stacked parameters) and evaluated with a vmapped ``objective``
    under ``lax.map``, so memory stays at ``chunk`` models.

    Args:
      params: stacked local models, leading axis n (static, at most :data:`MAX_BRUTE_FORCE`).
      valid: bool[n]; subsets holding an invalid slot are excluded.
      objective: ``params -> R`` for one model.
      value_empty: returned as the value when no slot is valid.
      chunk: subsets evaluated together.
    """
    n = _check_stacked(params, valid)
    if n > MAX_BRUTE_FORCE:
        raise ConfigError(
            f"brute force over 2^{n} - 1 subsets is too large; it takes n <= {MAX_BRUTE_FORCE}"
        )
    if chunk < 1:
        raise ConfigError(f"brute force chunk must be >= 1, got {chunk}")
    masks = subset_masks(n)
    num = masks.shape[0]
    chunk = min(chunk, num)
    num_chunks = -(-num // chunk)
    pad = num_chunks * chunk - num
    allowed = ~jnp.any(masks & ~valid[None, :], axis=1)
    weights = masks.astype(jnp.float32)
    weights = weights / jnp.sum(weights, axis=1, keepdims=True)
    weights = jnp.pad(weights, ((0, pad), (0, 0))).reshape(num_chunks, chunk, n)
    flat = jax.tree.map(lambda p: p.astype(jnp.float32).reshape(n, -1), params)

    def evaluate(w):
        averaged = jax.tree.map(lambda f, p: (w @ f).reshape((chunk,) + p.shape[1:]), flat, params)
        return jax.vmap(objective)(averaged)

    values = jax.lax.map(evaluate, weights).reshape(-1)[:num]
    values = jnp.where(allowed, clamp_value(values), VALUE_FLOOR)
    best = jnp.argmax(values)
    any_valid = jnp.any(valid)
    keep = jnp.where(any_valid, masks[best], False)
    value = jnp.where(any_valid, values[best], jnp.asarray(value_empty, jnp.float32))
    return BruteForceResult(keep, value, values)


def set_value_ratio(value: Array, value_opt: Array, offset: float = 10.0) -> Array:
    """Approximation ratio ``(offset + R(S)) / (offset + R(OPT))`` of Fig. 11.

    With ``R = -F_V`` the ratio of raw values is not meaningful (both are negative); the
    paper's figure uses the reference code's positive objective ``f = 10 - F_V``, i.e.
    ``offset = 10``.
    """
    return (offset + value) / (offset + value_opt)
