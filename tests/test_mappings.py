"""Long runs stay under vm.max_map_count: compiled programs are released when crowded."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from fedjax_sel.experiment.mappings import mapping_count, mapping_limit, release_if_crowded

pytestmark = pytest.mark.skipif(mapping_count() is None, reason="no /proc/self/maps here")


def _compile_programs(n: int) -> list:
    fns = []
    for i in range(n):
        f = jax.jit(lambda x, i=i: jnp.tanh(x) * (i + 1) + x @ x.T)
        f(jnp.ones((4 + i, 4 + i))).block_until_ready()
        fns.append(f)
    return fns


def test_release_frees_the_mappings_of_compiled_programs_only_when_crowded():
    fns = _compile_programs(40)
    assert all(f._cache_size() == 1 for f in fns)
    assert mapping_limit() is None or mapping_limit() > 1000
    # far below the limit: nothing is released
    assert release_if_crowded(limit=10**9) is None
    assert all(f._cache_size() == 1 for f in fns)
    # over half of a (pretended) limit: caches dropped and mappings returned to the kernel
    messages = []
    before = mapping_count()
    got = release_if_crowded(limit=before, echo=messages.append)
    assert got is not None and got[0] >= before and got[1] < got[0]
    assert all(f._cache_size() == 0 for f in fns)
    assert len(messages) == 1 and "vm.max_map_count" in messages[0]
    # the programs still run (compiled again) and give the same values
    x = jnp.ones((4, 4))
    assert float(fns[0](x)[0, 0]) == pytest.approx(float(jnp.tanh(1.0) + 4.0))


def test_run_cells_checks_after_every_group(tmp_path, monkeypatch):
    """The sweep runner (reproductions and suites run through it) checks the mappings after
    each group of cells that shares a program."""
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment import sweep

    calls = []
    monkeypatch.setattr(sweep, "release_if_crowded", lambda **kw: calls.append(kw))
    base = dict(dataset="digits", num_clients=10, per_round=3, rounds=2, local_steps=2)
    cells = [
        sweep.Cell(RunConfig(strategy=s, seed=seed, **base).validate(), tmp_path / f"{s}{seed}", s)
        for s in ("uniform", "power_of_choice")
        for seed in (0, 1)
    ]
    sweep.run_cells(cells, progress=False, echo=lambda *_: None)
    assert len(calls) == 2
