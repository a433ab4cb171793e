"""Pieces shared by CA-Fed and its baselines (Unbiased, More-available, AdaFed, F3AST):
target importance ``alpha``, availability estimates (oracle or Bayesian), slot packing, the
per-round diagnostics, and the reference code's per-client optima ``F_k^*``.

Availability estimates ``(pi_hat, lambda_hat)`` come from one of

* ``oracle``: the availability model's true parameters (``RoundInputs.availability_params``;
  the paper's main experiments, section V-A c);
* ``bayes``: the Beta-prior estimators of section IV-B, computed from the availability masks the
  strategy observes (:mod:`fedjax_sel.availability.estimators`);
* ``reference``: the public code's biased ``lambda`` estimator (github.com/arodio/CA-Fed;
  docs/ca_fed.md);
* ``auto`` (default): ``oracle`` when the availability model exposes its parameters, else
  ``bayes``.

The Beta prior is centred on ``pi_0 = 1/2, lambda_0 = 0`` (``prior="flat"``) or, as in the
reference code, on the true parameters (``prior="truth"``, needs an availability model that
exposes them); its weight is ``prior_rounds`` pseudo-rounds (2 = a uniform Beta(1, 1) on pi;
the reference code uses 100). Every strategy of the family traces ``prior_rounds`` in its state
(a grid of it shares one compiled program).

Budget variants (``candidates``, issue 54's equal-budget track). The paper's methods train every
available client their rule keeps (``per_round = K`` slots). ``candidates="all"`` (default) does
that, and with fewer slots keeps the selected clients of largest weight (a deterministic cut,
not the paper's rule). ``candidates="uniform"`` first draws ``m = min(per_round, |A_t|)`` of the
round's available clients ``A_t`` uniformly without replacement (:func:`draw_candidates`, with
the select key: the draw of the ``uniform`` strategy in the same round), then applies the
paper's rule to the drawn set ``D_t`` only. A client of ``A_t`` is drawn with probability ``m /
|A_t|``, so the unnormalised rules (``q_k = alpha_k / pi_hat_k``: Unbiased, More-available,
CA-Fed) weight a drawn client ``q_k |A_t| / m``: then ``E[sum_{k in D_t} q_k (|A_t| / m)
Delta_k | A_t] = sum_{k in A_t} q_k Delta_k``, the all-available aggregate, and eq. 4's biased
importance ``p`` is unchanged. A normalised rule (AdaFed) normalises over ``D_t`` instead.
Drawn clients the rule excludes leave their slot empty (they stay idle, as excluded available
clients do in the paper), so a round trains at most ``per_round`` clients.

Diagnostics (``Selection.diagnostics``, every round; docs/ca_fed.md), all fixed-size and
O(K) to compute, none K-sized in the logs:

* ``q_sum``, ``q_sum_sq``, ``q_max``: the sum of the trained clients' weights ``sum_k q_k``
  (not normalised by Unbiased and CA-Fed: it scales the server step), its square (the mean of
  both over rounds gives the standard deviation across rounds) and the largest single weight;
* ``law``: the aggregation weights normalised over the trained clients (the engine reduces it
  to ``law_entropy_ratio``, 1 = every available client trained with equal weight, and
  ``law_max_over_uniform``); with ``candidates="all"`` these methods draw nothing at random, so
  this is the law of the weights, not of a draw (with ``"uniform"``, of this round's draw);
* ``group_size``, ``kept_by_group``, ``trained_by_group``, ``weight_by_group`` (float32[4]):
  per group of clients (the classes of the paper's population, in
  :data:`~fedjax_sel.availability.markov_population.CLASS_NAMES` order: less available when
  ``pi < 1/2``, correlated when ``|lambda| >= 1/2``, from the true parameters when the
  availability model exposes them, else from the estimates), the clients, those with
  ``q_k > 0`` this round, those trained, and the sum of their weights. Fig. 1d's kept share
  and cumulative weight per class follow from their means over rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_sel.availability import estimators as est
from fedjax_sel.base import (
    Array,
    ConfigError,
    PRNGKey,
    RoundInputs,
    Selection,
    Strategy,
    update_identity,
)
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies.hyperparams import inject_hyperparams

Estimator = Literal["auto", "oracle", "bayes", "reference"]
Prior = Literal["flat", "truth"]
Candidates = Literal["all", "uniform"]
CANDIDATES = get_args(Candidates)
PI_FLOOR = 1e-6  # guards alpha / pi_hat against a client that is never online
NUM_GROUPS = 4


def check_availability_args(estimator: str, prior: str, prior_rounds: float, weighting: str):
    """Validates the hyperparameters every strategy of this family takes."""
    est.check_prior(prior_rounds)


def check_candidates(name: str, candidates: str) -> None:
    """A ``ConfigError`` naming a ``candidates`` value that is not one of :data:`CANDIDATES`
    (the registry checks it too; this covers a factory called directly)."""
    if candidates not in CANDIDATES:
        raise ConfigError(
            f"{name} candidates={candidates!r} is not a valid choice (one of "
            + ", ".join(repr(c) for c in CANDIDATES)
            + ")"
        )


def target_importance(num_examples: Array, weighting: str) -> Array:
    """``alpha``: ``n_k / sum n`` (``size``) or ``1 / K`` (``uniform``), float32[K]."""
    n = num_examples.astype(jnp.float32)
    raw = n if weighting == "size" else jnp.ones_like(n)
    return raw / jnp.sum(raw)


def availability_estimates(
    counts: est.AvailabilityCounts,
    inputs: RoundInputs,
    *,
    estimator: str,
    prior: str,
    prior_rounds: float,
) -> tuple[Array, Array, est.AvailabilityCounts]:
    """Observes this round's availability and returns ``(pi_hat, lambda_hat, counts)``.

    The counts are updated in every mode (so the state keeps one structure); ``pi_hat`` is
    floored at ``1e-6``. The choice between oracle and estimate is static (made at trace time).
    """
    truth = inputs.availability_params
    needs_truth = estimator == "oracle" or prior == "truth"
    if needs_truth and truth is None:
        raise ConfigError(
            f"estimator={estimator!r}, prior={prior!r} needs the true availability parameters, "
            "but this availability model does not expose them (use --availability markov, "
            "markov_clustered or trace, or estimator=bayes with prior=flat)"
        )
    kind = "bayes" if estimator in ("auto", "oracle") else estimator
    counts = est.update_counts(counts, inputs.available, estimator=kind)
    if estimator == "oracle" or (estimator == "auto" and truth is not None):
        pi_hat, lam_hat = truth.pi, truth.lam
    else:
        pi0, lam0 = (truth.pi, truth.lam) if prior == "truth" else (0.5, 0.0)
        pi_hat, lam_hat = est.estimate(
            counts, prior_rounds=prior_rounds, prior_pi=pi0, prior_lam=lam0, estimator=kind
        )
    pi_hat = jnp.clip(pi_hat.astype(jnp.float32), PI_FLOOR, 1.0)
    return pi_hat, lam_hat.astype(jnp.float32), counts


def pack_slots(selected: Array, priority: Array, per_round: int) -> tuple[Array, Array]:
    """The ``per_round`` selected clients of highest ``priority`` (ties by id) as slots:
    ``(clients int32[P], mask bool[P])``. With ``per_round = K`` nothing is dropped."""
    score = jnp.where(selected, priority.astype(jnp.float32), -jnp.inf)
    if per_round == selected.shape[0]:
        clients = jnp.argsort(score, descending=True, stable=True)
    else:
        _, clients = jax.lax.top_k(score, per_round)
    clients = clients.astype(jnp.int32)
    return clients, selected[clients]


def draw_candidates(
    key: PRNGKey, available: Array, per_round: int, candidates: str
) -> tuple[Array, Array]:
    """The clients the rule may pick this round and the factor their unnormalised weights take:
    ``(candidates bool[K], scale)``. ``all``: ``(available, 1)``. ``uniform``: ``m =
    min(per_round, |A_t|)`` available clients drawn uniformly without replacement (with ``key``;
    :func:`~fedjax_sel.kernels.uniform_without_replacement`, the ``uniform`` strategy's draw)
    and ``|A_t| / m``, the inverse of each available client's probability of being drawn (0 when
    no client is available, and then unused)."""
    if candidates == "all":
        return available, jnp.ones((), jnp.float32)
    clients, mask = uniform_without_replacement(key, available, per_round)
    drawn = slot_mask(clients, mask, available.shape[0])
    n_available = jnp.sum(available).astype(jnp.float32)
    n_drawn = jnp.sum(mask).astype(jnp.float32)
    return drawn, n_available / jnp.maximum(n_drawn, 1.0)


def client_groups(inputs: RoundInputs, pi_hat: Array, lam_hat: Array) -> Array:
    """int32[K] group of every client (see the module docstring): ``2 * (pi < 1/2) + (|lambda|
    < 1/2)``, i.e. 0 more available and correlated, 1 more available and weakly correlated,
    2 less available and correlated, 3 less available and weakly correlated. From the true
    parameters when the availability model exposes them, else from the estimates."""
    truth = inputs.availability_params
    pi, lam = (truth.pi, truth.lam) if truth is not None else (pi_hat, lam_hat)
    less = jnp.asarray(pi) < 0.5
    weak = jnp.abs(jnp.asarray(lam)) < 0.5
    return (2 * less.astype(jnp.int32) + weak.astype(jnp.int32)).astype(jnp.int32)


def round_diagnostics(groups: Array, kept: Array, trained: Array, q: Array) -> dict[str, Array]:
    """The per-round diagnostics of the module docstring from K-sized masks: ``kept`` (``q_k >
    0``), ``trained`` (the clients that train this round), ``q`` (their weights, float32[K]).
    Only fixed-size aggregates (and ``law``, which the engine reduces) are returned."""
    w = jnp.where(trained, q, 0.0).astype(jnp.float32)
    total = jnp.sum(w)

    def by_group(x):
        return jax.ops.segment_sum(x.astype(jnp.float32), groups, NUM_GROUPS)

    return {
        "q_sum": total,
        "q_sum_sq": jnp.square(total),
        "q_max": jnp.max(w),
        "law": w / jnp.maximum(total, 1e-30),
        "group_size": by_group(jnp.ones_like(w)),
        "kept_by_group": by_group(kept),
        "trained_by_group": by_group(trained),
        "weight_by_group": by_group(w),
    }


def slot_mask(clients: Array, mask: Array, num_clients: int) -> Array:
    """bool[K]: the clients that occupy a used slot."""
    return jnp.zeros((num_clients,), bool).at[clients].max(mask)


def slot_weights(clients: Array, mask: Array, weights: Array, num_clients: int) -> Array:
    """float32[K]: each client's weight this round (0 for clients in no used slot)."""
    w = jnp.where(mask, weights, 0.0).astype(jnp.float32)
    return jnp.zeros((num_clients,), jnp.float32).at[clients].add(w)


class CountsState(NamedTuple):
    """State of the stateless-but-estimating baselines: the availability counts."""

    counts: est.AvailabilityCounts


def availability_weighted(
    per_round: int,
    rule: Callable[..., tuple[Array, Array]],
    *,
    estimator: str,
    prior: str,
    prior_rounds: float,
    weighting: str,
    candidates: str = "all",
    normalised: bool = False,
    name: str = "strategy",
    **traced: float,
) -> Strategy:
    """A strategy that trains ``selected`` clients with weights ``q`` where
    ``rule(alpha, pi_hat, candidates, **traced) -> (selected bool[K], q float32[K])`` (Unbiased,
    AdaFed, More-available) and ``candidates`` is the round's available set (``candidates=
    "all"``; slots go to the selected clients of largest ``q``) or a uniform draw of
    ``per_round`` of them (``"uniform"``, :func:`draw_candidates`; the weights of a rule that is
    not ``normalised`` are then scaled by ``|A_t| / m``, see the module docstring). Its
    diagnostics are those of the module docstring (``kept``: the clients the rule would train
    were they available). ``prior_rounds`` and the rule's own numeric hyperparameters
    ``traced`` are traced in the state
    (:func:`~fedjax_sel.strategies.hyperparams.inject_hyperparams`); ``name`` is for errors."""
    check_availability_args(estimator, prior, prior_rounds, weighting)
    check_candidates(name, candidates)

    def init(key, spec):
        del key
        return CountsState(est.init_counts(spec.num_clients))

    def build(prior_rounds, **hyper):  # floats, or traced scalars inside the round
        def select(state, inputs, oracle, key):
            del oracle
            pi_hat, lam_hat, counts = availability_estimates(
                state.counts, inputs, estimator=estimator, prior=prior, prior_rounds=prior_rounds
            )
            alpha = target_importance(inputs.num_examples, weighting)
            drawn, scale = draw_candidates(key, inputs.available, per_round, candidates)
            selected, q = rule(alpha, pi_hat, drawn, **hyper)
            if candidates == "uniform" and not normalised:
                q = q * scale  # unbiased under the draw (module docstring)
            # with "uniform", at most per_round clients are selected: nothing is cut
            clients, mask = pack_slots(selected, q, per_round)
            weights = jnp.where(mask, q[clients], 0.0)
            k = inputs.available.shape[0]
            kept, _ = rule(alpha, pi_hat, jnp.ones_like(inputs.available), **hyper)
            diagnostics = round_diagnostics(
                client_groups(inputs, pi_hat, lam_hat),
                kept,
                slot_mask(clients, mask, k),
                slot_weights(clients, mask, weights, k),
            )
            return Selection(clients, mask, weights, diagnostics=diagnostics), CountsState(counts)

        return Strategy(init, select, update_identity, reads_deltas=False)

    return inject_hyperparams(build, **traced, prior_rounds=prior_rounds)


# ----------------------------------------------------------------------------- F_k^*
def fit_local_optimum(x: np.ndarray, y: np.ndarray, c: float = 1.0, max_iter: int = 1000):
    """The reference code's ``F_k^*`` of one client (``utils/utils.py::get_local_optimums``
    in github.com/arodio/CA-Fed): scikit-learn's ``LogisticRegression(multi_class=
    "multinomial", C=c, max_iter)`` fitted on the client's training examples, i.e. the
    minimiser of ``c * sum_i CE_i + ||W||^2 / 2`` (intercepts not penalised) over the classes
    present in ``y``, and ``F_k^*`` its mean training log-loss. A client with a single class
    makes scikit-learn raise, and the code then uses ``F_k^* = 0``: so do we.

    Returns ``(F_k^*, W float64[d, C'], b float64[C'], classes int[C'])`` (W, b: ``None`` when
    ``F_k^* = 0`` by that rule).
    """
    from scipy.optimize import minimize
    from scipy.special import logsumexp

    x = np.asarray(x, np.float64).reshape(len(y), -1)
    classes, y_idx = np.unique(np.asarray(y), return_inverse=True)
    if len(classes) < 2:
        return 0.0, None, None, classes
    n, d = x.shape
    m = len(classes)
    onehot = np.eye(m)[y_idx]

    def objective(theta):
        w, b = theta[: d * m].reshape(d, m), theta[d * m :]
        logits = x @ w + b
        log_p = logits - logsumexp(logits, axis=1, keepdims=True)
        ce = -np.sum(onehot * log_p)
        g_logits = np.exp(log_p) - onehot
        grad = np.concatenate([(c * x.T @ g_logits + w).ravel(), c * g_logits.sum(0)])
        return c * ce + 0.5 * np.sum(w * w), grad

    res = minimize(
        objective,
        np.zeros(d * m + m),
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": int(max_iter), "gtol": 1e-8},
    )
    w, b = res.x[: d * m].reshape(d, m), res.x[d * m :]
    logits = x @ w + b
    log_p = logits - logsumexp(logits, axis=1, keepdims=True)
    return float(-np.mean(log_p[np.arange(n), y_idx])), w, b, classes


def fit_local_optima(dataset, c: float = 1.0, max_iter: int = 1000) -> tuple[float, ...]:
    """:func:`fit_local_optimum` of every client of a federated data set (its training split),
    rounded to 6 decimals (they go into a configuration): CA-Fed's ``optimum="given"`` values
    as the reference code computes them for its tabular (Synthetic) data."""
    train = dataset.train
    return tuple(
        round(fit_local_optimum(*train.client_arrays(k), c=c, max_iter=max_iter)[0], 6)
        for k in range(train.num_clients)
    )
