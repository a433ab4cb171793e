"""The suite's converged tuning (issue 54): log grids in x2 steps that extend themselves while
the best point sits at an edge, until it is interior, the point beyond diverged, or the
extensions allowed are spent; the same number of configurations for every strategy (knobs
included); the choice and its position in the records and the leaderboard rows; the tuning
curves in ``tuning.json`` and ``tuning.png``.

The extension is checked as a pure function against planted metric curves whose optimum is
known in closed form, then end to end through ``fedjax-sel suite`` with a stub in place of the
training (a planted metric per lr, knob and seed: every choice is known), and once on the
tiniest real suite."""

from __future__ import annotations

import copy
import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats

from fedjax_sel.base import ConfigError
from fedjax_sel.benchmark import cells as cells_lib
from fedjax_sel.benchmark import suite as suite_lib
from fedjax_sel.cli.main import main
from fedjax_sel.experiment import tuning as tuning_lib
from fedjax_sel.experiment.loop import RunResult, program_key
from fedjax_sel.experiment.tuning import (
    ALL_WORST,
    EDGE,
    INTERIOR,
    NEXT_DIVERGED,
    NEXT_WORST,
    choose_point,
    limit_reason,
)

SEEDS = (7, 8, 9)


# ----------------------------------------------------------------------------- the extension
def _search(grid, metric, *, extend=4, better=True):
    """Runs :func:`choose_point` to the end as the suite does: ``metric(point, seed)`` gives a
    point's value on a seed (``None``: diverged). Returns the final choice and the points in
    the order they ran."""
    points = list(grid)
    used = 0
    while True:
        values = {p: [metric(p, s) for s in SEEDS] for p in points}
        diverged = {p: any(v is None for v in vs) for p, vs in values.items()}
        choice = choose_point(
            points, values, better=better, extend=extend, used=used, diverged=diverged
        )
        if choice.extend is None:
            return choice, points
        assert choice.extend not in points
        points.append(choice.extend)
        used += 1


def _line(lrs, knobs=()):
    return [(lr, knobs) for lr in lrs]


def _peak(at: float):
    """A concave curve in log2(lr) with its top at ``at``, the seeds a small constant apart
    (their mean is the curve)."""
    return lambda p, s: 0.9 - 0.01 * (math.log2(p[0] / at)) ** 2 + 0.001 * (s - 8)


def test_a_planted_optimum_beyond_the_top_edge_is_reached_and_interior():
    choice, points = _search(_line([0.05, 0.1, 0.2]), _peak(0.8))
    # 0.2 is the top edge: 0.4, then 0.8 (still the best, at the new edge), then 1.6 (worse)
    assert [p[0] for p in points[3:]] == [0.4, 0.8, 1.6]
    assert choice.point == (0.8, ()) and choice.position == INTERIOR and choice.reason is None
    assert choice.score == pytest.approx(0.9)


def test_a_planted_optimum_below_the_bottom_edge_extends_downward():
    choice, points = _search(_line([0.05, 0.1, 0.2]), _peak(0.0125))
    assert [p[0] for p in points[3:]] == [0.025, 0.0125, 0.00625]
    assert choice.point == (0.0125, ()) and choice.position == INTERIOR


def test_a_diverged_point_beyond_the_edge_stops_the_extension():
    def rising(p, s):  # better with every doubling, until 0.8 diverges on one seed
        if p[0] >= 0.8 and s == 9:
            return None
        return 0.5 + 0.1 * math.log2(p[0] / 0.05)

    choice, points = _search(_line([0.05, 0.1, 0.2]), rising)
    assert [p[0] for p in points[3:]] == [0.4, 0.8]
    assert choice.point == (0.4, ()) and choice.position == EDGE
    assert choice.reason == NEXT_DIVERGED and choice.extend is None
    # a point beyond the edge with its metric missing (not diverged) is the worst too
    values = {p: [rising(p, s) for s in SEEDS] for p in points}
    other = choose_point(points, values, better=True, extend=4, used=2, diverged={})
    assert other.point == (0.4, ()) and other.reason == NEXT_WORST


def test_the_extension_limit_is_recorded():
    def rising(p, s):
        return math.log2(p[0])

    choice, points = _search(_line([0.05, 0.1, 0.2]), rising, extend=2)
    assert [p[0] for p in points[3:]] == [0.4, 0.8]
    assert choice.point == (0.8, ()) and choice.position == EDGE
    assert choice.reason == limit_reason(2) == "extension limit 2 reached"
    choice, points = _search(_line([0.05, 0.1, 0.2]), rising, extend=0)
    assert len(points) == 3 and choice.point == (0.2, ()) and choice.reason == limit_reason(0)


def test_every_point_diverged_extends_down_then_says_so():
    choice, points = _search(_line([0.1, 0.2]), lambda p, s: None, extend=2)
    assert [p[0] for p in points[2:]] == [0.05, 0.025]  # too large everywhere: go lower
    assert choice.point == (0.025, ()) and choice.position == EDGE
    assert choice.reason == ALL_WORST and choice.score is None
    # the first lower point that trains is the choice, at the edge where 0.05 diverged
    choice, points = _search(_line([0.1, 0.2]), lambda p, s: 0.5 if p[0] < 0.05 else None, extend=4)
    assert [p[0] for p in points[2:]] == [0.05, 0.025, 0.0125]
    assert choice.point == (0.025, ()) and choice.reason == NEXT_DIVERGED


def test_knobs_extend_the_line_of_the_best_setting_only():
    """Grid points with a knob: each knob setting has its lr line; the best setting's line
    extends (at that setting), the other lines stay as they ran."""
    low, high = (("beta", 0.5),), (("beta", 2.0),)
    grid = [(lr, k) for lr in (0.1, 0.2) for k in (low, high)]

    def metric(p, s):
        lr, knobs = p
        top = 0.8 if knobs == high else 0.1  # the high setting peaks beyond the grid
        return (0.9 if knobs == high else 0.7) - 0.01 * math.log2(lr / top) ** 2

    choice, points = _search(grid, metric)
    assert points[4:] == [(0.4, high), (0.8, high), (1.6, high)]
    assert choice.point == (0.8, high) and choice.position == INTERIOR


def test_a_lower_is_better_metric_and_ties():
    line = _line([0.05, 0.1, 0.2])
    values = {line[0]: [3.0] * 3, line[1]: [1.0] * 3, line[2]: [1.0] * 3}
    choice = choose_point(line, values, better=False, extend=4, used=0)
    assert choice.point == line[1] and choice.position == INTERIOR  # the tie: the first
    values[line[1]] = [None, 1.0, 1.0]  # one seed missing: the worst, never the mean of two
    assert choose_point(line, values, better=False, extend=4, used=0).extend == (0.4, ())


def test_the_choice_is_the_mean_over_seeds_with_a_missing_value_worst():
    """point_score/best_index (shared by the sweep's and the suite's tuning) against NumPy."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        table = rng.uniform(0, 1, (6, 3))
        table[rng.uniform(size=table.shape) < 0.1] = np.nan
        scores = [
            tuning_lib.point_score([None if np.isnan(v) else v for v in row]) for row in table
        ]
        means = np.where(np.isnan(table).any(axis=1), -np.inf, table.mean(axis=1))
        assert tuning_lib.best_index(scores, True) == int(np.argmax(means))
        lows = np.where(np.isnan(table).any(axis=1), np.inf, table.mean(axis=1))
        assert tuning_lib.best_index(scores, False) == int(np.argmin(lows))


# ----------------------------------------------------------------------------- the suite file
BASE = {
    "suite": {"name": "t", "seeds": 2, "baseline": "uniform"},
    "tuning": {"lr": {"center": 0.1, "points": 3}, "seeds": list(SEEDS)},
    "tasks": {
        "digits": {
            "dataset": "digits",
            "num_clients": 8,
            "per_round": 3,
            "rounds": 2,
            "local_steps": 1,
            "batch_size": 16,
            "eval_every": 1,
            "test_fraction": 0.2,
        }
    },
    "scenarios": {"ideal": {}},
    "strategies": [{"strategy": "uniform"}],
}


def _spec(**changes):
    spec = copy.deepcopy(BASE)
    for section, value in changes.items():
        spec[section] = value
    return spec


def test_grids_are_x2_steps_from_a_center_or_a_list():
    suite = suite_lib.parse_suite(_spec())
    task, entry = suite.tasks[0], suite.strategies[0]
    assert suite.tuning.lr == (0.05, 0.1, 0.2) and suite.tuning.extend == 4
    assert suite.tuning_grid(task, entry) == _line([0.05, 0.1, 0.2])
    five = _spec(tuning={"lr": {"center": 0.1, "points": 5}, "seeds": list(SEEDS)})
    assert suite_lib.parse_suite(five).tuning.lr == (0.025, 0.05, 0.1, 0.2, 0.4)
    listed = _spec(tuning={"lr": [0.025, 0.05, 0.1, 0.2, 0.4], "seeds": list(SEEDS)})
    assert suite_lib.parse_suite(listed).tuning.lr == (0.025, 0.05, 0.1, 0.2, 0.4)
    # a task's own grid, under the same rule, moves the grid there
    spec = _spec()
    spec["tasks"]["digits"]["lr_grid"] = [0.01, 0.02, 0.04]
    suite = suite_lib.parse_suite(spec)
    assert suite.tuning_grid(suite.tasks[0], entry) == _line([0.01, 0.02, 0.04])
    assert suite.tuning.seeds == SEEDS


def test_every_strategy_tunes_over_the_same_number_of_configurations(tmp_path):
    """``configurations = C``: C lr points without knobs, C / k with knobs of k value
    combinations (the lr points around the same center)."""
    strategies = [
        {"strategy": "uniform"},
        {"strategy": "f3ast", "tune": {"beta": [0.0, 0.01, 0.1]}},
        {"strategy": "active_fl", "tune": {"alpha1": [0.5, 0.75], "alpha2": [0.01, 0.1, 1.0]}},
    ]
    tuning = {"lr": {"center": 0.1, "points": 3}, "seeds": list(SEEDS), "configurations": 12}
    suite = suite_lib.parse_suite(_spec(tuning=tuning, strategies=strategies))
    task = suite.tasks[0]
    uniform, f3ast, active = (suite.tuning_grid(task, e) for e in suite.strategies)
    assert len(uniform) == len(f3ast) == len(active) == 12
    assert [lr for lr, _ in uniform] == [0.1 * 2.0**j for j in range(-5, 7)]
    assert sorted({lr for lr, _ in f3ast}) == [0.05, 0.1, 0.2, 0.4]
    assert [k for lr, k in f3ast if lr == 0.1] == [(("beta", b),) for b in (0.0, 0.01, 0.1)]
    assert sorted({lr for lr, _ in active}) == [0.1, 0.2]
    # the lr and traced knobs leave the program alone: each strategy's grid is one program
    for entry in suite.strategies:
        cells = cells_lib.tuning_cells(suite, task, suite.scenarios[0], entry, tmp_path, None)
        assert len(cells) == 12 * len(SEEDS)
        assert len({program_key(c.config) for c in cells}) == 1
        assert len({c.out for c in cells}) == len(cells)  # a folder each
    assert {k for _, k in active} == {
        (("alpha1", a1), ("alpha2", a2)) for a1 in (0.5, 0.75) for a2 in (0.01, 0.1, 1.0)
    }
    # without configurations: the grid's points, for every strategy
    two = [{"strategy": "uniform"}, {"strategy": "f3ast", "tune": {"beta": [0.0, 0.01]}}]
    tuning = {"lr": {"center": 0.1, "points": 4}, "seeds": list(SEEDS)}
    suite = suite_lib.parse_suite(_spec(tuning=tuning, strategies=two))
    assert [len(suite.tuning_grid(task, e)) for e in suite.strategies] == [4, 4]
    assert sorted({lr for lr, _ in suite.tuning_grid(task, suite.strategies[1])}) == [0.1, 0.2]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda s: s["tuning"].update(seeds=[1000, 1001]),
            "[tuning] seeds [1000, 1001]: a tuned choice needs at least 3 tuning seeds",
        ),
        (
            lambda s: s["tuning"].update(lr=[0.03, 0.1, 0.3]),
            "[tuning] lr [0.03, 0.1, 0.3] is not a grid in x2 steps",
        ),
        (
            lambda s: s["tuning"].update(lr=[0.2, 0.1]),
            "[tuning] lr [0.2, 0.1] is not a grid in x2 steps",
        ),
        (
            lambda s: s["tasks"]["digits"].update(lr_grid=[0.01, 0.03, 0.1]),
            "[tasks.digits] lr_grid [0.01, 0.03, 0.1] is not a grid in x2 steps",
        ),
        (lambda s: s["tuning"].update(lr={"center": 0.1}), "{center = C, points = N}"),
        (lambda s: s["tuning"].update(lr={"center": -1, "points": 3}), "'center': -1"),
        (lambda s: s["tuning"].update(extend=-1), "[tuning] extend must be a whole number >= 0"),
        (
            lambda s: s["strategies"].append(
                {"strategy": "power_of_choice", "tune": {"d": [2, 4]}}
            ),
            "tune names ['d'], which 'power_of_choice' does not trace (its traced "
            "hyperparameters: none)",
        ),
        (
            lambda s: s["strategies"].append(
                {
                    "strategy": "oort",
                    "tune": {"cut_off_util": [0.5], "clip_bound": [0.9], "pacer_delta": [5]},
                }
            ),  # fmt: skip
            "names ['clip_bound', 'cut_off_util', 'pacer_delta']: at most 2 knobs",
        ),
        (
            lambda s: s["strategies"].append({"strategy": "f3ast", "tune": {"beta": [0, 0.1]}}),
            "strategy 'f3ast' tunes 2 knob value combination(s) ({'beta': (0.0, 0.1)}), so 3 "
            "must be a multiple of 2",
        ),
        (
            lambda s: s["strategies"].append(
                {"strategy": "f3ast", "tune": {"beta": [0, 0.1]}, "strategy_args": {"beta": 0}}
            ),
            "tune varies ['beta'], which its strategy_args also set",
        ),
        (
            lambda s: s["strategies"].append({"strategy": "f3ast", "tune": {"beta": [0, 0]}}),
            "tune beta repeats a value",
        ),
        (
            lambda s: s["strategies"].append({"strategy": "f3ast", "tune": ["beta"]}),
            "tune must be a table {knob = [values]}",
        ),
    ],
)
def test_tuning_errors_name_the_bad_value(change, message):
    spec = _spec()
    change(spec)
    with pytest.raises(ConfigError) as e:
        suite_lib.parse_suite(spec)
    assert message in str(e.value)


def test_configurations_leaving_one_lr_point_is_an_error():
    strategies = [{"strategy": "uniform"}, {"strategy": "f3ast", "tune": {"beta": [0, 0.1]}}]
    tuning = {"lr": [0.1, 0.2], "seeds": list(SEEDS), "configurations": 2}
    with pytest.raises(ConfigError, match="at least 2 lr points each.*at least 4"):
        suite_lib.parse_suite(_spec(tuning=tuning, strategies=strategies))


# ----------------------------------------------------------------------------- end to end
def _planted(config) -> tuple[float | None, bool]:
    """The stub's metric of a cell: uniform peaks at lr 1.6 (beyond the initial grid's top
    edge 0.4); active_fl peaks at lr 0.1 with alpha1 = 0.75, except that lr 0.8 and above
    diverge (so with alpha1 = 0.5 it rises to the edge and stops there)."""
    lr, seed = config.lr, config.seed
    noise = 0.002 * (seed % 3 - 1)
    if config.strategy == "uniform":
        return 0.9 - 0.01 * math.log2(lr / 1.6) ** 2 + noise, False
    if lr >= 0.8:
        return None, True
    alpha1 = config.strategy_args["alpha1"]
    if alpha1 == 0.75:
        return 0.6 - 0.01 * math.log2(lr / 0.1) ** 2 + noise, False
    return 0.7 + 0.01 * math.log2(lr) + noise, False  # rising: its best is at the top


STUB_SPEC = {
    "suite": {"name": "stub", "seeds": [0, 1, 2], "baseline": "uniform"},
    "tuning": {
        "lr": {"center": 0.1, "points": 4},
        "seeds": list(SEEDS),
        "configurations": 4,
        "extend": 3,
    },
    "tasks": {"digits": BASE["tasks"]["digits"]},
    "scenarios": {"ideal": {}},
    "strategies": [
        {"strategy": "uniform"},
        {"strategy": "active_fl", "tune": {"alpha1": [0.5, 0.75]}},
    ],
}


def _stub(calls: list):
    def run_cells(cells, **kwargs):
        out = []
        for c in cells:
            calls.append((c.config.strategy, c.config.lr, dict(c.config.strategy_args),
                          c.config.seed))  # fmt: skip
            value, diverged = _planted(c.config)
            summary = {"stable_accuracy": value, "final_accuracy": value, "diverged": diverged}
            out.append(RunResult(c.config, [], summary))
        return out

    return run_cells


@pytest.fixture(scope="module")
def stubbed(tmp_path_factory):
    from fedjax_sel.experiment import sweep as sweep_lib

    root = tmp_path_factory.mktemp("tuning")
    path = root / "stub.json"
    path.write_text(json.dumps(STUB_SPEC))
    calls: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sweep_lib, "run_cells", _stub(calls))
        assert main(["suite", str(path), "--out", str(root / "out"), "--no-progress"]) == 0
    return path, root / "out", calls


def _records(out):
    return json.loads((out / "per_seed" / "digits.json").read_text())


def test_the_suite_extends_each_grid_to_its_planted_optimum(stubbed):
    _, out, calls = stubbed
    data = _records(out)
    tuned = data["meta"]["tuned"]
    # uniform: 0.05 .. 0.4, then 0.8 and 1.6 (the planted top), then 3.2 (worse): interior
    uniform = tuned["ideal/uniform"]
    assert [(p["lr"], p["step"]) for p in uniform["points"]] == [
        (0.05, 0), (0.1, 0), (0.2, 0), (0.4, 0), (0.8, 1), (1.6, 2), (3.2, 3)
    ]  # fmt: skip
    assert uniform["lr"] == 1.6 and uniform["knobs"] == {}
    assert (uniform["position"], uniform["reason"], uniform["extensions"]) == ("interior", None, 3)
    # active_fl: 4 configurations = 2 lr points x 2 values of alpha1; alpha1 = 0.5 rises to
    # 0.4, then 0.8 diverges: the choice stays at the edge and says why
    active = tuned["ideal/active_fl"]
    assert [(p["lr"], p["knobs"], p["step"]) for p in active["points"]] == [
        (0.1, {"alpha1": 0.5}, 0), (0.1, {"alpha1": 0.75}, 0),
        (0.2, {"alpha1": 0.5}, 0), (0.2, {"alpha1": 0.75}, 0),
        (0.4, {"alpha1": 0.5}, 1), (0.8, {"alpha1": 0.5}, 2),
    ]  # fmt: skip
    assert (active["lr"], active["knobs"]) == (0.4, {"alpha1": 0.5})
    assert (active["position"], active["reason"]) == ("edge", NEXT_DIVERGED)
    assert data["meta"]["tuned_lr"] == {"ideal/uniform": 1.6, "ideal/active_fl": 0.4}
    # every tuning configuration ran on the three tuning seeds, each once
    tune_calls = [c for c in calls if c[3] in SEEDS]
    assert len(tune_calls) == len(set(map(repr, tune_calls))) == 3 * (7 + 6)
    # the evaluations ran at the chosen point: the lr and the knob
    evals = [r for r in data["cells"] if r["phase"] == "eval"]
    assert {(r["strategy"], r["config"]["lr"]) for r in evals} == {
        ("uniform", 1.6), ("active_fl", 0.4)
    }  # fmt: skip
    assert all(
        r["config"]["strategy_args"] == {"alpha1": 0.5}
        for r in evals
        if r["strategy"] == "active_fl"
    )
    # the choice, recomputed from the per-seed records alone: the best mean over the seeds
    for label in ("uniform", "active_fl"):
        means = {}
        for r in data["cells"]:
            if r["phase"] == "tune" and r["strategy"] == label:
                key = (r["lr"], json.dumps(r.get("knobs", {})))
                v = None if r["diverged"] else r["metrics"]["stable_accuracy"]
                means.setdefault(key, []).append(v)
        scores = {k: -np.inf if None in v else np.mean(v) for k, v in means.items()}
        best = max(scores, key=scores.get)
        assert best[0] == tuned[f"ideal/{label}"]["lr"]


def test_rows_carry_the_tuned_point_and_its_position(stubbed):
    _, out, _ = stubbed
    doc = json.loads((out / "leaderboard.json").read_text())
    for row in doc["rows"]:
        if row["strategy"] == "uniform":
            assert (row["tuned"], row["tuned_position"]) == ("lr=1.6", "interior")
        else:
            assert row["tuned"] == "lr=0.4,alpha1=0.5"
            assert row["tuned_position"] == "edge (next point diverged)"
    csv_head = (out / "leaderboard.csv").read_text().splitlines()[0].split(",")
    assert {"tuned", "tuned_position"} <= set(csv_head)
    md = (out / "leaderboard.md").read_text()
    assert "| digits | 1.6 | 0.4,alpha1=0.5 (edge: next point diverged) |" in md
    assert "![tuning curves](tuning.png)" in md
    assert (out / "tuning.png").stat().st_size > 0


def test_tuning_json_holds_every_curve_recomputed_from_the_records(stubbed):
    _, out, _ = stubbed
    curves = json.loads((out / "tuning.json").read_text())
    data = _records(out)
    assert curves["seeds"] == list(SEEDS) and curves["metric"] == "stable_accuracy"
    assert {(c["strategy"], c["position"]) for c in curves["curves"]} == {
        ("uniform", "interior"), ("active_fl", "edge")
    }  # fmt: skip
    checked = 0
    for c in curves["curves"]:
        for p in c["points"]:
            values = [
                r["metrics"]["stable_accuracy"]
                for r in data["cells"]
                if r["phase"] == "tune"
                and r["strategy"] == c["strategy"]
                and r["lr"] == p["lr"]
                and r.get("knobs", {}) == p["knobs"]
                and not r["diverged"]
            ]
            if not values:  # every seed diverged
                assert p["mean"] is None and p["score"] is None
                continue
            x = np.asarray(values)
            half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
            assert p["mean"] == pytest.approx(x.mean(), abs=1e-12)
            assert (p["ci_low"], p["ci_high"]) == pytest.approx(
                (x.mean() - half, x.mean() + half), abs=1e-12
            )
            checked += 1
    assert checked == 7 + 5


def test_a_killed_tuning_resumes_at_the_missing_extension(stubbed, tmp_path, monkeypatch):
    """Records of the second extension lost (a suite killed while it ran): the rerun runs
    those three cells, goes on with the third extension from its record, and runs nothing
    else."""
    from fedjax_sel.experiment import sweep as sweep_lib

    path, out, _ = stubbed
    copy_out = tmp_path / "out"
    shutil.copytree(out, copy_out)
    data = _records(copy_out)
    data["cells"] = [
        r for r in data["cells"]
        if not (r["strategy"] == "uniform" and r["phase"] == "tune" and r["step"] == 2)
    ]  # fmt: skip
    (copy_out / "per_seed" / "digits.json").write_text(json.dumps(data))
    calls: list = []
    monkeypatch.setattr(sweep_lib, "run_cells", _stub(calls))
    assert main(["suite", str(path), "--out", str(copy_out), "--no-progress"]) == 0
    assert sorted(calls) == [("uniform", 1.6, {}, s) for s in SEEDS]
    assert _records(copy_out)["meta"]["tuned"] == _records(out)["meta"]["tuned"]


def test_the_tiniest_real_suite_extends_its_grid(tmp_path):
    """One real run: a two-point grid, so the best point sits at an edge; the extension runs
    beyond that edge (one more program, on the three tuning seeds) and the record says where
    the choice stands, all of it recomputed from the per-seed records."""
    spec = _spec(tuning={"lr": [0.01, 0.02], "seeds": list(SEEDS), "extend": 1})
    spec["tasks"]["digits"].update(local_steps=4, rounds=3)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(spec))
    assert main(["suite", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    data = _records(tmp_path / "out")
    tune = [r for r in data["cells"] if r["phase"] == "tune"]

    def mean(lr):
        return np.mean([r["metrics"]["stable_accuracy"] for r in tune if r["lr"] == lr])

    first = 0.01 if mean(0.01) >= mean(0.02) else 0.02  # ties: the first
    beyond = 0.005 if first == 0.01 else 0.04
    summary = data["meta"]["tuned"]["ideal/uniform"]
    assert [(p["lr"], p["step"]) for p in summary["points"]] == [
        (0.01, 0), (0.02, 0), (beyond, 1)
    ]  # fmt: skip
    assert len(tune) == 9 and {r["seed"] for r in tune} == set(SEEDS)
    best = beyond if mean(beyond) > mean(first) else first
    assert summary["lr"] == best == data["meta"]["tuned_lr"]["ideal/uniform"]
    want = ("interior", None) if best == first else ("edge", limit_reason(1))
    assert (summary["position"], summary["reason"]) == want
    # the extension's cells ran as a program of their own: its batch holds its seeds only
    assert all(r["batch"]["seeds"] == list(SEEDS) for r in tune if r["step"] == 1)
    evals = [r for r in data["cells"] if r["phase"] == "eval"]
    assert {r["config"]["lr"] for r in evals} == {best}
