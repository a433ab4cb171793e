"""SP-CACW on the experiment layer at tiny sizes (clustered MNIST on a fake file): the CLI path of
a personalized run, the reproduction end to end (verdicts against the run folders), and the
Study reusing a finished cell but recomputing one whose configuration changed."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main
from fedjax_sel.experiment.outputs import read_metrics, strip_timings
from fedjax_sel.experiment.per_seed import not_recomputed, per_seed_stats_in
from fedjax_sel.experiment.reproductions import REPRODUCTIONS
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.experiment.study import Study
from fedjax_sel.experiment.verdicts import VERDICTS
from studies import sp_cacw as repro

TINY_DATA = (("num_clusters", 2), ("transform", "permute"), ("examples_per_client", 30))
FAST = (("pgd_steps", 20), ("power_iters", 3))

# The tiny end-to-end run's values (per_seed.json: cell -> seed -> metric) at the commit that
# pinned them. A change that moves them changes the reproduction's results: update them only on
# purpose, and say why in the commit message. rel=1e-4 leaves room for another x86 CPU's last
# bits (other XLA CPU code generation moved them by 2e-7 at most), not for a real change.
PINNED_TINY_VALUES = {
    "mnist_permute/SP-CACW": {1: {"target_accuracy": 0.47222223, "final_test_loss": 2.3060245}},
    "mnist_permute/FedAvg": {0: {"target_accuracy": 0.30555556, "final_test_loss": 2.2568045}},
    "mnist_permute/Local_only": {0: {"target_accuracy": 0.58333334}},
}


def fake_mnist(path, seed=0):
    """A Keras-layout MNIST stand-in: class c images are noise around a class template, so a
    linear model can learn them (and per-cluster label permutations then matter)."""
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0, 255, (10, 28, 28))
    y = np.arange(3000) % 10
    x = np.clip(templates[y] + rng.normal(0, 60, (3000, 28, 28)), 0, 255).astype(np.uint8)
    np.savez(
        path / "mnist.npz", x_train=x[:2500], y_train=y[:2500], x_test=x[2500:], y_test=y[2500:]
    )


def tiny_setting(**kw) -> repro.Setting:
    args = dict(
        dataset="clustered_mnist", num_clients=6, model="logreg", rounds=2, eval_every=1,
        lr=0.1, batch_size=8, dataset_args=TINY_DATA, methods=("sp_cacw", "local", "fedavg"),
        method_args=FAST, track_bound=True,
    )  # fmt: skip
    args.update(kw)
    return repro.Setting(**args)


def test_cli_personalized_run_writes_outputs_and_reruns_from_its_config(tmp_path, capsys):
    """``fedjax-sel run --mode personalized --strategy sp_cacw``: the three files, the
    method's own quantities in the records, and ``--config config.json`` reruns it identically."""
    fake_mnist(tmp_path)
    out = tmp_path / "run"
    flags = [
        "run", "--mode", "personalized", "--strategy", "sp_cacw",
        "--strategy-arg", "pgd_steps=20,power_iters=3,participation=0.5",
        "--dataset", "clustered_mnist", "--dataset-arg", "num_clusters=2,transform=permute",
        "--dataset-arg", "examples_per_client=30", "--data-dir", str(tmp_path),
        "--clients", "6", "--model", "logreg", "--rounds", "2", "--eval-every", "1",
        "--lr", "0.1", "--batch-size", "8", "--no-progress",
    ]  # fmt: skip
    assert main([*flags, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["config"]["mode"] == "personalized" and config["config"]["strategy"] == "sp_cacw"
    assert config["steps_per_epoch"] == 3 and config["update_period_epochs"] == 1.0  # 24 / 8
    assert config["seeds_vmapped"] == [config["config"]["seed"]]  # one seed per personalized run
    records = read_metrics(out / "metrics.jsonl")
    assert [r["round"] for r in records] == [0, 1, 2]
    last = records[-1]
    assert len(last["per_target"]["test_accuracy"]) == 6 and np.shape(last["weights"]) == (6, 6)
    for key in ("unobserved_weight", "own_cluster_weight", "bound_premise", "lr_times_smoothness"):
        assert key in last["per_target"]
    assert last["per_target"]["unobserved_weight"] == [0.0] * 6  # the observed-peer mask
    assert set(last["diagnostics"]) >= {"lr_times_smoothness", "unobserved_weight"}
    summary = json.loads((out / "summary.json").read_text())
    acc = np.mean([r["per_target"]["test_accuracy"] for r in records if r["round"] == 2])
    assert summary["target_accuracy"] == pytest.approx(acc)  # last 20% of 2 rounds: round 2
    assert ("risk_bound" in summary) == (summary["bound_premise_fraction"] > 0)
    again = tmp_path / "again"
    assert main(["run", "--config", str(out / "config.json"), "--out", str(again),
                 "--no-progress"]) == 0  # fmt: skip
    assert strip_timings(read_metrics(again / "metrics.jsonl")) == strip_timings(records)
    assert "outputs written to" in capsys.readouterr().out


def test_tiny_reproduction_end_to_end(tmp_path, monkeypatch, capsys, check_pinned):
    """Two paired seeds of SP-CACW, local and FedAvg on a tiny clustered MNIST: verdicts.json
    holds the required fields, its paired differences are those of the run folders' summaries,
    each summary's ``target_accuracy`` is the records' mean over targets, and the absent
    CIFAR-100 data is named."""
    fake_mnist(tmp_path)
    tiny = dict(repro.SCALES["cpu"], mnist_permute=tiny_setting())
    monkeypatch.setitem(repro.SCALES, "cpu", tiny)
    monkeypatch.setenv("FEDJAX_SEL_DATA_DIR", str(tmp_path))  # no cifar100.npz here
    assert REPRODUCTIONS["sp-cacw"].factory is repro.run
    out = tmp_path / "out"
    results = repro.run(
        seeds=2, out=out, size="cpu", data_dir=tmp_path, parts=("mnist_permute", "cifar100")
    )
    rows = json.loads((out / "verdicts.json").read_text())
    assert [r["baseline"] for r in rows] == ["Local only", "FedAvg"]
    required = {
        "paper", "claim", "profile", "size", "setting", "method", "baseline", "metric", "seeds",
        "paper_value", "paper_diff", "ours_mean", "ours_ci_low", "ours_ci_high", "diff_mean",
        "diff_ci_low", "diff_ci_high", "verdict", "note",
    }  # fmt: skip
    runs = out / "runs" / "mnist_permute"
    for r in rows:
        assert required <= set(r) and r["verdict"] in VERDICTS
        assert (r["profile"], r["size"], r["metric"], r["seeds"]) == (
            "paper", "cpu", "target_accuracy", 2
        )  # fmt: skip
        assert "below the evidence standard" in r["note"]
        diffs = []
        for s in (0, 1):
            sp = json.loads((runs / "SP-CACW" / f"seed{s}" / "summary.json").read_text())
            base = r["baseline"].replace(" ", "_")
            other = json.loads((runs / base / f"seed{s}" / "summary.json").read_text())
            diffs.append(100 * (sp["target_accuracy"] - other["target_accuracy"]))
        assert r["diff_mean"] == pytest.approx(np.mean(diffs))
    records = read_metrics(runs / "SP-CACW" / "seed1" / "metrics.jsonl")
    summary = json.loads((runs / "SP-CACW" / "seed1" / "summary.json").read_text())
    assert summary["target_accuracy"] == pytest.approx(
        np.mean(records[-1]["per_target"]["test_accuracy"])
    )
    assert "cifar100" in results["absent"] and "cifar100" in results["absent"]["cifar100"]
    assert results["note"] == repro.NOTE and "code" in repro.NOTE
    (sp_row,) = [t for t in results["tables"]["mnist_permute"] if t["method"] == "SP-CACW"]
    assert sp_row["unobserved_weight"] == 0.0 and sp_row["tightness"] is not None
    text = (out / "tables.md").read_text()
    assert "Verdicts" in text and "SP-CACW - method" in text and "cifar100" in text
    for key in ("curves", "heatmap", "bound"):  # file names in the folder, not paths
        assert (out / results["plots"]["mnist_permute"][key]).stat().st_size > 0
        assert "/" not in results["plots"]["mnist_permute"][key]
    per_seed = json.loads((out / "per_seed.json").read_text())
    check_pinned(per_seed, PINNED_TINY_VALUES)
    # the diagnostics rows and the cells come back from per_seed.json alone; a row's
    # first-chunk L eta is the mean over seeds of each metrics file's first chunk
    stats = per_seed_stats_in(json.loads((out / "results.json").read_text()))
    rows = results["tables"]["mnist_permute"]
    assert sum("keys" in st["from_per_seed"] for st in stats) == len(rows)
    assert len(stats) >= 2 * len(rows)
    assert not not_recomputed(json.loads((out / "results.json").read_text()), per_seed["cells"])
    first = []
    for s in (0, 1):
        records = read_metrics(runs / "SP-CACW" / f"seed{s}" / "metrics.jsonl")
        first.append(next(e for e in records if e.get("diagnostics"))["diagnostics"])
    first = [d["lr_times_smoothness"] for d in first]
    assert sp_row["lr_times_smoothness_first_chunk"] == pytest.approx(np.mean(first), rel=1e-12)
    assert "mnist_permute" in capsys.readouterr().out


def test_study_reuses_a_finished_cell_and_recomputes_a_changed_one(tmp_path):
    """Same configuration: the cell is read back, not rerun; more rounds: it is recomputed."""
    fake_mnist(tmp_path)
    setting = tiny_setting(methods=("fedavg",), track_bound=False)

    def study_of(rounds):
        study = Study("sp_cacw", profile="paper", size="cpu", seeds=1, out=tmp_path / "o",
                      progress=False, echo=lambda *_: None)  # fmt: skip
        cfg = repro.make_config(dataclasses.replace(setting, rounds=rounds), "fedavg", tmp_path)
        study.add("s", "FedAvg", cfg)
        study.run()
        return study

    summary = tmp_path / "o" / "runs" / "s" / "FedAvg" / "seed0" / "summary.json"
    study_of(2)
    first = summary.stat().st_mtime_ns
    assert study_of(2).runs("s", "FedAvg")[0].summary["rounds_completed"] == 2
    assert summary.stat().st_mtime_ns == first  # reused
    assert study_of(3).runs("s", "FedAvg")[0].summary["rounds_completed"] == 3
    assert summary.stat().st_mtime_ns != first


def test_configs_and_claims_follow_the_paper():
    """Every run is a personalized RunConfig; SP-CACW runs with the paper's FTAL (the default,
    no override); one partition for all seeds; claims only for baselines a setting has."""
    for size in ("cpu", "paper"):
        for part, setting in repro.SCALES[size].items():
            for m in setting.methods:
                cfg = resolve(repro.make_config(setting, m)).config
                assert cfg.mode == "personalized" and cfg.strategy == m and cfg.data_seed == 0
                assert "solver" not in cfg.strategy_args
            assert setting.update_every is None, part  # one local epoch: the paper's period
    shakespeare = repro.SCALES["cpu"]["shakespeare"]
    assert "oracle" not in shakespeare.methods
    labels = [c.baseline for c in repro.claims("shakespeare", shakespeare.methods)]
    assert labels == ["Local only", "FedAvg", "Cosine similarity", "IFCA"]
    assert repro.claims("x", ("local", "fedavg")) == []  # no SP-CACW, nothing to claim
    for _, overrides in repro.ABLATIONS:
        repro.make_config(repro.SCALES["cpu"]["mnist_permute"], "sp_cacw", None, overrides)
    with pytest.raises(ConfigError, match="part"):
        repro.run(seeds=1, out="unused", parts=("mnist_flip",))
    with pytest.raises(ConfigError, match="size"):
        repro.run(seeds=1, out="unused", size="huge")
