"""FedCS (Nishio and Yonetani, ICC 2019): the deadline greedy against a literal NumPy
transcription of the third-party "Algorithm 3" loop (docs/comparators/fedcs.md), a planted case
whose answer is known (brute force over every upload order), ties, the strategy's selection
through its inputs, and a simulation in which every FedCS pick meets the engine's deadline."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError, RoundInputs
from fedjax_sel.kernels import uniform_without_replacement
from fedjax_sel.strategies import make_strategy
from fedjax_sel.strategies.fedcs import (
    deadline_greedy,
    never_picked,
    num_candidates,
    pool_size,
    pruned_deadline_greedy,
)


def np_fedcs(t_ud, t_ul, t_dl, budget, max_picks=None, eligible=None, use_max=True):
    """The greedy as written (a while loop over the remaining candidates, argmax of the
    reciprocal increment, drop the pick, keep it if it fits the budget)."""
    n = len(t_ud)
    remaining = [i for i in range(n) if eligible is None or eligible[i]]
    chosen, theta, down = [], 0.0, 0.0

    def wait(k):
        return max(0.0, t_ud[k] - theta) if use_max else 0.0

    while remaining and (max_picks is None or len(chosen) < max_picks):
        inc = [max(down, t_dl[k]) - down + t_ul[k] + wait(k) for k in remaining]
        score = [1.0 / x if x > 0 else np.inf for x in inc]
        x = remaining[int(np.argmax(score))]
        remaining.remove(x)
        new_theta = theta + t_ul[x] + wait(x)
        if max(down, t_dl[x]) + new_theta < budget:
            chosen.append(x)
            theta, down = new_theta, max(down, t_dl[x])
    return chosen, theta, down


def schedule_length(order, t_ud, t_ul, t_dl):
    theta, down = 0.0, 0.0
    for x in order:
        theta = theta + t_ul[x] + max(0.0, t_ud[x] - theta)
        down = max(down, t_dl[x])
    return down + theta


def run_kernel(t_ud, t_ul, t_dl, budget, max_picks, eligible=None):
    n = len(t_ud)
    eligible = np.ones(n, bool) if eligible is None else eligible
    s = jax.jit(deadline_greedy, static_argnums=5)(
        jnp.asarray(t_ud, jnp.float32),
        jnp.asarray(t_ul, jnp.float32),
        jnp.asarray(t_dl, jnp.float32),
        jnp.asarray(eligible),
        jnp.float32(budget),
        max_picks,
    )
    order, valid = np.asarray(s.order), np.asarray(s.valid)
    assert np.all(valid[: valid.sum()]), "selected slots form a prefix"
    return order[valid].tolist(), float(s.theta), float(s.download)


# t^UD, t^UL, t^DL of five clients and T_round: the greedy fits 3 (the most any upload order
# fits: brute force below); two ties of the score on the way (0 and 2, then 2 and 3)
PLANTED = dict(
    t_ud=[4.0, 5.0, 6.0, 7.0, 1.0],
    t_ul=[3.0, 4.0, 2.0, 2.0, 4.0],
    t_dl=[2.0, 2.0, 2.0, 2.0, 3.0],
    budget=14.0,
)


def test_planted_schedule_is_the_known_optimum():
    p = PLANTED
    chosen, theta, down = run_kernel(p["t_ud"], p["t_ul"], p["t_dl"], p["budget"], 5)
    assert chosen == [4, 0, 2]
    assert (theta, down) == (10.0, 3.0)
    assert schedule_length(chosen, p["t_ud"], p["t_ul"], p["t_dl"]) == 13.0 < p["budget"]
    best = max(
        r
        for r in range(6)
        for order in itertools.permutations(range(5), r)
        if schedule_length(order, p["t_ud"], p["t_ul"], p["t_dl"]) < p["budget"]
    )
    assert best == len(chosen)
    assert np_fedcs(p["t_ud"], p["t_ul"], p["t_dl"], p["budget"])[0] == chosen
    # the case is discriminating: without the wait term, or with the download term ignored,
    # the greedy picks another set
    without_wait = np_fedcs(p["t_ud"], p["t_ul"], p["t_dl"], p["budget"], use_max=False)[0]
    no_download = np_fedcs(p["t_ud"], p["t_ul"], [0.0] * 5, p["budget"])[0]
    assert set(without_wait) != set(chosen) and set(no_download) != set(chosen)


def test_ties_go_to_the_lower_candidate():
    chosen, _, _ = run_kernel([1.0] * 6, [2.0] * 6, [1.0] * 6, 1.0 + 3 + 2 * 3 + 0.5, 6)
    assert chosen == [0, 1, 2, 3]  # 1 + (1 + 2) + 2 + 2 + 2 = 10 < 10.5; a fifth would be 12


@pytest.mark.parametrize("seed", range(6))
def test_greedy_matches_the_literal_loop(seed):
    """Random continuous instances, empty candidate slots and a cap on the picks: the
    fixed-shape argmax-among-the-fitting loop returns the literal loop's schedule."""
    rng = np.random.default_rng(seed)
    n = 12  # one shape; the number of candidates varies through the mask
    for _ in range(40):
        t_ud = rng.lognormal(1.0, 1.0, n)
        t_ul = rng.lognormal(0.0, 0.8, n)
        t_dl = rng.lognormal(0.0, 0.8, n)
        eligible = (rng.random(n) < 0.8) & (np.arange(n) < rng.integers(3, n + 1))
        budget = float(rng.uniform(2.0, 25.0))
        max_picks = int(rng.choice([2, 5, 12]))
        t_ud, t_ul, t_dl = (np.float32(a).astype(np.float64) for a in (t_ud, t_ul, t_dl))
        want, theta, down = np_fedcs(t_ud, t_ul, t_dl, budget, max_picks, eligible)
        got, g_theta, g_down = run_kernel(t_ud, t_ul, t_dl, budget, max_picks, eligible)
        assert got == want
        assert g_theta == pytest.approx(theta, rel=1e-5) and g_down == pytest.approx(down)
        if want:
            assert schedule_length(want, t_ud, t_ul, t_dl) < budget


PRUNE_N, PRUNE_PICKS, PRUNE_KEEP = 512, 8, 64


@jax.jit
def _full_and_pruned(t_ud, t_ul, t_dl, eligible, budget):
    args = (t_ud, t_ul, t_dl, eligible, budget, PRUNE_PICKS)
    never = never_picked(*args)
    return deadline_greedy(*args), pruned_deadline_greedy(*args, PRUNE_KEEP), never


def _profiles(rng, kind):
    n = PRUNE_N
    if kind == "equal":
        return np.full(n, 3.0), np.full(n, 1.0), np.full(n, 1.0)
    if kind == "ties":  # a few distinct values: many exact ties of the score
        return tuple(rng.integers(1, 4, n).astype(float) for _ in range(3))
    if kind == "comm":  # communication-bound: the bound rules out most candidates
        return rng.lognormal(-3.0, 1.0, n), *(2 * [rng.lognormal(0.0, 1.0, n)])
    return rng.lognormal(1.0, 1.0, n), rng.lognormal(0.0, 0.8, n), rng.lognormal(0.0, 0.8, n)


def test_pruned_greedy_is_the_greedy_bit_for_bit():
    """The pool of candidates that ``never_picked`` does not rule out gives the full greedy's
    schedule exactly, on the pool (count <= keep) and the fallback branch alike; no ruled-out
    candidate is ever among the full greedy's picks; equal speeds leave the first picks."""
    rng = np.random.default_rng(0)
    branches = {True: 0, False: 0}
    for kind in ("equal", "ties", "comm", "mixed"):
        for i in range(12):  # every pair of an eligible share (some below the picks) and budget
            t_ud, t_ul, t_dl = (jnp.asarray(a, jnp.float32) for a in _profiles(rng, kind))
            eligible = jnp.asarray(rng.random(PRUNE_N) < [0.01, 0.5, 1.0][i % 3])
            budget = jnp.float32([4.0, 8.0, 30.0, 1e4][i % 4])
            full, pruned, never = _full_and_pruned(t_ud, t_ul, t_dl, eligible, budget)
            for a, b in zip(full, pruned, strict=True):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            picks = np.asarray(full.order)[np.asarray(full.valid)]
            never = np.asarray(never)
            assert not never[picks].any()
            pool = np.asarray(eligible) & ~never
            branches[bool(pool.sum() <= PRUNE_KEEP)] += 1
            if kind == "equal" and eligible.sum() >= PRUNE_PICKS:
                assert np.flatnonzero(pool).tolist() == np.flatnonzero(eligible)[:8].tolist()
    assert branches[True] >= 12 and branches[False] >= 3, branches


@pytest.mark.parametrize(
    "fast, late",
    [
        # the greedy's 8th pick is the late one, outside T (s = 3.5 > T's 3.2), faster in
        # upload than T's slowest uploader: the dominance needs T's maxima
        ([(1, 1, 1)] * 7 + [(1, 2, 0.2)], (1, 1.5, 1)),
        # picked once the multicast has paid for its download (s = 1.9 > T's 1.6): its upload
        # lies below the bound max_T s = 1.6, not below half of it
        ([(0, 1, 0)] * 6 + [(1, 0.5, 0), (0, 1.6, 0)], (1, 0.9, 0)),
    ],
)
def test_a_late_pick_outside_the_fastest_is_kept(fast, late):
    """Planted: ``x`` is not among the ``max_picks`` of smallest ``s`` but the greedy picks it;
    the dominance test keeps it, and the pruned greedy gives the same schedule."""
    profile = np.full((PRUNE_N, 3), 10.0)  # (t^DL, t^UL, t^UD)
    profile[:8] = fast
    profile[100] = late
    t_dl, t_ul, t_ud = (jnp.asarray(profile[:, i], jnp.float32) for i in range(3))
    eligible = jnp.ones(PRUNE_N, bool)
    full, pruned, never = _full_and_pruned(t_ud, t_ul, t_dl, eligible, jnp.float32(1e3))
    picks = np.asarray(full.order)[np.asarray(full.valid)].tolist()
    assert picks[-1] == 100 and len(picks) == 8
    assert not bool(never[100]) and np.asarray(never)[8:].sum() == PRUNE_N - 9
    np.testing.assert_array_equal(np.asarray(pruned.order), np.asarray(full.order))


def test_pool_only_where_candidates_are_many():
    assert pool_size(1000, 10) == 1000  # 4 x 1024 > 1000: no test, the greedy over all
    assert pool_size(500_000, 1000) == 16_000
    assert pool_size(500_000, 10) == 1024


def _inputs(available, compute, comm, n):
    k = len(available)
    return RoundInputs(
        jnp.int32(3),
        jnp.asarray(available),
        {},
        jnp.asarray(n, jnp.int32),
        None,
        jnp.asarray(np.asarray(compute) + np.asarray(comm), jnp.float32),
        jnp.asarray(compute, jnp.float32),
        jnp.asarray(comm, jnp.float32),
    ), k


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_strategy_selects_the_greedy_over_its_candidates(fraction):
    """The strategy's picks: the greedy over the candidates (the same Gumbel-top-k draw among
    the available clients, in id order), upload = download = half the communication time,
    FedAvg weights by size over the picks."""
    rng = np.random.default_rng(7)
    k, per_round, deadline = 20, 6, 30.0
    available = rng.random(k) < 0.7
    compute = rng.lognormal(2.0, 0.7, k).astype(np.float32)
    comm = rng.lognormal(1.0, 0.7, k).astype(np.float32)
    n = rng.integers(5, 50, k)
    inputs, _ = _inputs(available, compute, comm, n)
    strategy = make_strategy("fedcs", per_round, deadline=deadline, fraction=fraction)
    state = strategy.init(jax.random.key(0), None)
    key = jax.random.key(11)
    sel, _ = jax.jit(strategy.select, static_argnums=2)(state, inputs, None, key)
    cand, ok = uniform_without_replacement(key, jnp.asarray(available), num_candidates(fraction, k))
    cand = np.sort(np.asarray(cand)[np.asarray(ok)])
    half = comm[cand].astype(np.float64) / 2
    want, _, _ = np_fedcs(compute[cand].astype(np.float64), half, half, deadline, per_round)
    clients, mask = np.asarray(sel.clients), np.asarray(sel.mask)
    assert clients[mask].tolist() == cand[want].tolist()
    assert 0 < len(want) <= per_round
    w = np.asarray(sel.weights)
    np.testing.assert_allclose(w[mask], n[cand[want]] / n[cand[want]].sum(), rtol=1e-6)
    assert not np.any(w[~mask])
    assert int(sel.diagnostics["fedcs_selected"]) == len(want)


def test_needs_profiles_and_checks_its_arguments():
    strategy = make_strategy("fedcs", 3)
    inputs = RoundInputs(jnp.int32(0), jnp.ones(5, bool), {}, jnp.ones(5, jnp.int32))
    with pytest.raises(ConfigError, match="device profiles"):
        strategy.select(strategy.init(jax.random.key(0), None), inputs, None, jax.random.key(1))
    for bad in (dict(fraction=0.0), dict(deadline=-1.0), dict(request_seconds=-1.0)):
        with pytest.raises(ConfigError):
            make_strategy("fedcs", 3, **bad)


def test_every_pick_meets_the_engine_deadline():
    """In a simulation with the engine's deadline equal to FedCS's, no FedCS pick is a
    straggler (each one's download, update and upload end within its serial schedule)."""
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.engine.system import lognormal
    from fedjax_sel.models import make_model
    from fedjax_sel.training import HParams, LocalConfig

    ds = load_dataset("digits", num_clients=24, partition="dirichlet:0.5", seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    deadline = 12.0  # binding: FedCS fits 13 of 16 slots; 16 uniform picks leave stragglers
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy("fedcs", 16, deadline=deadline, fraction=1.0),
        local=LocalConfig(batch_size=16, local_steps=2),
        per_round=16,
        system=lognormal(sigma=1.0),
        deadline=deadline,
    )
    sim = Simulation(spec, ds, num_rounds=6, chunk_size=6)
    state, logs = sim.run_rounds(sim.init(seed=0, hparams=HParams.of(0.1)), 6)
    assert np.all(logs.stragglers == 0)
    assert np.all((logs.num_selected >= 1) & (logs.num_selected < 16))
    assert np.all(logs.duration <= deadline)
    sched = logs.diagnostics["fedcs_schedule_seconds"]
    assert np.all(sched < deadline) and np.all(logs.duration <= sched + 1e-4)


def test_traced_deadline_acts():
    """``deadline`` is traced: initialised at a tighter value, the same strategy fits fewer."""
    from fedjax_sel.strategies.hyperparams import init_with_hyperparams

    rng = np.random.default_rng(3)
    k = 12
    compute = rng.lognormal(1.5, 0.5, k).astype(np.float32)
    comm = rng.lognormal(0.5, 0.5, k).astype(np.float32)
    inputs, _ = _inputs(np.ones(k, bool), compute, comm, np.full(k, 10))
    strategy = make_strategy("fedcs", k, deadline=1000.0, fraction=1.0)
    # traced, with the values it was built with
    assert dict(strategy.hyperparams) == {
        "deadline": 1000.0,
        "request_seconds": 0.0,
        "aggregation_seconds": 0.0,
    }
    select = jax.jit(strategy.select, static_argnums=2)
    counts = []
    for deadline in (1000.0, 20.0):
        state = init_with_hyperparams(strategy, jax.random.key(0), None, {"deadline": deadline})
        sel, _ = select(state, inputs, None, jax.random.key(1))
        half = comm.astype(np.float64) / 2
        want, _, _ = np_fedcs(compute.astype(np.float64), half, half, deadline, k)
        assert np.asarray(sel.clients)[np.asarray(sel.mask)].tolist() == want
        counts.append(len(want))
    assert counts[0] == k > counts[1] > 0
