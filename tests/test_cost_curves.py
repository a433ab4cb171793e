"""The results page's cost curves and its rankings at equal client updates
(:mod:`fedjax_sel.benchmark.curves`), from per-seed records built by hand in the shape
``run_group`` writes (no simulation): the curves' grid, step semantics, means and intervals
against a NumPy/SciPy transcription, the budget rankings against a planted order and a
``rankdata`` recompute, and the files ``report.write`` leaves."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from test_suite import TINY

from fedjax_sel.benchmark import cells as cells_lib
from fedjax_sel.benchmark import curves, leaderboard, report
from fedjax_sel.benchmark import suite as suite_lib
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.records import Store

PER_ROUND = 3  # TINY's tasks' per_round
FULL = 10  # full trains every client of digits' 10 (a reference)
# the planted accuracy at each evaluation (rounds 2, 4, 6 for the ranked strategies): the
# fast starter (power_of_choice) holds the most over the update budget but ends last
PLANTED = {
    "uniform": [0.3, 0.6, 0.8],
    "power_of_choice": [0.6, 0.65, 0.7],
    "active_fl": [0.5, 0.7, 0.9],
}
FULL_ACCURACY = [0.4, 0.55, 0.7, 0.8, 0.85, 0.9]  # every round


def _suite() -> suite_lib.Suite:
    spec = json.loads(json.dumps(TINY))
    spec["suite"].update(seeds=4, tracks=["selection", "bundle"])
    spec["tuning"] = {}
    spec["strategies"].insert(2, {"strategy": "active_fl"})
    return suite_lib.parse_suite(spec)


def _evals(label: str, seed: int, timed: bool, rng) -> list[dict]:
    """A run's metrics.jsonl evaluations: accuracy with a little per-seed noise and the
    running cost totals (a clock, with random round lengths, where ``timed``)."""
    if label == "full":
        rounds, accuracy, per = list(range(1, 7)), FULL_ACCURACY, FULL
    else:
        rounds, accuracy, per = [2, 4, 6], PLANTED[label], PER_ROUND
    seconds = np.cumsum(rng.uniform(5.0, 15.0, 6))
    out = []
    for r, a in zip(rounds, accuracy, strict=True):
        e = {
            "round": r,
            "test_accuracy": a + 0.002 * (seed - 1.5) + 0.001 * rng.standard_normal(),
            "client_updates": per * r,
            "uplink_bytes": 4000 * per * r,
            "client_flops": 2e6 * per * r + 1e5 * seed,
        }
        if timed:
            e["sim_time_s"] = float(seconds[r - 1])
        out.append(e)
    return out


def _plant(suite: suite_lib.Suite, out, *, series: bool = True) -> dict:
    """Every eval cell's record, as run_group writes it (metrics and series from the
    evaluations by the suite's own functions); returns the evaluations by cell."""
    rng = np.random.default_rng(7)
    evals = {}
    for task in suite.tasks:
        store = Store(out / "per_seed" / f"{task.name}.json")
        for scenario in suite.scenarios:
            timed = "system" in scenario.fields
            for entry in suite.strategies:
                if entry.reason(task.name, scenario.name) is not None:
                    continue
                for seed in suite.seeds:
                    runs = _evals(entry.label, seed, timed, rng)
                    evals[task.name, scenario.name, entry.label, seed] = runs
                    a = runs[-1]["test_accuracy"]
                    summary = {"final_accuracy": a, "stable_accuracy": a, "peak_accuracy": a}
                    record = {
                        "phase": "eval",
                        "scenario": scenario.name,
                        "strategy": entry.label,
                        "seed": seed,
                        "key": "k",
                        "suite_version": suite_lib.SUITE_VERSION,
                        "diverged": False,
                        "rounds": 6,
                        "metrics": cells_lib.cell_metrics(runs, summary, RunConfig(), task),
                    }
                    if series:
                        record["series"] = cells_lib.cell_series(runs)
                    store.put(record)
        store.save()
    return evals


def _held_reference(costs, accuracies, grid):
    """The step function written out: the last evaluation at or below x, NaN before."""
    i = np.searchsorted(np.asarray(costs, float), np.asarray(grid, float), side="right") - 1
    return np.where(i >= 0, np.asarray(accuracies, float)[np.maximum(i, 0)], np.nan)


def _band_reference(curves_by_seed):
    """Mean and 95% Student-t interval per grid point; NaN where any seed has no value."""
    v = np.asarray(curves_by_seed, float)
    n = v.shape[0]
    mean = v.mean(axis=0)
    half = stats.t.ppf(0.975, n - 1) * v.std(axis=0, ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half  # NaN propagates where a seed is NaN


def _as_array(values):
    return np.array([np.nan if v is None else v for v in values], float)


def test_held_curve_is_a_step_function_with_no_value_before_the_first_evaluation():
    grid = [0.0, 5.9, 6.0, 11.99, 12.0, 18.0, 30.0]
    held = curves.held_curve([6, 12, 18], [0.3, 0.6, 0.8], grid)
    assert held == [None, None, 0.3, 0.3, 0.6, 0.8, 0.8]  # beyond the run: its final accuracy
    # a diverged evaluation is skipped: the last finite accuracy is held
    assert curves.held_curve([6, 12], [0.3, float("nan")], [13.0]) == [0.3]
    # a single seed: a mean without an interval; a seed without a value blanks the point
    assert curves.band([[0.5, None]]) == ([0.5, None], [None, None], [None, None])
    assert curves.band([[0.4, 0.5], [None, 0.7]])[0] == [None, pytest.approx(0.6)]


def test_cost_curves_match_a_numpy_scipy_transcription(tmp_path):
    suite = _suite()
    evals = _plant(suite, tmp_path)
    doc = curves.build(suite, tmp_path)
    assert doc["points"] == curves.POINTS == 50
    panels = {(p["task"], p["scenario"], p["axis"]): p for p in doc["panels"]}
    # a panel per task, scenario and cost axis recorded there: no clock in the ideal scenario
    assert set(panels) == {
        (t, s, a)
        for t in ("digits", "synthetic")
        for s in ("ideal", "devices")
        for a in curves.AXES
        if a != "sim_seconds" or s == "devices"
    }
    field = {a: cells_lib.SERIES_FIELDS[a] for a in curves.AXES}
    for (task, scenario, axis), panel in panels.items():
        base = [evals[task, scenario, "uniform", s][-1][field[axis]] for s in suite.seeds]
        # the grid: 50 points from 0 to the baseline's median final total
        assert panel["end"] == pytest.approx(np.median(base)) and panel["end_from"] == "uniform"
        grid = np.linspace(0.0, np.median(base), 50)
        np.testing.assert_allclose(panel["grid"], grid)
        labels = ["uniform", "power_of_choice", "active_fl"]
        labels += ["full"] if scenario == "ideal" else []  # full: not applicable in devices
        # one line per track and strategy (each entry counts in both tracks: no bundles)
        assert sorted((ln["track"], ln["strategy"]) for ln in panel["lines"]) == sorted(
            (t, x) for t in ("selection", "bundle") for x in labels
        )
        for line in panel["lines"]:
            runs = [evals[task, scenario, line["strategy"], s] for s in suite.seeds]
            held = [
                _held_reference([e[field[axis]] for e in r], [e["test_accuracy"] for e in r], grid)
                for r in runs
            ]
            mean, lo, hi = _band_reference(held)
            assert line["seeds"] == suite.seeds
            assert line["reference"] == (line["strategy"] == "full")
            np.testing.assert_allclose(_as_array(line["mean"]), mean, rtol=1e-12)
            np.testing.assert_allclose(_as_array(line["ci_low"]), lo, rtol=1e-12)
            np.testing.assert_allclose(_as_array(line["ci_high"]), hi, rtol=1e-12)
    # before the first evaluation there is no value: the ranked strategies are first
    # evaluated at 6 client updates, full at 10; 0 updates is blank for everyone
    ups = panels["digits", "ideal", "client_updates"]
    for line in ups["lines"]:
        first = 6.0 if line["strategy"] != "full" else 10.0
        values = _as_array(line["mean"])
        assert np.all(np.isnan(values[np.asarray(ups["grid"]) < first]))
        assert np.all(np.isfinite(values[np.asarray(ups["grid"]) >= first]))
    # on the clock, each seed starts at its own time: blank until the last seed's first one
    clock = panels["digits", "devices", "sim_seconds"]
    (line,) = [x for x in clock["lines"] if x["strategy"] == "uniform" and x["track"] == "bundle"]
    starts = max(evals["digits", "devices", "uniform", s][0]["sim_time_s"] for s in suite.seeds)
    values, xs = _as_array(line["mean"]), np.asarray(clock["grid"])
    assert np.all(np.isnan(values[xs < starts])) and np.all(np.isfinite(values[xs >= starts]))


def test_budget_rankings_recover_a_planted_order_and_a_rankdata_recompute(tmp_path):
    suite = _suite()
    evals = _plant(suite, tmp_path)
    doc = leaderboard.build(suite, tmp_path)
    budget = doc["budget_rankings"]
    assert set(budget) == {"update_auc", "accuracy@updates:max"}
    # planted: power_of_choice holds the most accuracy over [0, 18] updates (area
    # (6 x 0.6 + 6 x 0.65) / 18 = 0.417 against active_fl's 0.400 and uniform's 0.300), yet
    # ends last at 18 updates (0.70 against 0.90 and 0.80); in every one of the 4 cells
    auc = [(r["strategy"], r["mean_rank"], r["cells"]) for r in budget["update_auc"]]
    assert auc == [("power_of_choice", 1.0, 4), ("active_fl", 2.0, 4), ("uniform", 3.0, 4)]
    at_max = [(r["strategy"], r["mean_rank"]) for r in budget["accuracy@updates:max"]]
    assert at_max == [("active_fl", 1.0), ("uniform", 2.0), ("power_of_choice", 3.0)]
    assert all(r["track"] == "selection" for r in budget["update_auc"])  # the ranked track
    assert "full" not in {r["strategy"] for r in budget["update_auc"]}  # a reference
    # recomputed: the area under the held step function (0 before the first evaluation)
    # per seed, ranked per seed with scipy, averaged over seeds and then over cells
    labels = ["uniform", "power_of_choice", "active_fl"]
    by_cell = []
    for task in suite.tasks:
        b = max(task.update_budgets)
        assert b == 18
        for scenario in suite.scenarios:
            values = []
            for label in labels:
                row = []
                for s in suite.seeds:
                    runs = evals[task.name, scenario.name, label, s]
                    u = np.array([e["client_updates"] for e in runs] + [b], float)
                    a = np.array([0.0] + [e["test_accuracy"] for e in runs], float)
                    keep = u <= b
                    edges = np.concatenate([[0.0], u[keep]])
                    row.append(float(np.sum(a[: keep.sum()] * np.diff(edges)) / b))
                values.append(row)
            by_cell.append(stats.rankdata(-np.asarray(values), axis=0).mean(axis=1))
    means = np.mean(by_cell, axis=0)
    got = {r["strategy"]: r["mean_rank"] for r in budget["update_auc"]}
    assert [got[x] for x in labels] == pytest.approx(means.tolist())
    # the metric the ranking reads is the record's update_auc, equal to the recompute's
    rec = Store(tmp_path / "per_seed" / "digits.json").records
    one = rec[Store.id({"phase": "eval", "scenario": "ideal", "strategy": "uniform", "seed": 0})]
    runs = evals["digits", "ideal", "uniform", 0]
    area = (6 * runs[0]["test_accuracy"] + 6 * runs[1]["test_accuracy"]) / 18
    assert one["metrics"]["update_auc"] == pytest.approx(area)
    # the headline ranking is untouched by the metric argument's default
    assert doc["ranking"] == leaderboard.rank(suite, {t.name: Store(
        tmp_path / "per_seed" / f"{t.name}.json") for t in suite.tasks})  # fmt: skip


def test_report_writes_the_cost_curves_and_the_budget_section(tmp_path):
    suite = _suite()
    _plant(suite, tmp_path)
    doc = report.write(suite, tmp_path, echo=None)
    assert doc["cost_curves"] == ["digits", "synthetic"]
    for name in ("cost_curves.json", "cost_curves_digits.png", "cost_curves_synthetic.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    written = json.loads((tmp_path / "cost_curves.json").read_text())
    assert written["ranked_track"] == "selection" and len(written["panels"]) == 2 * (3 + 4)
    text = (tmp_path / "leaderboard.md").read_text()
    assert "### Ranking at equal client updates" in text
    assert "![cost curves, digits](cost_curves_digits.png)" in text
    saved = json.loads((tmp_path / "leaderboard.json").read_text())
    assert saved["budget_rankings"]["update_auc"][0]["strategy"] == "power_of_choice"


def test_records_without_series_write_no_cost_curves(tmp_path):
    suite = _suite()
    _plant(suite, tmp_path, series=False)
    assert curves.build(suite, tmp_path) is None
    doc = report.write(suite, tmp_path, echo=None)
    assert doc["cost_curves"] == []
    assert not list(tmp_path.glob("cost_curves*"))
    assert "Cost curves" not in (tmp_path / "leaderboard.md").read_text()
