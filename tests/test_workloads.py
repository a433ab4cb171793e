"""``fedjax-sel bench workloads``: the stand-in data has the recipe's shapes and client-size
law, and a workload's row is what its run measured, projected as the docstring says."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_sel.bench.workloads import (
    WORKLOADS,
    add_flop_rate,
    evaluation_sample,
    standin,
    workloads_main,
)
from fedjax_sel.cli.main import main


def test_standin_has_the_recipes_shapes_and_client_sizes():
    w = WORKLOADS["cnn_femnist"]
    ds = standin(w, clients=3000)
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 62
    sizes = np.asarray(ds.train.counts) + np.asarray(ds.test.counts)
    assert sizes.mean() == pytest.approx(w.size_mean, rel=0.03)  # log-normal around the mean
    assert np.log(sizes).std() == pytest.approx(w.size_sigma, rel=0.05)
    fixed = standin(WORKLOADS["resnet18_cifar100"], clients=7)
    assert (np.asarray(fixed.train.counts) + np.asarray(fixed.test.counts)).tolist() == [100] * 7
    text = standin(WORKLOADS["lstm_shakespeare"], clients=3)
    x, y = text.train.client_arrays(0)
    assert x.shape[1:] == (80,) and x.max() < 80 and y.max() < 80


def test_the_evaluation_sample_is_a_seeded_subset_of_the_central_test_set():
    ds = standin(WORKLOADS["cnn_femnist"], clients=60)
    total = ds.test_x.shape[0]
    small = evaluation_sample(ds, 50)
    assert small.test is None and small.test_x.shape == (50, 28, 28, 1)
    assert small.info["eval_examples"] == 50 and small.info["test_examples"] == total
    rows = {bytes(np.asarray(r)) for r in ds.test_x}  # every sampled example is a test example
    assert all(bytes(np.asarray(r)) in rows for r in small.test_x)
    np.testing.assert_array_equal(evaluation_sample(ds, 50).test_y, small.test_y)
    whole = evaluation_sample(ds, total + 1)
    assert whole.test_x.shape[0] == total and whole.info["eval_examples"] == total


def test_the_flop_rate_of_a_row_is_the_models_count_over_the_round_time():
    row = {"workload": "logreg_mnist", "clients": 1000, "per_round": 10,
           "seconds_per_round": 0.002, "dataset_info": {"num_train_examples": 60_000}}  # fmt: skip
    out = add_flop_rate(row)
    assert out["train_flops_per_example"] == 6 * 784 * 10  # a 784 x 10 matmul, forward + backward
    assert out["round_flops_mean_client"] == 10 * 60 * 6 * 784 * 10
    assert out["gflops_per_second_mean_client"] == pytest.approx(10 * 60 * 47040 / 0.002 / 1e9)


@pytest.mark.slow
@pytest.mark.realdata
def test_the_mnist_recipe_runs_on_the_real_file_and_projects_its_schedule(data_dir, tmp_path):
    out = tmp_path / "workloads.json"
    rows = workloads_main(["logreg_mnist"], data_dir=str(data_dir), rounds=3, clients=20, out=out)
    (row,) = rows
    assert json.loads(out.read_text()) == rows
    assert (row["data"], row["dataset"], row["clients"], row["per_round"]) == (
        "real",
        "mnist",
        20,
        10,
    )
    assert (row["batch"], row["lr"], row["rounds"], row["rounds_run"]) == (10, 0.03, 100, 3)
    assert 0.1 < row["accuracy"] <= 1.0 and row["projected"]
    assert row["projected_total_s"] == pytest.approx(
        row["compile_s"] + 100 * row["seconds_per_round"]
    )
    # end to end covers the compile and the three rounds, and more (data, evaluations)
    assert row["wall_s"] >= row["compile_s"] + 3 * row["seconds_per_round"] - 0.01
    assert row["peak_memory_bytes"] > 0 and row["machine"]["backend"]
    assert row["peak_memory_gib"] == round(row["peak_memory_bytes"] / 2**30, 2)
    assert row["eval_examples"] == 10_000  # MNIST's whole test set
    # without the files: the stand-in, and no accuracy
    assert main(["bench", "workloads", "--workload", "logreg_mnist", "--rounds", "2",
                 "--clients", "12", "--data-dir", str(tmp_path / "none"),
                 "--out", str(tmp_path / "s.json")]) == 0  # fmt: skip
    (row,) = json.loads((tmp_path / "s.json").read_text())
    assert row["data"] == "standin" and row["accuracy"] is None and row["clients"] == 12
