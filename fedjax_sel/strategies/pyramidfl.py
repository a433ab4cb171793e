"""PyramidFL (Li, Zeng, Zhang, Cao, "PyramidFL: A Fine-grained Client Selection Framework for
Efficient Federated Learning", MobiCom 2022), as an extension of our Oort
(:mod:`fedjax_sel.strategies.oort`): the selection of the authors' artifact
(github.com/liecn/PyramidFL, ``training/param_server.py::prune_client_tasks``,
``oort/oort.py``, ``training/learner.py``). The paper's equations were not read; the code is
the executable definition (docs/comparators/pyramidfl.md).

*Inter-client ranking* (what this strategy runs). PyramidFL carries the original Oort artifact,
so each round the ``per_round`` picks (the engine's over-committed slots) come from Oort's
``getTopK`` with the original preset's knobs (the ``pyramidfl`` preset of
:data:`fedjax_sel.kernels.oort.PRESETS`), which differs from the original only in capping
``exploitLen`` at ``#explored - 1``. An explored client scores (Oort, eqs. of its section 4)::

    score_k = ((min(u_k, clip) - low) / span + sqrt(0.1 ln t / t_k)) * (D* / d_k)^alpha [d_k > D*]

with the statistical utility ``u_k = |B_k| sqrt(mean loss^2)`` (``|B_k| = min(n_k, U B)``)
and the speed term ``(D*/d_k)^alpha`` (``D*`` the pacer's duration percentile, ``d_k`` the
client's duration from the device profiles). The artifact also stores a *gradient utility*
per client, ``g_k = ||Delta~_k - theta_t|| |B_k| / 100`` (the server subtracts the last global
weights from a *delta*, see the docs), but ``getTopK`` never reads it: the ranking is Oort's
loss utility. ``ranking="gradient"`` (ours, flagged: not the artifact) ranks by ``g_k``
instead: Oort's reward becomes ``g_k``. ``gradient_utility="delta"`` uses the intended
``||Delta~_k||`` in place of the code's ``||Delta~_k - theta_t||``.

*Intra-client plan* (computed and logged, **not applied**). For the ``keep`` fastest picks
(the engine's over-commitment keeps the first finishers; ``keep = 0``: every pick), with
``local_k`` and ``comm_k`` the predicted compute and communication seconds
(``RoundInputs.compute_seconds``, ``comm_seconds``), ``c_k = local_k + comm_k`` and
``D = max_kept c``:

1. dropout (``dropout=True``): rank the kept by ``g`` (rank 0 = largest; ties share the lower
   rank), ``d_k = d_low + rank_k (d_high - d_low) / n_kept``,
   ``c_k <- local_k + (1 - d_k) comm_k``, ``D <- max_kept c_k``;
2. adaptive local iterations (``adapt=True``):
   ``r_k = min(10, beta_a floor((D - c_k) / (local_k / U)) / U) + 1``, ``iters_k = int(U r_k)``
   capped at ``max(5 ceil(n_k / B), U)``.

The engine cannot apply the plan, so this strategy is the *selection part only*: its clients
train the engine's ``local_steps`` and upload whole updates. What is missing: (a) a way for a
strategy to ask for per-slot step counts (``Selection`` has no such field; the trainer's
``step_limit`` is set only by the engine's deadline, :func:`fedjax_sel.engine.phases.apply_timing`);
(b) more steps than ``LocalConfig.local_steps`` (the trainer's ``fori_loop`` has that static
length; ``r_k`` up to 11 needs a loop of ``11 U`` steps masked per slot); (c) the clock
(:func:`fedjax_sel.engine.system.round_timing`) charges every slot its configured work, not
``iters_k`` steps nor ``(1 - d_k)`` of its upload; (d) per-tensor update dropout: the
aggregation weighs each slot's whole update by one scalar. The plan is kept in the state
(``plan_iters``, ``plan_dropout``) and summarised in the round's diagnostics.

Fixed shapes: Oort's masks and ``top_k`` (see :mod:`fedjax_sel.strategies.oort`); the plan is
an ``argsort`` over the ``per_round`` slots. What it asks of clients: Oort's, i.e. the
selected clients' training-loss statistic (computed during training, one scalar), the update
norm (one scalar; with ``gradient_utility="code"`` the server computes ``||Delta - theta||``
from the update it receives), and every client's device profile (compute speed, bandwidth) as
side information. The plan, if applied, would cost fast clients up to ``11 U`` steps.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Strategy
from fedjax_sel.strategies._common import Weighting, check_weighting
from fedjax_sel.strategies.oort import oort
from fedjax_sel.strategies.registry import register_strategy

Ranking = Literal["loss", "gradient"]
GradientUtility = Literal["code", "delta"]
MAX_EXTRA_RATIO = 10.0  # r_k = min(10, ...) + 1


class PyramidState(NamedTuple):
    """Oort's state (with its traced knobs) and PyramidFL's additions.

    Attributes:
      oort: the inner Oort selector's state.
      gradient: float32[K], each client's last gradient utility ``g_k`` (0 before any; the
        round's mean for picks the engine did not keep, as Oort does for its reward).
      plan_iters: int32[per_round], the last round's planned local iterations per slot
        (0 for slots outside the plan).
      plan_dropout: float32[per_round], the last round's planned update-dropout ratios.
    """

    oort: object
    gradient: Array
    plan_iters: Array
    plan_dropout: Array


class Plan(NamedTuple):
    """The intra-client plan over the slots (see the module docstring)."""

    ratio: Array  # float32[P], r_k (0 outside the kept slots)
    iters: Array  # int32[P], iters_k
    dropout: Array  # float32[P], d_k
    duration: Array  # float32, D after the dropout step


def slot_gradient_utility(
    deltas, params, update_norm: Array, bins: Array, variant: str = "code"
) -> Array:
    """``g_k = ||Delta_k - theta|| bins_k / 100`` (``code``) or ``||Delta_k|| bins_k / 100``
    (``delta``) per slot; ``deltas`` stacked over the slots, ``params`` the global weights."""
    if variant == "delta":
        norm = update_norm
    else:
        sq = jax.tree.map(
            lambda d, p: jnp.sum(jnp.square(d - p[None]).reshape(d.shape[0], -1), axis=1),
            deltas,
            params,
        )
        norm = jnp.sqrt(sum(jax.tree.leaves(sq)))
    return norm * bins / 100.0


def plan_intra_client(
    local_s: Array,
    comm_s: Array,
    gradient: Array,
    kept: Array,
    num_examples: Array,
    *,
    local_steps: int,
    batch_size: int,
    beta: float,
    dropout_low: float,
    dropout_high: float,
    dropout: bool,
    adapt: bool,
) -> Plan:
    """``prune_client_tasks``'s steps 3-4 over the slots (``kept``: the slots that run)."""
    c = local_s + comm_s
    n_kept = jnp.maximum(jnp.sum(kept), 1).astype(jnp.float32)
    duration = jnp.max(jnp.where(kept, c, 0.0))
    if dropout:
        g = jnp.where(kept, gradient, -jnp.inf)
        rank = jnp.sum(kept[None, :] & (g[None, :] > g[:, None]), axis=1).astype(jnp.float32)
        d = jnp.where(kept, dropout_low + rank * (dropout_high - dropout_low) / n_kept, 0.0)
        c = local_s + (1.0 - d) * comm_s
        duration = jnp.max(jnp.where(kept, c, 0.0))
    else:
        d = jnp.zeros(c.shape, jnp.float32)
    u = float(local_steps)
    if adapt:
        per_step = jnp.maximum(local_s / u, 1e-30)
        extra = beta * jnp.floor((duration - c) / per_step) / u
        ratio = jnp.minimum(MAX_EXTRA_RATIO, extra) + 1.0
    else:
        ratio = jnp.ones(c.shape, jnp.float32)
    batches = jnp.ceil(num_examples.astype(jnp.float32) / batch_size)
    cap = jnp.maximum(5.0 * batches, u)
    iters = jnp.minimum(jnp.floor(u * ratio), cap).astype(jnp.int32)
    ratio = jnp.where(kept, ratio, 0.0)
    return Plan(ratio, jnp.where(kept, iters, 0), d, duration)


@register_strategy(
    "pyramidfl",
    description="PyramidFL: Oort's ranking (PyramidFL's copy) with the gradient utility and "
    "the intra-client plan (adaptive iterations, update dropout) logged, not applied",
    reference="Li, Zeng, Zhang, Cao 2022, PyramidFL: A Fine-grained Client Selection Framework "
    "for Efficient FL (MobiCom)",
)
def pyramidfl(
    *,
    per_round: int,
    ranking: Ranking = "loss",
    gradient_utility: GradientUtility = "code",
    local_steps: int = 10,
    batch_size: int = 30,
    keep: int = 0,
    dropout: bool = True,
    adapt: bool = True,
    dropout_low: float = 0.1,
    dropout_high: float = 0.6,
    adaptive_beta: float = 1.0,
    exploration_factor: float | None = None,
    exploration_decay: float | None = None,
    exploration_min: float | None = None,
    cut_off_util: float | None = None,
    clip_bound: float | None = None,
    round_threshold: float | None = None,
    round_penalty: float | None = None,
    pacer_step: int | None = None,
    pacer_delta: float | None = None,
    sample_window: float | None = None,
    warmup_rounds: int = 1,
    weighting: Weighting = "uniform",
) -> Strategy:
    """PyramidFL's selection (module docstring).

    Args:
      per_round: the picks per round (the engine's over-committed slots; the artifact's
        over-commitment is 1.3: ``--overcommit 1.3``).
      ranking: ``loss`` (the artifact: Oort's loss utility) or ``gradient`` (ours: Oort's
        reward is the gradient utility).
      gradient_utility: ``code`` (``||Delta - theta||``, the artifact) or ``delta``
        (``||Delta||``).
      local_steps: U, the artifact's ``upload_epoch`` (give the engine's ``--local-steps``);
        the size prior and ``|B_k|`` are ``min(n_k, U batch_size)``.
      batch_size: B (give the engine's ``--batch-size``).
      keep: the picks the engine keeps (``--per-round`` under over-commitment); 0: all picks.
      dropout, adapt: the artifact's ``enable_dropout`` and ``enable_adapt_local_epoch``
        (its configs turn both on); they shape the logged plan only.
      dropout_low, dropout_high, adaptive_beta: ``d_low``, ``d_high``, ``beta_a``.
      exploration_factor ... sample_window: Oort's knobs (``None``: the original preset's).
      warmup_rounds: first rounds drawn uniformly (the artifact's first round is random).
      weighting: ``uniform`` (the artifact's ``is_even_avg``) or ``size``.

    Traced: Oort's (:data:`fedjax_sel.strategies.oort.TRACED`). The plan's knobs change
    only the logged plan and are static.
    """
    check_weighting(weighting)
    if ranking not in get_args(Ranking):
        raise ConfigError(f"pyramidfl ranking must be one of {get_args(Ranking)}, got {ranking!r}")
    if gradient_utility not in get_args(GradientUtility):
        raise ConfigError(
            f"pyramidfl gradient_utility must be one of {get_args(GradientUtility)}, got "
            f"{gradient_utility!r}"
        )
    if local_steps < 1 or batch_size < 1 or keep < 0:
        raise ConfigError(
            "pyramidfl local_steps and batch_size must be >= 1 and keep >= 0, got "
            f"{local_steps}, {batch_size}, {keep}"
        )
    if not (0.0 <= dropout_low <= dropout_high <= 1.0) or not (
        adaptive_beta >= 0 and math.isfinite(adaptive_beta)
    ):
        raise ConfigError(
            "pyramidfl needs 0 <= dropout_low <= dropout_high <= 1 and adaptive_beta >= 0, got "
            f"{dropout_low}, {dropout_high}, {adaptive_beta}"
        )
    samples = int(local_steps) * int(batch_size)
    inner = oort(
        per_round=per_round,
        preset="pyramidfl",
        exploration_factor=exploration_factor,
        exploration_decay=exploration_decay,
        exploration_min=exploration_min,
        cut_off_util=cut_off_util,
        clip_bound=clip_bound,
        round_threshold=round_threshold,
        round_penalty=round_penalty,
        pacer_step=pacer_step,
        pacer_delta=pacer_delta,
        sample_window=sample_window,
        warmup_rounds=warmup_rounds,
        samples_per_round=samples,
        weighting=weighting,
    )
    reads_deltas = gradient_utility == "code"

    def bins(num_examples: Array) -> Array:
        return jnp.minimum(num_examples.astype(jnp.float32), samples)

    def init(key, spec, hyperparams=None):
        return PyramidState(
            oort=inner.init(key, spec, hyperparams),
            gradient=jnp.zeros((spec.num_clients,), jnp.float32),
            plan_iters=jnp.zeros((per_round,), jnp.int32),
            plan_dropout=jnp.zeros((per_round,), jnp.float32),
        )

    def select(state, inputs, oracle, key):
        if inputs.compute_seconds is None or inputs.comm_seconds is None:
            raise ConfigError(
                "pyramidfl needs device profiles (RoundInputs.compute_seconds and comm_seconds): "
                "run it with a system model"
            )
        selection, inner_state = inner.select(state.oort, inputs, oracle, key)
        c, mask = selection.clients, selection.mask
        local_s, comm_s = inputs.compute_seconds[c], inputs.comm_seconds[c]
        if keep > 0:  # the engine keeps the first finishers (ties: the lower slot)
            order = jnp.argsort(jnp.where(mask, local_s + comm_s, jnp.inf), stable=True)
            rank = jnp.zeros(mask.shape, jnp.int32).at[order].set(jnp.arange(mask.shape[0]))
            kept = mask & (rank < keep)
        else:
            kept = mask
        plan = plan_intra_client(
            local_s,
            comm_s,
            state.gradient[c],
            kept,
            inputs.num_examples[c],
            local_steps=local_steps,
            batch_size=batch_size,
            beta=adaptive_beta,
            dropout_low=dropout_low,
            dropout_high=dropout_high,
            dropout=dropout,
            adapt=adapt,
        )
        n_kept = jnp.maximum(jnp.sum(kept), 1)
        diagnostics = dict(selection.diagnostics or {})
        diagnostics.update(
            pyramid_iters_ratio_mean=jnp.sum(plan.ratio) / n_kept,
            pyramid_iters_ratio_max=jnp.max(plan.ratio),
            pyramid_dropout_mean=jnp.sum(jnp.where(kept, plan.dropout, 0.0)) / n_kept,
            pyramid_planned_seconds=plan.duration,
        )
        state = state._replace(oort=inner_state, plan_iters=plan.iters, plan_dropout=plan.dropout)
        return selection._replace(diagnostics=diagnostics), state

    def update(state, selection, feedback):
        k = state.gradient.shape[0]
        mask = selection.mask
        g = gradient_utility_fn(feedback)
        idx = jnp.where(mask, selection.clients, k)
        done = jnp.zeros((k,), bool).at[idx].set(True, mode="drop")
        mean_g = jnp.sum(jnp.where(mask, g, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
        late = feedback.requested & ~mask
        late_idx = jnp.where(late, selection.clients, k)
        stragglers = jnp.zeros((k,), bool).at[late_idx].set(True, mode="drop")
        stragglers = stragglers & jnp.any(mask)
        reported = jnp.zeros((k,), jnp.float32).at[idx].set(g, mode="drop")
        gradient = jnp.where(done, reported, jnp.where(stragglers, mean_g, state.gradient))
        if ranking == "gradient":  # Oort's reward |B| sqrt(loss_sq) becomes g = |B| norm / 100
            b = jnp.maximum(bins(feedback.num_examples), 1e-30)
            feedback = feedback._replace(loss_sq=jnp.square(g / b))
        inner_state = inner.update(state.oort, selection, feedback)
        return state._replace(oort=inner_state, gradient=gradient)

    def gradient_utility_fn(feedback):
        return slot_gradient_utility(
            feedback.deltas,
            feedback.params,
            feedback.update_norm,
            bins(feedback.num_examples),
            variant,
        )

    variant = gradient_utility

    def metrics(state, params, evaluator):
        return inner.metrics(state.oort, params, evaluator)

    return Strategy(
        init,
        select,
        update,
        metrics=metrics,
        needs_system=True,
        hyperparams=inner.hyperparams,
        reads_deltas=reads_deltas,
    )
