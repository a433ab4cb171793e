"""HeteRo-Select (Masud, Jahin and Hasan 2025, arXiv:2508.06692, Algorithm 1):
multi-criteria client scores, softmax selection with a decaying temperature.

Each round every available client k gets a score from six components (eqs. 3-11, see
:mod:`fedjax_sel.kernels.hetero_select`): normalised loss V', label-distribution diversity D,
loss momentum M, fairness F, staleness St and update-norm penalty N, combined additively
(eq. 1, the paper's champion) or multiplicatively (eq. 2). ``per_round`` clients are drawn
without replacement from ``softmax(S / tau(t))`` over the available clients (eq. 12;
Gumbel-top-k is the sequential draw). Aggregation is the plain FedAvg mean of Algorithm 1
(line 27: ``1/m``). FedProx (eq. 13, ``mu = 0.1`` in the paper) is the local-training option
``HParams.prox_mu`` (with ``LocalConfig.prox``) / ``--prox-mu 0.1``.

Where the losses come from (``loss_source``):

* ``oracle`` (default; the paper's ``L_k(w_{t-1})`` for every available client): one forward
  pass of the current global model over every client's training data per round
  (``oracle.all_losses``, N forward passes: with E local epochs on a fraction f of the
  clients, about ``1 / (3 E f)`` of the training FLOPs). Momentum (eq. 5) compares it with the
  loss the client had the last time it was available.
* ``last``: no extra computation; the loss of the global model on the client's first local
  minibatch at its last participation (``RoundFeedback.initial_loss``). ``last_train``: its
  mean training loss over that participation. A client never selected has no loss yet: its V'
  is 1 (the most informative, so that it gets tried) and its momentum term is 0 (M = 0.5).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Selection, SimSpec, Strategy, loss_pass_work
from fedjax_sel.kernels import gumbel_top_k
from fedjax_sel.kernels import hetero_select as hs
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

Scoring = Literal["additive", "multiplicative"]
LossSource = Literal["oracle", "last", "last_train"]


class HeteroSelectState(NamedTuple):
    """Per-client metadata the server keeps (Algorithm 1, line 24), all of length K.

    Attributes:
      divergence: ``JS(P_k || P_avg)`` of the label histograms (fixed).
      loss_last: the most recent loss known for the client (0 before the first).
      loss_before: the one before it (eq. 5's ``L(w_{t-2})``).
      loss_seen: how many losses are known (capped at 2).
      participations: ``h_k``, rounds the client was selected in.
      last_round: ``l_k``, the 1-based round of its last selection (0 = never).
      norm_sq: squared norm of its last update ``||w_k^{t'} - w_{t'-1}||^2``.
      norm_known: whether ``norm_sq`` is real.
    """

    divergence: Array
    loss_last: Array
    loss_before: Array
    loss_seen: Array
    participations: Array
    last_round: Array
    norm_sq: Array
    norm_known: Array


def init_state(spec: SimSpec, *, needs_labels: bool, diversity_measure: str) -> HeteroSelectState:
    k = spec.num_clients
    if spec.label_counts is None:
        if needs_labels:
            raise ConfigError(
                "hetero_select's diversity term needs label histograms (a classification data "
                "set with one label per example, not sequence targets); set w_d=0 to run "
                "without it"
            )
        divergence = jnp.zeros((k,), jnp.float32)
    else:
        divergence = hs.client_divergences(spec.label_counts, diversity_measure)
    zeros = jnp.zeros((k,), jnp.float32)
    izeros = jnp.zeros((k,), jnp.int32)
    return HeteroSelectState(
        divergence=divergence,
        loss_last=zeros,
        loss_before=zeros,
        loss_seen=izeros,
        participations=izeros,
        last_round=izeros,
        norm_sq=zeros,
        norm_known=jnp.zeros((k,), bool),
    )


def compute_components(
    state: HeteroSelectState,
    t: Array,
    available: Array,
    current_loss: Array | None,
    *,
    eta: float,
    gamma: float,
    alpha: float,
    staleness_cap: int = hs.STALENESS_CAP,
    schedule_rounds: int = hs.SCHEDULE_ROUNDS,
    eps: float = 1e-8,
) -> hs.ScoreComponents:
    """The six components of every client at 1-based round ``t``.

    ``current_loss``: float32[K] ``L_k(w_{t-1})`` (``oracle`` mode; momentum then compares it
    with ``state.loss_last``), or ``None`` to use the losses stored in ``state`` (``last``
    modes).
    """
    if current_loss is not None:
        value = hs.normalized_loss(current_loss, available, eps)
        mom = hs.momentum(state.loss_last, current_loss, state.loss_seen >= 1)
    else:
        known = state.loss_seen >= 1
        value = hs.normalized_loss(state.loss_last, available & known, eps)
        value = jnp.where(known, value, 1.0)
        mom = hs.momentum(state.loss_before, state.loss_last, state.loss_seen >= 2)
    return hs.ScoreComponents(
        value=value,
        diversity=hs.diversity(state.divergence, t, schedule_rounds),
        momentum=mom,
        fairness=hs.fairness_factor(state.participations, eta),
        staleness=hs.staleness_factor(t, state.last_round, gamma, staleness_cap),
        norm=hs.norm_factor(state.norm_sq, state.norm_known, alpha),
    )


def _record_loss(state: HeteroSelectState, who: Array, loss: Array) -> HeteroSelectState:
    """Pushes ``loss`` into the two-deep loss history of the clients in ``who`` (bool[K])."""
    return state._replace(
        loss_before=jnp.where(who, state.loss_last, state.loss_before),
        loss_last=jnp.where(who, loss, state.loss_last),
        loss_seen=jnp.where(who, jnp.minimum(state.loss_seen + 1, 2), state.loss_seen),
    )


@register_strategy(
    "hetero_select",
    description="HeteRo-Select: additive/multiplicative multi-criteria score, softmax draw "
    "with decaying temperature",
    reference="Masud, Jahin, Hasan 2025, Stabilizing FL under Extreme Heterogeneity "
    "with HeteRo-Select",
)
def hetero_select(
    *,
    per_round: int,
    scoring: Scoring = "additive",
    w_v: float = 1.0,
    w_d: float = 1.0,
    w_m: float = 1.0,
    w_f: float = 1.0,
    w_st: float = 1.0,
    w_n: float = 1.0,
    eta: float = 0.3,
    gamma: float = 0.7,
    alpha: float = 0.5,
    tau0: float = 2.0,
    staleness_cap: int = hs.STALENESS_CAP,
    schedule_rounds: int = hs.SCHEDULE_ROUNDS,
    loss_source: LossSource = "oracle",
    diversity_measure: Literal["js_divergence", "js_distance"] = "js_divergence",
    eps: float = 1e-8,
    weighting: Weighting = "uniform",
) -> Strategy:
    """HeteRo-Select client selection.

    Args:
      per_round: m, clients drawn per round.
      scoring: ``additive`` (eq. 1) or ``multiplicative`` (eq. 2).
      w_v, w_d, w_m, w_f, w_st, w_n: component weights of eq. 1 (champion: all 1). With
        ``multiplicative`` each must be 0 (drop the factor) or 1.
      eta: fairness weight (eq. 6).
      gamma: staleness weight (eq. 7).
      alpha: update-norm penalty weight (eq. 11; the paper gives no value, 0.5 is ours).
      tau0: base softmax temperature (eq. 12). Defaults eta=0.3, gamma=0.7, tau0=2 are the
        paper's "explorative" configuration of Table III (section V-D).
      staleness_cap: T_max of eq. 7 (20).
      schedule_rounds: the 100 rounds of the decays in eqs. 4 and 12.
      loss_source: ``oracle``, ``last`` or ``last_train`` (module docstring).
      diversity_measure: ``js_divergence`` (base 2) or ``js_distance`` (sqrt, nats; SciPy's).
      eps: epsilon of eq. 3.
      weighting: ``uniform`` (Algorithm 1's 1/m) or ``size``.
    """
    weights = hs.ComponentWeights(*(float(w) for w in (w_v, w_d, w_m, w_f, w_st, w_n)))
    names = ("w_v", "w_d", "w_m", "w_f", "w_st", "w_n")
    for name, w in zip(names, weights, strict=True):
        if not math.isfinite(w):
            raise ConfigError(f"hetero_select {name} must be finite, got {w}")
        if scoring == "multiplicative" and w not in (0.0, 1.0):
            raise ConfigError(
                f"hetero_select multiplicative scoring (eq. 2) has no weights: {name} must be "
                f"0 (drop the factor) or 1, got {w}"
            )
    for name, v in (("eta", eta), ("gamma", gamma), ("eps", eps)):
        if not v >= 0:
            raise ConfigError(f"hetero_select {name} must be >= 0, got {v}")
    if not 0 <= alpha <= 1:
        raise ConfigError(f"hetero_select alpha must lie in [0, 1], got {alpha}")
    if not tau0 > 0:
        raise ConfigError(f"hetero_select tau0 must be > 0, got {tau0}")
    if staleness_cap < 1 or schedule_rounds < 1:
        raise ConfigError(
            f"hetero_select staleness_cap and schedule_rounds must be >= 1, got "
            f"{staleness_cap} and {schedule_rounds}"
        )
    combine = hs.additive_score if scoring == "additive" else hs.multiplicative_score

    def build(eta, gamma, alpha, tau0):  # floats, or traced scalars inside the round
        params = dict(
            eta=eta,
            gamma=gamma,
            alpha=alpha,
            staleness_cap=staleness_cap,
            schedule_rounds=schedule_rounds,
            eps=eps,
        )

        def init(key, spec):
            del key
            return init_state(spec, needs_labels=w_d != 0, diversity_measure=diversity_measure)

        def select(state, inputs, oracle, key):
            t = inputs.round + 1
            available = inputs.available
            current = oracle.all_losses(inputs.params) if loss_source == "oracle" else None
            comps = compute_components(state, t, available, current, **params)
            scores = combine(comps, weights)
            tau = hs.temperature(t, tau0, schedule_rounds)
            logits = scores / tau
            clients, mask = gumbel_top_k(key, logits, per_round, available)
            if current is not None:  # available clients reported L_k(w_{t-1})
                state = _record_loss(state, available, current)
            w = fedavg_weights(inputs.num_examples, clients, mask, weighting)
            n = jnp.maximum(jnp.sum(available), 1)
            diagnostics = {  # eq. 12's law and each component's mean over the available clients
                "law": hs.selection_probabilities(logits, 1.0, available),
                "temperature": tau,
                **{
                    f"mean_{name}": jnp.sum(jnp.where(available, value, 0.0)) / n
                    for name, value in comps._asdict().items()
                },
            }
            work = None if current is None else loss_pass_work(inputs.num_examples, available)
            return Selection(clients, mask, w, diagnostics=diagnostics, work=work), state

        def update(state, selection, feedback):
            k = state.participations.shape[0]
            idx = jnp.where(selection.mask, selection.clients, k)
            picked = jnp.zeros((k,), bool).at[idx].set(True, mode="drop")
            state = state._replace(
                participations=state.participations + picked.astype(jnp.int32),
                last_round=jnp.where(picked, feedback.round + 1, state.last_round),
                norm_sq=state.norm_sq.at[idx].set(jnp.square(feedback.update_norm), mode="drop"),
                norm_known=state.norm_known | picked,
            )
            if loss_source == "oracle":
                return state
            reported = feedback.initial_loss if loss_source == "last" else feedback.train_loss
            per_client = jnp.zeros((k,), jnp.float32).at[idx].set(reported, mode="drop")
            return _record_loss(state, picked, per_client)

        return Strategy(init, select, update, reads_deltas=False)

    return inject_hyperparams(build, eta=eta, gamma=gamma, alpha=alpha, tau0=tau0)
