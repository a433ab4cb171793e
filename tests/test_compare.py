"""Paired comparisons (``fedjax-sel compare``) against scipy.stats on planted run folders whose
true differences are known, and the reproduction verdict rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main
from fedjax_sel.experiment import compare, load_runs
from fedjax_sel.experiment.compare import markdown
from fedjax_sel.experiment.metric_table import higher_is_better, is_accuracy
from fedjax_sel.experiment.outputs import read_metrics, write_json
from fedjax_sel.experiment.per_seed import per_seed_cells, summarize_per_seed
from fedjax_sel.experiment.stats import bootstrap_ci, mean_ci, paired_stats
from fedjax_sel.experiment.verdicts import (
    holm_verdicts,
    p_values_from_ci,
    seeds_to_settle,
    t_test_p,
    verdict,
    verdict_from_p,
)

SEEDS = 8


def _write_run(folder, label, seed, finals, curve, setting=""):
    folder.mkdir(parents=True)
    config = {"strategy": label.split("-")[0], "seed": seed, "label": label}
    write_json(
        folder / "config.json", {"config": config, "sweep": {"label": label, "setting": setting}}
    )
    records = [{"round": r, "test_accuracy": a, "train_loss": 1.0 / r} for r, a in curve]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    write_json(folder / "summary.json", {"label": label, "seed": seed, **finals})


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """Three strategies over 8 seeds: a seed effect shared by all (common random numbers),
    ``better`` = base + 0.05 + small noise, ``same`` = base + noise of mean 0."""
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    seed_effect = rng.normal(0.0, 0.05, SEEDS)
    values = {
        "base": 0.7 + seed_effect,
        "better": 0.75 + seed_effect + rng.normal(0, 0.005, SEEDS),
        "same": 0.7 + seed_effect + rng.normal(0, 0.005, SEEDS),
    }
    for label, v in values.items():
        for s in range(SEEDS):
            curve = [(10, 0.4 + 0.1 * s / SEEDS), (20, v[s] - 0.1), (30, v[s])]
            _write_run(
                root / label / f"seed{s}",
                label,
                s,
                {"final_accuracy": v[s], "final_test_loss": 1 - v[s]},
                curve,
            )
    return root, values


def test_means_and_paired_differences_match_scipy(planted, tmp_path):
    root, values = planted
    rows = compare(
        [root],
        baseline="base",
        metrics=["final_accuracy", "final_test_loss"],
        out=tmp_path,
        echo=None,
    )
    by = {(r["strategy"], r["metric"]): r for r in rows}
    for label in ("base", "better", "same"):
        r = by[(label, "final_accuracy")]
        lo, hi = stats.t.interval(
            0.95, SEEDS - 1, loc=np.mean(values[label]), scale=stats.sem(values[label])
        )
        assert r["mean"] == pytest.approx(np.mean(values[label]))
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi))
        assert r["seeds"] == SEEDS
    base = by[("base", "final_accuracy")]
    assert base["diff"] is None and base["diff_ci_low"] is None and base["win_rate"] is None
    for label in ("better", "same"):
        r = by[(label, "final_accuracy")]
        d = values[label] - values["base"]
        lo, hi = stats.t.interval(0.95, SEEDS - 1, loc=d.mean(), scale=stats.sem(d))
        assert r["diff"] == pytest.approx(d.mean())
        assert (r["diff_ci_low"], r["diff_ci_high"]) == pytest.approx((lo, hi))
        assert r["p_value"] == pytest.approx(stats.ttest_rel(values[label], values["base"]).pvalue)
        assert r["diff_boot_ci_low"] <= d.mean() <= r["diff_boot_ci_high"]
    better = by[("better", "final_accuracy")]
    assert better["diff_ci_low"] > 0.04 and better["diff_ci_high"] < 0.06  # planted +0.05
    assert better["win_rate"] == 1.0
    # pairing removes the shared seed effect: the unpaired intervals overlap, the paired one
    # excludes 0
    assert by[("base", "final_accuracy")]["ci_high"] > better["ci_low"]
    same = by[("same", "final_accuracy")]
    assert same["diff_ci_low"] < 0 < same["diff_ci_high"]
    # lower is better for a loss: the win rate counts lower values as wins
    assert by[("better", "final_test_loss")]["win_rate"] == 1.0
    assert not by[("better", "final_test_loss")]["higher_is_better"]
    # the files
    written = json.loads((tmp_path / "comparison.json").read_text())
    keys = "strategy metric seeds mean ci_low ci_high diff diff_ci_low diff_ci_high win_rate"
    assert all(set(keys.split()) <= set(r) for r in written)
    assert (tmp_path / "comparison.csv").read_text().startswith("strategy,")
    assert "| better | 8 |" in (tmp_path / "comparison.md").read_text()
    assert (tmp_path / "comparison.png").stat().st_size > 10_000


def test_curve_metrics_and_rounds_to_target(planted):
    root, values = planted
    rows = compare([root], baseline="base", metrics=[], at_rounds=[20], targets=[0.75], echo=None)
    by = {(r["strategy"], r["metric"]): r for r in rows}
    assert by[("better", "accuracy@20")]["mean"] == pytest.approx(np.mean(values["better"]) - 0.1)
    reached = [s for s in range(SEEDS) if values["better"][s] >= 0.75]
    r = by[("better", "rounds_to:0.75")]
    assert r["seeds"] == len(reached) and r["runs"] == SEEDS
    assert not r["higher_is_better"]


def test_bootstrap_interval_and_small_samples():
    d = np.array([0.1, 0.2, 0.15, 0.12, 0.18])
    lo, hi = bootstrap_ci(d)
    means = np.random.default_rng(0).choice(d, (10_000, d.size)).mean(1)
    assert lo == pytest.approx(np.quantile(means, 0.025), abs=0.01)
    assert hi == pytest.approx(np.quantile(means, 0.975), abs=0.01)
    assert mean_ci([0.3]) == (0.3, None, None)  # one seed: no interval
    assert paired_stats([1.0, 2.0], [1.0, 2.0])["p_value"] == 1.0  # identical pairs


def test_cli_compare_and_missing_baseline(planted, tmp_path, capsys):
    root, _ = planted
    assert main(["compare", str(root), "--baseline", "base", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "comparison.json").exists()
    assert main(["compare", str(root), "--baseline", "nope"]) == 2
    assert "baseline 'nope' not found" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing")]) == 2
    assert "missing' does not exist" in capsys.readouterr().err


def test_compare_refuses_a_metrics_file_with_a_corrupt_middle_line(planted, tmp_path, capsys):
    """A corrupt line in the middle of ``metrics.jsonl`` is exit 2 naming the file and the
    line, not the curve up to there reported as the run's (``accuracy@30`` used to print
    round 20's accuracy)."""
    root, _ = planted
    copy = tmp_path / "runs"
    for label in ("base", "better"):
        for s in range(2):
            src, dst = root / label / f"seed{s}", copy / label / f"seed{s}"
            dst.mkdir(parents=True)
            for f in src.iterdir():
                (dst / f.name).write_bytes(f.read_bytes())
    bad = copy / "better" / "seed1" / "metrics.jsonl"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1][:15], lines[2]]) + "\n")
    assert main(["compare", str(copy), "--baseline", "base", "--at-round", "30"]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl' line 2 is not valid JSON" in err and str(bad) in err
    assert "Traceback" not in err


def test_read_metrics_ignores_only_the_lines_past_a_resumes_record_count(tmp_path):
    """A resume reads the first ``limit`` records (what its checkpoint says is valid): the
    lines after them, perhaps cut short by the crash, are ignored there and nowhere else."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 2}\n{"round": 4}\n{"rou')
    assert read_metrics(path, limit=2) == [{"round": 2}, {"round": 4}]
    with pytest.raises(ConfigError, match="line 3 is not valid JSON"):
        read_metrics(path)
    path.write_text('{"round": 2}\n[1, 2]\n')
    with pytest.raises(ConfigError, match="line 2 is not an evaluation record"):
        read_metrics(path)


def test_compare_on_a_sweep_folder_pairs_against_the_sweeps_own_baseline(planted, tmp_path):
    """``sweep.json`` says ``[sweep] baseline = "same"``: compare uses it without
    ``--baseline`` (it used to take the first label alphabetically, ``base``); an explicit
    ``--baseline`` still wins."""
    root, _ = planted
    # no cell list: every run under the folder is compared (a listed sweep reads its cells)
    write_json(root / "sweep.json", {"source": {"sweep": {"baseline": "same"}}})
    try:
        rows = compare([root], metrics=["final_accuracy"], echo=None)
        assert {r["baseline"] for r in rows} == {"same"}
        assert [r["strategy"] for r in rows if r["diff"] is None] == ["same"]
        rows = compare([root], baseline="base", metrics=["final_accuracy"], echo=None)
        assert {r["baseline"] for r in rows} == {"base"}
    finally:
        (root / "sweep.json").unlink()


def test_unknown_metric_is_an_error_listing_the_valid_forms(planted, capsys):
    """``--metric`` with a name no run has (or a malformed ``accuracy@R``) exits 2 listing the
    forms; it used to print nothing and exit 0."""
    root, _ = planted
    for bad in ("final_acuracy", "accuracy@x", "rounds_to:high"):
        assert main(["compare", str(root), "--metric", bad]) == 2
        err = capsys.readouterr().err
        assert f"unknown metric {bad!r}" in err
        assert "final_accuracy" in err and "accuracy@R" in err and "rounds_to:A" in err
    assert main(["compare", str(root), "--metric", "final_test_loss"]) == 0
    capsys.readouterr()


def test_diverged_and_nan_runs_are_left_out_with_a_count(planted, tmp_path):
    """A diverged run (``diverged: true``) is left out of the means, intervals and pairs, and
    its row counts it; a summary NaN (or null) of a run that did not diverge gives no ``nan``
    row: that run is left out (``seeds`` < ``runs``)."""
    root, values = planted
    runs = load_runs([root])
    for r in runs:
        if r.label == "better" and r.seed in (0, 1):
            r.summary = {**r.summary, "diverged": True, "final_accuracy": None}
        if r.label == "same" and r.seed == 2:
            r.summary = {**r.summary, "final_accuracy": float("nan")}
        if r.label == "base" and r.seed == 3:
            r.summary = {**r.summary, "diverged": True}  # its pairs go too
    rows = compare(runs=runs, baseline="base", metrics=["final_accuracy"], echo=None)
    by = {r["strategy"]: r for r in rows}
    assert [by[s]["diverged"] for s in ("base", "better", "same")] == [1, 2, 0]
    assert by["better"]["seeds"] == SEEDS - 2 and by["better"]["runs"] == SEEDS
    kept = [s for s in range(SEEDS) if s not in (0, 1)]
    assert by["better"]["mean"] == pytest.approx(np.mean(values["better"][kept]))
    assert by["better"]["pairs"] == len(kept) - 1  # the baseline's seed 3 diverged
    assert by["same"]["seeds"] == SEEDS - 1 and np.isfinite(by["same"]["mean"])
    table = markdown(rows)
    assert "| diverged |" in table and "nan" not in table
    assert f"| better | {SEEDS - 2} of {SEEDS} | 2 |" in table
    # every run of a strategy diverged: a row that says so, with no number
    for r in runs:
        if r.label == "better":
            r.summary = {**r.summary, "diverged": True}
    rows = compare(runs=runs, baseline="base", metrics=["final_accuracy"], echo=None)
    row = next(r for r in rows if r["strategy"] == "better")
    assert row["diverged"] == SEEDS and row["seeds"] == 0 and row["mean"] is None
    assert f"| better | 0 of {SEEDS} | {SEEDS} | - |" in markdown(rows)


def test_spreads_and_losses_are_lower_is_better_as_in_the_suite():
    """A larger spread of accuracy across clients is worse (``higher_is_better`` said True,
    so compare counted it as a win); compare agrees with the suite on the metrics both use."""
    from fedjax_sel.experiment.metric_table import CELL_METRICS

    for metric in (
        "final_client_test_accuracy_std",
        "selection_count_std",
        "selection_count_cv",
        "stability_drop",
        "best_test_loss",
        "final_test_loss",
        "rounds_to:0.8",
        "time_to:0.8",
    ):
        assert not higher_is_better(metric), metric
    for metric in ("final_accuracy", "jain_fairness", "accuracy@20", "peak_accuracy"):
        assert higher_is_better(metric), metric
    lower = {"rounds_to_target", "time_to_target", "client_accuracy_std", "deadline_hit_share"}
    for metric in CELL_METRICS:  # the suite's cells, by their meaning
        assert higher_is_better(metric) == (metric not in lower), metric
    # one definition of each, the metric table's, in the whole package
    package = Path(__file__).resolve().parents[1] / "fedjax_sel"
    for name in ("higher_is_better", "is_accuracy"):
        defs = [p for p in package.rglob("*.py") if f"def {name}(" in p.read_text()]
        assert [p.name for p in defs] == ["metric_table.py"], (name, defs)


def test_percent_reports_accuracies_in_percent_and_differences_in_points(planted, tmp_path):
    """``--percent``: accuracies x 100 (differences in pp, as papers quote them), losses and
    rounds-to-target untouched, and the unit named in every row and in the table."""
    root, values = planted
    argv = ["compare", str(root), "--baseline", "base", "--metric", "final_accuracy"]
    argv += ["--metric", "final_test_loss", "--at-round", "20", "--target", "0.75"]
    assert main([*argv, "--percent", "--out", str(tmp_path)]) == 0
    by = {
        (r["strategy"], r["metric"]): r
        for r in json.loads((tmp_path / "comparison.json").read_text())
    }
    d = 100 * (values["better"] - values["base"])
    lo, hi = stats.t.interval(0.95, SEEDS - 1, loc=d.mean(), scale=stats.sem(d))
    r = by[("better", "final_accuracy")]
    assert r["unit"] == "percent" and r["mean"] == pytest.approx(100 * np.mean(values["better"]))
    assert (r["diff"], r["diff_ci_low"], r["diff_ci_high"]) == pytest.approx((d.mean(), lo, hi))
    assert r["diff_boot_ci_low"] <= d.mean() <= r["diff_boot_ci_high"] and r["win_rate"] == 1.0
    at20 = by[("better", "accuracy@20")]
    assert at20["unit"] == "percent"
    assert at20["mean"] == pytest.approx(100 * (np.mean(values["better"]) - 0.1))
    loss = by[("better", "final_test_loss")]
    assert loss["unit"] is None and loss["diff"] == pytest.approx(-d.mean() / 100)
    reached = by[("better", "rounds_to:0.75")]  # the target stays a fraction
    assert reached["unit"] is None and reached["seeds"] == int(np.sum(values["better"] >= 0.75))
    # the summary's seconds to an accuracy are a cost, not an accuracy
    assert not is_accuracy("time_to_accuracy_s") and not higher_is_better("time_to_accuracy_s")
    assert is_accuracy("final_client_test_accuracy_mean") and not is_accuracy("final_test_loss")
    table = (tmp_path / "comparison.md").read_text()
    assert "in %, differences in percentage points" in table
    assert f"{d.mean():+.2f} [{lo:+.2f}, {hi:+.2f}]" in table


@pytest.mark.parametrize(
    "lo, hi, claimed, want",
    [
        (0.5, 2.0, 1.0, "reproduced"),  # excludes 0 on the claimed side, holds the claim
        (0.1, 0.4, 1.0, "smaller_effect"),  # ... but lies below the claimed size
        (1.5, 3.0, 1.0, "larger_effect"),  # ... or above it
        (-0.5, 0.4, 1.0, "not_reproduced"),  # excludes the claim, not above 0
        (-3.0, -1.0, 1.0, "not_reproduced"),  # the opposite direction
        (-0.5, 1.5, 1.0, "inconclusive"),  # contains both 0 and the claim
        (-2.0, -0.5, -1.0, "reproduced"),  # a claimed decrease
        (-0.5, -0.1, -1.0, "smaller_effect"),
        (-0.5, 0.5, -1.0, "not_reproduced"),
        (0.1, 5.0, 0.0, "reproduced"),  # a direction only: any size on the better side
        (-1.0, 1.0, 0.0, "inconclusive"),
        (-1.0, -0.1, 0.0, "not_reproduced"),
        (None, None, 1.0, "inconclusive"),  # one seed
    ],
)
def test_verdict_rules(lo, hi, claimed, want):
    assert verdict(lo, hi, claimed) == want


def test_p_values_give_the_interval_verdict_and_come_back_from_the_interval():
    """At 0.05 the two t-tests (against 0 and against the claim) decide as the 95% interval
    does; the committed rows' p-values are recomputed from their intervals the same way."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(3, 12))
        d = rng.normal(rng.normal(0, 1.5), rng.uniform(0.1, 2.0), n)
        claimed = float(rng.choice([0.0, 1.0, -1.0, 2.5]))
        m, lo, hi = mean_ci(d)
        p0, pd = t_test_p(d), t_test_p(d, claimed)
        t0 = stats.ttest_1samp(d, 0.0).pvalue
        assert p0 == pytest.approx(t0, rel=1e-9)
        assert pd == pytest.approx(stats.ttest_1samp(d, claimed).pvalue, rel=1e-9)
        assert verdict_from_p(m, p0, pd, claimed) == verdict(lo, hi, claimed)
        q0, qd = p_values_from_ci(m, lo, hi, n, claimed)
        assert (q0, qd) == pytest.approx((p0, pd), rel=1e-7, abs=1e-12)


def test_holm_verdicts_hold_the_family_wise_level():
    """Three claims whose unadjusted p-values against 0 are 0.01, 0.02 and 0.04: Holm makes
    them 0.03, 0.04 and 0.04, so all stay below 0.05; with a fourth claim at 0.30 the first
    becomes 0.04, the second 0.06 and the third 0.08: only one stays reproduced."""

    def row(p0, verdict="reproduced", diff=1.0, claimed=1.0):
        return {"verdict": verdict, "p_zero": p0, "p_paper": 0.9, "diff_mean": diff,
                "paper_diff": claimed}  # fmt: skip

    three = [row(0.01), row(0.02), row(0.04)]
    assert holm_verdicts(three) == ["reproduced"] * 3
    four = [*three, row(0.30, "inconclusive")]
    assert holm_verdicts(four) == ["reproduced", "inconclusive", "inconclusive", "inconclusive"]
    # a not-evidence row stays so and does not enlarge the family
    assert holm_verdicts([*three, row(0.30, "not_evidence")])[:3] == ["reproduced"] * 3
    assert holm_verdicts([row(0.30, "not_evidence")]) == ["not_evidence"]


def test_seeds_to_settle_is_where_the_interval_would_exclude_0_or_the_claim():
    d = np.array([0.2, -0.1, 0.5, 0.1, 0.3])
    n = seeds_to_settle(d, claimed=2.0)
    m, sd = d.mean(), d.std(ddof=1)
    gap = max(abs(m), abs(2.0 - m))
    half = lambda k: stats.t.ppf(0.975, k - 1) * sd / np.sqrt(k)  # noqa: E731
    assert half(n) < gap and (n == d.size or half(n - 1) >= gap)


def test_per_seed_holds_a_claim_metric_for_every_method_of_its_setting(tmp_path):
    """A claim's metric that is not a summary key (``accuracy@R``) goes into ``per_seed.json``
    for every method of the claim's setting, not only the claim's two arms: a paired
    comparison of all methods against one baseline (``paired_vs_*``) reads them all, and must
    rebuild from the committed file. Methods of another setting do not get it."""
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment.loop import RunResult
    from fedjax_sel.experiment.study import Study
    from fedjax_sel.experiment.verdicts import Claim

    study = Study("x", profile="paper", size="cpu", seeds=2, out=tmp_path, progress=False)
    base = RunConfig(dataset="digits", rounds=4)
    labels = {"A": "uniform", "B": "full", "C": "power_of_choice"}
    for label, strategy in labels.items():
        study.add("s", label, base.replace(strategy=strategy))
    study.add("t", "D", base.replace(strategy="oort"))
    for i, (setting, label) in enumerate(study.cells):
        study.results[(setting, label)] = [
            RunResult(
                c.config,
                [{"round": 2, "test_accuracy": 0.1 * i + 0.01 * s}],
                {"final_accuracy": 0.5 + 0.1 * i},
                out_dir=c.out,
            )
            for s, c in enumerate(study.cells[(setting, label)])
        ]
    cells = study.per_seed([Claim("c", "s", "A", "B", "accuracy@2", 1.0)])
    for label, i in (("A", 0), ("B", 1), ("C", 2)):
        seeds = cells[f"s/{label}"]["seeds"]
        assert seeds == {str(s): {"accuracy@2": 0.1 * i + 0.01 * s} for s in (0, 1)}, label
    assert "t/D" not in cells  # no claim reads setting t, and no run folder exists


def test_a_per_seed_statistic_is_recomputed_from_the_per_seed_file(tmp_path):
    """``Study.per_seed_stat`` (a results.json number that is not a claim: a premise, a
    table cell, a mechanism row) puts its metric into ``per_seed.json`` for the cells it read,
    though no claim reads them, and the per-seed values alone give it back bit for bit; its
    numbers are the mean and t interval of the planted values (or of their paired
    differences)."""
    from fedjax_sel.base import ConfigError
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment.loop import RunResult
    from fedjax_sel.experiment.per_seed import per_seed_stat
    from fedjax_sel.experiment.stats import paired_stats
    from fedjax_sel.experiment.study import Study

    study = Study("x", profile="paper", size="cpu", seeds=4, out=tmp_path, progress=False)
    base = RunConfig(dataset="digits", rounds=4)
    study.add("s", "A", base.replace(strategy="uniform"))
    study.add("s", "B", base.replace(strategy="full"))
    planted = {"A": [0.30, 0.50, 0.20, 0.40], "B": [0.10, 0.45, 0.05, 0.20]}
    for (setting, label), cells in study.cells.items():
        study.results[(setting, label)] = [
            RunResult(c.config, [{"round": 3, "test_accuracy": planted[label][s]}], {},
                      out_dir=c.out)
            for s, c in enumerate(cells)
        ]  # fmt: skip
    single = study.per_seed_stat("s", "A", "accuracy@3", 100.0)
    paired = study.per_seed_stat("s", "A", "accuracy@3", 100.0, baseline="B")
    tested = study.per_seed_stat("s", "A", "accuracy@3", 100.0, baseline="B", test=True)
    a, b = 100 * np.asarray(planted["A"]), 100 * np.asarray(planted["B"])
    for stat, v in ((single, a), (paired, a - b)):
        half = stats.t.ppf(0.975, 3) * v.std(ddof=1) / 2
        assert stat["mean"] == pytest.approx(v.mean())
        assert (stat["ci_low"], stat["ci_high"]) == pytest.approx(
            (v.mean() - half, v.mean() + half)
        )
        assert stat["seeds"] == 4
    assert {k: tested[k] for k in paired_stats(a, b)} == pytest.approx(paired_stats(a, b))
    cells = study.per_seed([])  # no claims: the statistics alone put the metric there
    for label in "AB":
        assert [v["accuracy@3"] for v in cells[f"s/{label}"]["seeds"].values()] == planted[label]
    for stat in (single, paired, tested):
        src = stat["from_per_seed"]
        again = per_seed_stat(cells, src["arm"], src["metric"], src["scale"], src["baseline"],
                              test=src.get("test", False))  # fmt: skip
        assert again == stat
    with pytest.raises(ConfigError, match="needs a baseline"):
        per_seed_stat(cells, "s/A", "accuracy@3", test=True)


def test_per_seed_means_of_diagnostics_come_back_from_the_per_seed_file(tmp_path):
    """Diagnostics a reproduction reduces from each run's curves (a number or an array per
    seed) go into ``per_seed.json`` under a prefix; their means over seeds (element-wise for
    arrays, over the seeds that have the key) come back from the file alone."""
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment.loop import RunResult
    from fedjax_sel.experiment.per_seed import recompute_from_per_seed
    from fedjax_sel.experiment.study import Study

    study = Study("x", profile="paper", size="cpu", seeds=3, out=tmp_path, progress=False)
    study.add("s", "A", RunConfig(dataset="digits", rounds=4, strategy="uniform"))
    study.results[("s", "A")] = [
        RunResult(c.config, [], {"final_accuracy": 0.5}, out_dir=c.out)
        for c in study.cells[("s", "A")]
    ]
    by_seed = {
        0: {"ratio": 0.25, "sizes": [4.0, 2.0], "never": 1.0},
        1: {"ratio": 0.75, "sizes": [5.0, 1.0]},
        2: {"ratio": 0.5, "sizes": [3.0, 3.0], "never": 4.0},
    }
    means = study.per_seed_means("s", "A", by_seed)
    assert means["ratio"] == 0.5 and means["sizes"] == [4.0, 2.0] and means["never"] == 2.5
    cells = study.per_seed([])
    assert cells["s/A"]["seeds"]["1"] == {"diagnostic.ratio": 0.75, "diagnostic.sizes": [5.0, 1.0]}
    assert recompute_from_per_seed(cells, means) == means


@pytest.mark.parametrize("derive", ["subprocess:run", "os:system", "os.system", ["x"]])
def test_a_results_file_naming_an_import_path_as_derive_runs_nothing(tmp_path, derive):
    """A ``results.json`` statistic names its ``derive`` from a fixed registry of library
    functions; one naming an import path (``subprocess:run``, ``os:system``) or anything
    unregistered is refused with a ConfigError naming it and the known names, and nothing it
    names is called (the marker file is never created)."""
    from fedjax_sel.base import ConfigError
    from fedjax_sel.experiment.per_seed import DERIVES, not_recomputed

    marker = tmp_path / "ran"
    # the means dict's keys are the command: subprocess.run(means) used to run `touch marker`
    keys = ["touch", str(marker)]
    cells = {"s/A": {"label": "A", "seeds": {"0": {f"diagnostic.{k}": 1.0 for k in keys}}}}
    source = {"arm": "s/A", "prefix": "diagnostic.", "keys": keys, "derive": derive,
              "derive_args": {}}  # fmt: skip
    results = {"row": {"from_per_seed": source, "touch": 1.0}}
    with pytest.raises(ConfigError, match=r"unknown derive .*known: .*ca_fed\.tuning_score"):
        not_recomputed(results, cells)
    assert not marker.exists()
    assert {"ca_fed.tuning_score", "ca_fed.class_shares", "ca_fed.class_weights"} <= set(DERIVES)


def test_per_seed_cells_record_which_seeds_ran_vmapped_together(tmp_path):
    """``per_seed.json`` says how each configuration's seeds were batched (a seed's last bits
    can depend on its batch): every distinct ``seeds_vmapped`` of its runs' ``config.json``,
    once, sorted; runs whose ``config.json`` does not say add nothing. The means do not read
    it."""
    runs = tmp_path / "runs"
    planted = {"s/A": {0: [0, 1, 2], 1: [2, 0, 1], 2: [0, 1, 2], 3: [4, 3], 4: [3, 4]},
               "s/B": {0: None, 1: None}}  # fmt: skip
    for cell, seeds in planted.items():
        for seed, together in seeds.items():
            d = runs / cell / f"seed{seed}"
            d.mkdir(parents=True)
            write_json(d / "summary.json", {"label": cell[2:], "seed": seed,
                                            "final_accuracy": 0.5 + 0.01 * seed})  # fmt: skip
            write_json(d / "config.json", {} if together is None else {"seeds_vmapped": together})
    cells = per_seed_cells(tmp_path)
    assert cells["s/A"]["batches"] == [[0, 1, 2], [3, 4]]
    assert cells["s/B"]["batches"] == []
    assert list(cells["s/A"]["seeds"]) == ["0", "1", "2", "3", "4"]
    row = summarize_per_seed(cells)["s/A"]
    assert row["seeds"] == [0, 1, 2, 3, 4]
    assert row["final_accuracy"]["mean"] == pytest.approx(100 * (0.5 + 0.02))


def test_a_study_runs_its_cells_as_its_execution_says(tmp_path, monkeypatch, capsys):
    """``Study(execution=Execution(seeds_together=N))`` hands N to ``run_cells`` (default
    ``"auto"``), and every reproduction takes an ``execution``, so ``fedjax-sel reproduce
    --seeds-together N`` reaches the runs. ``only_seeds`` runs those seeds' cells alone and
    stops before anything is read (``SeedsRunOnly``, naming the count); seeds that select no
    run, a batch that is not a positive number and malformed seed lists are refused, naming
    the value."""
    import inspect

    from fedjax_sel.base import ConfigError
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment import study as study_lib
    from fedjax_sel.experiment.execution import Execution, SeedsRunOnly
    from fedjax_sel.experiment.reproductions import REPRODUCTIONS
    from fedjax_sel.experiment.study import Study

    seen = []

    def fake_run_cells(cells, *, seeds_together="auto", **_):
        seen.append(([c.config.seed for c in cells], seeds_together))
        return [None] * len(cells)

    monkeypatch.setattr(study_lib, "run_cells", fake_run_cells)
    base = RunConfig(dataset="leaf_synthetic", num_clients=10, per_round=2, rounds=2)

    def study(name, **kw):
        s = Study("p", profile="paper", size="cpu", seeds=4, out=tmp_path / name, **kw)
        s.add("s", "A", base)
        s.add("s", "B", base.replace(strategy="power_of_choice"))
        return s

    study("auto").run()
    study("three", execution=Execution(seeds_together=3)).run()
    assert seen == [([0, 1, 2, 3] * 2, "auto"), ([0, 1, 2, 3] * 2, 3)]
    with pytest.raises(SeedsRunOnly, match=r"ran 4 runs \(seeds \[1, 3\] of every"):
        study("part", execution=Execution(only_seeds=(1, 3))).run()
    assert seen[-1] == ([1, 3, 1, 3], "auto")
    with pytest.raises(ConfigError, match=r"only_seeds \[7\] selects no run \(seeds 0 to 3"):
        study("none", execution=Execution(only_seeds=(7,))).run()
    for bad in ({"seeds_together": 0}, {"seeds_together": "many"}, {"only_seeds": (-1,)}):
        with pytest.raises(ConfigError, match=str(next(iter(bad.values())))):
            Execution(**bad)
    for name in REPRODUCTIONS:
        params = inspect.signature(REPRODUCTIONS[name].factory).parameters
        assert params["execution"].default is None, name
    for flag, bad in (("--seeds-together", "0"), ("--seeds-together", "many"),
                      ("--only-seeds", "3-x"), ("--only-seeds", "-2")):  # fmt: skip
        argv = ["reproduce", "hetero-select", flag, bad, "--out", str(tmp_path)]
        assert main(argv) == 2
        assert f"{flag} must be" in capsys.readouterr().err
