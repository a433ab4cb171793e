"""DELTA: diverse client sampling (Wang et al., NeurIPS 2023; the ICLR-2023 submission text,
OpenReview CcXTudu9bvu; docs/comparators/delta.md): unbiased importance sampling whose
probabilities combine each client's gradient diversity and its local gradient noise.

**Optimal law** (section 3.4, Corollary 3.4; DELTA's ``m`` is our K, its ``K`` the local steps
E). Over the surrogate objective of eq. (6), ``f~ = (1/m) sum_{i in S} F_i / (K p_i)``, the
variance term of the convergence bound (eqs. 9-10) is ``sum_i a_i / p_i`` with
``a_i = alpha1 zeta_i^2 + alpha2 sigma_i^2``, minimised by

    p_i = s_i / sum_j s_j,   s_i = sqrt(alpha1 zeta_i^2 + alpha2 sigma_i^2),

``zeta_i = |grad F_i(x) - grad f(x)|`` (gradient diversity), ``sigma_i^2`` the local stochastic
gradient variance, ``alpha1 = 20 E^2 L eta_L``, ``alpha2 = 5 E L eta_L + eta / m``.

**Practical algorithm** (section 4). ``p^0 = 1/K``; after round t, for the participants S_t
(distinct clients)

    p_i^{t+1} = s^_i / sum_{j in S_t} s^_j * (1 - sum_{j not in S_t} p_j^t)     (i in S_t)
    p_j^{t+1} = p_j^t                                                             (j not in S_t)

with ``s^_i = sqrt(alpha1 zeta^_i^2 + alpha2 sigma^_i^2)``, ``zeta^_i = |Delta_i - mean_S Delta|``
(the mean of the participants' updates stands in for the global one). A client that never took
part keeps its initial ``1/K`` (the paper's rule: only participants' probabilities move; the
mass the participants held is redistributed among them, so ``sum p = 1`` is kept).

Units (ours, [derived]). We measure both terms on the *updates*: ``zeta^_i^2 = |Delta_i -
mean_S Delta|^2`` and ``sigma^_i^2`` the variance of the update, ``Var(Delta_i) ~ eta_L^2 E
sigma_i^2`` (E independent minibatch noises). With ``Delta_i ~ -eta_L E grad F_i``, the paper's
``alpha1 zeta^2 + alpha2 sigma^2`` equals ``(5 L / eta_L) (4 zeta_u^2 + sigma_u^2)`` in update
units once the ``eta / m`` term of alpha2 is dropped, so ``alpha1 = 0.8, alpha2 = 0.2`` (the
ratio 4 : 1 of the paper's constants; also FedXplore's configuration values) is the paper's law
at any E and learning rate.

**sigma^_i** (the text read does not say how it is estimated [not found]): ``sigma="retrain"``
(default) trains each participant a second time from the same global model with an
independent minibatch stream, ``sigma^_i^2 = |Delta_i^(1) - Delta_i^(2)|^2 / 2`` (an unbiased
estimate of ``tr Cov(Delta_i)``). This costs **one extra local training per participant per
round** (the round's own training is the first run: the strategy returns it as
``train_result``, nobody trains three times). The free alternative, accumulating ``sum g`` and
``sum |g|^2`` over the local steps, needs a trainer statistic the engine does not report.
``sigma="none"``: ``s^_i = sqrt(alpha1) zeta^_i`` only, no extra cost. (With a system model,
the engine does not cut training a strategy ran itself to the deadline's step limits.)

**Sampling** (with replacement, eq. 9; the paper analyses both). ``m`` = ``per_round`` draws
from ``q``, ``p`` restricted to the available clients and renormalised (availability is ours:
the estimand becomes the objective over the available clients). Duplicates: the reference mode
trains a duplicated client twice; here every client's local randomness is
``fold_in(key, client)``, so both copies would train identically, and one slot with the count
``c_i`` in its weight gives the *same* aggregate (the reference trains it ``c_i`` times, which a
benchmark should charge as such if it mimics the reference). Slots beyond the distinct draws
are masked. ``replace=False``: Gumbel-top-k from ``q`` (distinct clients, fewer empty slots)
with the with-replacement weights below, an approximation (inclusion probabilities of
sequential sampling are not ``m q_i``): biased, flagged.

**Aggregation** (eq. 6, unnormalised): slot of client i with ``c_i`` draws gets
``w_i = c_i lambda_i / (m q_i)``, ``lambda_i`` the client's weight in the objective over the
available clients (``uniform``: ``1/|A_t|``, the paper's; ``size``: ``n_i / sum_{A_t} n``), so
``E[sum w_i Delta_i] = sum_{i in A_t} lambda_i Delta_i``. Algorithm 1, line 12 of the copy
read, ``(1/|S_t|) sum n_i / (n p_i^2) Delta_i``, looks garbled; we use eq. (6). With ``size``,
the law's score is ``lambda_i s^_i`` (``p_i`` proportional to ``lambda_i sqrt(a_i)`` minimises
``sum lambda_i^2 a_i / p_i``, [derived]) and ``p^0 = n_i / N``.

**Departures**: ``p`` is floored at ``floor / K`` after each update and renormalised (a zero
score, e.g. identical updates, would make ``p_i = 0`` absorbing); no clip of the weights (the
paper has none; with the floor a weight is at most ``K lambda_i / (m floor)``).

**Asks of clients** (cost): the update (sent anyway); with ``sigma="retrain"`` one extra local
training run per participant (``m C_train``; only a scalar, ``sigma^_i``, would travel).
Server: ``O(m d)`` for the scores, ``O(K)`` for the law and the draw.

Fixed shapes: ``m`` draws by inverse CDF (``jax.random.choice``, ``O(K + m log K)``); the
distinct draws by a sort and an ``m x m`` count; the law update is a masked scatter over the
``m`` slots. Diagnostics: ``law`` (the draw's ``q``) and ``weight_sum`` (``sum w``, 1 in
expectation).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Selection, SimSpec, Strategy, client_work
from fedjax_sel.kernels import gumbel_top_k
from fedjax_sel.strategies._common import Weighting
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy
from fedjax_sel.tree import stacked_norms

Sigma = Literal["retrain", "none"]
SIGMAS = get_args(Sigma)
TRACED = ("alpha1", "alpha2", "floor")


class DeltaState(NamedTuple):
    """``p``: float32[K], the sampling law over all clients; ``sigma_sq``: float32[per_round],
    this round's ``sigma^_i^2`` of each slot (written by ``select``, read by ``update``)."""

    p: Array
    sigma_sq: Array


def objective_weights(num_examples: Array, available: Array, weighting: str) -> Array:
    """``lambda``: float32[K], the clients' weights in the objective over the available ones
    (summing to one over them; zero elsewhere)."""
    raw = num_examples.astype(jnp.float32) if weighting == "size" else jnp.ones(available.shape)
    raw = jnp.where(available, raw, 0.0)
    return raw / jnp.maximum(jnp.sum(raw), 1e-30)


def draw_law(p: Array, available: Array) -> Array:
    """``q``: ``p`` restricted to the available clients and renormalised (zeros if none)."""
    q = jnp.where(available, p, 0.0)
    return q / jnp.maximum(jnp.sum(q), 1e-30)


def distinct_draws(key, q: Array, m: int) -> tuple[Array, Array, Array]:
    """``m`` draws from ``q`` with replacement, as slots of distinct clients: ``(clients
    int32[m], first bool[m], counts float32[m])``, ``first`` marking one slot per drawn client
    and ``counts`` its number of draws (``sum counts[first] = m``)."""
    draws = jax.random.choice(key, q.shape[0], (m,), replace=True, p=q)
    s = jnp.sort(draws.astype(jnp.int32))
    first = jnp.concatenate([jnp.ones((1,), bool), s[1:] != s[:-1]])
    counts = jnp.sum(s[:, None] == s[None, :], axis=1).astype(jnp.float32)
    return s, first, counts


def scores(deltas, mask: Array, sigma_sq: Array, alpha1, alpha2) -> Array:
    """``s^_i = sqrt(alpha1 |Delta_i - mean_S Delta|^2 + alpha2 sigma^_i^2)`` per slot
    (float32[m]; the mean over the valid slots ``mask``; zero on the others)."""
    on = mask.astype(jnp.float32)
    n = jnp.maximum(jnp.sum(on), 1.0)
    mean = jax.tree.map(lambda d: jnp.tensordot(on / n, d.astype(jnp.float32), axes=1), deltas)
    centred = jax.tree.map(lambda d, g: d.astype(jnp.float32) - g[None], deltas, mean)
    zeta_sq = jnp.square(stacked_norms(centred))
    return jnp.where(mask, jnp.sqrt(alpha1 * zeta_sq + alpha2 * sigma_sq), 0.0)


def update_law(p: Array, clients: Array, mask: Array, score: Array, floor) -> Array:
    """Section 4's rule: the participants' mass ``sum_{i in S} p_i`` redistributed among them
    in proportion to ``score`` (the others keep theirs), then floored at ``floor / K`` and
    renormalised. A round whose scores are all zero leaves ``p`` as it was."""
    k = p.shape[0]
    idx = jnp.where(mask, clients, k)
    mass = jnp.sum(jnp.where(mask, p[clients], 0.0))
    total = jnp.sum(jnp.where(mask, score, 0.0))
    new = jnp.where(total > 0, score / jnp.maximum(total, 1e-30) * mass, p[clients])
    p = p.at[idx].set(new, mode="drop")
    p = jnp.maximum(p, floor / k)
    return p / jnp.sum(p)


@register_strategy(
    "delta",
    description="DELTA: unbiased sampling by gradient diversity and local variance "
    "(with replacement, importance weights)",
    reference="Wang et al. 2023, DELTA: Diverse Client Sampling for Fasting Federated Learning "
    "(NeurIPS)",
)
def delta(
    *,
    per_round: int,
    alpha1: float = 0.8,
    alpha2: float = 0.2,
    floor: float = 1e-3,
    sigma: Sigma = "retrain",
    replace: bool = True,
    weighting: Weighting = "uniform",
) -> Strategy:
    """DELTA client sampling (module docstring).

    Args:
      per_round: m, draws per round (distinct clients fill the slots, the rest are masked).
      alpha1, alpha2: the weights of the diversity and the variance terms, on update-unit
        quantities (the module docstring: 0.8 / 0.2 is the paper's 4 : 1).
      floor: ``p_i >= floor / K`` after each update (ours; 0 disables it).
      sigma: ``retrain`` (one extra local training per participant estimates sigma^) or
        ``none`` (diversity only, no extra cost).
      replace: draw with replacement (the paper's eq. 9, unbiased) or without (Gumbel-top-k,
        approximate weights).
      weighting: the objective's client weights: ``uniform`` (the paper's) or ``size``.

    Traced (a grid of them shares one program): ``alpha1``, ``alpha2``, ``floor``.
    """
    if sigma not in SIGMAS:
        raise ConfigError(f"delta sigma must be one of {SIGMAS}, got {sigma!r}")
    if not (alpha1 >= 0 and alpha2 >= 0 and alpha1 + alpha2 > 0):
        raise ConfigError(f"delta needs alpha1, alpha2 >= 0, not both 0; got {alpha1}, {alpha2}")
    if not 0 <= floor < 1:
        raise ConfigError(f"delta floor must lie in [0, 1), got {floor}")
    replace = bool(replace)

    def init(key, spec: SimSpec) -> DeltaState:
        del key
        k = spec.num_clients
        n = jnp.asarray(spec.num_examples, jnp.float32)
        p = n / jnp.sum(n) if weighting == "size" else jnp.full((k,), 1.0 / k, jnp.float32)
        return DeltaState(p.astype(jnp.float32), jnp.zeros((spec.per_round,), jnp.float32))

    def build(alpha1, alpha2, floor):
        def select(state: DeltaState, inputs, oracle, key):
            q = draw_law(state.p, inputs.available)
            lam = objective_weights(inputs.num_examples, inputs.available, weighting)
            anyone = jnp.any(inputs.available)
            if replace:
                clients, mask, counts = distinct_draws(key, q, per_round)
                mask = mask & anyone
            else:
                clients, mask = gumbel_top_k(key, jnp.log(q), per_round, inputs.available)
                counts = jnp.ones((per_round,), jnp.float32)
            qc = jnp.maximum(q[clients], 1e-30)
            weights = jnp.where(mask, counts * lam[clients] / (per_round * qc), 0.0)
            diagnostics = {"law": q, "weight_sum": jnp.sum(weights)}
            selection = Selection(clients, mask, weights, diagnostics=diagnostics)
            if sigma == "none":
                return selection, state
            run1 = oracle.train(inputs.params, clients, oracle.train_key, mask)
            run2 = oracle.train(
                inputs.params, clients, jax.random.fold_in(oracle.train_key, 1), mask
            )
            diff = jax.tree.map(lambda a, b: a - b, run1.params, run2.params)
            sigma_sq = jnp.where(mask, 0.5 * jnp.square(stacked_norms(diff)), 0.0)
            # the second run is the sigma statistic's own work (a scalar goes up with the update)
            k = inputs.available.shape[0]
            work = client_work(k, clients, mask, train_steps=run2.num_steps)
            selection = selection._replace(train_result=run1, work=work)
            return selection, state._replace(sigma_sq=sigma_sq)

        def update(state: DeltaState, selection: Selection, feedback) -> DeltaState:
            mask = selection.mask
            score = scores(feedback.deltas, mask, state.sigma_sq, alpha1, alpha2)
            if weighting == "size":
                score = score * feedback.num_examples.astype(jnp.float32)
            p = update_law(state.p, selection.clients, mask, score, floor)
            return state._replace(p=p)

        return Strategy(init, select, update)

    return inject_hyperparams(build, alpha1=alpha1, alpha2=alpha2, floor=floor)
