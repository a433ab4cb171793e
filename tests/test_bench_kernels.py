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


def _selection_kernels():
    import fedjax_sel.bench  # noqa: F401  (registers every kernel benchmark)

    # the FilFL passes train and evaluate real models: their own tests cover them
    return [n for n in sorted(KERNEL_BENCHMARKS) if not n.startswith("filfl_")]


@pytest.mark.parametrize("name", _selection_kernels())
def test_every_registered_kernel_runs_at_a_small_size_with_finite_outputs(name):
    """Each benchmark builds its kernel against today's interfaces (a changed protocol breaks
    the build, not a later million-client run) and computes finite numbers."""
    import jax

    bench = KERNEL_BENCHMARKS[name]
    k = 64 if bench.info["max_clients"] is None else min(64, bench.info["max_clients"])
    fn, args = bench.factory(k)
    out = jax.jit(fn)(*args)
    leaves = [x for x in jax.tree.leaves(out) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
    assert all(bool(jnp.all(jnp.isfinite(x) | jnp.isinf(x) & (x < 0))) for x in leaves), name


def test_cpu_model_is_recorded(tmp_path):
    """Benchmark JSON names the CPU model, not only the architecture: an Intel Xeon and an AMD
    EPYC are both ``x86_64`` and differ in speed."""
    import platform

    from fedjax_sel.experiment.provenance import cpu_model, machine_info

    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
        "\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
    )
    assert cpu_model(info) == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    fallback = platform.processor() or platform.machine()
    assert cpu_model(tmp_path / "missing") == fallback  # no /proc (macOS, Windows)
    (tmp_path / "blank").write_text("processor\t: 0\nmodel name\t:\n")
    assert cpu_model(tmp_path / "blank") == fallback
    recorded = machine_info()["cpu_model"]
    assert isinstance(recorded, str) and recorded


def test_cpu_code_target_names_vendor_model_and_vector_extensions(tmp_path):
    """What XLA compiles for, from ``/proc/cpuinfo``: an AVX2 EPYC and an AVX-512 one of the
    same family differ, an Arm CPU is named by implementer and part, and the first processor's
    block alone is read."""
    from fedjax_sel.experiment.provenance import cpu_code_target, machine_info

    amd = tmp_path / "amd"
    amd.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu sse sse2 sse4_2 fma avx f16c avx2 bmi2\n\n"
        "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "flags\t\t: avx512f\n"
    )
    assert cpu_code_target(amd) == "AuthenticAMD 25/1: sse4_2 avx avx2 fma f16c"
    genoa = tmp_path / "genoa"
    genoa.write_text(
        "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "flags\t\t: avx2 avx avx512f avx512bw avx512_vnni sse4_2 fma avx512vl avx512dq\n"
    )
    assert cpu_code_target(genoa) == (
        "AuthenticAMD 25/17: sse4_2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni"
    )
    arm = tmp_path / "arm"
    arm.write_text(
        "processor\t: 0\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n"
    )
    assert cpu_code_target(arm) == "0x41/0xd40: asimd sve"
    assert cpu_code_target(tmp_path / "missing") == "unknown"
    info = machine_info()
    assert info["cpu_target"] == cpu_code_target() and info["jaxlib_version"]
