"""The kernel benchmark harness: rows as documented, kernels above their size limit skipped."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.bench.kernels import KERNEL_BENCHMARKS, kernels_main, register_kernel


@pytest.fixture
def limited_kernel():
    @register_kernel("test_dense_square", default_clients=(4, 8), max_clients=8)
    def _build(k: int):
        return (lambda x: jnp.outer(x, x).sum()), (jnp.ones((k,), jnp.float32),)

    yield "test_dense_square"
    KERNEL_BENCHMARKS.unregister("test_dense_square")


def test_rows_and_limit(limited_kernel, tmp_path, capsys):
    out = tmp_path / "k.json"
    rows = kernels_main([limited_kernel], [4, 8, 16], repeats=2, out=str(out))
    assert [r["clients"] for r in rows] == [4, 8]  # K = 16 is above max_clients
    assert "K=16: skipped, above its limit of 8 clients" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert [r["clients"] for r in written] == [4, 8]
    assert all(r["kernel"] == limited_kernel and r["seconds"] > 0 for r in written)


def test_unknown_kernel_is_a_config_error():
    with pytest.raises(ConfigError, match="no_such_kernel"):
        kernels_main(["no_such_kernel"], [10])
