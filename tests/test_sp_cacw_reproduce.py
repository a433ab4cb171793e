"""The ``sp-cacw`` reproduction's plumbing at a tiny size: clustered MNIST on a fake file, the
CIFAR-100 part without its data, and the tables against hand-computed rows."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.personalized import PersonalizedConfig, summary_row
from fedjax_sel.reproduce import REPRODUCTIONS
from fedjax_sel.reproduce import sp_cacw as repro


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


def tiny_mnist(transform, full, data_dir):
    assert not full
    return repro.Setting(
        f"mnist_{transform}", "clustered_mnist", 6, "logreg",
        PersonalizedConfig(lr=0.1, batch_size=8, pgd_steps=20, power_iters=3), epochs=3,
        eval_every=1,
        dataset_args={"num_clusters": 2, "transform": transform, "examples_per_client": 30},
        methods=("sp_cacw", "fedavg"), track_bound=True, data_path=data_dir,
    )  # fmt: skip


def test_tiny_reproduction(tmp_path, monkeypatch, capsys):
    fake_mnist(tmp_path)
    monkeypatch.setattr(repro, "mnist_setting", tiny_mnist)
    monkeypatch.setenv("FEDJAX_SEL_DATA_DIR", str(tmp_path))  # no cifar100.npz here
    assert REPRODUCTIONS["sp-cacw"].run is repro.run
    out = tmp_path / "out"
    report = repro.run(seeds=1, out=out, data_dir=str(tmp_path), parts="mnist_permute,cifar100")
    assert json.loads((out / "summary.json").read_text())["mnist_permute"]["rows"]
    body = report["mnist_permute"]
    assert [r["method"] for r in body["rows"]] == ["SP-CACW", "FedAvg"]
    for key in ("curves", "heatmap", "bound_plot"):
        assert (out / body[key].split("/")[-1]).stat().st_size > 0
    sp, fedavg = body["rows"]
    assert 0.0 <= sp["own_cluster_mass"] <= 1.0 and "own_cluster_mass" not in fedavg
    assert sp["seeds"] == 1 and sp["test_accuracy_std"] == 0.0
    # the bound table covers the peer weightings only, with finite values
    (tight,) = body["tightness"]
    assert tight["method"] == "SP-CACW"
    assert np.isfinite(tight["phi_online_over_exact"]) and tight["exact_error"] > 0
    assert "skipped" in report["cifar100"] and "cifar100" in report["cifar100"]["skipped"]
    printed = capsys.readouterr().out
    assert "mnist_permute" in printed and "cifar100: skipped" in printed


def test_table_is_the_mean_of_the_summary_rows():
    """``table`` against summary rows computed by hand on two synthetic seeds."""
    from fedjax_sel.personalized.experiment import MethodResult

    def result(acc):
        metrics = {
            "test_accuracy": np.array([[0.1, 0.1], acc]),
            "test_loss": np.ones((2, 2)),
            "train_loss": np.ones((2, 2)),
        }
        w = np.array([[[0.5, 0.5], [0.5, 0.5]], [[1.0, 0.0], [0.2, 0.8]]])
        return MethodResult(
            "sp_cacw", "SP", np.array([0, 10]), metrics, np.array([0, 1]), w, None, 1.0, [0, 1]
        )

    runs = {"SP": [result([0.6, 0.8]), result([0.7, 0.9])]}
    (row,) = repro.table(runs)
    assert row["test_accuracy"] == pytest.approx(0.75)
    assert row["test_accuracy_std"] == pytest.approx(0.05)
    assert row["worst_target_accuracy"] == pytest.approx(0.65)
    assert row["own_cluster_mass"] == pytest.approx(0.9)  # (1.0 + 0.8) / 2
    assert row["self_weight"] == pytest.approx(0.9)
    assert summary_row(runs["SP"][0])["peers_with_weight"] == pytest.approx(1.5)


def test_settings_and_bad_parts(tmp_path):
    shakespeare = repro.shakespeare_setting(False, None)
    assert "oracle" not in shakespeare.methods  # no true clusters
    for full in (False, True):
        mnist = repro.mnist_setting("rotate", full, None)
        assert mnist.dataset_args["num_clusters"] == 4 and mnist.track_bound
    assert dataclasses.asdict(repro.cifar_setting(None).config)["method"] == "sp_cacw"
    for _, overrides in repro.ABLATIONS:  # every ablation is a valid SP-CACW configuration
        dataclasses.replace(
            repro.mnist_setting("permute", False, None).config, **overrides
        ).validate()
    with pytest.raises(ConfigError, match="part"):
        repro.run(seeds=1, out=tmp_path, parts="mnist_flip")
    with pytest.raises(ConfigError, match="seeds"):
        repro.run(seeds=0, out=tmp_path, parts="mnist_permute")
