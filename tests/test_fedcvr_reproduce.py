"""The fedcvr-bolt reproduction at a tiny size: Table 1's four settings, the CIFAR-10 path of
Tables 2 and 4 on a fake ``cifar10.npz``, the report beside the paper's numbers, and resuming."""

from __future__ import annotations

import json

import numpy as np

from fedjax_sel.reproduce import REPRODUCTIONS
from fedjax_sel.reproduce import fedcvr_bolt as repro


def test_tiny_reproduction_tables_report_and_resume(tmp_path, monkeypatch):
    assert "fedcvr-bolt" in REPRODUCTIONS
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "cifar10.npz",
        x_train=rng.integers(0, 255, (300, 32, 32, 3), dtype=np.uint8),
        y_train=np.arange(300) % 10,
        x_test=rng.integers(0, 255, (50, 32, 32, 3), dtype=np.uint8),
        y_test=np.arange(50) % 10,
    )
    # one method for the image tables keeps the test small; the method lists are checked below
    monkeypatch.setattr(
        repro, "table2_methods", lambda bolt: [("FedCVR-Bolt", "fedcvr_bolt", bolt, 0.0)]
    )
    monkeypatch.setattr(repro, "AFFINITY_LABELS", {"rbf": "RBF (ours)"})  # Table 2's run
    scale = repro.Scale(
        "tiny",
        t1_rounds=3,
        t1_clients=12,
        t1_examples=10,
        rounds={"cifar10": 2, "cifar100": 2},
        local_steps=1,
        fraction=1.0,
        warmup=1,
        clients=10,
        eval_every=2,
        datasets=("cifar10", "cifar100"),
    )
    lines = []
    out = tmp_path / "out"
    results = repro.run_tables(
        scale, seeds=1, out=out, data_dir=str(tmp_path), echo=lines.append, tables=("2", "4")
    )
    acc = results["table2"]["cifar10"]["FedCVR-Bolt"]["mean"]
    assert 0.0 <= acc <= 100.0
    assert set(results["table4"]["cifar10"]) == {"rbf"}
    assert results["table4"]["cifar10"]["rbf"]["values"] == [acc]
    assert any("cifar100" in a for a in results["absent"])  # no cifar100.npz here
    report = (out / "report.txt").read_text()
    assert "57.06" in report  # the paper's numbers beside ours
    assert json.loads((out / "results.json").read_text())["seeds"] == 1
    # CIFAR runs sketch 300 random last-layer weights (appendix C.2)
    cfg = json.loads((out / "cifar10" / "fedcvr_bolt" / "seed0" / "config.json").read_text())
    assert cfg["config"]["strategy_args"]["sketch_dim"] == 300
    assert cfg["config"]["model"] == "cnn"
    # finished runs are read back, not rerun
    again = repro.run_tables(
        scale, seeds=1, out=out, data_dir=str(tmp_path), echo=lambda *_: 0, tables=("2", "4")
    )
    assert again["table2"] == results["table2"]


def test_method_lists_follow_the_paper():
    t1 = [m[0] for m in repro.table1_methods()]
    assert t1 == ["FedAvg", "Power-of-Choice", "Active FL", "FedCVR-Bolt"]
    t2 = repro.table2_methods(repro.bolt_args("mnist", repro.CPU))
    assert [m[0] for m in t2] == list(repro.PAPER_TABLE2["mnist"])
    by_label = {m[0]: m for m in t2}
    assert by_label["FedProx"][3] > 0 and by_label["Power-of-Choice"][2]["d"] == 20
    assert by_label["Active FL"][2] == {"alpha1": 0.8, "alpha2": 1.0, "alpha3": 0.0}
    assert repro.FULL.rounds["mnist"] == 200 and repro.FULL.warmup == 30


def test_table1_settings_and_statistics(tmp_path, monkeypatch):
    """Table 1's 4 settings x 4 methods x seeds, with training replaced by a fake that returns
    an MSE computed from the run's configuration."""
    configs = []

    def fake_run(config, dataset, out):
        configs.append(config)
        a = config.dataset_args
        mse = 10.0 * a["num_clusters"] + a["intercept"] + 0.5 * config.seed
        evals = [{"round": config.rounds, "client_test_loss_mean": mse}]
        return {}, [dict(evals[0], test_loss=mse, train_loss=mse)]

    monkeypatch.setattr(repro, "_run", fake_run)
    t1 = repro.run_table1(repro.CPU, 2, tmp_path, echo=lambda *_: 0)
    assert len(configs) == 4 * 4 * 2
    assert {(c.strategy, c.per_round, c.rounds, c.local_steps, c.lr) for c in configs} == {
        (s, 10, 100, 10, 0.01) for s in ("uniform", "power_of_choice", "active_fl", "fedcvr_bolt")
    }
    assert all(c.num_clients == 100 and c.model == "linreg" for c in configs)
    cell = t1["y = theta0 + theta1 x"]["Non-IID"]["FedCVR-Bolt"]
    assert cell["values"] == [21.0, 21.5]
    assert cell["mean"] == 21.25 and cell["std"] == 0.25
    assert t1["y = theta1 x"]["IID"]["Active FL"]["mean"] == 10.25
    report = repro.format_report({"table1": t1})
    assert "54.7102" in report and "21.2500" in report
