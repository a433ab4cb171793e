"""HeteRo-Select's score components and selection law (Masud, Jahin and Hasan 2025,
arXiv:2508.06692, section III-B, eqs. 1-12, and Theorem III.3 / eq. 20).

Every function is pure, jittable and O(K) (the label-histogram divergences are O(K C) once,
at initialisation). Rounds ``t`` are 1-based as in Algorithm 1; the callers convert.

Components of client k at round t (all ``float32[K]``):

* ``V'`` (eq. 3): local loss min-max normalised over the available clients.
* ``D`` (eq. 4): Jensen-Shannon divergence of the client's label distribution from the
  average one, weighted by ``2 (1 - 0.5 min(t / 100, 1))``.
* ``M`` (eq. 5): ``2 / (1 + exp(-5 m)) - 0.5`` of the relative loss change
  ``m = (L(w_{t-2}) - L(w_{t-1})) / L(w_{t-2})``.
* ``F`` (eq. 6): ``(1 + eta h_k / max_j h_j)^-2`` of the participation counts.
* ``St`` (eq. 7): ``1 + gamma log(1 + min(t - l_k, 20))`` of the rounds since the last pick.
* ``N`` (eq. 11): ``1 - alpha (2 / (1 + exp(-3 r_k)) - 1)`` with ``r_k`` the squared norm of
  the client's last update over the average of those norms.

The additive score (eq. 1) uses ``F - 1``, ``St - 1`` and ``N - 1`` (eqs. 8-10); the
multiplicative score (eq. 2) multiplies the six factors. Probabilities are the softmax of
``S / tau(t)`` over the available clients with ``tau(t) = tau0 (1 - 0.5 min(t / 100, 1))``
(eq. 12).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from fedjax_sel.base import Array
from fedjax_sel.kernels.sampling import masked_softmax

#: Staleness cap T_max of eq. 7 (rounds).
STALENESS_CAP = 20
#: The "100 rounds" of the schedules of eqs. 4 and 12.
SCHEDULE_ROUNDS = 100
DIVERSITY_MEASURES = ("js_divergence", "js_distance")


class ScoreComponents(NamedTuple):
    """The six per-client components, each float32[K], in their multiplicative form
    (``fairness``, ``staleness`` and ``norm`` are the factors F, St and N of eqs. 6, 7, 11)."""

    value: Array  # V', eq. 3
    diversity: Array  # D, eq. 4
    momentum: Array  # M, eq. 5
    fairness: Array  # F, eq. 6
    staleness: Array  # St, eq. 7
    norm: Array  # N, eq. 11


class ComponentWeights(NamedTuple):
    """``w_v, w_d, w_m, w_f, w_st, w_n`` of eq. 1 (the paper's champion: all 1.0)."""

    value: float = 1.0
    diversity: float = 1.0
    momentum: float = 1.0
    fairness: float = 1.0
    staleness: float = 1.0
    norm: float = 1.0


def label_distributions(label_counts: Array) -> Array:
    """Rows of ``label_counts`` (float[K, C]) normalised to probability vectors; a client
    without examples gets the uniform distribution."""
    counts = jnp.asarray(label_counts, jnp.float32)
    total = jnp.sum(counts, axis=1, keepdims=True)
    uniform = jnp.full_like(counts, 1.0 / counts.shape[1])
    return jnp.where(total > 0, counts / jnp.maximum(total, 1e-30), uniform)


def _kl_to(p: Array, m: Array) -> Array:
    # 0 log 0 = 0; where p > 0 the mixture m >= p / 2 > 0.
    ratio = jnp.where(p > 0, p / jnp.where(m > 0, m, 1.0), 1.0)
    return jnp.sum(jnp.where(p > 0, p * jnp.log(ratio), 0.0), axis=-1)


def js_divergence(p: Array, q: Array, *, base2: bool = True) -> Array:
    """Jensen-Shannon divergence ``0.5 KL(p || m) + 0.5 KL(q || m)``, ``m = (p + q) / 2``,
    of the rows of ``p`` (float[..., C]) against ``q`` (broadcast); in bits (within [0, 1])
    when ``base2``, in nats (within [0, ln 2]) otherwise."""
    p, q = jnp.broadcast_arrays(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32))
    m = 0.5 * (p + q)
    js = 0.5 * _kl_to(p, m) + 0.5 * _kl_to(q, m)
    js = jnp.maximum(js, 0.0)
    return js / math.log(2.0) if base2 else js


def client_divergences(label_counts: Array, measure: str = "js_divergence") -> Array:
    """``JS(P_k || P_avg)`` for every client (float32[K]), ``P_avg`` the mean of the clients'
    label distributions.

    ``measure``: ``js_divergence`` (base 2, within [0, 1] as Assumption A6 asks) or
    ``js_distance`` (the square root of the natural-log divergence, which is what
    ``scipy.spatial.distance.jensenshannon`` returns by default).
    """
    if measure not in DIVERSITY_MEASURES:
        raise ValueError(f"measure must be one of {DIVERSITY_MEASURES}, got {measure!r}")
    p = label_distributions(label_counts)
    p_avg = jnp.mean(p, axis=0)
    if measure == "js_divergence":
        return js_divergence(p, p_avg[None, :], base2=True)
    return jnp.sqrt(js_divergence(p, p_avg[None, :], base2=False))


def schedule_fraction(t: Array, schedule_rounds: int = SCHEDULE_ROUNDS) -> Array:
    """``min(t / 100, 1)``, the progress term shared by eqs. 4 and 12."""
    return jnp.minimum(jnp.asarray(t, jnp.float32) / float(schedule_rounds), 1.0)


def normalized_loss(loss: Array, mask: Array, eps: float = 1e-8) -> Array:
    """Eq. 3: ``(L_k - min_j L_j) / (max_j L_j - min_j L_j + eps)`` with min and max over the
    clients in ``mask`` (zero outside it)."""
    loss = jnp.asarray(loss, jnp.float32)
    lo = jnp.min(jnp.where(mask, loss, jnp.inf))
    hi = jnp.max(jnp.where(mask, loss, -jnp.inf))
    lo = jnp.where(jnp.isfinite(lo), lo, 0.0)
    hi = jnp.where(jnp.isfinite(hi), hi, 0.0)
    return jnp.where(mask, (loss - lo) / (hi - lo + eps), 0.0)


def diversity(divergence: Array, t: Array, schedule_rounds: int = SCHEDULE_ROUNDS) -> Array:
    """Eq. 4: ``JS(P_k || P_avg) * 2 (1 - 0.5 min(t / 100, 1))``."""
    return divergence * (2.0 * (1.0 - 0.5 * schedule_fraction(t, schedule_rounds)))


def momentum(loss_before: Array, loss_after: Array, known: Array) -> Array:
    """Eq. 5: ``2 / (1 + exp(-5 m)) - 0.5``, ``m = (L_before - L_after) / L_before``.

    ``known``: bool[K], both losses exist (``m = 0`` otherwise, and where ``L_before <= 0``).
    """
    ok = known & (loss_before > 0)
    m = jnp.where(ok, (loss_before - loss_after) / jnp.where(ok, loss_before, 1.0), 0.0)
    return 2.0 / (1.0 + jnp.exp(-5.0 * m)) - 0.5


def fairness_factor(participations: Array, eta: float) -> Array:
    """Eq. 6: ``(1 + eta h_k / max_j h_j)^-2`` (1 for everybody before the first pick)."""
    h = jnp.asarray(participations, jnp.float32)
    h_max = jnp.max(h)
    ratio = jnp.where(h_max > 0, h / jnp.where(h_max > 0, h_max, 1.0), 0.0)
    return (1.0 + eta * ratio) ** -2


def staleness_factor(t: Array, last_round: Array, gamma: float, cap: int = STALENESS_CAP) -> Array:
    """Eq. 7: ``1 + gamma log(1 + min(t - l_k, cap))``; ``l_k = 0`` for a client never picked."""
    stale = jnp.minimum(jnp.asarray(t, jnp.float32) - last_round.astype(jnp.float32), cap)
    return 1.0 + gamma * jnp.log1p(jnp.maximum(stale, 0.0))


def norm_factor(norm_sq: Array, known: Array, alpha: float) -> Array:
    """Eq. 11: ``1 - alpha (2 / (1 + exp(-3 r_k)) - 1)``, ``r_k = ||Delta_k||^2 /
    avg_j ||Delta_j||^2`` over the clients with a recorded update (``known``); 1 (no penalty)
    for a client without one."""
    n_known = jnp.sum(known)
    avg = jnp.sum(jnp.where(known, norm_sq, 0.0)) / jnp.maximum(n_known, 1)
    r = jnp.where(known & (avg > 0), norm_sq / jnp.where(avg > 0, avg, 1.0), 0.0)
    return 1.0 - alpha * (2.0 / (1.0 + jnp.exp(-3.0 * r)) - 1.0)


def temperature(t: Array, tau0: float, schedule_rounds: int = SCHEDULE_ROUNDS) -> Array:
    """``tau(t) = tau0 (1 - 0.5 min(t / 100, 1))`` (section III-B5)."""
    return tau0 * (1.0 - 0.5 * schedule_fraction(t, schedule_rounds))


def additive_score(c: ScoreComponents, w: ComponentWeights) -> Array:
    """Eq. 1 with the additive transforms of eqs. 8-10."""
    return (
        w.value * c.value
        + w.diversity * c.diversity
        + w.momentum * c.momentum
        + w.fairness * (c.fairness - 1.0)
        + w.staleness * (c.staleness - 1.0)
        + w.norm * (c.norm - 1.0)
    )


def multiplicative_score(c: ScoreComponents, w: ComponentWeights) -> Array:
    """Eq. 2: ``V' D M F St N``; a component whose weight is 0 is left out (factor 1), for
    ablations (other weights must be 1: eq. 2 has no weights)."""
    out = jnp.ones_like(c.value)
    for factor, weight in zip(c, w, strict=True):
        if weight != 0:
            out = out * factor
    return out


def selection_probabilities(scores: Array, tau: Array, mask: Array) -> Array:
    """Eq. 12: ``softmax(S / tau)`` over the clients in ``mask`` (zero elsewhere)."""
    return masked_softmax(scores / tau, mask)


def score_bounds(
    weights: ComponentWeights,
    *,
    eta: float,
    alpha: float,
    t: float,
    diversity_max: float = 1.0,
    schedule_rounds: int = SCHEDULE_ROUNDS,
) -> tuple[float, float]:
    """``(S_min, S_max)``: bounds of the additive score without its staleness part (Assumption
    A6), from the components' ranges: V' in [0, 1], D in [0, diversity_max * 2 (1 - 0.5
    min(t/100, 1))], M in [-0.5, 1.5], F - 1 in [(1 + eta)^-2 - 1, 0], N - 1 in [-alpha, 0].
    Weights must be non-negative."""
    if any(x < 0 for x in weights):
        raise ValueError(f"score_bounds needs non-negative weights, got {weights}")
    d_max = diversity_max * 2.0 * (1.0 - 0.5 * min(t / schedule_rounds, 1.0))
    s_min = (
        -0.5 * weights.momentum
        + weights.fairness * ((1.0 + eta) ** -2 - 1.0)
        - weights.norm * alpha
    )
    s_max = weights.value + weights.diversity * d_max + 1.5 * weights.momentum
    return s_min, s_max


def exploration_bound(
    s_min: float,
    s_max: float,
    gamma: float,
    staleness: Array,
    tau: float,
    num_others: int,
    cap: int = STALENESS_CAP,
) -> Array:
    """Theorem III.3 in the form of eq. 20 (appendix A-B): a lower bound on the selection
    probability of a client ``staleness`` rounds stale,

        eps_k = e^{a} / (e^{a} + n e^{b}),  a = (S_min + gamma log(1 + min(Delta, cap))) / tau,
                                             b = (S_max + gamma log(1 + cap)) / tau,

    with ``n = num_others`` competitors (the paper writes m - 1 for a candidate set of m; under
    eq. 12 the softmax runs over every available client, so n = |A_t| - 1). The staleness
    inside ``a`` is capped like the score itself (eq. 7); eq. 14's variant without the
    competitors' staleness bonus in ``b`` is not a bound in general.
    """
    stale = jnp.minimum(jnp.asarray(staleness, jnp.float32), cap)
    a = (s_min + gamma * jnp.log1p(stale)) / tau
    b = (s_max + gamma * math.log1p(cap)) / tau
    # e^a / (e^a + n e^b) = 1 / (1 + n e^(b - a)), stable for large |a|, |b|.
    return 1.0 / (1.0 + num_others * jnp.exp(b - a))
