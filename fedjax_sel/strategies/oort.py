"""Oort: guided participant selection (Lai, Zhu, Madhyastha, Chowdhury et al., OSDI 2021),
the training selector of ``oort/oort.py`` in ``SymbioticLab/Oort`` and FedScale
(github.com/SymbioticLab/FedScale; docs/hetero_select.md, "Oort", lists their differences).

Each client is an arm with a reward, its statistical utility ``U_i = |B_i| sqrt(mean loss^2)``
(``|B_i| = min(n_i, samples_per_round)``, the squared per-example losses averaged over the
local steps: ``RoundFeedback.loss_sq``), a duration, the round of its last feedback and a
count. Every round (1-based ``t``), over the available clients:

1. the pacer may move the duration threshold ``T`` (every ``W`` rounds, from the last two
   windows of exploitation utility); ``D*`` is the ``T``-th percentile of all durations;
2. explored clients score ``(min(U, clip) - min) / range + sqrt(0.1 ln t / t_i)``, times
   ``(D* / d_i)^alpha`` when slower than ``D*``;
3. the exploration factor decays, ``eps <- max(eps * decay, eps_min)``, and
   ``exploitLen ~ K' (1 - eps)`` explored clients are sampled proportionally to score among the
   cut-off-utility prefix of the ranking;
4. the rest of the picks explore: unexplored clients drawn proportionally to their size prior
   (with the same duration penalty) among the top ``sample_window`` times as many; any
   shortfall is filled uniformly at random;
5. over-commitment (the engine's, for every strategy: ``--overcommit``; the original artifact
   used 1.1, FedScale 1.3): of the picks, the first ``per_round`` finishers are aggregated
   (uniform mean); the stragglers get the round's mean utility (they count as explored).

Durations come from the simulation's device profiles, the same for every strategy
(:mod:`fedjax_sel.engine.system`, ``RoundInputs.durations``), and the round's simulated time
is the engine's clock. Without a system model every client is equally fast
(``RoundSpec.create`` gives a strategy that reads durations every client at the log-normal
profile's median speed): equal work takes equal time, ``D*`` equals every duration, and the
system factor of the paper's utility

    Util(i) = |B_i| sqrt(sum_{k in B_i} Loss(k)^2 / |B_i|) * (T / t_i)^(1(T < t_i) alpha)

(``T`` is ``D*``, ``t_i`` the duration; reference/algorithms.md section 5.1) is 1 for every
client: Oort ranks by statistical utility and exploration alone, its picks those of
``round_penalty=0`` (``tests/test_findings.py``). Before this, a simulation without a system
model gave Oort alone a log-normal profile: on Synthetic(1,1) (1,000 clients, 20 a round,
100 rounds) 94% of its picks went to the faster half of the devices and its final accuracy
was 15.3% against 29.0% with equal speeds (seed 0, lr 0.1; the committed CPU suite's
``ideal`` scenario predates the fix). Its run still keeps a clock the strategies that read no
durations lack, now of equal rounds (45 s each there).

Presets ``original`` (the OSDI artifact) and ``fedscale`` set every default of table 5.4 and
the small rule differences (exploitation length rounding, FedScale's 10x candidate floor, the
original's exploration reset). Known bugs of both codes are left out: FedScale's stale
exploration list and ``abs(score)``, the float blacklist slice, the IndexError of the cut-off
rank; the first ``warmup_rounds`` rounds are uniform (both codes start with a non-Oort round).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ConfigError, Selection, Strategy
from fedjax_sel.kernels import gumbel_top_k
from fedjax_sel.kernels import oort as ok
from fedjax_sel.strategies._common import Weighting, fedavg_weights
from fedjax_sel.strategies.hyperparams import inject_hyperparams
from fedjax_sel.strategies.registry import register_strategy

EXPLOIT_RULES = ("original", "fedscale")
_TINY = 1e-30
# traced in the state (a grid of them shares one program); the other options are static:
# pacer_step is the pacer's period and the length of its history, sample_window and
# candidate_floor set top_k depths (shapes) and candidate_floor > 0 a code path,
# blacklist_rounds >= 0 turns the blacklist on and blacklist_max_len caps it with a float64
# floor of a Python product, exploit_rule and zero_exploration choose code paths
TRACED = (
    "exploration_factor",
    "exploration_decay",
    "exploration_min",
    "cut_off_util",
    "clip_bound",
    "round_threshold",
    "round_penalty",
    "pacer_delta",
)


class OortState(NamedTuple):
    """Per-client arms (length K) and the selector's scalars.

    Attributes:
      reward: statistical utility (the size prior ``|B_i|`` until explored).
      duration: last known round duration of the client (seconds; the device profile's
        expectation until it reports).
      time_stamp: 1-based round of the last feedback (0 before any).
      count: feedbacks received (completed rounds plus straggler rounds).
      epsilon: exploration factor.
      epsilon_min: its floor (the original sets it to 0 once everybody is explored).
      round_threshold: the pacer's T (percent).
      exploit_history: float32[2W] exploitation utility of the last 2W rounds, oldest first.
      last_exploit, last_explore: bool[K], the last round's exploitation/exploration picks.
    """

    reward: Array
    duration: Array
    time_stamp: Array
    count: Array
    epsilon: Array
    epsilon_min: Array
    round_threshold: Array
    exploit_history: Array
    last_exploit: Array
    last_explore: Array


def _as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no"):
        return value.lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"oort {name} must be true or false, got {value!r}")


def resolve_hyper(preset: str, overrides: dict) -> ok.OortHyper:
    """The preset's hyperparameters with the non-``None`` overrides, validated."""
    if preset not in ok.PRESETS:
        raise ConfigError(f"oort preset must be one of {sorted(ok.PRESETS)}, got {preset!r}")
    base = ok.PRESETS[preset]._asdict()
    for name, value in overrides.items():
        if value is None:
            continue
        default = base[name]
        try:
            if isinstance(default, bool):
                value = _as_bool(name, value)
            elif isinstance(default, str):
                value = str(value)
            else:
                value = type(default)(value)
        except (TypeError, ValueError):
            raise ConfigError(f"oort {name}={value!r} is not a valid value") from None
        base[name] = value
    h = ok.OortHyper(**base)
    checks = [
        (0 <= h.exploration_factor <= 1, "exploration_factor must lie in [0, 1]"),
        (0 < h.exploration_decay <= 1, "exploration_decay must lie in (0, 1]"),
        (0 <= h.exploration_min <= 1, "exploration_min must lie in [0, 1]"),
        (h.cut_off_util >= 0, "cut_off_util must be >= 0"),
        (0 <= h.clip_bound <= 1, "clip_bound must lie in [0, 1]"),
        (0 < h.round_threshold <= 100, "round_threshold must lie in (0, 100]"),
        (h.round_penalty >= 0, "round_penalty must be >= 0"),
        (h.pacer_step >= 1, "pacer_step must be >= 1"),
        (h.pacer_delta >= 0, "pacer_delta must be >= 0"),
        (h.sample_window >= 1, "sample_window must be >= 1"),
        (h.blacklist_rounds >= -1, "blacklist_rounds must be -1 (off) or >= 0"),
        (0 <= h.blacklist_max_len <= 1, "blacklist_max_len must lie in [0, 1]"),
        (h.exploit_rule in EXPLOIT_RULES, f"exploit_rule must be one of {EXPLOIT_RULES}"),
        (h.candidate_floor >= 0, "candidate_floor must be >= 0"),
    ]
    for good, message in checks:
        if not good:
            raise ConfigError(f"oort {message}, got {h}")
    return h


@register_strategy(
    "oort",
    description="Oort: statistical x system utility, exploration, pacer, over-commitment "
    "(presets original / fedscale)",
    reference="Lai et al. 2021, Oort: Efficient FL via Guided Participant Selection (OSDI)",
)
def oort(
    *,
    per_round: int,
    preset: str = "original",
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
    blacklist_rounds: int | None = None,
    blacklist_max_len: float | None = None,
    exploit_rule: str | None = None,
    candidate_floor: float | None = None,
    zero_exploration: bool | None = None,
    warmup_rounds: int = 1,
    fill_random: bool = True,
    samples_per_round: int = 0,
    weighting: Weighting = "uniform",
) -> Strategy:
    """Oort's training selector.

    Args:
      per_round: the picks per round (the engine keeps the first finishers of them).
      preset: ``original`` or ``fedscale`` (table in docs/hetero_select.md, "Oort"); every
        ``None`` argument below takes the preset's value. ``pyramidfl``: PyramidFL's copy of
        the original (its knobs, exploitLen capped at #explored - 1; strategy ``pyramidfl``).
      exploration_factor, exploration_decay, exploration_min: eps, its decay and floor.
      cut_off_util: exploitation candidates score at least this times the exploitLen-th score.
      clip_bound: utility clipped at this quantile before normalisation.
      round_threshold: the pacer's initial T (percentile of durations); round_penalty: alpha.
      pacer_step, pacer_delta: W and Delta of the pacer.
      sample_window: exploration draws among the top ``sample_window * exploreLen`` by size.
      blacklist_rounds, blacklist_max_len: exclude clients picked more than that many times
        (-1: off), at most that fraction of clients.
      exploit_rule, candidate_floor, zero_exploration: the preset's rule variants (see
        :class:`fedjax_sel.kernels.oort.OortHyper`).
      warmup_rounds: first rounds drawn uniformly (both codes' first round is not Oort's).
      fill_random: fill a shortfall of picks uniformly among the other available clients (the
        original; FedScale returns fewer).
      samples_per_round: the size prior ``|B_i| = min(n_i, samples_per_round)`` of unexplored
        clients (local_steps * batch_size in both codes); 0: ``n_i`` (one epoch).
      weighting: ``uniform`` (the codes' mean of the K updates) or ``size``.

    Traced (:data:`TRACED`; a grid of them shares one program): ``exploration_factor``,
    ``exploration_decay``, ``exploration_min``, ``cut_off_util``, ``clip_bound``,
    ``round_threshold``, ``round_penalty``, ``pacer_delta``. The others are static (shapes,
    periods or code paths; see :data:`TRACED`'s comment).
    """
    hyper = resolve_hyper(
        preset,
        dict(
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
            blacklist_rounds=blacklist_rounds,
            blacklist_max_len=blacklist_max_len,
            exploit_rule=exploit_rule,
            candidate_floor=candidate_floor,
            zero_exploration=zero_exploration,
        ),
    )
    fill_random = _as_bool("fill_random", fill_random)
    if warmup_rounds < 0 or samples_per_round < 0:
        raise ConfigError(
            f"oort warmup_rounds and samples_per_round must be >= 0, got {warmup_rounds} and "
            f"{samples_per_round}"
        )
    window = int(hyper.pacer_step)

    def batch_sizes(num_examples: Array) -> Array:
        n = num_examples.astype(jnp.float32)
        return jnp.minimum(n, samples_per_round) if samples_per_round > 0 else n

    def init(h, key, spec):  # on the host: h holds the member's own values
        del key
        k = spec.num_clients
        n = jnp.asarray(spec.num_examples).astype(jnp.float32)
        none = jnp.zeros((k,), bool)
        return OortState(
            reward=batch_sizes(n),
            duration=jnp.zeros((k,), jnp.float32),
            time_stamp=jnp.zeros((k,), jnp.int32),
            count=jnp.zeros((k,), jnp.int32),
            epsilon=jnp.float32(h.exploration_factor),
            epsilon_min=jnp.float32(h.exploration_min),
            round_threshold=jnp.float32(h.round_threshold),
            exploit_history=jnp.zeros((2 * window,), jnp.float32),
            last_exploit=none,
            last_explore=none,
        )

    def build(**traced):  # floats, or traced scalars inside the round
        h = hyper._replace(**traced)
        return Strategy(
            functools.partial(init, h),
            functools.partial(select, h),
            update,
            metrics=functools.partial(metrics, h),
            needs_system=True,
            asynchronous=True,
            reads_deltas=False,
        )

    def select(h, state, inputs, oracle, key):
        del oracle
        k = state.reward.shape[0]
        kp = per_round
        slots = jnp.arange(kp)
        t = inputs.round + 1
        available = inputs.available
        k_exploit, k_explore, k_fill, k_warm = jax.random.split(key, 4)
        # durations known to the server: the last reported, the device profile's before that
        state = state._replace(
            duration=jnp.where(state.count > 0, state.duration, inputs.durations)
        )

        black = (
            ok.blacklist(state.count, h.blacklist_rounds, h.blacklist_max_len)
            if h.blacklist_rounds >= 0
            else jnp.zeros((k,), bool)
        )
        feasible = available & ~black
        threshold = ok.pacer(state.round_threshold, state.exploit_history, t, window, h.pacer_delta)
        d_pref = ok.preferred_duration(state.duration, threshold)
        penalty = ok.duration_penalty(state.duration, d_pref, h.round_penalty)

        # exploitation among explored clients
        explored = feasible & (state.count > 0)
        norm = ok.reward_norm(state.reward, feasible, h.clip_bound)
        scores = ok.explored_scores(state.reward, state.time_stamp, t, norm, penalty)
        eps = jnp.maximum(state.epsilon * h.exploration_decay, state.epsilon_min)
        if h.exploit_rule == "original":
            wanted = ok.floor_int(kp * (1.0 - eps))
        else:
            wanted = kp - ok.floor_int(kp * eps)
        exploit_len = jnp.minimum(wanted, jnp.maximum(jnp.sum(explored) - h.exploit_margin, 0))
        cand = ok.exploit_candidates(
            scores, explored, exploit_len, h.cut_off_util, h.candidate_floor, kp
        )
        logits = jnp.where(cand, jnp.log(jnp.maximum(scores, _TINY)), -jnp.inf)
        exploit, exploit_ok = gumbel_top_k(k_exploit, logits, kp)
        exploit_ok = exploit_ok & (slots < exploit_len)

        # exploration among unexplored clients, by size prior and duration penalty
        unexplored = feasible & (state.count == 0)
        n_unexplored = jnp.sum(unexplored)
        prior = state.reward * penalty
        explore_len = jnp.minimum(n_unexplored, kp - jnp.sum(exploit_ok))
        top = ok.top_ranked(
            prior,
            unexplored,
            jnp.minimum(ok.floor_int(h.sample_window * explore_len), n_unexplored),
            int(h.sample_window * kp) + 1,
        )
        logits = jnp.where(top, jnp.log(jnp.maximum(prior, _TINY)), -jnp.inf)
        explore, explore_ok = gumbel_top_k(k_explore, logits, kp)
        explore_ok = explore_ok & (slots < explore_len)

        def as_mask(ids, valid):
            return jnp.zeros((k,), bool).at[jnp.where(valid, ids, k)].set(True, mode="drop")

        exploit_mask, explore_mask = as_mask(exploit, exploit_ok), as_mask(explore, explore_ok)
        short = kp - jnp.sum(exploit_ok) - jnp.sum(explore_ok)
        fill, fill_ok = gumbel_top_k(
            k_fill, jnp.zeros((k,)), kp, feasible & ~exploit_mask & ~explore_mask
        )
        fill_ok = fill_ok & (slots < short) & fill_random
        ids = jnp.concatenate([explore, exploit, fill])
        valid = jnp.concatenate([explore_ok, exploit_ok, fill_ok])
        first = jnp.argsort(~valid, stable=True)[:kp]
        picks, picks_ok = ids[first], valid[first]

        if h.zero_exploration:  # the original: nothing left to explore -> eps = eps_min = 0
            exhausted = ~jnp.any(state.count == 0)
            eps_min = jnp.where(exhausted, 0.0, state.epsilon_min)
            eps = jnp.where(exhausted, 0.0, eps)
        else:
            eps_min = state.epsilon_min

        warm = inputs.round < warmup_rounds
        uniform, uniform_ok = gumbel_top_k(k_warm, jnp.zeros((k,)), kp, available)
        picks = jnp.where(warm, uniform, picks)
        picks_ok = jnp.where(warm, uniform_ok, picks_ok)

        def keep(new, old):  # warm-up rounds leave the selector's scalars alone
            return jnp.where(warm, old, new)

        clients, mask = picks, picks_ok
        state = state._replace(
            epsilon=keep(eps, state.epsilon),
            epsilon_min=keep(eps_min, state.epsilon_min),
            round_threshold=keep(threshold, state.round_threshold),
            last_exploit=exploit_mask & ~warm,
            last_explore=explore_mask & ~warm,
        )
        weights = fedavg_weights(inputs.num_examples, clients, mask, weighting)
        diagnostics = {
            "exploration": state.epsilon,
            "exploit_picks": jnp.sum(state.last_exploit),
            "explore_picks": jnp.sum(state.last_explore),
            "round_threshold": state.round_threshold,
            "preferred_duration": d_pref,
            "explored_fraction": jnp.mean(state.count > 0),
        }
        return Selection(clients, mask, weights, diagnostics=diagnostics), state

    def update(state, selection, feedback):
        k = state.reward.shape[0]
        t = feedback.round + 1
        idx = jnp.where(selection.mask, selection.clients, k)
        utility = batch_sizes(feedback.num_examples) * jnp.sqrt(jnp.maximum(feedback.loss_sq, 0))
        done = jnp.zeros((k,), bool).at[idx].set(True, mode="drop")
        reported = jnp.zeros((k,), jnp.float32).at[idx].set(utility, mode="drop")
        n_done = jnp.sum(selection.mask)
        mean_utility = jnp.sum(jnp.where(selection.mask, utility, 0.0)) / jnp.maximum(n_done, 1)
        # picks the engine did not keep (over-committed out, dropped, cut by the deadline)
        late = feedback.requested & ~selection.mask
        late_idx = jnp.where(late, selection.clients, k)
        stragglers = jnp.zeros((k,), bool).at[late_idx].set(True, mode="drop") & (n_done > 0)
        slot_idx = jnp.where(feedback.requested, selection.clients, k)
        realized = state.duration.at[slot_idx].set(feedback.durations, mode="drop")
        reward = jnp.where(done, reported, jnp.where(stragglers, mean_utility, state.reward))
        touched = done | stragglers
        n_exploit = jnp.sum(state.last_exploit)
        exploit_utility = jnp.sum(jnp.where(state.last_exploit, reward, 0.0)) / (n_exploit + 1e-4)
        return state._replace(
            reward=reward,
            duration=jnp.where(touched, realized, state.duration),
            time_stamp=jnp.where(touched, t, state.time_stamp),
            count=state.count + touched.astype(jnp.int32),
            exploit_history=ok.push_history(state.exploit_history, exploit_utility),
        )

    def metrics(h, state, params, evaluator):
        del params, evaluator
        return {
            "oort_round_threshold": state.round_threshold,
            "oort_exploration": state.epsilon,
            "oort_explored_fraction": jnp.mean(state.count > 0),
        }

    return inject_hyperparams(build, **{name: getattr(hyper, name) for name in TRACED})
