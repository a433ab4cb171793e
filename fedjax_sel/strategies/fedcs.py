"""FedCS: client selection under a round deadline (Nishio and Yonetani, "Client Selection for
Federated Learning with Heterogeneous Resources in Mobile Edge", ICC 2019, arXiv:1804.08333).

The paper's PDF was not read; the rule below is the greedy as two independent third-party
implementations transcribe it (SelecEval's ``seleceval/selection/fedcs.py`` calls it the
paper's Algorithm 3; docs/comparators/fedcs.md). Each round:

1. *Resource request*: ``C K`` clients drawn uniformly at random among the available ones (the
   candidates ``K'``) report their resources; here their device profile of the round
   (:mod:`fedjax_sel.engine.system`): update time ``t^UD_k`` (local computation,
   ``RoundInputs.compute_seconds``), upload time ``t^UL_k`` and download time ``t^DL_k`` (each
   half of ``RoundInputs.comm_seconds``: one model each way at the client's bandwidth).
2. *Selection*: the greedy that fits the most clients into the deadline ``T_round``. The
   server multicasts the model at the slowest selected client's rate,
   ``T^d_S = max_{k in S} t^DL_k``, the clients update in parallel, and the uploads are
   scheduled one after another in selection order. With ``Theta_0 = 0``, after the ``j``-th
   scheduled client ``Theta_j = Theta_{j-1} + t^UL_{k_j} + max(0, t^UD_{k_j} - Theta_{j-1})``::

       S = [], Theta = 0, R = K'
       while R nonempty (and |S| < per_round):
           x = argmax_{k in R} 1 / (T^d_{S+k} - T^d_S + t^UL_k + max(0, t^UD_k - Theta))
           R -= {x};  Theta' = Theta + t^UL_x + max(0, t^UD_x - Theta)
           if T_cs + T^d_{S+x} + Theta' + T_agg < T_round:  S.append(x);  Theta = Theta'

3. *Aggregation*: FedAvg over the selected clients (data-size weights; the paper's weighting
   was not found).

Fixed shapes. The candidates are a masked Gumbel-top-k of static size ``ceil(C K)`` (sorted by
client id, so that ties of the argmax go to the lower id, as ``np.argmax`` over an id-ordered
list); fewer available clients leave candidate slots invalid. The ``while`` loop (up to
``|K'|`` iterations, O(|K'|^2)) becomes ``per_round`` steps of a ``fori_loop``, each an argmax
over the candidates that fit *now*: a candidate the loop drops (it does not fit) would never
fit later, because ``Theta`` and ``T^d_S`` only grow with ``S`` and ``Theta'`` is
non-decreasing in ``Theta`` (``Theta' = max(Theta, t^UD) + t^UL``), and dropping it changes
no state, so the greedy's picks are exactly the successive argmaxes among the fitting ones
(checked against the literal loop in tests/test_fedcs.py). Cost O(per_round |K'|). With many
candidates (at least four times ``max(16 per_round, 1024)``) a dominance test first rules out
those that can never be picked (:func:`never_picked`), and the greedy runs on the rest when at
most ``max(16 per_round, 1024)`` remain (the same schedule, bit for bit). The
variable-size result (``|S| <= per_round``) is the slot order (the upload schedule) plus a
valid mask; ``per_round`` is the static bound ``m_max`` (the paper has none: give a large
``per_round`` to let FedCS fill as many slots as fit).

What it asks of clients: a resource report (update time, channel throughput) from each of the
``C K`` candidates every round (``C K`` scalar uploads, C_sc each); nothing beyond the selected
clients' training. Side information: the device profiles (compute and bandwidth) of every
candidate. The engine's virtual clock lets the selected clients upload in parallel, so it
charges a round ``max_k (t^UD_k + t^DL_k + t^UL_k)``, less than FedCS's own serial schedule
``T_cs + T^d_S + Theta_|S| + T_agg``, which the diagnostic ``fedcs_schedule_seconds`` reports.
Every selected client fits the engine's deadline when ``--deadline`` equals ``deadline``
(``t^DL_k + t^UD_k + t^UL_k <= T^d_S + Theta_|S|``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    Array,
    ConfigError,
    Selection,
    Strategy,
    init_empty_state,
    update_identity,
)
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies._common import Weighting, check_weighting, fedavg_weights
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

TRACED = ("deadline", "request_seconds", "aggregation_seconds")


class Schedule(NamedTuple):
    """FedCS's greedy outcome over the candidates.

    Attributes:
      order: int32[m_max], candidate positions in selection (upload) order.
      valid: bool[m_max], which of them were selected (a prefix).
      theta: float32, ``Theta_|S|`` (update and upload time after the multicast).
      download: float32, ``T^d_S`` (multicast time, the slowest selected download).
    """

    order: Array
    valid: Array
    theta: Array
    download: Array


def deadline_greedy(
    update_s: Array,
    upload_s: Array,
    download_s: Array,
    eligible: Array,
    budget: Array,
    max_picks: int,
) -> Schedule:
    """FedCS's greedy (module docstring) over ``n`` candidates: ``update_s``, ``upload_s`` and
    ``download_s`` (float32[n]) are ``t^UD``, ``t^UL`` and ``t^DL``; ``eligible`` (bool[n])
    masks empty candidate slots; ``budget = T_round - T_cs - T_agg``; at most ``max_picks``
    (static) are selected. Ties of the score go to the lower candidate position."""
    n = update_s.shape[0]
    zero = jnp.zeros((), jnp.float32)

    def step(j, carry):
        remaining, order, valid, theta, down = carry
        new_theta = theta + upload_s + jnp.maximum(0.0, update_s - theta)
        new_down = jnp.maximum(down, download_s)
        fits = remaining & (new_down + new_theta < budget)
        increment = (new_down - down) + upload_s + jnp.maximum(0.0, update_s - theta)
        score = jnp.where(fits, 1.0 / increment, -jnp.inf)
        x = jnp.argmax(score)
        ok = jnp.any(fits)
        return (
            remaining & ((jnp.arange(n) != x) | ~ok),
            order.at[j].set(jnp.where(ok, x, 0).astype(jnp.int32)),
            valid.at[j].set(ok),
            jnp.where(ok, new_theta[x], theta),
            jnp.where(ok, new_down[x], down),
        )

    carry = (
        eligible,
        jnp.zeros((max_picks,), jnp.int32),
        jnp.zeros((max_picks,), bool),
        zero,
        zero,
    )
    _, order, valid, theta, down = jax.lax.fori_loop(0, max_picks, step, carry)
    return Schedule(order, valid, theta, down)


def pool_size(num_candidates: int, max_picks: int) -> int:
    """The static size of :func:`pruned_deadline_greedy`'s pool (all candidates when that is
    not much smaller)."""
    keep = max(16 * max_picks, 1024)
    return num_candidates if 4 * keep > num_candidates else keep


def never_picked(
    update_s: Array,
    upload_s: Array,
    download_s: Array,
    eligible: Array,
    budget: Array,
    max_picks: int,
) -> Array:
    """bool[n]: candidates that :func:`deadline_greedy` provably never picks in its
    ``max_picks`` steps (none when fewer than ``max_picks`` are eligible).

    Let ``T`` be the ``max_picks`` eligible candidates of smallest ``s_k = t^DL_k + t^UL_k +
    t^UD_k``. Before each step at least one member ``y`` of ``T`` remains, and a candidate
    ``x`` is never the argmax while such a ``y`` is there if either

    1. ``t^UL_x > max_T s`` (with a rounding margin): ``y``'s increment is at most ``s_y``,
       ``x``'s at least ``t^UL_x``, and ``y``'s schedule is shorter, so ``y`` fits whenever
       ``x`` does; or
    2. ``x`` is no faster than every member of ``T`` in each of ``t^DL``, ``t^UL`` and
       ``t^UD`` and comes after all of them: the increment and the schedule are
       non-decreasing in each (in floating point too), and ties go to the lower position.
    """
    n = update_s.shape[0]
    if max_picks > n:
        return jnp.zeros((n,), bool)
    total = jnp.where(eligible, download_s + upload_s + update_s, jnp.inf)
    # fewer eligible than max_picks: all of them are in T, and neither test rules out a member
    _, fastest = jax.lax.top_k(-total, max_picks)
    # rounding: increments and schedules are sums of terms up to the budget
    bound = jnp.max(total[fastest]) * (1.0 + 1e-4) + 1e-5 * jnp.abs(budget)
    slower = (
        (download_s >= jnp.max(download_s[fastest]))
        & (upload_s >= jnp.max(upload_s[fastest]))
        & (update_s >= jnp.max(update_s[fastest]))
        & (jnp.arange(n) > jnp.max(fastest))
    )
    return eligible & ((upload_s > bound) | slower)


def pruned_deadline_greedy(
    update_s: Array,
    upload_s: Array,
    download_s: Array,
    eligible: Array,
    budget: Array,
    max_picks: int,
    keep: int,
) -> Schedule:
    """:func:`deadline_greedy`'s schedule, exactly, run on a pool of at most ``keep`` (static)
    candidates: those :func:`never_picked` does not rule out, in position order (ties still go
    to the lower position). When more than ``keep`` remain the greedy runs over all
    candidates (``lax.cond``; under ``vmap`` both branches run). Cost ``O(n log max_picks)``
    for the test plus ``O(max_picks keep)``, against ``O(max_picks n)``; equal speeds (the
    engine's default profile) leave the first ``max_picks`` eligible candidates."""
    n = update_s.shape[0]
    args = (update_s, upload_s, download_s, eligible, budget, max_picks)
    if keep >= n:
        return deadline_greedy(*args)
    pool = eligible & ~never_picked(*args)
    count = jnp.sum(pool)
    (pos,) = jnp.nonzero(pool, size=keep, fill_value=0)

    def on_pool(_):
        s = deadline_greedy(
            update_s[pos],
            upload_s[pos],
            download_s[pos],
            jnp.arange(keep) < count,
            budget,
            max_picks,
        )
        return s._replace(order=jnp.where(s.valid, pos[s.order], 0).astype(jnp.int32))

    return jax.lax.cond(count <= keep, on_pool, lambda _: deadline_greedy(*args), None)


def num_candidates(fraction: float, num_clients: int) -> int:
    """``ceil(C K)`` candidates (at least one, at most K)."""
    return max(1, min(num_clients, math.ceil(fraction * num_clients - 1e-9)))


@register_strategy(
    "fedcs",
    description="FedCS: the most clients whose download, update and serial upload fit a "
    "deadline (greedy over a random fraction of resource reports)",
    reference="Nishio, Yonetani 2019, Client Selection for FL with Heterogeneous Resources "
    "in Mobile Edge (ICC)",
)
def fedcs(
    *,
    per_round: int,
    deadline: float = 120.0,
    fraction: float = 0.5,
    request_seconds: float = 0.0,
    aggregation_seconds: float = 0.0,
    weighting: Weighting = "size",
) -> Strategy:
    """FedCS (module docstring).

    Args:
      per_round: the static bound on the selected clients (slots).
      deadline: ``T_round``, seconds (give the same number as the engine's ``--deadline``;
        the paper's value was not found).
      fraction: ``C``, the fraction of the K clients asked for resources each round (drawn
        among the available ones; the paper's value was not found, third-party defaults are
        0.2 and 0.5).
      request_seconds: ``T_cs``, the resource-request step's seconds.
      aggregation_seconds: ``T_agg``, the aggregation step's seconds.
      weighting: ``size`` (FedAvg, ``n_k / sum n``) or ``uniform``.

    Traced: ``deadline``, ``request_seconds``, ``aggregation_seconds``. ``fraction`` sets a
    shape (the number of candidates) and is static.
    """
    check_weighting(weighting)
    if not (0.0 < fraction <= 1.0):
        raise ConfigError(f"fedcs fraction must lie in (0, 1], got {fraction!r}")
    if not (deadline > 0 and math.isfinite(deadline)):
        raise ConfigError(f"fedcs deadline must be a positive number of seconds, got {deadline!r}")
    if request_seconds < 0 or aggregation_seconds < 0:
        raise ConfigError(
            "fedcs request_seconds and aggregation_seconds must be >= 0, got "
            f"{request_seconds!r} and {aggregation_seconds!r}"
        )

    def build(deadline, request_seconds, aggregation_seconds):
        def select(state, inputs, oracle, key):
            del oracle
            if inputs.compute_seconds is None or inputs.comm_seconds is None:
                raise ConfigError(
                    "fedcs needs device profiles (RoundInputs.compute_seconds and comm_seconds): "
                    "run it with a system model"
                )
            k = inputs.available.shape[0]
            n_c = num_candidates(fraction, k)
            cand, cand_ok = uniform_without_replacement(key, inputs.available, n_c)
            # id order: the argmax's ties go to the lower client id
            order = jnp.argsort(jnp.where(cand_ok, cand, k), stable=True)
            cand, cand_ok = cand[order], cand_ok[order]
            half_comm = 0.5 * inputs.comm_seconds[cand]
            budget = deadline - request_seconds - aggregation_seconds
            sched = pruned_deadline_greedy(
                inputs.compute_seconds[cand],
                half_comm,
                half_comm,
                cand_ok,
                budget,
                per_round,
                pool_size(n_c, per_round),
            )
            clients = cand[sched.order]
            mask = sched.valid
            weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
            n_sel = jnp.sum(mask)
            diagnostics = {
                "fedcs_candidates": jnp.sum(cand_ok),
                "fedcs_selected": n_sel,
                "fedcs_schedule_seconds": jnp.where(
                    n_sel > 0,
                    request_seconds + sched.download + sched.theta + aggregation_seconds,
                    0.0,
                ),
            }
            return Selection(clients, mask, weights, diagnostics=diagnostics), state

        return Strategy(
            init_empty_state, select, update_identity, needs_system=True, reads_deltas=False
        )

    return inject_hyperparams(
        build,
        deadline=deadline,
        request_seconds=request_seconds,
        aggregation_seconds=aggregation_seconds,
    )
