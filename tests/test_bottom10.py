"""The bottom-10% client accuracy (issue 54's metrics): the mean test accuracy of the worst
``ceil(n / 10)`` of the ``n`` clients that hold test data, checked against a NumPy transcription
on planted accuracies, through the engine's evaluation on a planted model, and carried from a
run's last evaluation to its summary and a suite cell's record."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_simulation import planted_logreg

from fedjax_sel.benchmark.cells import cell_metrics
from fedjax_sel.benchmark.suite import Task
from fedjax_sel.config import RunConfig
from fedjax_sel.engine.oracle import bottom_tenth_mean
from fedjax_sel.experiment import run_experiment
from fedjax_sel.experiment.metric_table import CELL_METRICS, metric
from fedjax_sel.training import HParams


def _reference(acc: np.ndarray, has: np.ndarray) -> float:
    """The definition written out: sort the accuracies of the clients with test data, average
    the lowest ceil(n / 10) (0 when no client has test data)."""
    ranked = sorted(float(a) for a, h in zip(acc, has, strict=True) if h)
    if not ranked:
        return 0.0
    take = math.ceil(len(ranked) / 10)
    return sum(ranked[:take]) / take


@pytest.mark.parametrize(
    ("clients", "with_data"),
    [(23, 17), (40, 31), (12, 10), (30, 30), (9, 1), (5, 0), (101, 99), (64, 21)],
)
def test_bottom_tenth_matches_the_written_out_definition(clients, with_data):
    """n not a multiple of 10 (17 -> 2 clients, 31 -> 4, 99 -> 10, 21 -> 3), a multiple (10
    -> 1, 30 -> 3), one client, none; clients without data carry accuracies (even 0 and NaN)
    that must not count."""
    rng = np.random.default_rng(clients * 100 + with_data)
    acc = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0], size=clients).astype(np.float32)  # ties
    acc += rng.uniform(0, 0.1, size=clients).astype(np.float32) * (rng.random(clients) < 0.5)
    has = np.zeros(clients, bool)
    has[rng.choice(clients, size=with_data, replace=False)] = True
    acc[~has] = np.where(rng.random(np.sum(~has)) < 0.5, 0.0, np.nan)
    got = float(jax.jit(bottom_tenth_mean)(jnp.asarray(acc), jnp.asarray(has)))
    assert got == pytest.approx(_reference(acc, has), abs=1e-6)


def test_bottom_tenth_is_the_lowest_of_a_planted_ranking():
    """23 clients with test data, accuracies 0.01 .. 0.23: ceil(2.3) = 3, so (0.01 + 0.02 +
    0.03) / 3 = 0.02, whatever the order and however many clients hold no test data."""
    acc = np.concatenate([np.arange(1, 24) / 100, np.zeros(7)]).astype(np.float32)
    has = np.arange(30) < 23
    order = np.random.default_rng(0).permutation(30)
    got = bottom_tenth_mean(jnp.asarray(acc[order]), jnp.asarray(has[order]))
    assert float(got) == pytest.approx(0.02, abs=1e-7)


def test_the_engines_evaluation_reports_the_bottom_tenth_of_its_clients():
    """A planted logistic model on 13 clients with own test splits, two of them empty: the
    evaluation's ``client_test_accuracy_bottom10`` is the mean of the lowest ceil(11 / 10) = 2
    per-client accuracies, each computed here with NumPy from the model's weights."""
    rng = np.random.default_rng(3)
    train_sizes = rng.integers(4, 10, 13).tolist()
    test_sizes = rng.integers(3, 12, 13).tolist()
    test_sizes[4] = test_sizes[9] = 0

    sim, params, vxs, vys = planted_logreg(rng, train_sizes, test_sizes)
    scores = sim.evaluate(sim.init(0, params=params, hparams=HParams.of(0.1)))
    w = np.asarray(params["Dense_0"]["kernel"])
    b = np.asarray(params["Dense_0"]["bias"])
    accs = [np.mean((x @ w + b).argmax(1) == y) for x, y in zip(vxs, vys, strict=True) if len(y)]
    assert len(accs) == 11
    worst = np.sort(accs)[:2].mean()
    assert scores["client_test_accuracy_bottom10"] == pytest.approx(worst, abs=1e-6)
    assert scores["client_test_accuracy_bottom10"] <= scores["client_test_accuracy_mean"]


def test_a_runs_summary_and_a_suite_cell_carry_the_last_evaluations_bottom_tenth(tmp_path):
    """``final_client_test_accuracy_bottom10`` in the summary is the last evaluation's value;
    a suite cell records it as ``client_accuracy_bottom10``, an accuracy where higher is
    better."""
    config = RunConfig(
        dataset="digits",
        num_clients=12,
        partition="dirichlet:0.5",
        per_round=3,
        rounds=4,
        local_steps=2,
        batch_size=16,
        eval_every=2,
        test_fraction=0.3,
    )
    result = run_experiment(config, tmp_path / "run", progress=False, echo=lambda *_: None)
    last = result.evals[-1]["client_test_accuracy_bottom10"]
    assert 0.0 <= last <= result.evals[-1]["client_test_accuracy_mean"]
    assert result.summary["final_client_test_accuracy_bottom10"] == last
    metrics = cell_metrics(result.evals, result.summary, result.config, Task("t", {}))
    assert metrics["client_accuracy_bottom10"] == pytest.approx(last)
    assert "client_accuracy_bottom10" in CELL_METRICS
    for name in ("client_accuracy_bottom10", "final_client_test_accuracy_bottom10"):
        assert metric(name).higher_is_better and metric(name).is_accuracy
