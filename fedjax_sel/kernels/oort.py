"""Oort's building blocks (Lai et al., OSDI 2021; the original artifact github.com/SymbioticLab/Oort
and FedScale's version, github.com/SymbioticLab/FedScale, compared in docs/hetero_select.md,
"Oort"), as pure fixed-shape functions over ``float32[K]`` client arrays.

Durations come from the simulation's shared device profiles (:mod:`fedjax_sel.engine.system`, the
FedScale completion-time model), and over-commitment is the engine's.

* :func:`preferred_duration`: the pacer's duration ``D*`` at the ``T``-th percentile.
* :func:`pacer`: the threshold ``T`` moves by ``delta`` every ``W`` rounds from the last two
  windows of exploitation utility.
* :func:`reward_norm` and :func:`explored_scores`: the normalised statistical utility plus the
  temporal-uncertainty bonus, times the system-utility penalty ``(D* / d)^alpha`` when
  ``d > D*``.
* :func:`exploit_candidates`: the cut-off-utility prefix of the ranked explored clients.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array

# float32 floor(x) for x computed from decimal fractions (K' (1 - eps), K T / 100): the
# reference computes them in float64, where e.g. 10 * (1 - 0.3) is 7.0, not 6.9999...
_FLOOR_TOL = 1e-4


def floor_int(x: Array) -> Array:
    """``int(x)`` of a non-negative float32, tolerant of float32 rounding just below an
    integer."""
    return jnp.floor(jnp.asarray(x, jnp.float32) + _FLOOR_TOL).astype(jnp.int32)


class OortHyper(NamedTuple):
    """Oort's selector hyperparameters (the presets' table in docs/hetero_select.md, "Oort").

    ``exploit_rule``: ``original`` ``exploitLen = int(K' (1 - eps))`` or ``fedscale``
    ``K' - int(K' eps)``. ``candidate_floor``: FedScale keeps at least ``10 * exploitLen``
    candidates before the cut-off applies (0: the original, no floor). ``zero_exploration``:
    the original sets ``eps = eps_min = 0`` once no client is left unexplored.
    """

    exploration_factor: float
    exploration_decay: float
    exploration_min: float
    cut_off_util: float
    clip_bound: float
    round_threshold: float
    round_penalty: float
    pacer_step: int
    pacer_delta: float
    sample_window: float
    blacklist_rounds: int
    blacklist_max_len: float
    exploit_rule: str
    candidate_floor: float
    zero_exploration: bool
    # PyramidFL's copy of the original caps exploitLen at (#explored - 1): 1; else 0
    exploit_margin: int = 0


# the presets' over-commitment, applied by the engine for every strategy (``--overcommit``)
PRESET_OVERCOMMIT = {"original": 1.1, "fedscale": 1.3}

PRESETS: dict[str, OortHyper] = {
    # SymbioticLab/Oort training/argParser.py and oort/oort.py
    "original": OortHyper(
        exploration_factor=0.9,
        exploration_decay=0.95,
        exploration_min=0.2,
        cut_off_util=0.7,
        clip_bound=0.98,
        round_threshold=10.0,
        round_penalty=2.0,
        pacer_step=20,
        pacer_delta=5.0,
        sample_window=5.0,
        blacklist_rounds=-1,
        blacklist_max_len=0.3,
        exploit_rule="original",
        candidate_floor=0.0,
        zero_exploration=True,
    ),
    # SymbioticLab/FedScale fedscale/cloud/config_parser.py and thirdparty/oort/oort.py
    "fedscale": OortHyper(
        exploration_factor=0.9,
        exploration_decay=0.98,
        exploration_min=0.3,
        cut_off_util=0.05,
        clip_bound=0.9,
        round_threshold=30.0,
        round_penalty=2.0,
        pacer_step=20,
        pacer_delta=5.0,
        sample_window=5.0,
        blacklist_rounds=-1,
        blacklist_max_len=0.3,
        exploit_rule="fedscale",
        candidate_floor=10.0,
        zero_exploration=False,
    ),
}
# PyramidFL's copy of the original (liecn/PyramidFL oort/oort.py, training/argParser.py): the
# original's knobs, exploitLen capped at (#explored - 1) (strategy ``pyramidfl``)
PRESETS["pyramidfl"] = PRESETS["original"]._replace(exploit_margin=1)


def preferred_duration(durations: Array, round_threshold: Array) -> Array:
    """``D*``: the duration at index ``int(K T / 100)`` (clamped to K - 1) of the sorted
    durations of all clients; ``inf`` when ``T >= 100``."""
    k = durations.shape[0]
    idx = jnp.minimum(floor_int(k * round_threshold / 100.0), k - 1)
    return jnp.where(round_threshold < 100.0, jnp.sort(durations)[idx], jnp.inf)


def duration_penalty(durations: Array, d_pref: Array, round_penalty: float | Array) -> Array:
    """System utility: ``(D* / max(1e-4, d))^alpha`` for clients slower than ``D*``, else 1.

    ``round_penalty`` may be traced. XLA computes a power by the constant 2 as ``x * x`` (the
    presets' alpha): a traced 2 does the same, so both give the same bits. (Other constants
    it may also rewrite, e.g. 0.5 and 3 on CPU, so a traced 0.5 or 3 can differ from the
    constant in the last bit.)"""
    ratio = d_pref / jnp.maximum(durations, 1e-4)
    powered = jnp.where(round_penalty == 2.0, ratio * ratio, ratio**round_penalty)
    return jnp.where(durations > d_pref, powered, 1.0)


def pacer(round_threshold: Array, history: Array, t: Array, step: int, delta: float) -> Array:
    """The pacer at 1-based round ``t``. ``history`` (float32[2W]) holds the last 2W rounds'
    exploitation utilities, oldest first. When ``t >= 2W`` and ``W | t``, with ``U_prev`` and
    ``U_cur`` the sums over the older and the newer W:

    * ``|U_cur - U_prev| <= 0.1 U_prev`` (utility flat): ``T <- min(100, T + delta)``;
    * ``|U_cur - U_prev| >= 5 U_prev`` (changing sharply): ``T <- max(delta, T - delta)``.

    (The reference code relaxes T when utility is flat; the paper's text says when it drops.)
    """
    prev = jnp.sum(history[:step])
    cur = jnp.sum(history[step:])
    change = jnp.abs(cur - prev)
    moved = jnp.where(
        change <= 0.1 * prev,
        jnp.minimum(100.0, round_threshold + delta),
        jnp.where(
            change >= 5.0 * prev, jnp.maximum(delta, round_threshold - delta), round_threshold
        ),
    )
    due = (t >= 2 * step) & (t % step == 0)
    return jnp.where(due, moved, round_threshold)


def push_history(history: Array, value: Array) -> Array:
    """Shift register: drops the oldest entry, appends ``value``."""
    return jnp.concatenate([history[1:], jnp.reshape(value, (1,)).astype(history.dtype)])


class RewardNorm(NamedTuple):
    low: Array  # 0.999 * min
    span: Array  # max(max - low, 1e-4)
    clip: Array  # value at quantile clip_bound
    count: Array


def reward_norm(reward: Array, eligible: Array, clip_bound: float) -> RewardNorm:
    """Oort's ``get_norm`` over the rewards of ``eligible`` clients with ``reward > 0``:
    ``clip`` is the sorted value at index ``min(int(n clip_bound), n - 1)``."""
    use = eligible & (reward > 0)
    n = jnp.sum(use)
    ranked = jnp.sort(jnp.where(use, reward, jnp.inf))
    last = jnp.maximum(n - 1, 0)
    clip = ranked[jnp.minimum(floor_int(n * clip_bound), last)]
    hi, lo = ranked[last], 0.999 * ranked[0]
    ok = n > 0
    lo = jnp.where(ok, lo, 0.0)
    return RewardNorm(
        low=lo,
        span=jnp.where(ok, jnp.maximum(hi - lo, 1e-4), 1.0),
        clip=jnp.where(ok, clip, jnp.inf),
        count=n,
    )


def explored_scores(
    reward: Array,
    time_stamp: Array,
    t: Array,
    norm: RewardNorm,
    penalty: Array,
) -> Array:
    """``((min(r, clip) - low) / span + sqrt(0.1 ln t / time_stamp)) * penalty`` (the
    reference's ``getTopK`` score of an explored client; ``time_stamp >= 1``)."""
    stat = (jnp.minimum(reward, norm.clip) - norm.low) / norm.span
    bonus = jnp.sqrt(0.1 * jnp.log(jnp.asarray(t, jnp.float32)) / jnp.maximum(time_stamp, 1))
    return (stat + bonus) * penalty


def exploit_candidates(
    scores: Array,
    explored: Array,
    exploit_len: Array,
    cut_off_util: float,
    floor: float,
    max_len: int,
) -> Array:
    """bool[K]: the prefix of the explored clients ranked by score (descending) whose score is
    at least ``cut_off_util`` times the score ranked ``exploit_len`` (clamped to the last, which
    avoids the reference's IndexError when every explored client is wanted), extended to the
    first ``floor * exploit_len + 1`` ranks (FedScale; ``floor = 0`` for the original).

    ``max_len``: a static bound on ``exploit_len`` (K'), so that a ``top_k`` of depth
    ``max(max_len, floor * max_len) + 1`` replaces a full sort (ties: lower id first, as the
    reference's stable sort).
    """
    k = scores.shape[0]
    n = jnp.sum(explored)
    depth = min(k, int(max(max_len, floor * max_len)) + 1)
    ranked, order = jax.lax.top_k(jnp.where(explored, scores, -jnp.inf), depth)
    cut = ranked[jnp.clip(exploit_len, 0, jnp.maximum(n - 1, 0))] * cut_off_util
    keep = explored & (scores >= cut)
    if floor > 0:
        pos = jnp.arange(depth)
        prefix = (pos <= floor * exploit_len) & (pos < n)
        keep = keep | jnp.zeros((k,), bool).at[order].set(prefix)
    return keep


def top_ranked(values: Array, eligible: Array, count: Array, max_count: int) -> Array:
    """bool[K]: the ``count`` eligible clients with the largest ``values`` (ties: lower id);
    ``max_count`` is a static bound on ``count`` (the depth of the ``top_k``)."""
    k = values.shape[0]
    _, order = jax.lax.top_k(jnp.where(eligible, values, -jnp.inf), min(k, int(max_count)))
    keep = (jnp.arange(order.shape[0]) < count) & eligible[order]
    return jnp.zeros((k,), bool).at[order].set(keep)


def blacklist(count: Array, rounds: int, max_len: float) -> Array:
    """bool[K]: clients picked more than ``rounds`` times, most-used first (ties: lower id),
    at most ``int(max_len * K)`` of them (the references slice with the float cap, a
    TypeError; we floor it)."""
    k = count.shape[0]
    order = jnp.argsort(-count, stable=True)
    rank = jnp.zeros((k,), jnp.int32).at[order].set(jnp.arange(k, dtype=jnp.int32))
    return (count > rounds) & (rank < int(math.floor(max_len * k)))
