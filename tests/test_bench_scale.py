"""``fedjax-sel bench scale``: one row measured in process, checked against the data it ran on."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.bench.scale import (
    MAX_PER_ROUND,
    PERSONAL_SCALE,
    SCALE_STRATEGIES,
    measure_one,
    row_args,
    scale_main,
)
from fedjax_sel.data import load_dataset
from fedjax_sel.strategies import STRATEGIES


def test_row_describes_the_simulation_it_timed():
    row = measure_one("ca_fed", 400, 20, rounds=2, max_examples=6, local_steps=2, accuracy_rounds=9)
    # the same generator call, independently: the row's example count and layout are the data's
    ds = load_dataset(
        "leaf_synthetic",
        num_clients=400,
        seed=0,
        max_examples=6,
        layout="auto",
        personal_scale=PERSONAL_SCALE,
    )
    counts = np.asarray(ds.train.counts)
    assert row["examples"] == int(counts.sum()) and counts.max() <= 6
    assert row["layout"] == ds.train.layout
    assert (row["clients"], row["per_round"], row["availability"]) == (400, 20, "markov")
    for key in ("seconds_per_round", "training_s", "evaluation_s", "data_seconds"):
        assert row[key] > 0, key
    for key in ("availability_s", "selection_s", "aggregation_s"):
        assert row[key] >= 0, key
    # phases are timed separately; together they cannot be orders of magnitude off the round
    assert row["training_s"] < 50 * row["seconds_per_round"]
    assert row["peak_memory_bytes"] > 2**20
    assert row["peak_memory_gib"] == pytest.approx(row["peak_memory_bytes"] / 2**30)
    assert row["rounds_trained"] == 9 and 0.0 <= row["test_accuracy"] <= 1.0
    assert row["mean_seconds_per_round"] >= row["seconds_per_round"] / 5


def test_every_strategy_has_a_row_and_its_large_k_settings():
    assert {s.partition(":")[0] for s in SCALE_STRATEGIES} == set(STRATEGIES)
    # the approximations that keep a round bounded at large K, sized from K and P
    assert row_args("divfl", 10**6, 100) == {"sketch_dim": 100, "pool": 1000}
    assert row_args("divfl", 500, 100)["pool"] == 500
    assert row_args("filfl", 10**5, 1000)["considered"] == 2000
    assert row_args("power_of_choice", 10**4, 1000)["d"] == 2000
    assert row_args("fedcvr_bolt", 10**6, 100)["coalitions"] == "landmark"
    assert MAX_PER_ROUND["fedcvr_bolt"] == MAX_PER_ROUND["divfl"] == 100


def test_unknown_strategy_is_named():
    with pytest.raises(ConfigError, match="'nope'"):
        scale_main(["uniform", "nope"], [100])


def test_full_participation_is_not_run_above_its_limit_and_says_why():
    rows = scale_main(["full"], [200_000])
    assert rows == [
        {
            "strategy": "full",
            "clients": 200_000,
            "per_round": 200_000,
            "rounds": 5,
            "max_examples": 20,
            "error": "not run above K = 100,000: trains every client every round "
            "(10^6 local trainings per round)",
        }
    ]
