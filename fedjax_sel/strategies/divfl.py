"""DivFL: diverse client selection by submodular maximisation (Balakrishnan, Li, Zhou, Himayat,
Smith and Bilmes, ICLR 2022), the baseline and inner selector of FilFL.

DivFL picks the K clients whose update directions best represent everybody's, minimising the
facility-location cost

    G(S) = sum_{i in U} min_{j in S} || g_i - g_j ||

over the candidates, i.e. greedily maximising the submodular ``F(S) = sum_i (C - min_j d_ij)``
(C >= every distance, so ``F(empty) = |U| C``): each of the K steps adds the candidate with the
largest reduction of G. ``g_k`` is client k's stale update direction, the last local update
``theta_k - theta_global`` it sent (the server cannot see current gradients of clients it did
not select). U, the clients to represent, is the available set (``cover="available"``) or every
client with a known update (``cover="known"``).

The FilFL reference repository's "DivFL" maximises the cost instead of minimising it and never
resets its distance accumulator (salmakh1/FilFL; docs/filfl.md, "Decisions"); this module
implements the paper's version.

Most clients are never picked, and that is the rule's own property. The greedy is
deterministic given the table, and a round refreshes only the picked clients' rows, as in the
authors' code (melodi-lab/divfl, ``flearn/trainers/fedavg.py``: every client's gradient is
computed once in round 0, afterwards only the selected clients' rows of ``all_grads`` and
``norm_diff`` are overwritten, and the greedy over all clients draws nothing at random; it
stores the full gradient at the global model where we store the local update). So the table
hardly moves between rounds and the picks repeat: the medoids of the round-0 directions, and
clients whose fresh update stays small (the 1-median of a cloud centred near zero keeps the
first pick). On Synthetic(1,1) (1,000 clients, 20 a round, 100 rounds, seed 0) 784 clients are
never picked (uniform sampling leaves ``1000 * 0.98^100 ~ 133``) and one is picked in 93
rounds, its update norm 0.05 (the never-picked: median 0.92); with one local step (a direction is
then ``-lr`` times a minibatch gradient at the global model) 720 are never picked.
``tests/test_findings.py`` pins both mechanisms on planted tables.

A client that never sent an update has no direction yet. With ``warm_start=True`` (default) every
available client trains once in the first round, so that the first selection already sees
real directions (that round's selected clients reuse those results; nobody trains twice);
otherwise an unknown direction is the zero vector. Above ``warm_chunk`` clients the warm-start
round trains them ``warm_chunk`` at a time and keeps only each one's row of the table, then
trains the picked clients again with the same per-client randomness (``fold_in(key, client)``:
the same local training, equal up to float rounding, which may differ with the batch shape):
memory ``O(warm_chunk |theta|)`` instead of ``O(K |theta|)`` (2.4 GB of updates for 10^6
logistic regressions, twice).

The greedy costs ``O(per_round |U| |candidates|)`` and the distances ``O(|U| |candidates|)``
memory: 400 MB at 10^4 clients, out of reach at 10^5. ``pool = n`` (ours, for 10^5-10^6
clients) runs it on ``n`` clients drawn uniformly each round from U, which are both the clients
covered and, those of them available, the candidates: ``O(per_round n^2)`` whatever K. On
planted clusters the pool's picks cover all clients within a few percent of the full greedy
(``tests/test_divfl.py`` states the bound); the logged ``cover_cost`` is then the pool's.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import (
    Array,
    ClientWork,
    ConfigError,
    RoundInputs,
    Selection,
    SimSpec,
    Strategy,
    client_work,
    no_work,
)
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.members import members_cond
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies._sketch import sketch_coordinates
from fedjax_sel.strategies.registry import register_strategy
from fedjax_sel.tree import flatten_stacked, row_mask

Cover = Literal["available", "known"]


class DivFLState(NamedTuple):
    """``updates``: float32[K, D] last update direction of each client (a fixed coordinate
    subset when ``sketch_dim > 0``); ``known``: bool[K] whether it is real; ``coords``:
    int32[D] the coordinates kept; ``warmed``: whether the warm-start round happened."""

    updates: Array
    known: Array
    coords: Array
    warmed: Array


def pairwise_distances(x: Array) -> Array:
    """Euclidean distances between the rows of ``x`` (float32[K, K]) via the Gram matrix."""
    sq = jnp.sum(jnp.square(x), axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (x @ x.T)
    return jnp.sqrt(jnp.maximum(d2, 0.0))


def facility_location_greedy(
    dist: Array, candidates: Array, cover: Array, k: int, priority: Array
) -> tuple[Array, Array]:
    """Greedy minimisation of ``sum_{i in cover} min_{j in S} dist[i, j]`` over ``|S| <= k``
    candidates (Balakrishnan et al. 2022, section 3; Nemhauser et al. 1978).

    Args:
      dist: float32[K, K] distances.
      candidates: bool[K], clients that may be picked.
      cover: bool[K], clients whose distances count.
      k: picks (static).
      priority: float32[K] tie-break among equal gains (higher first).

    Returns:
      ``(picks int32[k], valid bool[k])`` in greedy order.
    """
    w = cover.astype(jnp.float32)
    c = jnp.max(jnp.where(cover[:, None] & candidates[None, :], dist, 0.0))
    start = jnp.full(dist.shape[0], c, jnp.float32)

    def step(carry, _):
        nearest, chosen = carry
        closer = jnp.minimum(nearest[:, None], dist)  # [i, j]: cover i's distance with j added
        gain = jnp.sum(w[:, None] * (nearest[:, None] - closer), axis=0)
        open_ = candidates & ~chosen
        gain = jnp.where(open_, gain, -jnp.inf)
        best = jnp.argmax(jnp.where(gain == jnp.max(gain), priority, -jnp.inf))
        ok = jnp.any(open_)
        chosen = chosen.at[best].set(chosen[best] | ok)
        nearest = jnp.where(ok, closer[:, best], nearest)
        return (nearest, chosen), (best.astype(jnp.int32), ok)

    init = (start, jnp.zeros(dist.shape[0], bool))
    _, (picks, valid) = jax.lax.scan(step, init, None, length=k)
    return picks, valid


def coverage(dist: Array, cover: Array, picks: Array, valid: Array) -> dict[str, Array]:
    """Diagnostics of a selection: ``cover_cost``, the facility-location cost
    ``G(S) = sum_{i in cover} min_{j in S} dist[i, j]`` divided by ``|cover|`` (the mean
    distance of a covered client's direction to its nearest pick), and ``cover_size``."""
    to_picks = jnp.where(valid[None, :], dist[:, picks], jnp.inf)
    nearest = jnp.min(to_picks, axis=1)
    covered = cover & jnp.isfinite(nearest)
    n = jnp.sum(cover).astype(jnp.float32)
    cost = jnp.sum(jnp.where(covered, nearest, 0.0)) / jnp.maximum(n, 1.0)
    return {"cover_cost": cost, "cover_size": n}


@register_strategy(
    "divfl",
    description="DivFL: greedy facility-location selection over stale client update directions",
    reference="Balakrishnan, Li, Zhou, Himayat, Smith, Bilmes 2022, Diverse Client Selection for "
    "Federated Learning via Submodular Maximization (ICLR)",
)
def divfl(
    *,
    per_round: int,
    cover: Cover = "available",
    sketch_dim: int = 0,
    pool: int = 0,
    warm_start: bool = True,
    warm_chunk: int = 8192,
    weighting: Weighting = "size",
) -> Strategy:
    """DivFL client selection.

    Args:
      per_round: K, clients picked by the greedy.
      cover: the clients G sums over: ``available`` or ``known`` (every client with a known
        update, available or not).
      sketch_dim: compare updates on this many random coordinates (a fixed subset drawn at
        init; the squared distance on it estimates ``sketch_dim / D`` of the full one, and a
        constant scale does not change the greedy); ``0``: the whole update (memory K x D).
      pool: run the greedy on this many clients drawn uniformly from U each round (the large-K
        approximation of the module docstring); ``0``, or at least K, on every client.
      warm_start: every available client trains in the first round to initialise the
        directions (see the module docstring).
      warm_chunk: above this many clients the warm start trains them in chunks of this size
        and trains its picks again (the module docstring); ``0``: all at once whatever K.
      weighting: aggregation weights, ``size`` (FedAvg) or ``uniform``.

    Diagnostics (every round): ``cover_cost`` and ``cover_size`` (:func:`coverage`); the
    selection is deterministic given the directions, so there is no sampling ``law``.
    """
    sketch_dim = int(sketch_dim)
    if sketch_dim < 0:
        raise ConfigError(f"divfl sketch_dim must be >= 0, got {sketch_dim}")
    warm_chunk = int(warm_chunk)
    if warm_chunk < 0:
        raise ConfigError(f"divfl warm_chunk must be >= 0, got {warm_chunk}")
    pool = int(pool)
    if pool != 0 and not pool >= per_round:
        raise ConfigError(
            f"divfl pool must be 0 (every client) or >= per_round ({per_round}), got {pool}"
        )

    def init(key, spec: SimSpec) -> DivFLState:
        coords = sketch_coordinates(key, spec.params, "all", sketch_dim)
        return DivFLState(
            updates=jnp.zeros((spec.num_clients, coords.shape[0]), jnp.float32),
            known=jnp.zeros((spec.num_clients,), bool),
            coords=coords,
            warmed=jnp.zeros((), bool),
        )

    def record(state: DivFLState, clients, mask, deltas) -> DivFLState:
        idx = jnp.where(mask, clients, state.known.shape[0])
        rows = flatten_stacked(deltas)[:, state.coords]
        return state._replace(
            updates=state.updates.at[idx].set(rows, mode="drop"),
            known=state.known.at[idx].set(True, mode="drop"),
        )

    def pick(state: DivFLState, inputs: RoundInputs, key):
        k_count = state.known.shape[0]
        covered = inputs.available if cover == "available" else state.known | inputs.available
        priority = jax.random.uniform(key, (k_count,))
        updates, candidates = state.updates, inputs.available
        pooled = 0 < pool < k_count
        if pooled:  # the greedy on the pool: rows ids of the table, picks index the pool
            ids, covered = uniform_without_replacement(jax.random.fold_in(key, 1), covered, pool)
            updates, candidates, priority = updates[ids], covered & candidates[ids], priority[ids]
        dist = pairwise_distances(updates)
        picks, mask = facility_location_greedy(dist, candidates, covered, per_round, priority)
        clients = ids[picks] if pooled else picks
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        return Selection(clients, mask, weights, diagnostics=coverage(dist, covered, picks, mask))

    def deltas_from(trained, params):  # stacked local results minus the global start
        return jax.tree.map(lambda p, g: p - g[None], trained.params, params)

    def warm(state: DivFLState, inputs: RoundInputs, oracle, key):
        k_count = state.known.shape[0]
        if 0 < warm_chunk < k_count:
            return warm_in_chunks(state, inputs, oracle, key)
        everyone = jnp.arange(k_count, dtype=jnp.int32)
        trained = oracle.train(inputs.params, everyone, oracle.train_key, inputs.available)
        deltas = deltas_from(trained, inputs.params)
        state = record(state, everyone, inputs.available, deltas)
        sel = pick(state, inputs, key)
        on = sel.mask
        result = jax.tree.map(
            lambda x: jnp.where(row_mask(on, x), x[sel.clients], 0),
            trained._replace(params=deltas),
        )
        params = jax.tree.map(lambda d, g: d + g[None], result.params, inputs.params)
        work = warm_work(inputs.available, sel, trained.num_steps)
        return sel._replace(train_result=result._replace(params=params), work=work), state

    def warm_work(available, sel: Selection, steps) -> ClientWork:
        """The warm start's training and uploads of the available clients not kept."""
        k_count = available.shape[0]
        kept = jnp.zeros((k_count,), bool).at[sel.clients].max(sel.mask)
        extra = available & ~kept
        everyone = jnp.arange(k_count, dtype=jnp.int32)
        return client_work(k_count, everyone, extra, train_steps=steps, uploads=1.0)

    def warm_in_chunks(state: DivFLState, inputs: RoundInputs, oracle, key):
        k_count = state.known.shape[0]

        def chunk(i, carry):
            state, steps = carry
            ids = i * warm_chunk + jnp.arange(warm_chunk, dtype=jnp.int32)
            real = ids < k_count  # the last chunk's padding slots are inactive
            ids = jnp.where(real, ids, 0)
            active = real & inputs.available[ids]
            trained = oracle.train(inputs.params, ids, oracle.train_key, active)
            steps = steps.at[ids].add(jnp.where(active, trained.num_steps, 0))
            return record(state, ids, active, deltas_from(trained, inputs.params)), steps

        steps = jnp.zeros((k_count,), jnp.int32)
        state, steps = jax.lax.fori_loop(0, -(-k_count // warm_chunk), chunk, (state, steps))
        sel = pick(state, inputs, key)
        # the same clients, key and start as in the chunks: the same local training again
        trained = oracle.train(inputs.params, sel.clients, oracle.train_key, sel.mask)
        work = warm_work(inputs.available, sel, steps)
        return sel._replace(train_result=trained, work=work), state

    def regular(state: DivFLState, inputs: RoundInputs, oracle, key):
        sel = pick(state, inputs, key)
        trained = oracle.train(inputs.params, sel.clients, oracle.train_key, sel.mask)
        work = no_work(inputs.available.shape[0])
        return sel._replace(train_result=trained, work=work), state

    def select(state: DivFLState, inputs: RoundInputs, oracle, key):
        if not warm_start:
            return pick(state, inputs, key), state
        sel, state = members_cond(
            state.warmed,
            lambda: regular(state, inputs, oracle, key),
            lambda: warm(state, inputs, oracle, key),
        )
        return sel, state._replace(warmed=jnp.ones((), bool))

    def update(state: DivFLState, selection: Selection, feedback) -> DivFLState:
        return record(state, selection.clients, selection.mask, feedback.deltas)

    return Strategy(init, select, update)
