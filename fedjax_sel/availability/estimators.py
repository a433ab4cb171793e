"""On-device estimators of each client's availability ``pi_k`` and correlation ``lambda_k``
from the observed availability masks (CA-Fed, Rodio et al. 2023, section IV-B).

The server sees ``A_t`` every round. With ``N_k(t)`` the rounds client ``k`` was online among the
``t`` observed and a Beta prior of ``H`` pseudo-rounds centred on ``pi_0``:

* ``pi_hat_k = (N_k + H pi_0) / (t + H)`` (section IV-B: ``n_k = H pi_0``, ``m_k = H (1 - pi_0)``).
* ``lambda_hat_k``: the second eigenvalue ``p11 + p00 - 1`` of the estimated 2x2 transition
  matrix, each row a Beta posterior mean. ``bayes`` (correct): ``p11 = (C11 + H P11_0) /
  (n_on + H)`` and ``p00 = (C00 + H P00_0) / (n_off + H)``, where ``C11`` (``C00``) counts
  on->on (off->off) transitions and ``n_on`` (``n_off``) the transitions that left the on
  (off) state; the prior transition probabilities ``P11_0 = pi_0 + lambda_0 (1 - pi_0)`` and
  ``P00_0 = 1 - pi_0 + lambda_0 pi_0`` belong to the chain ``(pi_0, lambda_0)``.
* ``reference``: the public CA-Fed code's estimator (github.com/arodio/CA-Fed), which
  divides ``C11`` and ``C00`` by ``t + H`` instead of the number of transitions out of the
  state: it estimates joint frequencies, so ``lambda_hat -> -2 pi (1 - pi)(1 - lambda)``, biased
  toward negative values whatever the true ``lambda``. Its first round also counts an
  off->off transition for every offline client (the "previous" set starts empty). Offered to
  reproduce the code, not for use.

Everything is a fixed-shape ``float32[K]`` update, ``O(K)`` per round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError

ESTIMATORS = ("bayes", "reference")


class AvailabilityCounts(NamedTuple):
    """Sufficient statistics of the observed availability of K clients.

    Attributes:
      rounds: float32 scalar, rounds observed (``t``).
      online: float32[K], rounds each client was online (``N_k``).
      previous: bool[K], the last observed state (all offline before the first round).
      from_on, on_on: float32[K], transitions out of the on state, and on->on among them.
      from_off, off_off: float32[K], transitions out of the off state, and off->off.
    """

    rounds: Array
    online: Array
    previous: Array
    from_on: Array
    on_on: Array
    from_off: Array
    off_off: Array


def init_counts(num_clients: int) -> AvailabilityCounts:
    """Counts before the first observation."""
    z = jnp.zeros((num_clients,), jnp.float32)
    return AvailabilityCounts(
        jnp.zeros((), jnp.float32), z, jnp.zeros((num_clients,), bool), z, z, z, z
    )


def update_counts(
    counts: AvailabilityCounts, available: Array, *, estimator: str = "bayes"
) -> AvailabilityCounts:
    """Adds one observed round ``available`` bool[K]. The first round has no transition
    (``bayes``), or an off->off one for every offline client (``reference``)."""
    chex.assert_shape(available, counts.online.shape)
    on = available.astype(bool)
    was = counts.previous
    has_prev = (counts.rounds > 0) | (estimator == "reference")
    f = jnp.float32
    return AvailabilityCounts(
        rounds=counts.rounds + 1,
        online=counts.online + on.astype(f),
        previous=on,
        from_on=counts.from_on + (has_prev & was).astype(f),
        on_on=counts.on_on + (has_prev & was & on).astype(f),
        from_off=counts.from_off + (has_prev & ~was).astype(f),
        off_off=counts.off_off + (has_prev & ~was & ~on).astype(f),
    )


def prior_transitions(pi0: Array, lam0: Array) -> tuple[Array, Array]:
    """``(P11, P00)`` of the two-state chain with stationary law ``pi0`` and eigenvalue
    ``lam0``: ``P11 = pi0 + lam0 (1 - pi0)``, ``P00 = 1 - pi0 + lam0 pi0``."""
    return pi0 + lam0 * (1 - pi0), 1 - pi0 + lam0 * pi0


def estimate(
    counts: AvailabilityCounts,
    *,
    prior_rounds: float = 2.0,
    prior_pi: Array | float = 0.5,
    prior_lam: Array | float = 0.0,
    estimator: str = "bayes",
) -> tuple[Array, Array]:
    """``(pi_hat, lambda_hat)`` float32[K] from the counts (see the module docstring).

    Args:
      counts: the observed statistics.
      prior_rounds: H, the prior's weight in pseudo-rounds (``H = 2``, ``pi_0 = 1/2`` is the
        uniform Beta(1, 1) prior on ``pi``).
      prior_pi, prior_lam: the prior's centre (scalars or float32[K]).
      estimator: ``bayes`` or ``reference``.
    """
    check_estimator(estimator)
    h = jnp.float32(prior_rounds)
    pi0 = jnp.asarray(prior_pi, jnp.float32)
    p11_0, p00_0 = prior_transitions(pi0, jnp.asarray(prior_lam, jnp.float32))
    t = counts.rounds
    pi_hat = (counts.online + h * pi0) / (t + h)
    if estimator == "bayes":
        p11 = (counts.on_on + h * p11_0) / (counts.from_on + h)
        p00 = (counts.off_off + h * p00_0) / (counts.from_off + h)
    else:  # the reference code's joint frequencies (biased)
        p11 = (counts.on_on + h * p11_0) / (t + h)
        p00 = (counts.off_off + h * p00_0) / (t + h)
    lam_hat = p11 + p00 - 1
    shape = counts.online.shape
    return jnp.broadcast_to(pi_hat, shape), jnp.broadcast_to(lam_hat, shape)


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ConfigError(f"availability estimator must be one of {ESTIMATORS}, got {estimator!r}")


def check_prior(prior_rounds: float) -> None:
    if not (prior_rounds > 0 and math.isfinite(prior_rounds)):
        raise ConfigError(
            f"prior_rounds (the Beta prior's pseudo-rounds H) must be > 0, got {prior_rounds!r}"
        )


def estimation_error_curve(
    trajectory: Array,
    pi: Array,
    lam: Array,
    checkpoints: Sequence[int],
    *,
    prior_rounds: float = 2.0,
    prior_pi: Array | float = 0.5,
    prior_lam: Array | float = 0.0,
    estimator: str = "bayes",
) -> tuple[Array, Array]:
    """Fig. 4a: the mean absolute errors ``(1/N) sum_k |pi_hat_k - pi_k|`` and
    ``(1/N) sum_k |lambda_hat_k - lambda_k|`` after each number of observed rounds in
    ``checkpoints``, from one observed ``trajectory`` bool[T, K] (one scan over T rounds).

    Returns:
      ``(pi_mae, lambda_mae)``, float32[len(checkpoints)].
    """
    check_estimator(estimator)
    traj = jnp.asarray(trajectory, bool)
    if min(checkpoints) < 1 or max(checkpoints) > traj.shape[0]:
        raise ConfigError(f"checkpoints must lie in [1, {traj.shape[0]}], got {checkpoints}")

    def body(counts, available):
        counts = update_counts(counts, available, estimator=estimator)
        pi_hat, lam_hat = estimate(
            counts,
            prior_rounds=prior_rounds,
            prior_pi=prior_pi,
            prior_lam=prior_lam,
            estimator=estimator,
        )
        errors = jnp.stack([jnp.mean(jnp.abs(pi_hat - pi)), jnp.mean(jnp.abs(lam_hat - lam))])
        return counts, errors

    _, errors = jax.lax.scan(body, init_counts(traj.shape[1]), traj)
    picked = errors[jnp.asarray(checkpoints) - 1]
    return picked[:, 0], picked[:, 1]
