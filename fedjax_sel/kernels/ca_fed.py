"""CA-Fed's greedy client exclusion, ``get()`` of Algorithm 1 (Rodio et al. 2023), in
``O(K log K)``: one sort plus one ``lax.scan`` with running sums per pass (docs/ca_fed.md,
"Equations").

Algorithm 1 starts every round from ``q = alpha / pi_hat`` and only ever sets entries to zero,
so on the kept set ``I`` the biased importance (eq. 4) is ``p_k = pi_k q_k / sum_h pi_h q_h =
alpha_k / S_I`` with ``S_I = sum_{k in I} alpha_k``, and ``d_TV(alpha, p) = 1 - S_I``. The error
proxy (eq. 20, with eqs. 18-19) is then

    eps_hat(I) = (sum_{k in I} alpha_k g_k) / S_I + 4 kappa_bar^2 Gamma' (1 - S_I)^2,

``g_k = F_hat_k - F_hat_k^*`` and ``Gamma' = max_k g_k`` (eq. 19, over all clients: a constant
of the round). Each greedy step changes two running sums, so it costs ``O(1)``: excluding
client ``k`` from ``I`` (``s = S_I``, ``b = sum_I alpha g``, ``s' = s - alpha_k``) lowers the
proxy by

    eps_hat(I) - eps_hat(I - k) = alpha_k [(g_k - b / s) / s' - 4 kappa_bar^2 Gamma' (2 - s - s')],

computed in this form rather than as a difference of two rounded ``eps_hat`` (which loses the
``O(alpha_k)`` change in float32 at large K). The sums are carried with Kahan compensation so that
``K = 10^6`` float32 steps stay exact to ~1e-7.

``get()`` visits the clients in descending order of a key (ties by client id, as Python's
stable ``sorted`` does in the reference code), tentatively sets ``q_k = 0`` and keeps the
exclusion when ``eps_hat`` falls by at least ``tau`` (line 19: ``eps - eps+ >= tau``, so with
``tau = 0`` a tie is accepted). Excluding the last kept client is never tried (the reference
code stops there: "never exclude everybody").
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array

LAMBDA_ORDERS = ("signed", "abs")


def ca_fed_objective(alpha: Array, gap: Array, gamma: Array, kept: Array, kappa2: float) -> Array:
    """``eps_hat`` of the kept set (eq. 20 in closed form; see the module docstring).

    ``alpha`` is normalised to sum to one; ``kept`` must hold at least one client.
    """
    alpha = alpha / jnp.sum(alpha)
    s = jnp.sum(jnp.where(kept, alpha, 0.0))
    b = jnp.sum(jnp.where(kept, alpha * gap, 0.0))
    return b / s + 4.0 * kappa2 * gamma * jnp.square(1.0 - s)


def descending_order(key: Array) -> Array:
    """``argsort(key, descending=True, stable=True)`` (ties by id) for float32 ``key``: a stable
    sort of an order-preserving int32 image of the floats, which XLA's CPU sort runs ~1.5x
    faster than the float comparator. ``-0.0`` and ``0.0`` tie (so do subnormals and zero:
    XLA flushes them); NaN is not allowed."""
    bits = jax.lax.bitcast_convert_type(key.astype(jnp.float32) + 0.0, jnp.int32)  # -0 -> +0
    ascending = jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # float order as int order
    iota = jnp.arange(key.shape[0], dtype=jnp.int32)
    return jax.lax.sort((~ascending, iota), num_keys=1, is_stable=True)[1]


def default_unroll() -> int:
    """Greedy steps per scan iteration for the backend jax runs on: 1 on a CPU (unrolling is
    slower there), 32 elsewhere, where each of the ``K`` iterations would cost a kernel launch
    (on a GPU, ``K = 10^6`` at ``unroll=1`` spends seconds per pass in launches alone)."""
    return 1 if jax.default_backend() == "cpu" else 32


def _kahan_sub(total: Array, comp: Array, x: Array) -> tuple[Array, Array]:
    """``total - x`` with Kahan compensation ``comp`` (the running rounding error)."""
    y = -x - comp
    t = total + y
    return t, (t - total) - y


def ca_fed_get(
    alpha: Array,
    gap: Array,
    gamma: Array,
    key: Array,
    kept: Array,
    *,
    kappa2: float | Array = 1.0,
    tau: float | Array = 0.0,
    unroll: int | None = None,
) -> Array:
    """One pass of Algorithm 1's ``get()`` (lines 13-22): the clients still kept afterwards.

    Args:
      alpha: float32[K], target importance (positive; normalised here).
      gap: float32[K], ``g_k = F_hat_k - F_hat_k^*``.
      gamma: scalar, ``Gamma'`` (eq. 19).
      key: float32[K], the order ``rho``: clients are visited by descending key, ties by id.
      kept: bool[K], the clients with ``q_k > 0`` on entry (at least one).
      kappa2: ``kappa_bar^2``, the weight of the bias term.
      tau: threshold ``tau >= 0`` of line 19.
      unroll: greedy steps per iteration of the scan's loop (``lax.scan(unroll=)``): fewer
        loop iterations, which matters on GPUs where each costs a launch. ``None``:
        :func:`default_unroll` for the backend. The exclusions do not depend on it.

    Returns:
      bool[K], ``q_k > 0`` after the pass.
    """
    chex.assert_rank([alpha, gap, key, kept], 1)
    chex.assert_equal_shape([alpha, gap, key, kept])
    dt = jnp.promote_types(jnp.result_type(alpha, gap), jnp.float32)  # float64 under x64 only
    alpha = alpha.astype(dt) / jnp.sum(alpha.astype(dt))
    gap = gap.astype(dt)
    c = 4.0 * jnp.asarray(kappa2, dt) * jnp.asarray(gamma, dt)
    tau = jnp.asarray(tau, dt)
    if dt == jnp.float32:
        order = descending_order(key)
    else:  # float64 keys (x64 only) would not survive the float32 image
        order = jnp.argsort(key, descending=True, stable=True)
    a, g, k = alpha[order], gap[order], kept[order]
    s0 = jnp.sum(jnp.where(k, a, 0.0))
    b0 = jnp.sum(jnp.where(k, a * g, 0.0))
    zero = jnp.zeros((), dt)

    def step(carry, x):
        s, s_comp, b, b_comp, n = carry
        a_k, g_k, kept_k = x
        s1, s1_comp = _kahan_sub(s, s_comp, a_k)
        b1, b1_comp = _kahan_sub(b, b_comp, a_k * g_k)
        # eps_hat(I) - eps_hat(I - k) in closed form: subtracting two rounded eps_hat values
        # would lose the O(alpha_k) difference in float32 when K is large
        decrease = a_k * ((g_k - b / s) / s1 - c * (2.0 - s - s1))
        accept = kept_k & (n > 1) & (decrease >= tau)
        carry = jax.tree.map(
            lambda new, old: jnp.where(accept, new, old),
            (s1, s1_comp, b1, b1_comp, n - 1),
            carry,
        )
        return carry, kept_k & ~accept

    init = (s0, zero, b0, zero, jnp.sum(k.astype(jnp.int32)))
    if unroll is None:
        unroll = default_unroll()
    _, kept_sorted = jax.lax.scan(step, init, (a, g, k), unroll=unroll)
    return jnp.zeros_like(kept).at[order].set(kept_sorted, unique_indices=True)


@functools.partial(jax.jit, static_argnames=("lambda_order", "unroll"))
def ca_fed_exclusions(
    alpha: Array,
    gap: Array,
    pi_hat: Array,
    lam_hat: Array,
    *,
    kappa2: float | Array = 1.0,
    tau: float | Array = 0.0,
    lambda_order: str = "signed",
    eligible: Array | None = None,
    unroll: int | None = None,
) -> tuple[Array, Array]:
    """Algorithm 1, lines 5-7: start from every client kept (``q = alpha / pi_hat``), run
    ``get()`` by descending ``lambda_hat`` (``lambda_order="abs"``: by descending
    ``|lambda_hat|``, the reference code), then by ascending ``pi_hat`` (``rho = -pi_hat``).

    ``eligible`` (bool[K], default all): clients that exist at all; the others start with
    ``q_k = 0`` and ``alpha_k`` should be 0 (padding to a fixed size). Jitted; ``kappa2`` and
    ``tau`` are traced; ``unroll`` as in :func:`ca_fed_get`.

    Returns:
      ``(kept bool[K], gamma)``: the clients with ``q_k > 0`` and ``Gamma' = max_k g_k``.
    """
    if lambda_order not in LAMBDA_ORDERS:
        raise ValueError(f"lambda_order must be one of {LAMBDA_ORDERS}, got {lambda_order!r}")
    kept = jnp.ones(alpha.shape, bool) if eligible is None else eligible.astype(bool)
    gamma = jnp.max(jnp.where(kept, gap, -jnp.inf))
    key1 = jnp.abs(lam_hat) if lambda_order == "abs" else lam_hat
    kw = {"kappa2": kappa2, "tau": tau, "unroll": unroll}
    kept = ca_fed_get(alpha, gap, gamma, key1, kept, **kw)
    kept = ca_fed_get(alpha, gap, gamma, -pi_hat, kept, **kw)
    return kept, gamma
