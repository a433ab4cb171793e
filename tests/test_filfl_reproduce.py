"""The FilFL reproduction: the code profile's configurations, the reference code's 34 filtering
windows, the metrics read from run records, the premise line, the paper-size data sets on fake
files, and a tiny end-to-end run (verdicts.json; a changed configuration is recomputed)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data import load_dataset, shakespeare
from fedjax_sel.data.dataset_shakespeare_filfl import (
    CODE_FILTER_TARGETS,
    CODE_FILTER_WINDOWS,
    code_windows,
)
from fedjax_sel.experiment.compare import Run
from fedjax_sel.experiment.reproductions import REPRODUCTIONS
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.experiment.run import RunResult
from fedjax_sel.experiment.verdicts import VERDICTS
from studies import filfl as repro
from studies import filfl_setup as setup

PAPER = setup.SCALES["paper"]

# The tiny end-to-end run's values (per_seed.json: cell -> seed -> metric) at the commit that
# pinned them. A change that moves them changes the reproduction's results: update them only on
# purpose, and say why in the commit message. rel=1e-4 leaves room for another x86 CPU's last
# bits (other XLA CPU code generation moved them by 2e-7 at most), not for a real change.
# Fig. 11 trains one arm (both greedies read from its one tracked run); the baseline is the
# paper's bound, a constant.
PINNED_TINY_VALUES = {
    "ratio/FilFL_DGF__RS____brute_force": {
        0: {
            "diagmin:ratio_dgf": 0.99766999,
            "diagmin:ratio_rgf": 0.99834001,
            "final_accuracy": 0.24581005,
        },
        1: {"final_test_loss": 2.1898859},
    },
    "ratio/0.96_x_OPT__paper_s_bound_": {0: {"diagmin:ratio_dgf": 0.96}},
}


# ----------------------------------------------------------------------------- configurations
def test_code_profile_configurations():
    """Shakespeare as the reference code ran it: FilFL samples at random after the filter,
    FedAvg's PoC ranks every available client (d = n), a random-selection control, SGD with
    momentum 0.9 and weight decay 1e-4 in persistent buffers, one epoch of 64 at lr 0.8, the
    code's filtering windows, f(empty) = 0 and DGF ties added, the availability redrawn in
    each of the first 5 rounds, FedProx mu = 0.001."""
    task = PAPER.shakespeare
    methods = setup.main_methods("code")
    labels = [m.label("code") for m in methods]
    assert labels == [
        "FedAvg (PoC)",
        "FedAvg (RS)",
        "FilFL DGF (RS)",
        "FilFL RGF (RS)",
        "FedProx (RS)",
        "FilFL DGF (FedProx, RS)",
        "FilFL RGF (FedProx, RS)",
    ]
    configs = {m.label("code"): setup.make_config(m, task, "code") for m in methods}
    for cfg in configs.values():
        resolve(cfg)  # every option is known to its registry
        assert (cfg.num_clients, cfg.per_round, cfg.rounds) == (143, 10, 200)
        assert (cfg.momentum, cfg.weight_decay, cfg.persistent_client_state) == (0.9, 1e-4, True)
        assert (cfg.lr, cfg.local_epochs, cfg.local_steps, cfg.batch_size) == (0.8, 1, None, 64)
        assert cfg.availability == "subset:n=100,every=5,warmup=5"
        assert cfg.dataset_args["filter_text"] == "code" and cfg.data_seed == 0
        assert cfg.model == "lstm" and cfg.model_args == {}  # the 8-dim + 2 x 256 LSTM
    poc = configs["FedAvg (PoC)"]
    assert (poc.strategy, poc.strategy_args) == (
        "power_of_choice",
        {"d": 100, "weighting": "uniform"},
    )
    assert configs["FedAvg (RS)"].strategy_args == {"weighting": "uniform"}
    rgf = configs["FilFL RGF (RS)"]
    assert rgf.strategy == "filfl" and rgf.prox_mu == 0.0
    assert rgf.strategy_args == {
        "inner": "uniform",
        "variant": "rgf",
        "period": 5,
        "considered": 100,
        "filter_size": 34,
        "weighting": "uniform",
        "empty_value": "code",
        "ties": "add",
    }
    assert configs["FilFL DGF (RS)"].strategy_args["variant"] == "dgf"
    for label in ("FedProx (RS)", "FilFL DGF (FedProx, RS)", "FilFL RGF (FedProx, RS)"):
        assert configs[label].prox_mu == 0.001
    # the code's FEMNIST training on the image task
    img = setup.make_config(setup.RS, PAPER.image, "code")
    assert (img.lr, img.local_epochs, img.batch_size, img.momentum) == (0.003, 2, 16, 0.9)


def test_paper_profile_keeps_the_text():
    """The paper profile: PoC on the filtered set, plain SGD, the ECAI introduction, R(empty)
    infeasible and DGF's ties removed (the defaults)."""
    task = PAPER.shakespeare
    labels = [m.label("paper") for m in setup.main_methods("paper")]
    assert labels[:3] == ["FedAvg (PoC)", "FilFL DGF (PoC)", "FilFL RGF (PoC)"]
    cfg = setup.make_config(setup.filfl_methods("poc")[0], task, "paper")
    assert cfg.strategy_args["inner"] == "power_of_choice"
    assert cfg.strategy_args["inner_args"] == "d=100"
    assert "empty_value" not in cfg.strategy_args and "ties" not in cfg.strategy_args
    assert (cfg.momentum, cfg.weight_decay, cfg.persistent_client_state) == (0.0, 0.0, False)
    assert cfg.availability == "subset:n=100,every=5"
    assert cfg.dataset_args["filter_text"] == "introduction"
    claims = setup.main_claims("shakespeare", "paper")
    assert [(c.label, c.baseline, c.paper_diff) for c in claims] == [
        ("FilFL DGF (PoC)", "FedAvg (PoC)", 10.0),
        ("FilFL RGF (PoC)", "FedAvg (PoC)", 10.0),
        ("FilFL DGF (FedProx, RS)", "FedProx (RS)", 3.0),
        ("FilFL RGF (FedProx, RS)", "FedProx (RS)", 6.0),
    ]
    assert {c.metric for c in claims} == {"tail:test_accuracy"}
    code = setup.main_claims("shakespeare", "code")  # as coded: FilFL (RS) vs FedAvg (PoC)
    assert (code[0].label, code[0].baseline) == ("FilFL DGF (RS)", "FedAvg (PoC)")
    assert {c.metric for c in code} == {"tail:client_test_accuracy_mean"}


def test_ratio_claims_read_both_greedies_from_the_one_tracked_run():
    """Fig. 11: both ratios come from the brute-force run, which filters with DGF; the RGF row
    says so (its method column names that run)."""
    dgf, rgf = setup.ratio_claims("paper")
    assert (dgf.metric, rgf.metric) == ("diagmin:ratio_dgf", "diagmin:ratio_rgf")
    assert dgf.label == rgf.label == setup.RATIO_METHOD.label("paper")
    assert (dgf.paper_diff, rgf.paper_diff) == (0.0, 0.0)
    assert "DGF filters" in rgf.note and "DGF filters" not in dgf.note


# ----------------------------------------------------------------------------- the 34 windows
def test_code_windows_are_the_reference_codes():
    x, y = code_windows()
    assert x.shape == (34, 79) and y.shape == (34,) and y.dtype == np.int32
    assert len(CODE_FILTER_WINDOWS) == len(CODE_FILTER_TARGETS) == 34
    assert {len(w) for w in CODE_FILTER_WINDOWS} == {79} and {
        len(t) for t in CODE_FILTER_TARGETS
    } == {1}
    decode = "".join(shakespeare.VOCAB[i] for i in x[0])
    assert decode.startswith("Federated learning has emerged as a promising")
    assert "".join(shakespeare.VOCAB[i] for i in y[:5]) == "llh T"
    # windows and targets are consecutive stretches of one text (the abstract), every
    # character in LEAF's vocabulary (none mapped to a space)
    text = "".join(w + t for w, t in zip(CODE_FILTER_WINDOWS, CODE_FILTER_TARGETS, strict=True))
    assert "allows collaborative training" in text and "to be used fo" in text
    ids = shakespeare.encode(text)
    assert "".join(shakespeare.VOCAB[i] for i in ids) == text
    np.testing.assert_array_equal(x.reshape(-1), np.delete(ids, np.arange(79, ids.size, 80)))
    np.testing.assert_array_equal(code_windows(8)[0], x[:8])
    with pytest.raises(ConfigError, match="filter_samples=35"):
        code_windows(35)


def test_shakespeare_filfl_loads_the_code_windows(data_dir):
    opts = dict(num_clients=4, seed=1, max_examples=100)
    ds = load_dataset("shakespeare_filfl", filter_text="code", **opts)
    x, y = code_windows()
    np.testing.assert_array_equal(np.asarray(ds.server_x), x)
    np.testing.assert_array_equal(np.asarray(ds.server_y), y)
    assert ds.info["server_set"] == "code" and ds.info["num_server_examples"] == 34
    base = load_dataset("shakespeare_filfl", **opts)  # the clients do not change
    np.testing.assert_array_equal(np.asarray(ds.train.x), np.asarray(base.train.x))
    assert load_dataset(
        "shakespeare_filfl", filter_text="code", filter_samples=17, **opts
    ).server_x.shape == (17, 79)
    with pytest.raises(ConfigError, match="filter_stride"):
        load_dataset("shakespeare_filfl", filter_text="code", filter_stride=80, **opts)


# ----------------------------------------------------------------------------- reading runs
def _run(records, seed=0, label="x", summary=None) -> Run:
    return Run(Path("."), label, "s", seed, summary or {}, records)


def test_run_metrics_against_numpy():
    """``tail``: the evaluations of the last 20% of the rounds; ``diag``: the mean over
    filtering rounds from chunk means (weighted by chunk length); ``diagmin``: the smallest
    chunk's mean over its filtering rounds."""
    # chunks of 10, 10 and 5 rounds; filtering rounds 3, 1 and 5 of them
    rates = [np.array([0.5, 0.6, 0.7]), np.array([0.4]), np.array([0.2, 0.3, 0.3, 0.2, 0.5])]
    lengths = [10, 10, 5]
    records, r = [], 0
    for n, rate, acc in zip(lengths, rates, (0.1, 0.5, 0.7), strict=True):
        r += n
        records.append(
            {
                "round": r,
                "test_accuracy": acc,
                "diagnostics": {"filter_round": rate.size / n, "filter_rate": rate.sum() / n},
            }
        )
    run = _run(records)
    np.testing.assert_allclose(setup.run_metric(run, "tail", "test_accuracy"), 0.7)  # r > 20
    expect = np.concatenate(rates).mean()
    np.testing.assert_allclose(setup.run_metric(run, "diag", "filter_rate"), expect)
    np.testing.assert_allclose(setup.run_metric(run, "diagmin", "filter_rate"), 0.3)
    assert setup.run_metric(run, "diag", "worse") is None  # a run without that diagnostic
    # tail over the last 20% of 50 rounds: rounds 41..50
    run = _run([{"round": t, "test_accuracy": t / 100} for t in range(5, 55, 5)])
    np.testing.assert_allclose(setup.run_metric(run, "tail", "test_accuracy"), 0.475)


def _fake_study(tmp_path, accuracy: dict[str, float], profile="code") -> setup.FilFLStudy:
    """A study whose runs are records written by hand (3 seeds; FilFL arms filter every
    round: filter_round 1, worse share 0.5, half of the worse removed)."""
    study = setup.FilFLStudy("filfl", profile=profile, size="cpu", seeds=3, out=tmp_path)
    cfg = RunConfig()
    for label, acc in accuracy.items():
        runs = []
        for seed in range(3):
            diag = {}
            if label.startswith("FilFL"):
                diag = {
                    "filter_round": 1.0,
                    "filter_rate": 0.6,
                    "worse_share": 0.5,
                    "worse": 4.0,
                    "worse_removed": 2.0,
                }
            a = acc + 0.01 * seed
            evals = [
                {
                    "round": 10,
                    "test_accuracy": a,
                    "client_test_accuracy_mean": a - 0.05,
                    "diagnostics": diag,
                }  # fmt: skip
            ]
            runs.append(
                RunResult(cfg.replace(seed=seed), evals, {"diverged": False}, out_dir=tmp_path)
            )
        study.results[("shakespeare", label)] = runs
    return study


def test_premise_line_and_tables(tmp_path):
    labels = {"FedAvg (PoC)": 0.30, "FedAvg (RS)": 0.28, "FilFL RGF (RS)": 0.33}
    study = _fake_study(tmp_path, labels)
    ok, line = repro.premise(study, "code", "FedAvg (PoC)")
    assert not ok and "does NOT hold" in line and "26.00%" in line  # client mean 0.25-0.27
    table = repro.method_table(
        study,
        "shakespeare",
        list(labels),
        "FedAvg (PoC)",
        "FedAvg (RS)",
        "tail:client_test_accuracy_mean",
    )
    row = next(r for r in table.splitlines() if r.startswith("| FilFL RGF (RS)"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1].startswith("34.00") and cells[2].startswith("29.00")
    assert cells[3] == "3.00 [3.00, 3.00]" and cells[4] == "5.00 [5.00, 5.00]"
    assert [c[:4] for c in cells[5:]] == ["0.60", "0.50", "0.50"]  # kept, worse, removed
    assert len(cells) == 8 and table.splitlines()[0].count("|") == 9  # no stray "|"
    ok, line = repro.premise(_fake_study(tmp_path, {"FedAvg (PoC)": 0.52}), "code", "FedAvg (PoC)")
    assert ok and line.endswith("holds.")


# ----------------------------------------------------------------------------- paper-size data
def _fake_npz(path: Path, shape, classes: int, n: int = 64) -> None:
    rng = np.random.default_rng(0)
    y = np.arange(n) % classes
    x = rng.integers(0, 255, (n, *shape), dtype=np.uint8)
    np.savez(path, x_train=x, y_train=y, x_test=x[:16], y_test=y[:16])


def test_paper_size_data_sets_on_fake_files(tmp_path):
    """EMNIST (FEMNIST's place) and CIFAR-10 cannot be fetched here: with their files present
    the paper size runs them, without them MNIST stands in and the absence is recorded."""
    image, cifar, absent = setup.resolve_tasks(PAPER, tmp_path)
    assert image.dataset == "mnist" and cifar == image
    assert set(absent) == {"emnist", "cifar10"} and "stands in" in absent["emnist"]
    _fake_npz(tmp_path / "emnist.npz", (28, 28), 62)
    _fake_npz(tmp_path / "cifar10.npz", (32, 32, 3), 10)
    image, cifar, absent = setup.resolve_tasks(PAPER, tmp_path)
    assert (image.dataset, cifar.dataset, absent) == ("emnist", "cifar10", {})
    assert (image.num_clients, image.available, image.per_round) == (190, 50, 5)
    assert (cifar.num_clients, cifar.available, cifar.per_round, cifar.filter_size) == (
        200,
        30,
        3,
        500,
    )
    cfg = setup.make_config(setup.filfl_methods("rs")[1], cifar, "paper", str(tmp_path))
    cfg = resolve(cfg).config
    assert cfg.dataset == "cifar10" and cfg.strategy_args["filter_size"] == 500


# ----------------------------------------------------------------------------- end to end
TINY = setup.Task(
    "digits", 10, 6, 2, 6, 2, model="logreg", partition="dirichlet:0.5", server_fraction=0.1,
    test_fraction=0.2, local_steps=2, batch_size=16, lr=0.1,
)  # fmt: skip


def _tiny_scale(rounds: int) -> setup.Scale:
    return setup.Scale("cpu", TINY, TINY, None, ratio_rounds=rounds, ratio_available=5)


@pytest.mark.slow
def test_tiny_end_to_end_writes_verdicts_and_recomputes_changed_cells(
    tmp_path, monkeypatch, check_pinned
):
    """Fig. 11 at a tiny size through ``fedjax-sel reproduce``'s entry: verdicts.json holds
    the required fields; the same call reuses the finished cells; changing the rounds reruns
    them (the Study matches cells by their whole configuration)."""
    monkeypatch.setitem(setup.SCALES, "cpu", _tiny_scale(4))
    assert REPRODUCTIONS["filfl"].factory is repro.run
    out = tmp_path / "out"

    def run(**options):  # as ``fedjax-sel reproduce filfl --option parts=ratio`` calls it
        return REPRODUCTIONS.build("filfl", seeds=2, out=out, profile="code", size="cpu", **options)

    results = run(parts="ratio")
    rows = json.loads((out / "verdicts.json").read_text())
    required = {
        "paper", "claim", "profile", "size", "setting", "method", "baseline", "metric", "seeds",
        "paper_value", "paper_diff", "ours_mean", "ours_ci_low", "ours_ci_high", "diff_mean",
        "diff_ci_low", "diff_ci_high", "verdict", "note",
    }  # fmt: skip
    assert len(rows) == 2 and all(required <= set(r) for r in rows)
    for r in rows:  # a greedy never beats the optimum: min ratio in (0, 1]
        assert r["baseline"] == setup.BOUND_LABEL and r["seeds"] == 2 and r["paper_value"] == 0.96
        assert 0 < r["ours_mean"] <= 1 + 1e-6
        np.testing.assert_allclose(r["diff_mean"], r["ours_mean"] - 0.96)
        assert r["verdict"] in VERDICTS
    assert results["verdicts"] == rows and "Fig. 11" in (out / "tables.md").read_text()
    per_seed = json.loads((out / "per_seed.json").read_text())
    check_pinned(per_seed, PINNED_TINY_VALUES)
    summary = next((out / "runs").rglob("summary.json"))
    assert json.loads(summary.read_text())["rounds_completed"] == 4
    stamp = summary.stat().st_mtime_ns
    run(parts="ratio")
    assert summary.stat().st_mtime_ns == stamp  # finished and unchanged: reused
    monkeypatch.setitem(setup.SCALES, "cpu", _tiny_scale(3))
    run(parts="ratio")
    assert json.loads(summary.read_text())["rounds_completed"] == 3  # recomputed
    with pytest.raises(ConfigError, match="parts"):
        run(parts="nope")


def test_scales_are_consistent():
    for scale in setup.SCALES.values():
        for task in (scale.shakespeare, scale.image, scale.cifar, scale.emnist):
            if task is None:
                continue
            assert task.per_round <= task.available <= task.num_clients
            assert task.rounds % task.eval_every == 0  # equal chunks: diag means are exact
        assert 2**scale.ratio_available - 1 <= 2**16
    assert dataclasses.asdict(setup.SCALES["paper"].shakespeare)["num_clients"] == 143
