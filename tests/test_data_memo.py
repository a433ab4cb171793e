"""A suite's data sets are loaded once per task (``DataMemo``): the same configuration's data
set is the very object loaded before, another seed's is its own, and the memo keeps at most its
capacity, dropping the least recently used."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.build import DataMemo, load_data_for


def _config(seed: int, **kw) -> RunConfig:
    return RunConfig(
        **{"dataset": "digits", "num_clients": 6, "test_fraction": 0.2, **kw}, seed=seed
    )


def test_a_memo_returns_what_it_loaded_and_drops_the_least_recent():
    memo = DataMemo(2)
    a = load_data_for(_config(0), memo)
    # the strategy and lr are not read by the load: the same data set
    assert load_data_for(_config(0, strategy="power_of_choice", lr=0.3), memo) is a
    b = load_data_for(_config(1), memo)
    assert b is not a and len(memo) == 2
    fresh = load_data_for(_config(1))  # without a memo: loaded again, equal values
    np.testing.assert_array_equal(np.asarray(fresh.train.counts), np.asarray(b.train.counts))
    assert load_data_for(_config(0), memo) is a  # used last: b is now the oldest
    load_data_for(_config(2), memo)
    assert len(memo) == 2
    assert load_data_for(_config(0), memo) is a
    assert load_data_for(_config(1), memo) is not b  # dropped, loaded again
    # what the load reads (here the number of clients) keys it
    assert load_data_for(_config(0, num_clients=5), memo) is not a


def test_a_memo_needs_room_for_one():
    with pytest.raises(ValueError, match="capacity must be at least 1, got 0"):
        DataMemo(0)
