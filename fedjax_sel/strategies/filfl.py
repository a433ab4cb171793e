"""FilFL: client filtering before client selection (Fourati, Kharrat, Aggarwal, Alouini and
Canini, ECAI 2024, arXiv:2302.06599; Algorithms 1-2, eqs. 3-4).

Algorithm 1. In a *filtering round* (the first round, every ``period`` = h rounds, and whenever
the available set differs from the previous round's) every considered available client trains
from the global model, the double greedy chi-GF (``kernels/double_greedy.py``) keeps the
filtered-in set S^f maximising

    R(S) = -F_V( (1/|S|) sum_{k in S} w^k )                                     (eq. 3)

on a filtering set V, and an inner selector picks at most ``per_round`` clients from S^f; their
already-trained models are aggregated (the round does not train them again). In the other
rounds the inner selector picks from the stale S^f and only the picked clients train. When S^f
holds no more than ``per_round`` clients, all of them are taken (Algorithm 1, line 6).

V is the server-held set (``filter_data="server"``: a stratified slice held out of every
client's data, ``load_dataset(server_fraction=...)``, or the text of ``shakespeare_filfl``), or
the validation split of one available client drawn at random each filtering round
(``filter_data="client"``, the variable-dataset ablation of section 5.3.3).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    Array,
    ConfigError,
    RoundInputs,
    Selection,
    SimSpec,
    Strategy,
    TrainResult,
    add_work,
    client_work,
    no_work,
)
from fedjax_sel.kernels.double_greedy import (
    MAX_BRUTE_FORCE,
    VALUE_FLOOR,
    brute_force_filter,
    check_variant,
    clamp_value,
    filter_clients,
    set_value_ratio,
)
from fedjax_sel.kernels.sampling import uniform_without_replacement
from fedjax_sel.members import members_cond
from fedjax_sel.registry import parse_pairs
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.registry import STRATEGIES, make_strategy, register_strategy
from fedjax_sel.tree import row_mask

CODE_OFFSET = 10.0  # the reference code maximises f = 10 - F_V with f(empty) = 0


class FilFLState(NamedTuple):
    """``filtered``: bool[K] S^f; ``last_available``: bool[K] S_{t-1}; ``has_filter``: whether
    a filtering round happened; ``inner``: the inner selector's state."""

    filtered: Array
    last_available: Array
    has_filter: Array
    inner: Any


def diagnostic_keys(empty_value: str, track_opt: bool) -> tuple[str, ...]:
    """The keys of :func:`filfl`'s per-round ``Selection.diagnostics`` (besides the inner
    selector's, see :func:`filfl`); static for a configuration."""
    keys = [
        "filter_round",
        "considered",
        "kept",
        "removed",
        "filter_rate",
        "worse",
        "worse_share",
        "worse_removed",
        "value",
        "value_all",
        "value_global",
    ]
    if empty_value != "infeasible":  # the infeasible empty set's value is VALUE_FLOOR
        keys.append("value_empty")
    if track_opt:
        keys += ["value_dgf", "value_rgf", "value_opt", "ratio_dgf", "ratio_rgf"]
        keys += ["loss_ratio_dgf", "loss_ratio_rgf"]
    return tuple(keys)


def filter_diagnostics(
    valid: Array,
    keep: Array,
    value_global: Array,
    local_values: Array,
    values: dict[str, Array],
) -> dict[str, Array]:
    """What one filtering pass did, as float32 scalars.

    Args:
      valid: bool[n], the considered slots (clients that trained this round).
      keep: bool[n], the filtered-in slots (S^f).
      value_global: R of the current global model, ``-F_V(w_t)``.
      local_values: float32[n], R of each local model alone, ``-F_V(w^k)``.
      values: the greedy's values (``value``, ``value_all`` ...), passed through.

    Returns:
      ``considered`` (n), ``kept`` (|S^f|), ``removed``, ``filter_rate`` (|S^f| / n, Fig. 10),
      ``worse`` (local models whose loss on V exceeds the global model's; a non-finite loss
      counts as worse), ``worse_share`` (``worse / n``), ``worse_removed`` (how many of those
      the filter removed) and ``values``.
    """
    n = jnp.sum(valid).astype(jnp.float32)
    kept = jnp.sum(keep & valid).astype(jnp.float32)
    worse = valid & (clamp_value(local_values) < clamp_value(value_global))
    n_worse = jnp.sum(worse).astype(jnp.float32)
    out = {
        "filter_round": jnp.ones((), jnp.float32),
        "considered": n,
        "kept": kept,
        "removed": n - kept,
        "filter_rate": kept / jnp.maximum(n, 1.0),
        "worse": n_worse,
        "worse_share": n_worse / jnp.maximum(n, 1.0),
        "worse_removed": jnp.sum(worse & ~keep).astype(jnp.float32),
        "value_global": jnp.asarray(value_global, jnp.float32),
    }
    out.update({k: jnp.asarray(v, jnp.float32) for k, v in values.items()})
    return out


def parse_inner_args(text: str) -> dict[str, str]:
    """``"d=20;variant=cpow"`` -> ``{"d": "20", "variant": "cpow"}`` (``;`` separates pairs so
    that the CLI's comma-separated ``--strategy-arg`` list can carry them)."""
    return parse_pairs(text, what="filfl inner_args", sep=";")


def _gather_slots(result: TrainResult, slot: Array, mask: Array, params) -> TrainResult:
    """The trained results of the selected slots, as the round's own training would return
    them (start parameters and zero metrics on empty slots)."""

    def take(x, start=None):
        x = x[slot]
        on = row_mask(mask, x)
        return jnp.where(on, x, start[None] if start is not None else jnp.zeros_like(x))

    new_params = jax.tree.map(take, result.params, params)
    rest = {
        f: jax.tree.map(lambda x: x[slot], getattr(result, f))
        for f in ("opt_states",)
        if getattr(result, f) is not None
    }
    return TrainResult(
        params=new_params,
        loss=take(result.loss),
        initial_loss=take(result.initial_loss),
        loss_sq=take(result.loss_sq),
        num_steps=take(result.num_steps),
        **rest,
    )


@register_strategy(
    "filfl",
    description="FilFL: greedy client filtering (DGF/RGF) on a filtering set, then an inner "
    "selector (uniform, power_of_choice, divfl) on the filtered-in clients",
    reference="Fourati, Kharrat, Aggarwal, Alouini, Canini 2024, FilFL: Client Filtering for "
    "Optimized Client Participation in Federated Learning (ECAI)",
)
def filfl(
    *,
    per_round: int,
    inner: Literal["uniform", "power_of_choice", "divfl"] = "uniform",
    inner_args: str = "",
    variant: Literal["dgf", "rgf"] = "rgf",
    period: int = 5,
    considered: int = 0,
    filter_size: int = 0,
    filter_data: Literal["server", "client"] = "server",
    empty_value: Literal["infeasible", "global", "code"] = "infeasible",
    ties: Literal["remove", "add"] = "remove",
    if_empty: Literal["none", "all"] = "none",
    weighting: Weighting = "uniform",
    track_opt: bool = False,
) -> Strategy:
    """FilFL (Algorithm 1) around an inner selector.

    Args:
      per_round: K, clients aggregated per round (at most).
      inner: the selector applied to S^f: ``uniform`` (RS), ``power_of_choice`` (PoC) or
        ``divfl``.
      inner_args: the inner selector's hyperparameters, ``"key=value;key=value"`` (e.g.
        ``"d=100"`` for PoC over up to 100 candidates).
      variant: ``dgf`` (deterministic) or ``rgf`` (randomised) greedy filtering.
      period: h, rounds between filtering rounds (a change of the available set also filters).
      considered: n, the most available clients considered (and trained) in a filtering round;
        a uniform random subset when more are available (``Shuffle(S_t)`` of Algorithm 1).
        ``0``, or more than the K clients: all clients (K slots).
      filter_size: m, examples of the server filtering set used (spread evenly over it);
        ``0``: all of it.
      filter_data: ``server`` (a server-held set) or ``client`` (the validation split of one
        random considered client per filtering round, section 5.3.3).
      empty_value: R of the empty set, which Algorithm 2 needs at its first step and whenever
        Y would lose its last client: ``infeasible`` (the lowest value: eq. 3 maximises over
        non-empty subsets, as Fig. 11's brute force over 2^n - 1 of them; the first considered
        client is then always kept and S^f is never empty), ``global`` (-F_V of the current
        global model: an empty aggregate leaves it unchanged; under non-IID data a single local
        model is usually worse than the global one, so DGF often keeps nobody) or ``code``
        (-10: the reference code's ``f(empty) = 0`` with ``f = 10 - F_V``).
      ties: DGF's rule when ``a_i == b_i``: ``remove`` (paper) or ``add`` (reference code).
      if_empty: when the greedy keeps nobody (possible with ``empty_value`` ``global`` or
        ``code``): ``none`` (no client until the next filtering round: the objective prefers no
        update) or ``all`` (keep every considered client, i.e. no filtering).
      weighting: aggregation weights passed to the inner selector: ``uniform`` (Algorithm 1,
        line 19) or ``size``.
      track_opt: also run both greedies and the brute force over all ``2^n - 1`` subsets in
        each filtering round and log their values (needs ``considered <= 16``; Fig. 11).

    Diagnostics (``Selection.diagnostics``, every round; :func:`diagnostic_keys`): in a
    filtering round ``filter_round = 1`` and :func:`filter_diagnostics`' counts and values
    (``filter_rate = |S^f| / n``; ``worse``, ``worse_share``, ``worse_removed``: local models
    worse than the global model on V and how many of them the filter removed; ``value``,
    ``value_all``, ``value_global``, ``value_empty``: R(S^f), R of all n, R(w_t), R(empty);
    with ``track_opt`` both greedies' values, the optimum and the ratios
    ``ratio_dgf/rgf = (10 + R(S)) / (10 + R(OPT))`` and ``loss_ratio_dgf/rgf = F_V(OPT) /
    F_V(S)``); in the other rounds all of these are 0, so a mean over filtering rounds is the
    mean of a key over rounds divided by the mean of ``filter_round``. The inner selector's
    diagnostics pass through (its ``law``, over the eligible clients, as ``law``; the others
    as ``inner_<key>``).
    """
    check_variant(variant, ties)
    period, considered, filter_size = int(period), int(considered), int(filter_size)
    if period < 1:
        raise ConfigError(f"filfl period h must be >= 1, got {period}")
    if considered < 0:
        raise ConfigError(f"filfl considered (n) must be >= 0, got {considered}")
    if filter_size < 0:
        raise ConfigError(f"filfl filter_size (m) must be >= 0, got {filter_size}")
    if filter_data == "client" and filter_size:
        raise ConfigError("filfl filter_size applies to the server set, not to filter_data=client")
    kwargs: dict[str, Any] = parse_inner_args(inner_args)
    if "weighting" in STRATEGIES[inner].options:
        kwargs.setdefault("weighting", weighting)
    inner_strategy = make_strategy(inner, per_round, **kwargs)

    keys = diagnostic_keys(empty_value, track_opt)

    def init(key, spec: SimSpec) -> FilFLState:
        k = spec.num_clients
        n = min(considered or k, k)  # at most n: a federation of fewer clients considers all
        if track_opt and n > MAX_BRUTE_FORCE:
            raise ConfigError(
                f"filfl track_opt needs considered <= {MAX_BRUTE_FORCE} (brute force over "
                f"2^n - 1 subsets), got n={n}; set considered=N"
            )
        return FilFLState(
            filtered=jnp.zeros((k,), bool),
            last_available=jnp.zeros((k,), bool),
            has_filter=jnp.zeros((), bool),
            inner=inner_strategy.init(key, spec),
        )

    def choose(inner_state, inputs: RoundInputs, eligible, oracle, key):
        """The inner selector on ``eligible``, or all of it when it fits (Algorithm 1, l. 6);
        the inner selector's diagnostics come along (``law`` as it is, the others prefixed
        ``inner_``)."""
        k_inner, k_all = jax.random.split(key)
        sel, inner_state = inner_strategy.select(
            inner_state, inputs._replace(available=eligible), oracle, k_inner
        )
        all_clients, all_mask = uniform_without_replacement(k_all, eligible, per_round)
        fits = jnp.sum(eligible) <= per_round
        all_weights = fedavg_weights(inputs.num_examples, all_clients, all_mask, weighting)
        diagnostics = {
            (k if k == "law" else f"inner_{k}"): v for k, v in (sel.diagnostics or {}).items()
        }
        # an inner selector's own train_result is dropped (XLA removes the unused work)
        sel = Selection(
            clients=jnp.where(fits, all_clients, sel.clients).astype(jnp.int32),
            mask=jnp.where(fits, all_mask, sel.mask),
            weights=jnp.where(fits, all_weights, sel.weights),
            diagnostics=diagnostics,
        )
        return sel, inner_state

    def objective_fn(oracle, slots, valid, key):
        if filter_data == "client":
            pick, _ = uniform_without_replacement(key, valid, 1)
            client = slots[pick]
            return lambda p: -oracle.client_test_loss(p, client)[0]
        if oracle.server_loss is None:
            raise ConfigError("filfl needs a server-held filtering set (oracle.server_loss)")
        if filter_size:
            return lambda p: -oracle.server_loss(p, size=filter_size)
        return lambda p: -oracle.server_loss(p)

    def filtering_round(state: FilFLState, inputs: RoundInputs, oracle, key):
        k = inputs.available.shape[0]
        n = min(considered or k, k)
        k_order, k_greedy, k_data, k_select, k_other = jax.random.split(key, 5)
        slots, valid = uniform_without_replacement(k_order, inputs.available, n)
        trained = oracle.train(inputs.params, slots, oracle.train_key, valid)
        objective = objective_fn(oracle, slots, valid, k_data)
        value_global = objective(inputs.params)
        if empty_value == "global":
            value_empty = value_global
        elif empty_value == "code":
            value_empty = jnp.asarray(-CODE_OFFSET, jnp.float32)
        else:
            value_empty = jnp.asarray(VALUE_FLOOR, jnp.float32)
        result = filter_clients(
            trained.params, valid, objective, value_empty, variant=variant, key=k_greedy, ties=ties
        )
        keep = result.keep & valid
        if if_empty == "all":
            keep = jnp.where(jnp.any(keep), keep, valid)
        filtered = jnp.zeros((k,), bool).at[slots].set(keep)
        eligible = inputs.available & filtered
        sel, inner_state = choose(state.inner, inputs, eligible, oracle, k_select)
        slot_of = jnp.zeros((k,), jnp.int32).at[slots].set(jnp.arange(n, dtype=jnp.int32))
        # every considered client trained and sent its model; the kept ones count as the
        # round's training, the others as the filter's work
        kept = jnp.zeros((k,), bool).at[sel.clients].max(sel.mask)
        extra = valid & ~kept[slots]
        sel = sel._replace(
            train_result=_gather_slots(trained, slot_of[sel.clients], sel.mask, inputs.params),
            work=add_work(
                sel.work, client_work(k, slots, extra, train_steps=trained.num_steps, uploads=1.0)
            ),
        )
        values = {"value": result.value, "value_all": result.value_full}
        if empty_value != "infeasible":
            values["value_empty"] = value_empty
        if track_opt:
            other = "rgf" if variant == "dgf" else "dgf"
            second = filter_clients(
                trained.params, valid, objective, value_empty, variant=other, key=k_other, ties=ties
            )
            dgf, rgf = (result, second) if variant == "dgf" else (second, result)
            opt = brute_force_filter(trained.params, valid, objective, value_empty)
            values.update(value_dgf=dgf.value, value_rgf=rgf.value, value_opt=opt.value)
            for name, r in (("dgf", dgf), ("rgf", rgf)):
                values[f"ratio_{name}"] = set_value_ratio(r.value, opt.value, CODE_OFFSET)
                values[f"loss_ratio_{name}"] = opt.value / r.value  # F_V(OPT) / F_V(S)
        # R of each local model alone: only for the diagnostics (n forward passes over V)
        local_values = jax.vmap(objective)(trained.params)
        diagnostics = filter_diagnostics(valid, keep, value_global, local_values, values)
        sel = sel._replace(diagnostics={**sel.diagnostics, **diagnostics})
        return sel, inner_state, filtered

    def regular_round(state: FilFLState, inputs: RoundInputs, oracle, key):
        eligible = inputs.available & state.filtered
        sel, inner_state = choose(state.inner, inputs, eligible, oracle, key)
        trained = oracle.train(inputs.params, sel.clients, oracle.train_key, sel.mask)
        zeros = {name: jnp.zeros((), jnp.float32) for name in keys}
        sel = sel._replace(
            train_result=trained,
            diagnostics={**sel.diagnostics, **zeros},
            work=add_work(sel.work, no_work(inputs.available.shape[0])),
        )
        return sel, inner_state, state.filtered

    def select(state: FilFLState, inputs: RoundInputs, oracle, key):
        changed = jnp.any(inputs.available != state.last_available)
        do_filter = (~state.has_filter) | (inputs.round % period == 0) | changed
        sel, inner_state, filtered = members_cond(
            do_filter,
            lambda: filtering_round(state, inputs, oracle, key),
            lambda: regular_round(state, inputs, oracle, key),
        )
        new_state = FilFLState(
            filtered=filtered,
            last_available=inputs.available,
            has_filter=jnp.ones((), bool),
            inner=inner_state,
        )
        return sel, new_state

    def update(state: FilFLState, selection: Selection, feedback) -> FilFLState:
        return state._replace(inner=inner_strategy.update(state.inner, selection, feedback))

    def metrics(state: FilFLState, params, evaluator) -> dict[str, Array]:
        del params, evaluator
        return {"filtered_size": jnp.sum(state.filtered).astype(jnp.float32)}

    return Strategy(init, select, update, metrics=metrics, reads_deltas=False)
