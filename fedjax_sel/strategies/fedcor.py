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

from fedjax_sel.base import Array, ConfigError, Selection, Strategy, client_work, no_work
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

        def greedy(state, inputs):
            n = inputs.num_examples.astype(jnp.float32)
            w = n / jnp.maximum(jnp.sum(n), 1.0)
            if solver == "dense":
                sigma = gp.dense_covariance(state.embedding, noise)
                return gp.greedy_dense(sigma, w, state.beta, inputs.available, per_round)
            return gp.greedy_lowrank(
                state.embedding, noise, w, state.beta, inputs.available, per_round
            )

        def select(state, inputs, oracle, key):
            k_extra, k_warm = jax.random.split(key)
            state, info, work = gp_work(state, inputs, oracle, k_extra)
            active = inputs.round > warmup

            def by_gp(_):
                g = greedy(state, inputs)
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
