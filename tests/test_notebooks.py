"""Executes every notebook under notebooks/ at a tiny size (FEDJAX_SEL_NOTEBOOK_SMALL=1) and
checks what it computes.

A cell that raises fails the run (nbclient raises ``CellExecutionError``). Each notebook ends
with a cell printing ``NOTEBOOK_RESULT {json}``: the numbers it computed, checked below against
what they must be (a planted structure recovered, a paired interval that excludes zero, a
figure drawn); the notebook's figures are counted from its outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def _result(nb) -> dict:
    for cell in reversed(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            for line in text.splitlines():
                if line.startswith("NOTEBOOK_RESULT "):
                    return json.loads(line[len("NOTEBOOK_RESULT ") :])
    raise AssertionError("the notebook printed no NOTEBOOK_RESULT line")


def _figures(nb) -> int:
    return sum(
        "image/png" in out.get("data", {})
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )


def check_quickstart(r: dict) -> None:
    acc = r["final_accuracy"]
    assert r["seeds"] == 3 and set(acc) == {"uniform", "power_of_choice", "full"}
    assert all(0.1 < a <= 1.0 for a in acc.values())  # above chance (10 classes)
    # full participation trains 6x the clients of uniform sampling on the same seeds: the
    # paired difference is positive at this size
    lo, hi = r["full_minus_uniform_ci"]
    assert lo < hi and hi > 0
    assert r["soft_loss_selected"] == 5 * r["rounds"]  # the custom strategy filled every slot


def check_sp_cacw(r: dict) -> None:
    assert r["toy_weights"][3] == 0.0  # the harmful peer
    assert r["toy_unobserved_masked"] == 0.0 < r["toy_unobserved_free"]
    assert r["unobserved_weight_masked"] == 0.0 < r["unobserved_weight_unmasked_first"]
    assert r["premise_fraction"]["smoothness"] == 1.0 and r["risk_bound_reported"]["smoothness"]
    assert r["risk_bound_reported"]["fixed"] == (r["premise_fraction"]["fixed"] > 0)
    assert r["own_cluster_mass"] > r["uniform_own_share"]


def check_filfl(r: dict) -> None:
    assert r["toy_diverged_rejected"] and r["toy_opt_ge_greedy"]
    for f in r["filter"].values():
        assert f["filtering_rounds"] >= 2 and 0 < f["kept_share"] <= 1
        assert 0 <= f["worse_removed"] <= f["worse"]
    assert all(0 < v <= 1 + 1e-6 for v in r["ratio_min"].values())


def check_ca_fed(r: dict) -> None:
    # the simulated chains hold their stationary availability (4 classes)
    for emp, pi in zip(r["empirical_pi"], r["true_pi"], strict=True):
        assert abs(emp - pi) < 0.1
    # the corrected estimator's lambda error ends below the reference code's biased one
    assert r["lambda_error_last"]["bayes"] < r["lambda_error_last"]["reference"]
    # small kappa^2 excludes the planted high-loss clients, a large one keeps everybody
    assert r["excluded"]["0.01"] > 0 and r["excluded"]["100.0"] == 0
    assert all(0.1 < a <= 1 for a in r["final_accuracy"].values()) and r["q_sum_finite"]


def check_hetero_select(r: dict) -> None:
    assert abs(r["probabilities_sum"] - 1.0) < 1e-5  # eq. 12 is a law
    # Theorem III.3 (eq. 20) bounds the stale client's probability from below
    assert r["bound_below_probability"] and r["bound_positive"]
    # every method filled its slots in every round (Oort keeps the first P of its picks)
    for label, total in r["selection_counts_total"].items():
        assert total == r["rounds"] * r["per_round"], label
    assert all(0 < j <= 1 for j in r["jain"].values())
    assert all(h > 0 for h in r["sim_hours"].values())


def check_fedcvr_bolt(r: dict) -> None:
    assert r["ari_exact"] == r["ari_landmark"] == 1.0  # planted coalitions recovered
    assert r["value_rel_error"] < 1e-4  # streaming value vector = dense C^d
    for key, sums in r.items():
        if key.startswith("prob_sums_"):
            assert all(abs(v - 1) < 1e-5 for v in sums), key  # one draw per coalition
    d = r["diagnostics"]
    zero = d["beta = 0 (coalitions only)"]
    assert abs(zero["coalition_entropy_ratio"] - 1) < 1e-5 and zero["logit_spread"] == 0
    assert d["scale-free beta = 1 (ours)"]["logit_spread"] > d["beta = 1 (paper)"]["logit_spread"]
    assert all(v == r["clients"] for v in r["coalition_sizes_sum"].values())


CHECKS = {
    "quickstart": (check_quickstart, 3),
    "fedcvr_bolt": (check_fedcvr_bolt, 4),
    "hetero_select": (check_hetero_select, 4),
    "ca_fed": (check_ca_fed, 3),
    "sp_cacw": (check_sp_cacw, 3),
    "filfl": (check_filfl, 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_computes(path, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("FEDJAX_SEL_NOTEBOOK_SMALL", "1")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    check, min_figures = CHECKS[path.stem]
    check(_result(nb))
    assert _figures(nb) >= min_figures
