"""The ``ca-fed`` reproduction: the paper's settings map onto run configurations, a tiny run's
curves and cumulative weights against its own round logs, Fig. 1d's class grouping, the Fig. 5
map image, the kernel benchmarks of CA-Fed, and the Fig. 4a benchmark's falling errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from fedjax_sel.bench import kernels_main
from fedjax_sel.reproduce import REPRODUCTIONS
from fedjax_sel.reproduce import ca_fed as rep
from fedjax_sel.runner import build_simulation

TINY = rep.Scale(
    num_clients=8,
    rounds=4,
    rounds_fig2=4,
    rounds_fig5=2,
    local_steps=2,
    eval_every=2,
    synthetic_max_examples=30,
    mnist_subsample=60,
)


def test_configs_follow_section_v():
    assert "ca-fed" in REPRODUCTIONS
    methods = rep.fig1_methods(100)
    assert [m.strategy for m in methods] == [
        "ca_fed",
        "unbiased",
        "more_available",
        "adafed",
        "f3ast",
    ]
    assert methods[0].args == {"kappa2": 1.0, "estimator": "oracle"}
    assert methods[-1].args["budget"] == 50
    syn = rep.make_config(methods[0], "synthetic", rep.CPU_SCALE, 3)
    assert (syn.dataset, syn.dataset_args, syn.partition) == (
        "leaf_synthetic",
        {"alpha": 0.5, "beta": 0.5},
        "natural",
    )
    assert (syn.num_clients, syn.per_round, syn.availability) == (100, 100, "markov")
    assert (syn.model, syn.model_args) == ("logreg", {"ridge": 0.01})
    assert (syn.server_momentum, syn.seed, syn.data_seed) == (0.0, 3, 0)
    mnist = rep.make_config(methods[1], "mnist", rep.FULL_SCALE, 0, rounds=100)
    assert (mnist.partition, mnist.test_fraction, mnist.rounds) == ("dirichlet:0.5", 0.2, 100)
    assert (mnist.local_epochs, mnist.local_steps) == (2, None)
    clustered = rep.make_config(
        methods[0], "mnist", rep.CPU_SCALE, 0, availability="markov_clustered", partition="iid"
    )
    assert (clustered.availability, clustered.partition) == ("markov_clustered", "iid")
    assert [rep.kappa_method(x).args["kappa2"] for x in rep.KAPPAS] == [0.01, 0.1, 1, 10, 100]


def test_run_method_weights_and_trace_agree_with_the_round_logs(tmp_path):
    method = rep.fig1_methods(TINY.num_clients)[0]
    config = rep.make_config(method, "synthetic", TINY, 0, eval_every=1)
    dataset = rep.load(config, TINY, tmp_path)
    (run,) = rep.run_method(config, dataset, trace=True)
    assert run["rounds"] == [1, 2, 3, 4] and len(run["accuracy"]) == 4
    assert run["available"].shape == run["included"].shape == (4, TINY.num_clients)
    # replay the same seed and sum the weights from the logs directly
    sim = build_simulation(config, dataset)
    state, logs = sim.run_rounds(sim.init(0), 4)
    want = np.zeros(TINY.num_clients)
    for c, m, w in zip(logs.clients, logs.mask, logs.weights, strict=True):
        want[np.asarray(c)[np.asarray(m)]] += np.asarray(w)[np.asarray(m)]
    np.testing.assert_allclose(run["cumulative_weight"], want / 4, rtol=1e-5)
    np.testing.assert_allclose(run["accuracy"][-1], sim.evaluate(state)["test_accuracy"])
    # a trained client was available and included in its round
    trained = np.zeros((4, TINY.num_clients), bool)
    for t, (c, m) in enumerate(zip(logs.clients, logs.mask, strict=True)):
        trained[t, np.asarray(c)[np.asarray(m)]] = True
    np.testing.assert_array_equal(trained, run["available"] & run["included"])
    summary = rep.summarize([run, run])
    assert summary["final_std"] == 0.0 and summary["finals"] == [run["accuracy"][-1]] * 2


def test_class_weights_group_fig_1d_classes():
    # 8 clients: classes 0, 0, 1, 1 (more available), 2, 2 (less, correlated), 3, 3 (less, weak)
    w = np.array([1.0, 3.0, 5.0, 7.0, 0.0, 2.0, 4.0, 4.0])
    got = rep.class_weights(w)
    assert got == {
        "more available": 4.0,
        "less available, weakly correlated": 4.0,
        "less available, correlated": 1.0,
    }


def test_plots_write_images(tmp_path):
    rng = np.random.default_rng(0)
    available, included = rng.random((5, 20)) < 0.5, rng.random((5, 20)) < 0.7
    assert rep.plot_map(available, included, tmp_path / "m.png", "map").stat().st_size > 0
    curves = {"a": {"rounds": [1, 2], "mean": [0.1, 0.2], "std": [0.0, 0.01]}}
    assert rep.plot_accuracy(curves, tmp_path / "c.png", "c").stat().st_size > 0
    assert rep.plot_weights({"a": np.arange(8.0)}, tmp_path / "w.png").stat().st_size > 0


def test_kernel_benchmarks_run_at_small_k(tmp_path):
    rows = kernels_main(
        ["markov_step", "availability_estimate", "ca_fed_get"],
        [64],
        repeats=1,
        out=str(tmp_path / "k.json"),
    )
    assert [r["kernel"] for r in rows] == ["markov_step", "availability_estimate", "ca_fed_get"]
    assert all(r["clients"] == 64 and r["seconds"] > 0 for r in rows)
    assert (tmp_path / "k.json").exists()


def test_fig4a_benchmark_errors_fall_with_observed_rounds(tmp_path):
    path = Path(__file__).parents[1] / "benchmarks" / "fig4a_estimators.py"
    spec = importlib.util.spec_from_file_location("fig4a_estimators", path)
    fig4a = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig4a)
    rows = fig4a.measure(num_clients=200, seeds=1, checkpoints=(10, 3000))
    bayes = [r for r in rows if r["estimator"] == "bayes"]
    assert bayes[1]["pi_mae"] < bayes[0]["pi_mae"] / 2
    assert bayes[1]["lambda_mae"] < bayes[0]["lambda_mae"] / 4
    reference = [r for r in rows if r["estimator"] == "reference"]
    assert reference[1]["lambda_mae"] > 0.3  # the biased estimator does not converge
    fig4a.plot(rows, tmp_path / "f.png")
    assert (tmp_path / "f.png").exists()
