"""Hyperparameter grids in one compiled program: learning rates, the server learning rate and
FedProx mu are traced (:class:`fedjax_sel.training.hparams.HParams`), so the points of a grid
run vmapped together, each equal to its separate run; ``[sweep.tune]`` chooses a point per
strategy on tuning seeds and compares the chosen points on the other seeds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import run as run_lib
from fedjax_sel.experiment import run_experiment, run_group, run_sweep
from fedjax_sel.experiment.loop import program_key
from fedjax_sel.experiment.sweep import expand_sweep

BASE = dict(
    dataset="digits",
    num_clients=10,
    per_round=3,
    rounds=4,
    eval_every=2,
    local_steps=3,
    batch_size=16,
)
TOL = dict(rel=1e-5, abs=1e-6)  # the float reduction order of a vmapped batch (seeds alike)


def assert_same_run(a, b):
    assert [e["selected"] for e in a.evals] == [e["selected"] for e in b.evals]
    for x, y in zip(a.evals, b.evals, strict=True):
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert x[key] == pytest.approx(y[key], **TOL), key


def test_traced_hyperparameters_share_a_program_and_equal_separate_runs(tmp_path):
    """Client lr, server lr (FedAvgM) and FedProx mu differ across the members of one batch;
    every member's metrics equal its own run's, and the learning rates really act (different
    points end with different losses)."""
    points = [(0.05, 1.0, 0.01), (0.2, 0.5, 0.1), (0.1, 1.5, 0.3)]
    configs = [
        RunConfig(**BASE, lr=lr, server="momentum", server_lr=slr, prox_mu=mu, seed=s, data_seed=0)
        for lr, slr, mu in points
        for s in (0, 1)
    ]
    assert len({program_key(c) for c in configs}) == 1
    # whether the proximal term exists is part of the program; a personalized run keeps lr
    assert program_key(configs[0]) != program_key(configs[0].replace(prox_mu=0.0))
    assert program_key(configs[0].replace(mode="personalized")) != program_key(
        configs[2].replace(mode="personalized")
    )
    outs = [tmp_path / f"t{i}" for i in range(len(configs))]
    together = run_group(configs, outs, seeds_together=len(configs))
    info = json.loads((outs[0] / "config.json").read_text())
    assert info["seeds_vmapped"] == [0, 1] * 3
    assert [p["lr"] for p in info["hparams_vmapped"]] == [0.05, 0.05, 0.2, 0.2, 0.1, 0.1]
    for i in (1, 2, 5):
        assert_same_run(together[i], run_experiment(configs[i], None, progress=False))
    finals = {round(r.evals[-1]["test_loss"], 4) for r in together[::2]}
    assert len(finals) == 3


GRID_SPEC = {
    "sweep": {
        "seeds": 4,
        "baseline": "uniform",
        "seeds_together": "auto",
        "tune": {"metric": "final_accuracy", "seeds": 2},
    },
    "base": BASE,
    "grid": {"lr": [0.01, 0.1, 0.3]},
    "strategies": [
        {"strategy": "uniform"},
        {"strategy": "power_of_choice", "strategy_args": {"d": 6}},
    ],
}


def test_a_tuned_grid_sweep_runs_one_program_per_strategy(tmp_path, monkeypatch):
    groups = []
    real = run_lib.run_group

    def counting(configs, *args, **kwargs):
        groups.append(sorted({(c.config.strategy, c.config.lr) for c in configs}))
        return real(configs, *args, **kwargs)

    monkeypatch.setattr(run_lib, "run_group", counting)
    run_sweep(GRID_SPEC, tmp_path, progress=False, echo=lambda *a: None)
    assert len(groups) == 2  # one compiled program per strategy, its 3 points x 4 seeds in it
    assert all(len(g) == 3 for g in groups)

    sweep = expand_sweep(GRID_SPEC, tmp_path)
    cell = next(c for c in sweep.cells if c.label == "power_of_choice" and c.config.seed == 3)
    done = run_lib.finished_result(cell.config, cell.out)
    assert_same_run(done, run_experiment(cell.config, None, progress=False))

    # the choice, recomputed from the per-seed summaries: best mean over seeds 0 and 1
    tuning = json.loads((tmp_path / "tuning.json").read_text())
    assert tuning["tuning_seeds"] == [0, 1] and tuning["held_out_seeds"] == [2, 3]

    def final(label, lr, seed):
        c = next(
            c
            for c in sweep.cells
            if c.label == label and c.config.lr == lr and c.config.seed == seed
        )
        return json.loads((c.out / "summary.json").read_text())["final_accuracy"]

    chosen = {}
    for label in ("uniform", "power_of_choice"):
        means = [np.mean([final(label, lr, s) for s in (0, 1)]) for lr in (0.01, 0.1, 0.3)]
        chosen[label] = (0.01, 0.1, 0.3)[int(np.argmax(means))]
        (choice,) = [c for c in tuning["choices"] if c["strategy"] == label]
        assert choice["chosen"] == {"lr": chosen[label]}
        assert choice["score"] == pytest.approx(max(means))
    # the tuned comparison reads only the chosen points on the held-out seeds
    rows = json.loads((tmp_path / "tuned" / "comparison.json").read_text())
    row = next(
        r for r in rows if r["strategy"] == "power_of_choice" and r["metric"] == "final_accuracy"
    )
    a = [final("power_of_choice", chosen["power_of_choice"], s) for s in (2, 3)]
    b = [final("uniform", chosen["uniform"], s) for s in (2, 3)]
    assert row["seeds"] == 2 and row["setting"] == ""
    assert row["mean"] == pytest.approx(np.mean(a))
    assert row["diff"] == pytest.approx(np.mean(np.subtract(a, b)))


@pytest.mark.parametrize(
    "tune, match",
    [
        ({"axes": ["momentum"]}, "must be grid axes"),
        ({"seeds": 3}, "two others"),
        ({"seeds": [7]}, r"seeds \[7\] are not seeds"),
        ({"metric": "fastest"}, "metric 'fastest'"),
        ({"metric": "final_accuracy", "rounds": 2}, "unknown"),
    ],
)
def test_bad_tuning_sections_are_named(tmp_path, tune, match):
    spec = {**GRID_SPEC, "sweep": {**GRID_SPEC["sweep"], "tune": tune}}
    with pytest.raises(ConfigError, match=match):
        expand_sweep(spec, tmp_path)


def test_batch_size_is_the_fastest_measured_and_stops_when_larger_is_not_faster():
    from fedjax_sel.experiment.batching import choose_batch, sizes_to_try

    assert sizes_to_try(16) == [1, 2, 4, 8, 16] and sizes_to_try(12) == [1, 2, 4, 8, 12]
    asked = []
    planted = {1: 1.0, 2: 0.6, 4: 0.5, 8: 0.55, 16: 0.1}

    def timing(b):
        asked.append(b)
        return planted[b]

    choice = choose_batch(16, timing)
    assert choice.size == 4 and 16 not in asked  # 8 is not 5% faster than 4: stop there
    assert choice.seconds_per_member_round == {"1": 1.0, "2": 0.6, "4": 0.5, "8": 0.55}
    # a one-off spike in the first pass does not decide: every size is timed twice
    spikes = iter([2.0, 1.5, 0.5, 0.9])  # first pass 1, 2; second pass 1, 2

    choice = choose_batch(2, lambda b: next(spikes))
    assert choice.size == 1 and choice.seconds_per_member_round == {"1": 0.5, "2": 0.9}


def test_memory_bound_of_a_batch_does_not_depend_on_what_is_free_now(monkeypatch):
    """The bound on seeds per batch is half the machine's total memory (the device's
    ``bytes_limit``; the host's physical pages on CPU), not of what is free at the moment:
    the bound is part of the batch cache's key, and a run's bits can depend on its batch, so
    one machine must give one bound whatever else is running."""
    import os

    real = os.sysconf
    budgets = []
    for free_pages in (1_000, 1_000_000):
        fake = {"SC_AVPHYS_PAGES": free_pages, "SC_PHYS_PAGES": 4_000_000, "SC_PAGE_SIZE": 4096}
        monkeypatch.setattr(os, "sysconf", lambda name, fake=fake: fake.get(name) or real(name))
        monkeypatch.setattr(run_lib.jax, "devices", lambda: [type("D", (), {
            "memory_stats": lambda self: None})()])  # fmt: skip
        budgets.append(run_lib._memory_budget())
    assert budgets == [0.5 * 4_000_000 * 4096] * 2
    stats = iter([{"bytes_limit": 8e9, "bytes_in_use": 7e9}, {"bytes_limit": 8e9}])
    device = type("D", (), {"memory_stats": lambda self: next(stats)})()
    monkeypatch.setattr(run_lib.jax, "devices", lambda: [device])
    assert run_lib._memory_budget() == run_lib._memory_budget() == 4e9


def test_measured_batch_is_recorded_cached_and_used(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDJAX_SEL_AUTOTUNE", "1")
    configs = [RunConfig(**BASE, lr=0.1, seed=s) for s in range(4)]
    run_group(configs, [tmp_path / f"a{s}" for s in range(4)], echo=lambda *a: None)
    info = json.loads((tmp_path / "a0" / "config.json").read_text())
    choice = info["batch_choice"]
    assert choice["source"] == "measured" and choice["bound"] == 4
    timings = choice["seconds_per_member_round"]
    assert choice["size"] == int(min(timings, key=timings.get))
    assert len(info["seeds_vmapped"]) == choice["size"]
    run_group(configs, [tmp_path / f"b{s}" for s in range(4)], echo=lambda *a: None)
    again = json.loads((tmp_path / "b0" / "config.json").read_text())["batch_choice"]
    assert again == {**choice, "source": "cache"}


def test_traced_strategy_hyperparameters_share_a_program_and_equal_separate_runs(tmp_path):
    """Active FL's softmax inverse temperature alpha2 and exclusion fraction alpha1 are traced
    in its state (inject_hyperparams): one program for the grid, each point as alone; alpha3
    sets how many slots are soft draws (a shape) and stays in the program."""
    base = dict(BASE, strategy="active_fl", lr=0.1, data_seed=0)
    points = [{"alpha1": 0.5, "alpha2": 0.1}, {"alpha1": 0.0, "alpha2": 5.0}, {"alpha2": 1.0}]
    configs = [
        RunConfig(**base, strategy_args={**p, "alpha3": 0.25}, seed=s)
        for p in points
        for s in (0, 1)
    ]
    assert len({program_key(c) for c in configs}) == 1
    assert program_key(configs[0]) != program_key(
        configs[0].replace(strategy_args={"alpha2": 0.1, "alpha3": 0.5})
    )
    outs = [tmp_path / f"t{i}" for i in range(len(configs))]
    together = run_group(configs, outs, seeds_together=len(configs))
    info = json.loads((outs[0] / "config.json").read_text())
    # the third point leaves alpha1 at the factory's default, not the first member's 0.5
    assert [p["strategy.alpha1"] for p in info["hparams_vmapped"][::2]] == [0.5, 0.0, 0.75]
    for i in (1, 3, 4):
        assert_same_run(together[i], run_experiment(configs[i], None, progress=False))
    # each member's own alpha2 scales its logits (the spread of the kept ones)
    spreads = [r.evals[-1]["diagnostics"]["logit_spread"] for r in together[::2]]
    assert len({round(x, 6) for x in spreads}) == 3 and min(spreads) > 0


def test_injected_state_holds_the_values_and_refuses_untraced_names():
    import jax

    from fedjax_sel.base import SimSpec
    from fedjax_sel.strategies import make_strategy
    from fedjax_sel.strategies.hyperparams import init_with_hyperparams

    strategy = make_strategy("hetero_select", 2, tau0=1.5, w_d=0)  # no label counts needed
    assert strategy.hyperparams == (("eta", 0.3), ("gamma", 0.7), ("alpha", 0.5), ("tau0", 1.5))
    spec = SimSpec(num_clients=5, per_round=2, num_rounds=3, num_examples=np.ones(5), params={})
    state = strategy.init(jax.random.key(0), spec)
    assert float(state.hyperparams["tau0"]) == 1.5
    assert state.inner.participations.shape == (5,)  # HeteRo-Select's own state beside them
    state = init_with_hyperparams(strategy, jax.random.key(0), spec, {"tau0": 3.0})
    assert float(state.hyperparams["tau0"]) == 3.0
    assert float(state.hyperparams["eta"]) == np.float32(0.3)  # the default, as built
    with pytest.raises(ConfigError, match=r"traces \['eta', 'gamma', 'alpha', 'tau0'\]"):
        init_with_hyperparams(strategy, jax.random.key(0), spec, {"w_v": 2.0})


def test_round_spec_is_static_and_refuses_what_cannot_work():
    """The round's spec holds no arrays (data and traced hyperparameters are arguments, so one
    program serves them all), and its checks name the setting that breaks."""
    import jax

    from fedjax_sel.data.datasets import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.models import make_model
    from fedjax_sel.strategies import make_strategy
    from fedjax_sel.training import LocalConfig

    ds = load_dataset("digits", num_clients=6, seed=0)
    model = make_model("logreg", input_shape=ds.input_shape, num_classes=ds.num_classes)
    spec = RoundSpec.create(
        ds, model, make_strategy("uniform", 2), local=LocalConfig(), per_round=2
    )
    assert jax.tree.leaves(spec) == [] and spec.slots == 2 and spec.system is None
    with pytest.raises(ConfigError, match=r"per_round=7 .* exceeds the number of clients \(6\)"):
        RoundSpec.create(ds, model, make_strategy("uniform", 7), local=LocalConfig(), per_round=7)
    with pytest.raises(ConfigError, match="deadline or over-commitment needs device profiles"):
        RoundSpec.create(
            ds, model, make_strategy("uniform", 2), local=LocalConfig(), per_round=2, deadline=5.0
        )


def test_a_grid_over_strategy_args_merges_with_each_strategys_own(tmp_path):
    spec = {
        "sweep": {"seeds": 1},
        "base": BASE,
        "grid": {"strategy_args": [{"beta": 0.5}, {"beta": 2.0}]},
        "strategies": [{"strategy": "fedcvr_bolt", "strategy_args": {"warmup": 1}}],
    }
    cells = expand_sweep(spec, tmp_path).cells
    assert [c.config.strategy_args for c in cells] == [
        {"beta": 0.5, "warmup": 1},
        {"beta": 2.0, "warmup": 1},
    ]
    assert len({program_key(c.config) for c in cells}) == 1  # beta is traced
    spec["strategies"][0]["strategy_args"]["beta"] = 1.0
    with pytest.raises(ConfigError, match=r"sets strategy_args \['beta'\], which the grid varies"):
        expand_sweep(spec, tmp_path)


OWN_GRID_SPEC = {
    "sweep": {"seeds": 4, "baseline": "uniform", "tune": {"metric": "final_accuracy", "seeds": 2}},
    "base": dict(BASE, lr=0.1),
    "strategies": [
        {"strategy": "uniform"},
        {
            "strategy": "active_fl",
            "strategy_args": {"alpha3": 0.25},
            "grid": {"strategy_args": {"alpha2": [0.01, 5.0]}},
        },
    ],
}


def test_a_strategys_own_grid_is_labelled_run_in_one_program_and_tuned(tmp_path, monkeypatch):
    """``[[strategies]] grid``: the points of one strategy's own option (the others lack it)
    are labelled cells of one program, paired against the baseline, and always tuned."""
    groups = []
    real = run_lib.run_group

    def counting(configs, *args, **kwargs):
        groups.append(sorted({c.config.label for c in configs}))
        return real(configs, *args, **kwargs)

    monkeypatch.setattr(run_lib, "run_group", counting)
    sweep = expand_sweep(OWN_GRID_SPEC, tmp_path)
    labels = sorted({c.label for c in sweep.cells})
    low, high = "active_fl[strategy_args.alpha2=0.01]", "active_fl[strategy_args.alpha2=5.0]"
    assert labels == [low, high, "uniform"]
    cell = next(c for c in sweep.cells if c.label == high)
    assert cell.config.strategy_args == {"alpha2": 5.0, "alpha3": 0.25} and cell.setting == ""
    run_sweep(sweep, tmp_path, progress=False, echo=lambda *a: None)
    assert sorted(groups) == [[low, high], ["uniform"]]

    def final(label, seed):
        c = next(c for c in sweep.cells if c.label == label and c.config.seed == seed)
        return json.loads((c.out / "summary.json").read_text())["final_accuracy"]

    rows = json.loads((tmp_path / "comparison.json").read_text())
    assert {r["strategy"] for r in rows} >= {low, high}
    means = {x: np.mean([final(x, s) for s in (0, 1)]) for x in (low, high)}
    best = max(means, key=means.get)  # ties: the first in grid order, as max keeps
    tuning = json.loads((tmp_path / "tuning.json").read_text())
    (choice,) = [c for c in tuning["choices"] if c["strategy"] == "active_fl"]
    assert choice["chosen"] == {"strategy_args.alpha2": 0.01 if best == low else 5.0}
    assert choice["score"] == pytest.approx(means[best])
    tuned = json.loads((tmp_path / "tuned" / "comparison.json").read_text())
    row = next(r for r in tuned if r["strategy"] == "active_fl" and r["metric"] == "final_accuracy")
    a, b = [final(best, s) for s in (2, 3)], [final("uniform", s) for s in (2, 3)]
    assert row["seeds"] == 2 and row["mean"] == pytest.approx(np.mean(a))
    assert row["diff"] == pytest.approx(np.mean(np.subtract(a, b)))


@pytest.mark.parametrize(
    "change, match",
    [
        ({"grid": {"strategy_args": [{"alpha2": 1.0}]}}, r"grids \['strategy_args'\], which"),
        ({"entry_args": {"alpha2": 1.0}}, r"sets strategy_args \['alpha2'\], which the grid"),
        ({"own": {"lr": 0.1}}, "'lr' must be a non-empty list, got 0.1"),
        ({"baseline": "active_fl"}, "baseline 'active_fl' has a grid of its own"),
        (
            {"grid": {"strategy_args": [{"alpha2": 1.0}]}, "keep": 1},
            r"set strategy_args \['alpha2'\] twice",
        ),
    ],
)
def test_bad_own_grids_are_named(tmp_path, change, match):
    import copy

    spec = copy.deepcopy(OWN_GRID_SPEC)
    entry = spec["strategies"][1]
    entry["grid"]["strategy_args"] = {"alpha2": [0.01, 5.0]}
    if "grid" in change:
        spec["grid"] = change["grid"]
        if "keep" not in change:
            entry["grid"] = {"strategy_args": [{"alpha2": 2.0}]}
    if "entry_args" in change:
        entry["strategy_args"].update(change["entry_args"])
    if "own" in change:
        entry["grid"].update(change["own"])
    if "baseline" in change:
        spec["sweep"]["baseline"] = change["baseline"]
    with pytest.raises(ConfigError, match=match):
        expand_sweep(spec, tmp_path)


def test_the_docs_list_every_strategys_traced_hyperparameters():
    """docs/extending.md's table of traced hyperparameters is the registry's."""
    from pathlib import Path

    from fedjax_sel.strategies import STRATEGIES
    from fedjax_sel.strategies.registry import traced_values

    text = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    table = text.split("### Traced hyperparameters", 1)[1].split("\n\n")[1]
    documented = {
        row.split("|")[1].strip(): tuple(x.strip(" `") for x in row.split("|")[2].split(","))
        for row in table.splitlines()[2:]
    }
    # what each strategy traces, built with its defaults (a run's default 10 slots)
    traced = {n: tuple(traced_values(n, 10, {})) for n in sorted(STRATEGIES)}
    assert documented == {n: names for n, names in traced.items() if names}


def test_nbytes_counts_arrays_and_shapes_but_not_prng_keys():
    """``tree.nbytes`` (what the batch bound and the parameter-size check measure) equals
    NumPy's byte count of the same arrays, reads shapes alone from ``jax.eval_shape``, and
    counts a typed PRNG key as nothing."""
    import jax

    from fedjax_sel.tree import nbytes

    arrays = {"w": np.zeros((3, 5), np.float32), "n": np.zeros(7, np.int64)}
    tree = {**arrays, "key": jax.random.key(0)}
    assert nbytes(tree) == sum(a.nbytes for a in arrays.values()) == 3 * 5 * 4 + 7 * 8
    shapes = jax.eval_shape(lambda: {"w": jax.numpy.zeros((3, 5)), "key": jax.random.key(1)})
    assert nbytes(shapes) == 3 * 5 * 4
