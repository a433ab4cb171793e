"""Active Federated Learning (Goetz, Malik, Bui, Moon, Liu and Kumar 2019, arXiv:1909.12641;
docs/fedcvr_bolt.md, "Baselines"), a selection baseline of FedCVR-Bolt's Tables 1-2.

Each client has a valuation ``v_k``, refreshed only when it participates (never-seen clients
start at ``-inf``). Each round, over the available clients:

1. the ``floor(alpha1 * n)`` lowest valuations (``n`` available clients) are set to ``-inf``;
2. ``P_k ~ exp(alpha2 * v_k)`` (``-inf`` gets 0);
3. ``floor((1 - alpha3) m)`` clients are drawn from ``P`` without replacement;
4. the remaining slots, and any slot step 3 could not fill (fewer clients with ``P_k > 0``,
   e.g. in the first round), are drawn uniformly from the available clients not yet chosen.

Valuation (``valuation``), the value a participant reports with its update:

* ``loss`` (default, the paper's): ``v_k = sqrt(n_k) * mean loss`` of the round's global model on
  the client's whole training set before local training, i.e. the summed loss over
  ``sqrt(n_k)`` (our reading of the paper's ``L / sqrt(n_k)`` with ``L`` the summed loss);
* ``loss_per_sqrt_n``: ``mean loss / sqrt(n_k)`` (Plato's ``_calc_valuation``);
* ``train_loss``: the mean training loss over the client's last local round (Power-of-Choice's
  reference ``afl``; no extra forward pass).

Which valuations are fresh (``refresh``):

* ``participants`` (default, the paper's): a valuation is refreshed only when its client takes
  part. With ``alpha3 = 0`` this never explores: after the first round only its ``m``
  participants have a finite valuation, step 1 keeps exactly them, and the same ``m`` clients
  are drawn in every later round;
* ``available``: every available client reports its valuation of the round's global model
  before selection (``oracle.all_losses``, one pass over all training data). This is what
  FedCVR-Bolt's appendix C.1 must have run: it calls ``alpha1 = 0.8`` "equivalent to
  ``d = 2P``" (Power-of-Choice's ``d`` fresh candidate losses), which holds only when every
  client has a current valuation.

Defaults ``alpha1 = 0.75, alpha2 = 0.01, alpha3 = 0.1`` are the paper's; FedCVR-Bolt's
comparison uses ``alpha1 = 0.8, alpha2 = 1, alpha3 = 0`` (appendix C.1).

Diagnostics (``Selection.diagnostics``): ``law``, the softmax of step 2 (the law of each soft
draw; uniform over the available clients when no valuation is finite); ``kept``, the clients it
can draw (finite logits); ``soft_entropy_ratio``, its entropy over ``log(kept)`` (1 = uniform on
the kept set); ``top_mass``, the probability of its ``floor((1 - alpha3) m)`` most likely clients
(near 1 with ``kept`` above that number: a near-greedy draw); ``logit_spread``, the range of
``alpha2 v`` over the kept clients.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    Array,
    ConfigError,
    Selection,
    Strategy,
    client_work,
    loss_pass_work,
)
from fedjax_sel.kernels import gumbel_top_k, masked_softmax, uniform_without_replacement
from fedjax_sel.kernels.boltzmann import fill_slots
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

Valuation = Literal["loss", "loss_per_sqrt_n", "train_loss"]
Refresh = Literal["participants", "available"]


class ActiveFLState(NamedTuple):
    """``values``: float32[K] the latest valuation of each client (``-inf`` if never seen)."""

    values: Array


def active_logits(values: Array, available: Array, alpha1: float, alpha2: float) -> Array:
    """Steps 1-2: ``alpha2 * v`` with the ``floor(alpha1 * n)`` lowest available valuations,
    and every unavailable client, at ``-inf`` (float32[K])."""
    z = jnp.where(available, values, -jnp.inf)
    n = jnp.sum(available)
    drop = jnp.floor(alpha1 * n).astype(jnp.int32)
    # rank among the available clients, lowest value first (stable on ties)
    order = jnp.argsort(jnp.where(available, values, jnp.inf), stable=True)
    rank = jnp.zeros(values.shape, jnp.int32).at[order].set(jnp.arange(values.shape[0]))
    keep = available & (rank >= drop) & jnp.isfinite(values)
    return jnp.where(keep, alpha2 * jnp.where(keep, z, 0.0), -jnp.inf)


def valuation(kind: str, mean_loss: Array, num_examples: Array) -> Array:
    """The valuation of clients with ``mean_loss`` and ``num_examples`` (module docstring)."""
    root = jnp.sqrt(num_examples.astype(jnp.float32))
    if kind == "loss_per_sqrt_n":
        return mean_loss / jnp.maximum(root, 1.0)
    if kind == "loss":
        return mean_loss * root
    return mean_loss


def active_diagnostics(logits: Array, available: Array, num_soft: int) -> dict[str, Array]:
    """The law of step 2 and how sharp it is (module docstring)."""
    kept = jnp.isfinite(logits)
    n_kept = jnp.sum(kept)
    law = jnp.where(
        n_kept > 0,
        masked_softmax(logits, kept),
        available / jnp.maximum(jnp.sum(available), 1).astype(jnp.float32),
    )
    p = jnp.where(kept, law, 0.0)
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
    ratio = jnp.where(n_kept > 1, entropy / jnp.log(jnp.maximum(n_kept, 2)), 1.0)
    top = jnp.sum(jax.lax.top_k(p, max(num_soft, 1))[0]) if num_soft > 0 else jnp.zeros(())
    finite = jnp.where(kept, logits, 0.0)
    spread = jnp.where(
        n_kept > 0,
        jnp.max(jnp.where(kept, logits, -jnp.inf)) - jnp.min(jnp.where(kept, logits, jnp.inf)),
        0.0,
    )
    return {
        "law": law,
        "kept": n_kept.astype(jnp.float32),
        "soft_entropy_ratio": ratio,
        "top_mass": jnp.where(n_kept > 0, top, 0.0),
        "logit_spread": spread,
        "logit_mean": jnp.sum(finite) / jnp.maximum(n_kept, 1),
    }


@register_strategy(
    "active_fl",
    description="valuation-based sampling: drop the alpha1 lowest, softmax(alpha2 v), alpha3 "
    "uniform",
    reference="Goetz et al. 2019, Active Federated Learning",
)
def active_fl(
    *,
    per_round: int,
    alpha1: float = 0.75,
    alpha2: float = 0.01,
    alpha3: float = 0.1,
    valuation_kind: Valuation = "loss",
    refresh: Refresh = "participants",
    weighting: Weighting = "size",
) -> Strategy:
    """Active FL (module docstring).

    Args:
      per_round: m, clients per round.
      alpha1: fraction of lowest valuations excluded.
      alpha2: softmax inverse temperature.
      alpha3: fraction of slots drawn uniformly.
      valuation_kind: ``loss``, ``loss_per_sqrt_n`` or ``train_loss``.
      refresh: whose valuations are fresh each round: ``participants`` (the paper's) or every
        ``available`` client (module docstring).
      weighting: aggregation weights, ``size`` (FedAvg) or ``uniform``.
    """
    if not 0.0 <= alpha1 < 1.0:
        raise ConfigError(f"active_fl alpha1 must be in [0, 1), got {alpha1}")
    if not alpha2 >= 0.0:
        raise ConfigError(f"active_fl alpha2 must be >= 0, got {alpha2}")
    if not 0.0 <= alpha3 <= 1.0:
        raise ConfigError(f"active_fl alpha3 must be in [0, 1], got {alpha3}")
    if refresh == "available" and valuation_kind == "train_loss":
        raise ConfigError(
            "active_fl refresh='available' needs a loss valuation (train_loss exists only for "
            "participants)"
        )
    num_soft = math.floor((1.0 - alpha3) * per_round + 1e-9)  # guard 0.9 * 10 = 8.999...

    def build(alpha1, alpha2):  # floats, or traced scalars inside the round
        def init(key, spec):
            del key
            return ActiveFLState(jnp.full((spec.num_clients,), -jnp.inf, jnp.float32))

        def select(state: ActiveFLState, inputs, oracle, key):
            k_soft, k_unif, k_loss = jax.random.split(key, 3)
            work = None
            if refresh == "available":  # every available client reports before the draw
                v = valuation(valuation_kind, oracle.all_losses(inputs.params), inputs.num_examples)
                state = ActiveFLState(jnp.where(inputs.available, v, state.values))
                work = loss_pass_work(inputs.num_examples, inputs.available)
            logits = active_logits(state.values, inputs.available, alpha1, alpha2)
            soft, soft_ok = gumbel_top_k(k_soft, logits, max(num_soft, 1))
            soft, soft_ok = soft[:num_soft], soft_ok[:num_soft]
            taken = jnp.zeros(inputs.available.shape, bool).at[soft].max(soft_ok)
            rest, rest_ok = uniform_without_replacement(
                k_unif, inputs.available & ~taken, per_round
            )
            clients, mask = fill_slots(soft, soft_ok, rest, rest_ok, per_round)
            weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
            if valuation_kind != "train_loss" and refresh == "participants":
                # the participants' pre-training loss of this round's model, sent with the update
                loss = oracle.loss(inputs.params, clients, k_loss)
                v = valuation(valuation_kind, loss, inputs.num_examples[clients])
                idx = jnp.where(mask, clients, state.values.shape[0])
                state = ActiveFLState(state.values.at[idx].set(v, mode="drop"))
                k = inputs.num_examples.shape[0]
                work = client_work(k, clients, mask, forward_examples=inputs.num_examples[clients])
            diagnostics = active_diagnostics(logits, inputs.available, num_soft)
            selection = Selection(clients, mask, weights, diagnostics=diagnostics, work=work)
            return selection, state

        def update(state: ActiveFLState, selection, feedback) -> ActiveFLState:
            if valuation_kind != "train_loss":
                return state
            idx = jnp.where(selection.mask, selection.clients, state.values.shape[0])
            return ActiveFLState(state.values.at[idx].set(feedback.train_loss, mode="drop"))

        return Strategy(init, select, update, reads_deltas=False)

    return inject_hyperparams(build, alpha1=alpha1, alpha2=alpha2)
