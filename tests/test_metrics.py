"""Run metrics (HeteRo-Select section V): peak, final and stable accuracy, stability drop,
selection-count spread and Jain's index, against plain-Python definitions; and that every run's
summary.json and printed table carry them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedjax_sel import metrics
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import run_experiment
from fedjax_sel.experiment.outputs import print_summary_table


@pytest.mark.parametrize("seed", range(5))
def test_accuracy_summary_matches_definitions(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    curve = rng.uniform(0.1, 0.9, n).tolist()
    got = metrics.accuracy_summary(curve)
    last10 = curve[-10:]
    assert got["final_accuracy"] == curve[-1]
    assert got["peak_accuracy"] == max(curve)
    assert got["stable_accuracy"] == pytest.approx(sum(last10) / len(last10))
    assert got["stability_drop"] == pytest.approx(max(curve) - curve[-1])
    assert got["stability_drop"] >= 0


def test_stable_accuracy_over_the_last_rounds_when_rounds_are_given():
    # evaluated every 5 rounds: the last 10 rounds hold the evaluations at rounds 45 and 50
    rounds = list(range(5, 55, 5))
    curve = [0.1 * i for i in range(10)]
    got = metrics.accuracy_summary(curve, rounds=rounds)
    assert got["stable_accuracy"] == pytest.approx((curve[-1] + curve[-2]) / 2)
    assert metrics.accuracy_summary(curve)["stable_accuracy"] == pytest.approx(np.mean(curve))
    every_round = metrics.accuracy_summary(curve, rounds=range(1, 11))
    assert every_round == metrics.accuracy_summary(curve)
    with pytest.raises(ValueError, match="differ"):
        metrics.accuracy_summary(curve, rounds=[1, 2])


def test_accuracy_summary_edge_cases():
    assert metrics.accuracy_summary([]) == {}
    assert metrics.accuracy_summary([float("nan")] * 3) == {}
    got = metrics.accuracy_summary([0.5, 0.7, float("nan")])  # diverged at the end
    assert got["peak_accuracy"] == 0.7 and math.isnan(got["final_accuracy"])
    assert math.isnan(got["stability_drop"])
    assert got["stable_accuracy"] == pytest.approx(0.6)


@pytest.mark.parametrize("seed", range(5))
def test_selection_summary_matches_definitions(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 30, int(rng.integers(2, 50))).tolist()
    counts[0] = 3  # not all zero
    k = len(counts)
    mean = sum(counts) / k
    std = math.sqrt(sum((c - mean) ** 2 for c in counts) / k)
    jain = sum(counts) ** 2 / (k * sum(c * c for c in counts))
    got = metrics.selection_summary(counts)
    assert got["selection_count_mean"] == pytest.approx(mean)
    assert got["selection_count_std"] == pytest.approx(std)
    assert got["selection_count_cv"] == pytest.approx(std / mean)
    assert got["jain_fairness"] == pytest.approx(jain)
    assert got["clients_never_selected"] == sum(c == 0 for c in counts)
    assert (got["selection_count_min"], got["selection_count_max"]) == (min(counts), max(counts))
    assert 1 / k - 1e-12 <= got["jain_fairness"] <= 1 + 1e-12


def test_jain_index_extremes():
    assert metrics.jain_index([7, 7, 7, 7]) == pytest.approx(1.0)
    assert metrics.jain_index([12, 0, 0, 0]) == pytest.approx(0.25)
    assert metrics.jain_index([0, 0]) == 1.0
    with pytest.raises(ValueError):
        metrics.jain_index([])
    # two clients always picked out of four: J = 1/2, std = half the per-client count
    got = metrics.selection_summary([100, 100, 0, 0])
    assert got["jain_fairness"] == pytest.approx(0.5)
    assert got["selection_count_std"] == pytest.approx(50.0)
    assert math.isnan(metrics.selection_summary([0, 0])["selection_count_cv"])


def test_loss_summary():
    got = metrics.loss_summary([3.0, 1.0, float("inf"), 2.0])
    assert got == {"final_test_loss": 2.0, "best_test_loss": 1.0, "stable_test_loss": 2.0}
    assert metrics.loss_summary([]) == {}


def test_every_run_reports_them(tmp_path, capsys):
    config = RunConfig(
        strategy="hetero_select",
        dataset="digits",
        num_clients=8,
        partition="dirichlet:0.1",
        per_round=4,
        rounds=12,
        local_steps=2,
        batch_size=16,
        lr=0.1,
        prox_mu=0.1,
        eval_every=1,
        model="logreg",
    )
    result = run_experiment(config, tmp_path, progress=False)
    s = result.summary
    acc = [e["test_accuracy"] for e in result.evals]
    assert len(acc) == 12
    assert s["peak_accuracy"] == pytest.approx(max(acc))
    assert s["final_accuracy"] == pytest.approx(acc[-1])
    assert s["stable_accuracy"] == pytest.approx(np.mean(acc[-10:]))
    assert s["stability_drop"] == pytest.approx(max(acc) - acc[-1])
    counts = np.asarray(s["selection_counts"])
    assert counts.sum() == 12 * 4
    picks = [c for e in result.evals for round_picks in e["selected"] for c in round_picks]
    selected = np.bincount(picks, minlength=8)
    np.testing.assert_array_equal(counts, selected)
    assert s["selection_count_std"] == pytest.approx(counts.std())
    assert s["jain_fairness"] == pytest.approx(counts.sum() ** 2 / (8 * (counts**2).sum()))
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    for key in ("peak_accuracy", "stable_accuracy", "stability_drop", "selection_count_std"):
        assert on_disk[key] == pytest.approx(s[key])
    print_summary_table([s])
    header = capsys.readouterr().out.splitlines()[0]
    for column in ("peak acc", "stable acc", "drop", "sel std", "jain"):
        assert column in header
