"""Fed-CBS: class-balanced client sampling (Zhang et al., ICML 2023, arXiv 2209.15245;
docs/comparators/fedcbs.md).

Random cohorts on non-iid data pool into a class-imbalanced training set; Fed-CBS scores a
group S by its Quadratic Class-Imbalance Degree (QCID, :mod:`fedjax_sel.kernels.fedcbs`)

    QCID(S) = sum_b (sum_{i in S} c_ib / sum_{i in S} n_i - 1/B)^2

and draws the cohort one client at a time with probabilities favouring a low QCID. With ``C_j``
the first j picks, ``T_k`` the times client k was selected (starting at 1), ``t`` the round:

    pick 1:   P(k)        ~ QCID({k})^-beta_1 + lam sqrt(3 ln(t + 1) / (2 T_k))
    pick j>1: P(k | C_j-1) ~ QCID(C_j-1)^beta_j-1 / max(QCID(C_j-1 + {k})^beta_j, floor)

(the numerator is the same for every candidate and cancels), ``T_k += 1`` for the cohort after
the round. The paper's own statement and its beta / lambda values were not available [not
found]; this follows the structure the two public implementations share (comparators.md,
section 6):

* ``Yoruko-Tang/FedProphet`` ``src/selection/FedCBS.py`` (by a Fed-CBS co-author), our
  defaults: ``beta_j`` linear from ``beta_init = 1`` to ``beta_final = 10`` over the m picks;
  no lambda (``lam = 1``); the first pick is the **argmax**; the denominator floored at
  ``floor = 1e-3``; the whole draw repeated ``repeats = 6`` times, keeping the lowest-QCID
  cohort.
* ``ispras/FedXplore`` ``src/client_selectors/fedcbs.py``: ``lam = 10``, ``beta_j = j``
  (``beta_final = per_round``), the first pick sampled (``first="sample"``), one draw
  (``repeats=1``). Not reproduced: its second pick's exploration term uses the candidate's own
  ``T_k`` (the telescoped form has the first pick's), its later picks' exponent is off by one
  against its own list, and NaN/inf probabilities become 1e-6 (we clamp in log space instead).

Availability (ours; neither code has it): candidates are the available clients. Aggregation:
FedAvg over the cohort (``size``, FedXplore's; the paper's [not found]).

**Asks of clients** (cost): each client's class histogram (B counts), once; the paper's
private variant sends encrypted pairwise inner products instead. Nothing per round. Server:
``O(m K B)`` per sequential draw (running class sums; FedProphet recomputes ``O(K m^2)``), times
``repeats``; state ``K x B`` counts (from ``SimSpec.label_counts``, on device from init) and
``T``.

Fixed shapes: a ``scan`` of m picks carrying a chosen-mask and the running sums; each pick an
inverse-CDF draw from the masked log-scores (not Gumbel-top-k: the law changes after every
pick); the repeats ``vmap`` over keys, then an argmin. Log space throughout: ``Q^-10``
overflows float32 near ``Q = 0``; ``Q = 0`` (a perfectly balanced group) reaches the floor
exactly. Diagnostics: ``qcid``, the chosen cohort's QCID.

*Candidate pool* (``pool = C``, opt-in; ``0``, the default, or ``C >= K``: the exact rule
above, bit for bit). Each pick scores every client, ``O(repeats m K B)`` a round. With a pool,
each round first draws C available clients uniformly without replacement (the round's key,
split into the pool's and the draws'), then runs the whole rule (the first pick's argmax and
exploration bonus, the sequential draws, the repeats, all sharing the one pool) on them alone
(:func:`pooled_best_of_draws`): ``O(K)`` for the pool plus ``O(repeats m C B)``. Within the pool
the law is the exact rule's; what it changes against the paper is that the cohort is built from
C clients instead of all, so the lowest-QCID cohorts outside the pool are out of reach that
round, and the first pick is the best-balanced client of the pool. Why a uniform pool: QCID is a
property of the group, so no per-client ranking predicts which clients complete a balanced
cohort (a one-class client is the worst alone and the best complement), and a fixed preselection
would also shut the other clients out of the exploration bonus; a uniform pool keeps every
available client reachable with probability ``C / |available|`` a round. The approximation
(the cohorts' QCID against the exact rule's, seconds) is ``benchmarks/comparator_pools.py``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, PRNGKey, Selection, SimSpec, Strategy
from fedjax_sel.kernels import fedcbs as kc
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

First = Literal["argmax", "sample"]
FIRSTS = get_args(First)
TRACED = ("lam", "beta_init", "beta_final", "floor")


class FedCBSState(NamedTuple):
    """``counts``: float32[K, B] class histograms (static); ``pulls``: float32[K], ``T_k``
    (1 + times selected)."""

    counts: Array
    pulls: Array


def pooled_best_of_draws(
    key: PRNGKey,
    counts: Array,
    available: Array,
    pool: int,
    m: int,
    repeats: int,
    betas: Array,
    lam: Array,
    floor: Array,
    round_index: Array,
    pulls: Array,
    first: First = "argmax",
) -> tuple[Array, Array, Array, Array, Array]:
    """Fed-CBS's rule on a uniform pool of ``pool`` available clients (module docstring,
    *Candidate pool*): ``key`` splits into the pool's key and the draws'.

    Returns ``(clients int32[m], valid bool[m], qcid, members int32[pool], in_pool
    bool[pool])``: the cohort (client ids), its QCID and the pool (``in_pool`` False for slots
    past the available clients)."""
    k_pool, k_draw = jax.random.split(key)
    members, ok = uniform_without_replacement(k_pool, available, pool)
    picks, valid, q = kc.best_of_draws(
        k_draw,
        counts[members],
        ok,
        m,
        repeats,
        betas,
        lam,
        floor,
        round_index,
        pulls[members],
        first == "argmax",
    )
    return members[picks], valid, q, members, ok


@register_strategy(
    "fedcbs",
    description="Fed-CBS: sequential sampling favouring class-balanced cohorts (QCID)",
    reference="Zhang et al. 2023, Fed-CBS: A Heterogeneity-Aware Client Sampling Mechanism "
    "for Federated Learning via Class-Imbalance Reduction (ICML)",
)
def fedcbs(
    *,
    per_round: int,
    lam: float = 1.0,
    beta_init: float = 1.0,
    beta_final: float = 10.0,
    floor: float = 1e-3,
    first: First = "argmax",
    repeats: int = 6,
    weighting: Weighting = "size",
    pool: int = 0,
) -> Strategy:
    """Fed-CBS client sampling (module docstring; defaults: FedProphet's code).

    Args:
      per_round: m, the cohort size.
      lam: the first pick's exploration weight (FedXplore 10; FedProphet has none: 1).
      beta_init, beta_final: the exponents of the first and the last pick, linear in between.
      floor: lower bound of ``QCID^beta`` in a later pick's denominator (> 0).
      first: ``argmax`` (FedProphet) or ``sample`` (FedXplore) for the first pick.
      repeats: independent draws per round, the lowest-QCID one kept (FedProphet 6).
      weighting: FedAvg ``size`` or ``uniform``.
      pool: C, the candidates per round, drawn uniformly among the available clients (module
        docstring, the large-K path); ``0`` (default) or ``C >= K``: every client, the exact
        rule. At least ``per_round`` when set.

    Traced (a grid of them shares one program): ``lam``, ``beta_init``, ``beta_final``,
    ``floor``.
    """
    if first not in FIRSTS:
        raise ConfigError(f"fedcbs first must be one of {FIRSTS}, got {first!r}")
    if not (beta_init > 0 and beta_final > 0):
        raise ConfigError(f"fedcbs betas must be > 0, got {beta_init}, {beta_final}")
    if not lam >= 0:
        raise ConfigError(f"fedcbs lam must be >= 0, got {lam}")
    if not floor > 0:
        raise ConfigError(f"fedcbs floor must be > 0, got {floor}")
    repeats = int(repeats)
    if repeats < 1:
        raise ConfigError(f"fedcbs repeats must be >= 1, got {repeats}")
    pool = int(pool)
    if pool < 0 or 0 < pool < per_round:
        raise ConfigError(f"fedcbs pool must be 0 or >= per_round ({per_round}), got {pool}")

    def init(key, spec: SimSpec) -> FedCBSState:
        del key
        if spec.label_counts is None:
            raise ConfigError(
                "fedcbs needs per-client class histograms (a classification data set with one "
                "label per example)"
            )
        counts = jnp.asarray(spec.label_counts, jnp.float32)
        return FedCBSState(counts, jnp.ones((spec.num_clients,), jnp.float32))

    def build(lam, beta_init, beta_final, floor):
        betas = kc.beta_schedule(per_round, beta_init, beta_final)

        def select(state: FedCBSState, inputs, oracle, key):
            del oracle
            rule = (per_round, repeats, betas, lam, floor, inputs.round)
            if 0 < pool < state.counts.shape[0]:
                clients, mask, q, _, _ = pooled_best_of_draws(
                    key, state.counts, inputs.available, pool, *rule, state.pulls, first
                )
            else:
                clients, mask, q = kc.best_of_draws(
                    key,
                    state.counts,
                    inputs.available,
                    per_round,
                    repeats,
                    betas,
                    lam,
                    floor,
                    inputs.round,
                    state.pulls,
                    first == "argmax",
                )
            weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
            return Selection(clients, mask, weights, diagnostics={"qcid": q}), state

        def update(state: FedCBSState, selection: Selection, feedback) -> FedCBSState:
            del feedback
            k = state.pulls.shape[0]
            idx = jnp.where(selection.mask, selection.clients, k)
            return state._replace(pulls=state.pulls.at[idx].add(1.0, mode="drop"))

        return Strategy(init, select, update, asynchronous=True, reads_deltas=False)

    return inject_hyperparams(
        build, lam=lam, beta_init=beta_init, beta_final=beta_final, floor=floor
    )
