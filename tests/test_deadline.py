"""A suite scenario's deadline (issue 54's metrics): a quantile of the realised uniform rounds'
lengths *with* the scenario's availability, dropouts and over-commitment, checked at suite start
(a deadline that cuts outside 25-75% of those rounds is refused). Planted cases whose length
distribution is known in closed form, the engine's own uniform rounds reproduced round for
round, and the error."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.availability import AVAILABILITY
from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark import cells as cells_lib
from fedjax_sel.benchmark import suite as suite_lib
from fedjax_sel.benchmark.units import task_deadlines
from fedjax_sel.engine.system import SYSTEMS
from fedjax_sel.experiment.run import run_group

SEEDS = 8


def _lengths(availability, system, samples, *, rounds, per_round, slots, dropout, kbit):
    """Every seed's realised uniform rounds (float64[SEEDS * rounds])."""
    run = cells_lib.uniform_rounds(
        availability,
        system,
        kbit,
        rounds=rounds,
        per_round=per_round,
        slots=slots,
        dropout=dropout,
    )
    samples = jnp.asarray(samples, jnp.float32)
    steps = jnp.ones(samples.shape, jnp.int32)
    out = [run(jax.random.fold_in(jax.random.key(s), 2), samples, steps) for s in range(SEEDS)]
    return np.concatenate(out).astype(np.float64)


def _within(share: float, p: float, n: int) -> bool:
    """``share`` of ``n`` Bernoulli(p) draws within 4.5 standard errors of ``p``."""
    return abs(share - p) <= 4.5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_constant_durations_and_bernoulli_availability_closed_form():
    """Every device equally fast (c = 3 * 20 examples * 100 ms + 2 * 50 kbit / 1000 kbit/s =
    6.1 s) and each of K = 6 clients online with p = 0.3: a round lasts c unless none of its
    min(A, 3) selected slots survives the dropout d = 0.5 (A ~ Bin(6, 0.3) online), then 0 s.
    So P(0 s) = E[d^min(A, 3)] = 0.382, the 0.3 quantile is 0 and the 0.5 quantile is c."""
    k, p, d, slots = 6, 0.3, 0.5, 3
    system = SYSTEMS.build(
        "normal", compute_ms=100.0, std=0.0, bandwidth_kbps=1000.0, bandwidth_std=0.0
    )
    lengths = _lengths(
        AVAILABILITY.build("bernoulli", p=p),
        system,
        np.full(k, 20.0),
        rounds=500,
        per_round=2,
        slots=slots,
        dropout=d,
        kbit=50.0,
    )
    (c,) = np.unique(lengths[lengths > 0])  # one length (float32 arithmetic: about 6.1 s)
    assert c == pytest.approx(6.1, rel=1e-6)
    empty = sum(
        math.comb(k, a) * p**a * (1 - p) ** (k - a) * d ** min(a, slots) for a in range(k + 1)
    )
    assert empty == pytest.approx(0.3819, abs=1e-4)
    assert _within(float(np.mean(lengths == 0.0)), empty, lengths.size)
    assert np.quantile(lengths, 0.3) == 0.0 and np.quantile(lengths, 0.5) == c
    # a deadline at c cuts no round: every non-empty round has the same length
    assert cells_lib.cut_share(lengths, c) == 0.0
    assert cells_lib.cut_share(lengths, 0.0) == pytest.approx(1 - np.mean(lengths == 0.0))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_two_speeds_the_dropout_moves_the_share_a_deadline_cuts(tmp_path, dropout):
    """Four always-online clients from a FedScale profile file, two fast (a = 1.2 s of
    compute) and two slow (b = 3.6 s); 2 slots for 1 kept update (over-commitment 2): a round
    lasts as long as its first live finisher. Of the 6 equally likely pairs, 1 is both slow
    and 4 are mixed, so P(b) = (1 - d^2) / 6 + 4 d (1 - d) / 6 and P(0 s) = d^2. The 0.5
    quantile is a in both cases, and a deadline between a and b cuts P(b): 16.7% of rounds
    without dropouts (a 25-75% check refuses it), 29.2% with d = 0.3 -- what the profiles
    alone (the former deadline) could not see."""
    profiles = {
        str(i): {"computation": ms, "communication": 1e9} for i, ms in enumerate([100.0, 300.0])
    }
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(profiles))
    lengths = _lengths(
        AVAILABILITY.build("always"),
        SYSTEMS.build("fedscale", path=str(path)),
        np.full(4, 4.0),
        rounds=750,
        per_round=1,
        slots=2,
        dropout=dropout,
        kbit=10.0,
    )
    a, b = 3 * 4 * 0.1, 3 * 4 * 0.3
    assert np.all((lengths == 0) | np.isclose(lengths, a) | np.isclose(lengths, b))
    slow = (1 - dropout**2) / 6 + 4 * dropout * (1 - dropout) / 6
    assert _within(float(np.mean(np.isclose(lengths, b))), slow, lengths.size)
    assert _within(float(np.mean(lengths == 0)), dropout**2, lengths.size)
    assert np.quantile(lengths, 0.5) == pytest.approx(a, rel=1e-5)
    share = cells_lib.cut_share(lengths, 2.0)
    assert _within(share, slow, lengths.size)
    lo, hi = cells_lib.DEADLINE_CUT_BOUNDS
    assert (lo <= share <= hi) == (dropout > 0)


def _suite(scenario: dict, rounds: int = 8, seeds: int = 3) -> suite_lib.Suite:
    return suite_lib.parse_suite(
        {
            "suite": {"name": "deadline", "seeds": seeds, "baseline": "uniform"},
            "tasks": {
                "digits": {
                    "dataset": "digits",
                    "num_clients": 10,
                    "per_round": 3,
                    "rounds": rounds,
                    "local_steps": 2,
                    "batch_size": 4,
                    "eval_every": 4,
                }
            },
            "scenarios": {"devices": {**scenario, "headline": "final_accuracy"}},
            "strategies": [{"strategy": "uniform"}],
        }
    )


DEVICES = {
    "system": "lognormal",
    "availability": "bernoulli:p=0.6",
    "deadline_quantile": 0.5,
    "overcommit": 1.34,
    "dropout": 0.2,
}


def test_the_realised_rounds_are_the_engines_uniform_rounds():
    """The uniform cells of the scenario, run by the engine with the deadline, last
    min(realised length, deadline) round for round on every seed, so the share of their rounds
    at the deadline (the cell's ``deadline_hit_share``) is the share the check measured."""
    suite = _suite(DEVICES)
    task, scenario = suite.tasks[0], suite.scenarios[0]
    realised = cells_lib.realised_uniform_rounds(suite, task, scenario)
    assert realised.shape == (3, 8)
    deadline = cells_lib.deadline_for(suite, task, scenario)
    pooled = realised.astype(np.float64).ravel()
    assert deadline.seconds == round(float(np.quantile(pooled, 0.5)), 1)
    assert deadline.cut_share == np.mean(pooled > deadline.seconds)
    assert 0.25 <= deadline.cut_share <= 0.75  # some rounds cut, some not
    entry = suite.strategies[0]
    configs = [
        suite_lib.cell_config(
            suite, task, scenario, entry, seed=s, lr=None, deadline=deadline.seconds
        )
        for s in suite.seeds
    ]
    results = run_group(configs, [None] * len(configs), echo=lambda *_: None)
    hits = []
    for seed_lengths, result in zip(realised, results, strict=True):
        seconds = np.array([s for e in result.evals for s in e["round_seconds"]])
        np.testing.assert_allclose(seconds, np.minimum(seed_lengths, deadline.seconds), rtol=1e-6)
        metrics = cells_lib.cell_metrics(
            result.evals, result.summary, result.config, suite_lib.Task("t", {})
        )
        hits.append(metrics["deadline_hit_share"])
    assert np.mean(hits) == pytest.approx(deadline.cut_share)


def test_task_deadlines_records_and_prints_the_share_it_cuts():
    suite = _suite(DEVICES)
    meta, said = {}, []
    deadlines = task_deadlines(suite, suite.tasks[0], said.append, meta)
    d = cells_lib.deadline_for(suite, suite.tasks[0], suite.scenarios[0])
    assert deadlines == {"devices": d.seconds}
    assert meta["deadline_cut_share"] == {"devices": d.cut_share}
    assert 0.25 <= d.cut_share <= 0.75
    assert f"{d.seconds:g} s" in said[0] and f"{100 * d.cut_share:.1f}%" in said[0]


def test_a_deadline_that_cuts_outside_25_to_75_percent_is_refused_naming_it():
    """Equal devices (no spread in compute or bandwidth) and every client online: every round
    lasts the same, so no quantile of them cuts half; the suite stops at start, naming the
    scenario, the deadline and the share."""
    equal = {
        **DEVICES,
        "system": "normal:std=0,bandwidth_std=0",
        "availability": "always",
        "dropout": 0.0,
    }
    suite = _suite(equal)
    d = cells_lib.deadline_for(suite, suite.tasks[0], suite.scenarios[0])
    assert d.cut_share in (0.0, 1.0)  # 0 when the rounding lands at or above the length
    with pytest.raises(ConfigError) as err:
        task_deadlines(suite, suite.tasks[0], lambda *_: None, {})
    message = str(err.value)
    assert "'devices'" in message and f"{d.seconds:g} s" in message
    assert f"cuts {100 * d.cut_share:.1f}%" in message and "25-75%" in message
