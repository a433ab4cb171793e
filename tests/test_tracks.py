"""The selection-only comparison (``aggregation = "fedavg"``): every strategy's kept slots are
averaged by size-weighted FedAvg, so only the choice of clients differs."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.data import load_dataset
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig

ROUNDS, PER_ROUND = 3, 4


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", num_clients=12, partition="dirichlet:0.5", seed=0)


def _logs(ds, strategy: str, aggregation: str):
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    spec = RoundSpec.create(
        ds,
        model,
        make_strategy(strategy, PER_ROUND),
        local=LocalConfig(batch_size=8, local_steps=2),
        per_round=PER_ROUND,
        aggregation=aggregation,
    )
    sim = Simulation(spec, ds, num_rounds=ROUNDS)
    state, logs = sim.run_rounds(sim.init(0, hparams=HParams.of(0.1)), ROUNDS)
    return state, jax.tree.map(np.asarray, logs)


def test_fedavg_aggregation_replaces_a_strategys_weights_by_sizes(digits):
    _, own = _logs(digits, "f3ast", "strategy")
    _, fedavg = _logs(digits, "f3ast", "fedavg")
    counts = np.asarray(digits.train.counts)
    np.testing.assert_array_equal(own.clients[0], fedavg.clients[0])  # same first choice
    for clients, mask, weights in zip(fedavg.clients, fedavg.mask, fedavg.weights, strict=True):
        n = np.where(mask, counts[clients], 0).astype(np.float64)
        np.testing.assert_allclose(weights, n / n.sum(), rtol=1e-6)
    assert not np.allclose(own.weights[0], fedavg.weights[0])  # F3AST's own are not sizes


def test_fedavg_aggregation_leaves_fedavg_itself_unchanged(digits):
    a_state, a = _logs(digits, "uniform", "strategy")
    b_state, b = _logs(digits, "uniform", "fedavg")
    pairs = zip(
        jax.tree.leaves((a_state.params, a)), jax.tree.leaves((b_state.params, b)), strict=True
    )
    for x, y in pairs:
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_unknown_aggregation_is_refused(digits):
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        _logs(digits, "uniform", "median")


def _own_weights_are_fedavg(ds, strategy: str, args: dict) -> bool:
    """Whether ``strategy`` run with its own weights and with FedAvg's gives the same logs."""
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=10)
    out = []
    for aggregation in ("strategy", "fedavg"):
        spec = RoundSpec.create(
            ds,
            model,
            make_strategy(strategy, PER_ROUND, **args),
            local=LocalConfig(batch_size=8, local_steps=2),
            per_round=PER_ROUND,
            aggregation=aggregation,
        )
        sim = Simulation(spec, ds, num_rounds=ROUNDS)
        state, logs = sim.run_rounds(sim.init(0, hparams=HParams.of(0.1)), ROUNDS)
        out.append((np.asarray(logs.clients), np.asarray(logs.mask), np.asarray(logs.weights)))
    (c0, m0, w0), (c1, m1, w1) = out
    # the same clients, and weights equal up to float rounding (XLA may fuse the division
    # differently in the two programs)
    return (
        np.array_equal(c0, c1)
        and np.array_equal(m0, m1)
        and np.allclose(w0, w1, rtol=1e-6, atol=1e-7)
    )


def _cpu_entries_without_bundle():
    from pathlib import Path

    from fedjax_sel.config import read_config_file

    spec = read_config_file(Path(__file__).parents[1] / "benchmarks/selection/cpu.toml")
    return [
        (e["strategy"], dict(e.get("strategy_args") or {}))
        for e in spec["strategies"]
        if "bundle" not in e and not e.get("reference") and e["strategy"] != "filfl"
    ]


@pytest.mark.parametrize("strategy,args", _cpu_entries_without_bundle())
def test_cpu_suite_entries_without_a_bundle_aggregate_as_fedavg(digits, strategy, args):
    """The suite's claim for each entry without a ``bundle`` table: its own weights are
    FedAvg's, so its selection-track cells are its bundle-track cells too."""
    assert _own_weights_are_fedavg(digits, strategy, args)


def _suite_spec(strategies):
    return {
        "suite": {
            "name": "t", "seeds": 4, "baseline": "uniform", "tracks": ["selection", "bundle"]
        },
        "tasks": {
            "digits": {
                "dataset": "digits", "num_clients": 12, "per_round": 3, "rounds": 2,
                "local_steps": 1, "eval_every": 1, "target": 0.5,
            }
        },
        "scenarios": {"ideal": {"headline": "stable_accuracy"}},
        "strategies": strategies,
    }  # fmt: skip


def test_tracks_expand_entries_and_check_the_budget():
    from fedjax_sel.benchmark import suite as suite_lib
    from fedjax_sel.benchmark.tracks import SELECTION_FIELDS, track_labels

    suite = suite_lib.parse_suite(
        _suite_spec(
            [
                {"strategy": "uniform"},
                {"strategy": "hetero_select", "bundle": {"prox_mu": 0.1}},
                {"strategy": "full", "per_round": "all", "reference": True},
            ]
        )
    )
    labels = [(e.label, e.track) for e in suite.strategies]
    assert labels == [
        ("uniform", "selection"),
        ("hetero_select", "selection"),
        ("hetero_select.bundle", "bundle"),
        ("full", "selection"),
    ]
    task, scenario = suite.tasks[0], suite.scenarios[0]
    by = {e.label: e for e in suite.strategies}
    sel = suite_lib.cell_config(
        suite, task, scenario, by["hetero_select"], seed=0, lr=None, deadline=None
    )
    bun = suite_lib.cell_config(
        suite, task, scenario, by["hetero_select.bundle"], seed=0, lr=None, deadline=None
    )
    assert {k: getattr(sel, k) for k in SELECTION_FIELDS} == SELECTION_FIELDS
    assert (bun.aggregation, bun.prox_mu, bun.label) == ("strategy", 0.1, "hetero_select.bundle")
    # the bundle track: its own entries, and the selection entries without a bundle
    assert track_labels(suite.strategies, "bundle") == ["uniform", "hetero_select.bundle", "full"]
    assert by["full"].reference
    with pytest.raises(ConfigError, match="per_round=12 clients a round on task 'digits'"):
        suite_lib.parse_suite(
            _suite_spec([{"strategy": "uniform"}, {"strategy": "full", "per_round": "all"}])
        )
    with pytest.raises(ConfigError, match="which the selection track fixes"):
        suite_lib.parse_suite(
            _suite_spec([{"strategy": "uniform"}, {"strategy": "hetero_select", "prox_mu": 0.1}])
        )


def test_leaderboard_ranks_tracks_apart_counts_twins_once_and_needs_three_pairs(tmp_path):
    from fedjax_sel.benchmark import leaderboard
    from fedjax_sel.benchmark import suite as suite_lib
    from fedjax_sel.experiment.records import Store
    from fedjax_sel.experiment.stats import min_detectable_effect

    suite = suite_lib.parse_suite(
        _suite_spec(
            [
                {"strategy": "uniform"},
                {"strategy": "power_of_choice", "bundle": {"aggregation": "strategy"}},
                {"strategy": "active_fl"},
                {"strategy": "fedcbs"},
                {"strategy": "full", "per_round": "all", "reference": True},
            ]
        )
    )
    store = Store(tmp_path / "per_seed" / "digits.json")
    rng = np.random.default_rng(1)
    values = {
        "uniform": 0.70 + 0.01 * rng.standard_normal(4),
        "power_of_choice": 0.80 + 0.01 * rng.standard_normal(4),
        "power_of_choice.bundle": 0.60 + 0.01 * rng.standard_normal(4),
        "full": np.full(2, 0.99),  # two seeds only: no difference reported
    }
    values["active_fl"] = values["power_of_choice"].copy()  # a twin: counted once
    values["fedcbs"] = values["uniform"] + 0.05
    for label, accs in values.items():
        for seed, acc in enumerate(accs):
            store.put({
                "phase": "eval", "scenario": "ideal", "strategy": label, "seed": seed,
                "key": "k", "suite_version": suite_lib.SUITE_VERSION,
                "metrics": {"stable_accuracy": float(acc)},
            })  # fmt: skip
    store.save()
    doc = leaderboard.build(suite, tmp_path)
    selection = doc["rankings"]["selection"]
    assert [r["strategy"] for r in selection] == ["power_of_choice", "fedcbs", "uniform"]
    assert selection[0]["identical_to"] == {} and doc["references"] == ["full"]
    twin = next(r for r in doc["rankings"]["selection"] if r["strategy"] == "power_of_choice")
    assert "active_fl" not in [r["strategy"] for r in selection] and twin["cells"] == 1
    assert selection[0]["track"] == "selection"
    bundle = doc["rankings"]["bundle"]
    expect = ["active_fl", "fedcbs", "uniform", "power_of_choice.bundle"]
    assert [r["strategy"] for r in bundle] == expect
    ranked = doc["rows"]
    full = next(r for r in ranked if r["strategy"] == "full" and r["metric"] == "stable_accuracy")
    assert full["ranked"] is False and full["pairs"] == 2 and full["diff"] is None
    row = next(r for r in ranked if r["strategy"] == "fedcbs" and r["metric"] == "stable_accuracy")
    assert row["pairs"] == 4 and row["diff"] == pytest.approx(0.05)
    mde = next(m for m in doc["min_detectable_effect"] if m["track"] == "selection")
    diffs = [values[x] - values["uniform"] for x in ("power_of_choice", "active_fl", "fedcbs")]
    sd = np.sqrt(np.mean([np.var(d, ddof=1) for d in diffs]))
    assert mde["mde"] == pytest.approx(min_detectable_effect(sd, 4, mde["comparisons"]))


BUNDLE_VALUES = {"uniform": 0.7, "power_of_choice": 0.8, "power_of_choice.bundle": 0.6}


def _store_values(suite, folder, tasks, scenarios, values) -> None:
    """Four seeds of ``stable_accuracy`` (``values[label]`` + 0.001 seed) for every applicable
    (task, scenario, strategy), in ``folder/per_seed/``."""
    from fedjax_sel.benchmark import suite as suite_lib
    from fedjax_sel.experiment.records import Store

    by = {e.label: e for e in suite.strategies}
    for task in tasks:
        store = Store(folder / "per_seed" / f"{task}.json")
        for scenario in scenarios:
            for label, base in values.items():
                if by[label].reason(task, scenario):
                    continue
                for seed in range(4):
                    store.put({
                        "phase": "eval", "scenario": scenario, "strategy": label, "seed": seed,
                        "key": "k", "suite_version": suite_lib.SUITE_VERSION,
                        "metrics": {"stable_accuracy": base + 0.001 * seed},
                    })  # fmt: skip
        store.save()


def test_bundle_scenarios_keep_the_bundle_track_to_them(tmp_path):
    """``[suite] bundle_scenarios``: a bundle entry is a not-applicable row (with the reason)
    elsewhere, the bundle track is ranked in those scenarios only, and the selection track in
    every scenario."""
    from fedjax_sel.benchmark import leaderboard
    from fedjax_sel.benchmark import suite as suite_lib

    spec = _suite_spec(
        [
            {"strategy": "uniform"},
            {"strategy": "power_of_choice", "bundle": {"aggregation": "strategy"}},
        ]
    )
    spec["scenarios"]["busy"] = {"availability": "markov", "headline": "stable_accuracy"}
    spec["suite"]["bundle_scenarios"] = ["ideal"]
    suite = suite_lib.parse_suite(spec)
    by = {e.label: e for e in suite.strategies}
    assert by["power_of_choice.bundle"].reason("digits", "ideal") is None
    assert "bundle_scenarios" in by["power_of_choice.bundle"].reason("digits", "busy")
    assert by["power_of_choice"].reason("digits", "busy") is None
    assert [s.name for s in suite.track_scenarios("bundle")] == ["ideal"]
    assert [s.name for s in suite.track_scenarios("selection")] == ["ideal", "busy"]
    _store_values(suite, tmp_path, ["digits"], ["ideal", "busy"], BUNDLE_VALUES)
    doc = leaderboard.build(suite, tmp_path)
    assert {r["cells"] for r in doc["rankings"]["selection"]} == {2}
    bundle = doc["rankings"]["bundle"]
    assert [r["strategy"] for r in bundle] == ["uniform", "power_of_choice.bundle"]
    assert {r["cells"] for r in bundle} == {1}  # the ideal cell only: busy is not ranked
    assert doc["track_scenarios"] == {"selection": ["ideal", "busy"], "bundle": ["ideal"]}
    from fedjax_sel.benchmark.report import markdown

    assert "### Ranking, bundle track (scenarios: ideal)" in markdown(doc)
    na = [
        r for r in doc["rows"] if r["strategy"] == "power_of_choice.bundle" and not r["applicable"]
    ]
    assert na and {r["scenario"] for r in na} == {"busy"}
    for bad in (["nowhere"], [], "ideal"):
        spec["suite"]["bundle_scenarios"] = bad
        with pytest.raises(ConfigError, match="bundle_scenarios must be a non-empty list"):
            suite_lib.parse_suite(spec)


def test_task_scenarios_and_tracks_keep_a_task_to_them(tmp_path):
    """``[tasks.X] scenarios`` and ``tracks``: the task's other cells are not-applicable rows
    with the reason; the bundle track ranks only the tasks that run it (so a task without it
    never ranks the selection entries it shares as a partial bundle cell); bad lists are
    refused by name."""
    from fedjax_sel.benchmark import leaderboard
    from fedjax_sel.benchmark import suite as suite_lib
    from fedjax_sel.benchmark.report import markdown

    spec = _suite_spec(
        [
            {"strategy": "uniform"},
            {"strategy": "power_of_choice", "bundle": {"aggregation": "strategy"}},
        ]
    )
    spec["tasks"]["small"] = dict(
        spec["tasks"]["digits"], scenarios=["ideal"], tracks=["selection"]
    )
    spec["scenarios"]["busy"] = {"availability": "markov", "headline": "stable_accuracy"}
    suite = suite_lib.parse_suite(spec)
    by = {e.label: e for e in suite.strategies}
    assert "[tasks.small] scenarios" in by["uniform"].reason("small", "busy")
    assert by["uniform"].reason("small", "ideal") is None
    assert "[tasks.small] tracks" in by["power_of_choice.bundle"].reason("small", "ideal")
    assert by["power_of_choice.bundle"].reason("digits", "busy") is None
    assert [t.name for t in suite.track_tasks("bundle")] == ["digits"]
    assert [t.name for t in suite.track_tasks("selection")] == ["digits", "small"]
    _store_values(suite, tmp_path, ["digits", "small"], ["ideal", "busy"], BUNDLE_VALUES)
    doc = leaderboard.build(suite, tmp_path)
    assert {r["cells"] for r in doc["rankings"]["selection"]} == {3}
    assert {r["cells"] for r in doc["rankings"]["bundle"]} == {2}  # digits' two cells only
    assert doc["track_tasks"] == {"selection": ["digits", "small"], "bundle": ["digits"]}
    assert "### Ranking, bundle track (tasks: digits; scenarios: ideal, busy)" in markdown(doc)
    md = markdown(doc)  # a cell no strategy runs in says why in one line
    assert "### small / busy\n\nNot applicable: small runs in ideal only" in md
    assert "- not applicable: **power_of_choice.bundle**: the bundle track does not run" in md
    cov = doc["coverage"]
    assert cov["finished"] == cov["cells"] - cov["not_applicable"]
    for key, bad, match in (
        ("scenarios", ["nowhere"], "must be distinct scenarios"),
        ("scenarios", ["busy"], "leave out the tuning scenario 'ideal'"),
        ("tracks", ["bundle"], "leave out the ranked track 'selection'"),
        ("tracks", [], "must be a non-empty list"),
    ):
        bad_spec = dict(spec, tasks=dict(spec["tasks"], small=dict(spec["tasks"]["small"])))
        bad_spec["tasks"]["small"][key] = bad
        with pytest.raises(ConfigError, match=match):
            suite_lib.parse_suite(bad_spec)


def test_readme_ranking_names_cells_and_identical_rows():
    """The README's top five carry each strategy's number of ranked cells, and a strategy
    ranked on fewer cells because its rows equal another's elsewhere says so."""
    from fedjax_sel.benchmark import page

    def entry(name, cells, identical=None):
        by_cell = {f"t/s{i}": 1.0 for i in range(cells)}
        return {
            "strategy": name,
            "mean_rank": 2.0,
            "ci_low": 1.5,
            "ci_high": 2.5,
            "cells": cells,
            "rank_by_cell": by_cell,
            "identical_to": identical or {},
        }

    doc = {
        "coverage": {"cells": 8, "finished": 8, "not_applicable": 0},
        "ranking": [
            entry("a", 4),
            entry("twin", 1, {"t/s1": "a", "t/s2": "a", "t/s3": "a"}),
        ],
        "suite": "x",
        "seeds": list(range(20)),
        "baseline": "uniform",
    }
    text = page.readme_block(doc)
    assert "| 1 | a | 2.00 [1.50, 2.50] | 4 |" in text
    assert "| 2 | twin | 2.00 [1.50, 2.50] | 1 |" in text
    assert "`twin` is ranked on 1 of 4 cells: in 3 others its rows are identical by " in text
    assert "`a`'s and count once" in text and "`a` is ranked" not in text


def test_page_wall_time_sets_aside_superseded_invocations_and_names_cpu_targets():
    """The page's wall time counts the invocations that made the committed records: those
    before the suite-time JSON's ``superseded`` time are named apart, in no figure; an
    invocation that names its CPU target shows it."""
    from fedjax_sel.benchmark import page

    def run(started, seconds, target=None):
        entry = {"started": started, "wall_seconds": seconds, "cpu_model": "AMD EPYC"}
        entry |= {"cpu_count": 2, "backend": "cpu"}
        return entry | ({"cpu_target": target} if target else {})

    runs = [
        run("2026-11-28T05:00:00Z", 3600.0),
        run("2026-12-07T17:00:00Z", 1800.0),
        run("2026-12-08T01:00:00Z", 5400.0, "AuthenticAMD 25/1: avx2"),
    ]
    assert page.wall_time_text(runs, None) == (
        "Wall time 3.00 h over 3 invocation(s) on `AMD EPYC` (2 cores, cpu), "
        "`AMD EPYC` (2 cores, cpu, `AuthenticAMD 25/1: avx2`)."
    )
    spent = {"superseded": {"before": "2026-12-07T00:00:00Z"}}
    text = page.wall_time_text(runs, spent)
    assert text.startswith("Wall time 2.00 h over 2 invocation(s) on ")
    assert text.endswith(
        " 1 earlier invocation(s) (1.00 h, before 2026-12-07T00:00:00Z) made records that "
        "were all run again; they count in no figure here."
    )
