"""Pickles from the internet are read as plain data only: a file that names a callable (here
``os.system`` creating a file) is refused with a clear error, and nothing it names runs."""

from __future__ import annotations

import collections
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from fedjax_sel.availability.fedscale_trace import load_behaviour_trace
from fedjax_sel.base import ConfigError
from fedjax_sel.engine.system import load_device_capacity
from fedjax_sel.safe_pickle import RefusedPickle, load_plain_pickle


class _Exploit:
    """Unpickling this calls ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def _crafted(tmp_path, name: str, payload) -> tuple:
    marker = tmp_path / f"{name}.ran"
    path = tmp_path / f"{name}.pkl"
    path.write_bytes(pickle.dumps(payload(f"touch {marker}")))
    return path, marker


def test_plain_data_of_every_protocol_loads_as_written(tmp_path):
    data = {
        1: {"active": [0, 10.5], "inactive": [5, 20], "finish_time": 100},
        "x": ({1, 2}, frozenset({3}), 1 + 2j, b"raw", bytearray(b"ab"), None, True),
        "ordered": collections.OrderedDict(a=1),
    }
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        path = tmp_path / f"p{protocol}.pkl"
        path.write_bytes(pickle.dumps(data, protocol=protocol))
        assert load_plain_pickle(path) == data


@pytest.mark.parametrize(
    "payload",
    [
        lambda cmd: {"client": _Exploit(cmd)},  # a reduce to os.system inside plain data
        lambda cmd: [_Exploit(cmd)],
    ],
)
def test_a_pickle_naming_a_callable_is_refused_and_runs_nothing(tmp_path, payload):
    path, marker = _crafted(tmp_path, "trace", payload)
    with pytest.raises(RefusedPickle, match=r"names (posix|nt|os)\.system: only plain data"):
        load_plain_pickle(path, "behaviour trace")
    assert not marker.exists()
    # the two FedScale readers refuse it the same way (a ConfigError: exit 2 at the CLI)
    with pytest.raises(ConfigError, match=r"behaviour trace .* names (posix|nt|os)\.system"):
        load_behaviour_trace(path)
    with pytest.raises(ConfigError, match=r"device capacity file .* names (posix|nt|os)\.system"):
        load_device_capacity(path)
    assert not marker.exists()


def test_classes_and_arrays_are_refused_too(tmp_path):
    path = tmp_path / "array.pkl"
    path.write_bytes(pickle.dumps({"a": np.arange(3)}))
    with pytest.raises(RefusedPickle, match="numpy"):
        load_plain_pickle(path)
    path.write_bytes(pickle.dumps({"a": ConfigError("x")}))
    with pytest.raises(RefusedPickle, match="fedjax_sel.base.ConfigError"):
        load_plain_pickle(path)


def test_trace_convert_exits_2_on_a_crafted_pickle_and_runs_nothing(tmp_path):
    path, marker = _crafted(tmp_path, "behave", lambda cmd: {"1": _Exploit(cmd)})
    done = subprocess.run(
        [sys.executable, "-m", "fedjax_sel", "trace", "convert", str(path),
         str(tmp_path / "t.npy"), "--round-seconds", "60", "--rounds", "5"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert "only plain data" in done.stderr and not marker.exists()
