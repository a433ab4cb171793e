"""``fedjax-sel demo``: the paired comparison it prints is the one its run folders give."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main
from fedjax_sel.demo import demo_spec


@pytest.mark.slow
def test_demo_prints_paired_intervals_of_its_own_runs(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--rounds", "2", "--seeds", "3",
                 "--no-progress"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "3 paired seeds per strategy" in printed
    # equal budget: every strategy trained 5 clients in each of its 2 rounds
    assert "5 clients trained a round, 10 client updates in all" in printed
    for label in ("uniform", "power_of_choice", "active_fl"):
        for s in range(3):
            log = tmp_path / "runs" / "default" / label / f"seed{s}" / "metrics.jsonl"
            records = [json.loads(line) for line in log.read_text().splitlines()]
            assert all(len(set(r)) == 5 for e in records for r in e["selected"]), label
    rows = json.loads((tmp_path / "comparison.json").read_text())
    assert {r["metric"] for r in rows} == {"final_accuracy", "stable_accuracy"}
    assert (tmp_path / "comparison.png").is_file()

    def final(label):  # from the run folders themselves, seed by seed
        return np.array([
            json.loads((tmp_path / "runs" / "default" / label / f"seed{s}" / "summary.json")
                       .read_text())["final_accuracy"]
            for s in range(3)
        ])  # fmt: skip

    base = final("uniform")
    for label in ("power_of_choice", "active_fl"):
        diff = final(label) - base
        row = next(r for r in rows if r["strategy"] == label and r["metric"] == "final_accuracy")
        half = stats.t.ppf(0.975, 2) * diff.std(ddof=1) / np.sqrt(3)
        assert row["diff"] == pytest.approx(diff.mean(), abs=1e-12)
        if half > 0:
            assert row["diff_ci_low"] == pytest.approx(diff.mean() - half, abs=1e-9)
            assert row["diff_ci_high"] == pytest.approx(diff.mean() + half, abs=1e-9)
        # the printed table is these rows
        text = f"| {label} | 3 | {row['mean']:.4f}"
        assert text in printed


def test_demo_refuses_a_single_seed():
    with pytest.raises(ConfigError, match="at least 2 seeds, got seeds=1"):
        demo_spec(seeds=1)
