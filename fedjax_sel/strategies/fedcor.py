"""FedCor: correlation-based active client selection with a Gaussian process (Tang, Ning, Wang,
Sun, Wang, Li, Chen, "FedCor: Correlation-Based Active Client Selection Strategy for
Heterogeneous Federated Learning", CVPR 2022, pp. 10102-10111).

The paper's text was not read beyond its abstract; the mechanics follow the authors' code
(``Yoruko-Tang/FedCor`` HEAD d941083: ``src/GPR.py``, ``src/federated_main.py``; see
docs/comparators/fedcor.md for the versions and our departures).

*Model.* The clients' loss changes ``Delta L_i = L_i(theta_{t+1}) - L_i(theta_t)`` are jointly
Gaussian, ``N(mu, Sigma)`` with ``Sigma = X^T X + sigma_n^2 I`` (``X``: float32[D, K] learned
client embeddings, ``D = 15``, initialised ``N(0, 1) / sqrt(D)``; ``sigma_n = 0.01`` fixed).
``X`` maximises the discounted marginal likelihood of the stored loss-change vectors,
``sum_e gamma^(t-e) log N(Delta L^e | mu, Sigma)`` over the window ``e >= t - M``, by Adam
(lr 0.01) from a fresh optimizer state; with ``update_mean`` ``mu`` is the discounted mean of
the stored vectors, else 0.

*Greedy selection* (``Select_Clients``; ``w_i = n_i / N``, ``beta`` the annealing discounts)::

    repeat m times: k* = argmax_k beta_k (sum_i w_i Sigma[i, k]) / sqrt(Sigma[k, k])
                    Sigma <- Sigma - Sigma[:, k*] Sigma[k*, :] / Sigma[k*, k*]

(``-score`` is the shift of ``E[sum_i w_i Delta L_i]`` when ``Delta L_k*`` is observed one
prior standard deviation below its mean; conditioning makes the next pick account for what
``k*`` already tells about its correlated clients).

*Schedule* (0-based rounds ``t``, ``warmup``, ``Delta t = gpr_interval``):

* rounds ``t <= warmup``: ``m`` clients uniformly at random; afterwards every client reports
  ``L_i(theta_{t+1})`` and ``Delta L^t`` is stored; the GP trains ``warmup_iterations`` Adam
  steps every warm-up round, or, with ``update_mean``, ``final_iterations`` once at
  ``t = warmup``;
* rounds ``t > warmup``: the greedy. If ``t % Delta t == 0`` (a GP round): ``beta <- 1``; an
  *extra* FedAvg round from ``theta_{t+1}`` with ``m`` random clients gives a temporary model
  (discarded), every client reports its loss under both, ``Delta L = L(temp) - L(theta_{t+1})``
  is stored and the GP trains ``gp_iterations`` steps. Otherwise ``beta_k <- discount beta_k``
  for this round's picks.

The engine's ``update`` has no oracle, so the work that follows round ``t`` (the loss reports,
the extra round, the GP training) runs at the start of round ``t + 1``'s ``select``, on
``theta_{t+1} = inputs.params``, before its selection: the same order as the code. It runs under
:func:`fedjax_sel.members.members_cond`, so rounds that need none of it pay nothing (seeds and
grid points vmapped together run a branch when some member takes it).

Fixed shapes: the stored vectors are a ring buffer of ``min(M + 1, warmup + 2 + M // Delta t)``
slots (the most a window can hold) with round stamps; weights ``gamma^(t-e)``, 0 for empty or
expired slots. The training loop is a ``fori_loop`` with a traced trip count. The greedy is a
``fori_loop`` of ``m`` masked argmaxes (under ``members_cond``: warm-up rounds skip it).

*Scalable path* (``solver="lowrank"``, the default): Sigma is rank D plus noise, so the
likelihood uses Woodbury (a D x D Cholesky, O(K D^2 + S K D) per Adam step instead of the K x K
Cholesky's O(K^3)) and the greedy conditions the D-dimensional latent of
``Delta L = X^T z + noise`` (a D x D covariance, one Sherman-Morrison downdate per pick: O(K D)
per pick instead of O(K^2)); nothing K x K is formed. This is exact, not an approximation (float32
rounding differs; tests compare it with ``solver="dense"``, the code's K x K algebra). What
remains linear in K per round is the clients' loss evaluations, which the method needs.

*Candidate pool* (``pool = C``, opt-in; ``0``, the default, or ``C >= K``: the exact rule
above). The greedy still costs ``O(m K D)``: each of the m picks rescores every client. With a
pool, each greedy round first draws C available clients uniformly without replacement (the
round's key) and lets only them be picked; the objective stays the global one, every client in
``sum_i w_i Sigma[i, k]``. The clients outside the pool enter that sum only through
``r = sum_{i not in pool} w_i x_i``, which no pick changes (only pool members are conditioned
out of it), so they ride along as one never-eligible extra column with embedding ``r`` and
weight 1 (:func:`pooled_greedy`): the scores of the pool's clients are then exactly the exact
greedy's restricted to them, at ``O(K D)`` once plus ``O(m C D)`` (``O(m C^2)`` dense). What it
changes against the paper: a pick is the best of the pool, not of all clients (the picks are
random, not deterministic). Why a uniform pool rather than, say, the C best first-pick scores:
after about D picks the conditioned scores are led by the weights and the annealing, not by the
first-pick ranking, and a fixed top-C set would shut the other clients out for good; a uniform
pool keeps every available client reachable each round with probability ``C / |available|``.
The approximation against the exact greedy (the chosen set's posterior variance reduction of
``sum_i w_i Delta L_i``, the overlap of the sets, seconds) is ``benchmarks/comparator_pools.py``.
The GP fit and the all-client loss passes are not pooled (linear in K, and the model needs them).

Availability (none in the code): only available clients are picked (uniformly in warm-up, and
``-inf`` scores in the greedy), but every client stays in the weighted sum ``sum_i w_i Sigma``
(the objective is the global loss) and reports its loss in warm-up and GP rounds, as in the
code. The extra round draws among the available clients.

What it asks of clients: in every warm-up round and every GP round, every client's loss of the
current global model (``K`` loss evaluations, ``oracle.all_losses``: one forward pass over all
``N`` training examples, and ``K`` scalar uploads); in each GP round also the extra round's
``m`` local trainings and uploads, and a second ``K``-client loss evaluation of the temporary
model. Server: the GP training and the greedy (above). Diagnostics per round:
``fedcor_eval_passes`` (all-client loss passes), ``fedcor_extra_trainings``,
``fedcor_gp_iterations``, ``fedcor_greedy`` and ``fedcor_nll``.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple, get_args

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    Array,
    ConfigError,
    PRNGKey,
    Selection,
    Strategy,
    client_work,
    no_work,
)
from fedjax_sel.kernels import gp, uniform_without_replacement
from fedjax_sel.members import members_cond
from fedjax_sel.strategies._common import Weighting, check_weighting, fedavg_weights
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

Solver = Literal["lowrank", "dense"]
LossSource = Literal["train", "test"]
TRACED = ("gamma", "discount", "noise", "lr")


class FedCorState(NamedTuple):
    """Attributes:
    embedding: float32[D, K], the GP's client embeddings ``X``.
    mu: float32[K], the prior mean.
    beta: float32[K], the annealing discounts.
    samples: float32[S, K], the stored loss-change vectors (ring buffer).
    stamps: int32[S], each slot's round (-1: empty).
    cursor: int32, the next slot to write.
    last_losses: float32[K], every client's loss at the last evaluation.
    nll: float32, the GP's last training loss.
    """

    embedding: Array
    mu: Array
    beta: Array
    samples: Array
    stamps: Array
    cursor: Array
    last_losses: Array
    nll: Array


def buffer_slots(warmup: int, interval: int, group_size: int) -> int:
    """The most loss-change vectors a window of ``group_size + 1`` rounds holds: one per
    warm-up round, one per GP round."""
    return max(1, min(group_size + 1, warmup + 2 + group_size // interval))


def window_weights(stamps: Array, gamma: Array, group_size: int) -> Array:
    """``gamma^(t - e)`` for the stored rounds ``e >= t - group_size`` (``t``: the newest
    stamp), 0 for empty or expired slots."""
    newest = jnp.max(stamps)
    age = (newest - stamps).astype(jnp.float32)
    live = (stamps >= 0) & (stamps >= newest - group_size)
    return jnp.where(live, jnp.power(gamma, age), 0.0)


def run_greedy(
    x: Array, noise: Array, weights: Array, beta: Array, eligible: Array, m: int, solver: str
) -> gp.Greedy:
    """FedCor's greedy (``Select_Clients``) with the ``solver``'s algebra."""
    if solver == "dense":
        return gp.greedy_dense(gp.dense_covariance(x, noise), weights, beta, eligible, m)
    return gp.greedy_lowrank(x, noise, weights, beta, eligible, m)


def pooled_greedy(
    key: PRNGKey,
    x: Array,
    noise: Array,
    weights: Array,
    beta: Array,
    available: Array,
    m: int,
    pool: int,
    solver: str = "lowrank",
) -> tuple[Array, Array, Array, Array]:
    """The greedy with only a uniform pool of ``pool`` available clients eligible, the objective
    over all clients (module docstring, *Candidate pool*).

    Returns ``(clients int32[m], valid bool[m], members int32[pool], in_pool bool[pool])``:
    the picks (client ids) and the pool (``in_pool`` False for slots past the available
    clients)."""
    members, ok = uniform_without_replacement(key, available, pool)
    inside = jnp.zeros(available.shape, bool).at[members].set(ok)
    # the clients outside the pool: one extra column, never eligible, weight 1
    rest = x @ jnp.where(inside, 0.0, weights)
    one = jnp.ones((1,), x.dtype)
    xs = jnp.concatenate([x[:, members], rest[:, None]], axis=1)
    ws = jnp.concatenate([jnp.where(ok, weights[members], 0.0), one])
    bs = jnp.concatenate([beta[members], one])
    eligible = jnp.concatenate([ok, jnp.zeros((1,), bool)])
    g = run_greedy(xs, noise, ws, bs, eligible, m, solver)
    return members[jnp.minimum(g.clients, pool - 1)], g.valid, members, ok


@register_strategy(
    "fedcor",
    description="FedCor: GP over clients' loss changes, greedy posterior selection (warm-up, "
    "GP retraining with an extra random round every gpr_interval)",
    reference="Tang et al. 2022, FedCor: Correlation-Based Active Client Selection (CVPR)",
)
def fedcor(
    *,
    per_round: int,
    warmup: int = 15,
    gpr_interval: int = 10,
    group_size: int = 100,
    gamma: float = 0.95,
    discount: float = 0.95,
    update_mean: bool = True,
    dimension: int = 15,
    noise: float = 0.01,
    lr: float = 0.01,
    gp_iterations: int = 100,
    warmup_iterations: int = 150,
    final_iterations: int = 1000,
    solver: Solver = "lowrank",
    loss_source: LossSource = "train",
    weighting: Weighting = "uniform",
    pool: int = 0,
) -> Strategy:
    """FedCor (module docstring). Defaults: the code's FMNIST command (HEAD).

    Args:
      per_round: m, clients per round.
      warmup: the last warm-up round (0-based; rounds ``0..warmup`` are random).
      gpr_interval: ``Delta t``, rounds between GP updates after warm-up.
      group_size: M, the window of stored loss changes (rounds).
      gamma: the likelihood's discount ``gamma^(t - e)``.
      discount: the annealing factor of the picks' ``beta`` between GP rounds.
      update_mean: ``mu`` = the discounted mean of the stored vectors (else 0).
      dimension: D, the embedding dimension.
      noise: ``sigma_n``.
      lr: Adam's learning rate.
      gp_iterations, warmup_iterations, final_iterations: Adam steps in a GP round, in each
        warm-up round (without ``update_mean``), and at the last warm-up round (with it).
      solver: ``lowrank`` (Woodbury, exact, O(K D^2)) or ``dense`` (K x K, the code's).
      loss_source: the clients' loss reports: ``train`` (their training data, one pass over
        all examples) or ``test`` (their own test split, ``test_fraction > 0``; the code
        evaluates a held-out 20% of each client's data).
      weighting: ``uniform`` (the code's mean of the picks' models) or ``size``.
      pool: C, the greedy's candidates per round, drawn uniformly among the available clients
        (module docstring, the large-K path); ``0`` (default) or ``C >= K``: every client, the
        exact greedy. At least ``per_round`` when set.

    Traced: ``gamma``, ``discount``, ``noise``, ``lr``. The rest set shapes, schedules or code
    paths.
    """
    check_weighting(weighting)
    if solver not in get_args(Solver):
        raise ConfigError(f"fedcor solver must be one of {get_args(Solver)}, got {solver!r}")
    if loss_source not in get_args(LossSource):
        raise ConfigError(
            f"fedcor loss_source must be one of {get_args(LossSource)}, got {loss_source!r}"
        )
    ints = dict(
        warmup=warmup,
        gpr_interval=gpr_interval,
        group_size=group_size,
        dimension=dimension,
        gp_iterations=gp_iterations,
        warmup_iterations=warmup_iterations,
        final_iterations=final_iterations,
    )
    lows = dict(warmup=0, gpr_interval=1, group_size=0, dimension=1)
    for name, value in ints.items():
        if value < lows.get(name, 0):
            raise ConfigError(f"fedcor {name} must be >= {lows.get(name, 0)}, got {value}")
    for name, value in dict(gamma=gamma, discount=discount, noise=noise, lr=lr).items():
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"fedcor {name} must be a positive number, got {value!r}")
    pool = int(pool)
    if pool < 0 or 0 < pool < per_round:
        raise ConfigError(f"fedcor pool must be 0 or >= per_round ({per_round}), got {pool}")
    slots = buffer_slots(warmup, gpr_interval, group_size)

    def init(key, spec):
        k = spec.num_clients
        x = jax.random.normal(key, (dimension, k), jnp.float32) / math.sqrt(dimension)
        return FedCorState(
            embedding=x,
            mu=jnp.zeros((k,), jnp.float32),
            beta=jnp.ones((k,), jnp.float32),
            samples=jnp.zeros((slots, k), jnp.float32),
            stamps=jnp.full((slots,), -1, jnp.int32),
            cursor=jnp.zeros((), jnp.int32),
            last_losses=jnp.zeros((k,), jnp.float32),
            nll=jnp.zeros((), jnp.float32),
        )

    def build(gamma, discount, noise, lr):
        def losses_of(oracle, params, k):
            if loss_source == "test":
                if oracle.client_test_loss is None:
                    raise ConfigError("fedcor loss_source=test needs per-client test splits")
                out = oracle.client_test_loss(params, jnp.arange(k, dtype=jnp.int32))
                return jnp.nan_to_num(out.astype(jnp.float32))
            return oracle.all_losses(params).astype(jnp.float32)

        def extra_round(oracle, params, available, key):
            """One FedAvg round from ``params`` with m random available clients (plain mean
            of their models, the code's ``average_weights``); the model is discarded."""
            clients, ok = uniform_without_replacement(key, available, per_round)
            result = oracle.train(params, clients, key, ok)
            w = ok.astype(jnp.float32) / jnp.maximum(jnp.sum(ok), 1)

            def mean(p, stacked):
                delta = stacked - p[None]
                return p + jnp.tensordot(w, delta, axes=1).astype(p.dtype)

            k = available.shape[0]
            work = client_work(k, clients, ok, train_steps=result.num_steps, uploads=1.0)
            return jax.tree.map(mean, params, result.params), work

        def gp_work(state, inputs, oracle, key):
            """After round t - 1: the loss reports, the stored loss change, the GP training."""
            k = state.beta.shape[0]
            t = inputs.round
            prev = t - 1
            warm = (t >= 1) & (prev <= warmup)
            gp_round = (prev > warmup) & (jnp.mod(prev, gpr_interval) == 0)
            need = (t == 0) | warm | gp_round

            zeros = jnp.zeros((k,), jnp.float32)
            none = no_work(k)

            def evaluate(_):
                cur = losses_of(oracle, inputs.params, k)

                def with_extra(_):
                    temp, work = extra_round(oracle, inputs.params, inputs.available, key)
                    return losses_of(oracle, temp, k) - cur, work

                change, work = members_cond(
                    gp_round, with_extra, lambda _: (cur - state.last_losses, none), 0
                )
                return cur, change, work

            cur, change, work = members_cond(need, evaluate, lambda _: (zeros, zeros, none), 0)
            # every client's loss pass (one, or two around the extra round), as the code does
            passes = need.astype(jnp.float32) + gp_round.astype(jnp.float32)
            examples = passes * inputs.num_examples.astype(jnp.float32)
            work = work._replace(forward_examples=work.forward_examples + examples)
            store = warm | gp_round
            slot = jnp.mod(state.cursor, slots)
            samples = jnp.where(store, state.samples.at[slot].set(change), state.samples)
            stamps = jnp.where(store, state.stamps.at[slot].set(prev), state.stamps)
            if update_mean:
                warm_iters = jnp.where(prev == warmup, final_iterations, 0)
            else:
                warm_iters = jnp.asarray(warmup_iterations)
            iters = jnp.where(warm, warm_iters, jnp.where(gp_round, gp_iterations, 0))
            iters = iters.astype(jnp.int32)

            def train(_):
                w = window_weights(stamps, gamma, group_size)
                mu = gp.weighted_mean(samples, w) if update_mean else state.mu
                x, nll = gp.train_embeddings(
                    state.embedding, noise, mu, samples, w, lr, iters, solver
                )
                return x, mu, nll

            x, mu, nll = members_cond(
                iters > 0, train, lambda _: (state.embedding, state.mu, state.nll), 0
            )
            state = state._replace(
                embedding=x,
                mu=mu,
                nll=nll,
                samples=samples,
                stamps=stamps,
                cursor=state.cursor + store.astype(jnp.int32),
                last_losses=jnp.where(need, cur, state.last_losses),
            )
            info = {
                "fedcor_eval_passes": need.astype(jnp.int32) + gp_round.astype(jnp.int32),
                "fedcor_extra_trainings": jnp.where(
                    gp_round, jnp.minimum(per_round, jnp.sum(inputs.available)), 0
                ),
                "fedcor_gp_iterations": iters,
            }
            return state, info, work

        def select(state, inputs, oracle, key):
            k_extra, k_warm = jax.random.split(key)
            state, info, work = gp_work(state, inputs, oracle, k_extra)
            active = inputs.round > warmup

            def by_gp(_):
                n = inputs.num_examples.astype(jnp.float32)
                w = n / jnp.maximum(jnp.sum(n), 1.0)
                x, beta, available = state.embedding, state.beta, inputs.available
                if 0 < pool < available.shape[0]:
                    # k_warm: the warm-up draw's key, which a greedy round does not use
                    clients, valid, _, _ = pooled_greedy(
                        k_warm, x, noise, w, beta, available, per_round, pool, solver
                    )
                    return clients, valid
                g = run_greedy(x, noise, w, beta, available, per_round, solver)
                return g.clients, g.valid

            def at_random(_):
                return uniform_without_replacement(k_warm, inputs.available, per_round)

            clients, mask = members_cond(active, by_gp, at_random, 0)
            weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
            diagnostics = dict(info, fedcor_greedy=active.astype(jnp.int32), fedcor_nll=state.nll)
            selection = Selection(clients, mask, weights, diagnostics=diagnostics, work=work)
            return selection, state

        def update(state, selection, feedback):
            k = state.beta.shape[0]
            t = feedback.round
            picks = selection.mask if feedback.requested is None else feedback.requested
            idx = jnp.where(picks, selection.clients, k)
            chosen = jnp.zeros((k,), bool).at[idx].set(True, mode="drop")
            after = t > warmup
            gp_round = after & (jnp.mod(t, gpr_interval) == 0)
            beta = jnp.where(
                gp_round,
                jnp.ones_like(state.beta),
                jnp.where(after & chosen, discount * state.beta, state.beta),
            )
            return state._replace(beta=beta)

        return Strategy(init, select, update, reads_deltas=False)

    return inject_hyperparams(build, gamma=gamma, discount=discount, noise=noise, lr=lr)
