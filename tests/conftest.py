"""Shared test fixtures.

Real data: tests that need it use the ``data_dir`` fixture (or call ``require_data``), which
reads ``$FEDJAX_SEL_DATA_DIR`` (default ``../shared/data`` next to the project). Without the
files such a test is skipped with the reason; when ``FEDJAX_SEL_REQUIRE_DATA=1`` (``.ci/run``
sets it) it fails instead, so CI always runs them.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest

# One persistent compilation cache for the session (shared by the xdist workers of one run,
# empty in a fresh one): tests that build the same program (the same small digits or
# synthetic simulation, say) compile it once. Executables come back bit-identical.
# Subprocesses (CLI runs, notebook kernels, the two-process test) inherit it through the
# environment. Every program is cached, however fast it compiled: the suite's many sub-second
# compiles repeat across files and subprocesses (about 13% less CPU time than a 0.5 s floor).
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
_JAX_CACHE = Path(tempfile.gettempdir()) / f"fedjax_sel_tests_{_RUN}"
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_JAX_CACHE)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
jax.config.update("jax_compilation_cache_dir", str(_JAX_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
# The suite's programs are tiny and compiled once each, so compile time dominates: skip LLVM's
# expensive passes (XLA's own graph passes still run; results stay deterministic, and every
# comparison a test makes is between programs built alike). Subprocesses inherit it.
os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
jax.config.update("jax_disable_most_optimizations", True)

# GPUs multiply float32 matrices in TensorFloat-32 by default (a 10-bit mantissa), and the suite
# compares against float64 NumPy references: full float32 products everywhere (what CPUs compute
# anyway). A run's matmul_precision="default" keeps it; subprocesses inherit it.
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "float32"
jax.config.update("jax_default_matmul_precision", "float32")


def _test_xla_flags() -> str:
    """XLA flags for the suite: with most optimizations off, the CPU backend's classic fusion
    emitters compile the suite's small programs faster than the newer MLIR emitters
    (benchmarks/cpu_fusion_emitters.py; the whole suite took about half the time). XLA aborts
    on a flag it does not know, so a jaxlib without this one is probed once (the xdist
    workers and subprocesses inherit the answer)."""
    known = os.environ.get("FEDJAX_SEL_TEST_XLA_FLAGS")
    if known is not None:
        return known
    import subprocess
    import sys

    flags = "--xla_cpu_use_fusion_emitters=false"
    probe = subprocess.run(
        [sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"],
        env=dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu"),
        capture_output=True,
    )
    return flags if probe.returncode == 0 else ""


# Read when the backend starts (the first computation), so set before any test runs.
TEST_XLA_FLAGS = _test_xla_flags()
os.environ["FEDJAX_SEL_TEST_XLA_FLAGS"] = TEST_XLA_FLAGS
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {TEST_XLA_FLAGS}".strip()


def pytest_unconfigure(config):
    """The controlling process (not an xdist worker) removes the session's cache."""
    if not hasattr(config, "workerinput"):
        import shutil

        shutil.rmtree(_JAX_CACHE, ignore_errors=True)


def pytest_runtest_logreport(report):
    """With ``FEDJAX_SEL_FAILURE_LOG`` set, each failure's traceback is appended to that file as
    it happens (by the controlling process only), so a run stopped before pytest's summary
    (a lease's time limit, say: benchmarks/gpu_check.sh) still says why each test failed."""
    path = os.environ.get("FEDJAX_SEL_FAILURE_LOG")
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = (ROOT / ".." / "shared" / "data").resolve()


def data_dir_path() -> Path:
    return Path(os.environ.get("FEDJAX_SEL_DATA_DIR", DEFAULT_DATA_DIR)).expanduser()


def require_data(*names: str) -> Path:
    """The data folder, if it holds ``names``; otherwise skip (or fail under CI)."""
    d = data_dir_path()
    missing = [n for n in names if not (d / n).exists()]
    if missing:
        msg = (
            f"real data {missing} not found under {str(d)!r}; set FEDJAX_SEL_DATA_DIR to the "
            "folder holding mnist.npz and shakespeare/"
        )
        if os.environ.get("FEDJAX_SEL_REQUIRE_DATA") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture
def data_dir() -> Path:
    """The real-data folder with mnist.npz and shakespeare/ (see module docstring)."""
    return require_data("mnist.npz", "shakespeare")


@pytest.fixture(scope="session", autouse=True)
def _data_dir_env(tmp_path_factory):
    """Tests see the data-dir variable (loaders read it) pointing at the resolved folder. The
    measured ``--parallel auto`` and seed-batch choices are switched off (the rules decide;
    measuring compiles every candidate) except where a test switches them on (its
    ``monkeypatch`` restores this), and their cache goes to a temporary folder, never the
    user's. Session-scoped, so that module-scoped fixtures (a suite run once for a file's
    tests) see it too: a fixture of a wider scope is set up before a function-scoped one."""
    patch = pytest.MonkeyPatch()
    patch.setenv("FEDJAX_SEL_DATA_DIR", str(data_dir_path()))
    patch.setenv("FEDJAX_SEL_AUTOTUNE", "0")
    patch.setenv("FEDJAX_SEL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    yield
    patch.undo()


@pytest.fixture
def host_leaves():
    """A pytree's leaves as NumPy arrays (PRNG keys as their key data), to compare states
    leaf by leaf."""

    def leaves(tree) -> list[np.ndarray]:
        return [
            np.asarray(jax.random.key_data(x))
            if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
            else np.asarray(x)
            for x in jax.tree.leaves(tree)
        ]

    return leaves


@pytest.fixture
def check_pinned():
    """Checks a reproduction's tiny run (its ``per_seed.json``) against values pinned as
    ``{cell: {seed: {metric: value}}}``, within ``rel=1e-4`` (room for another x86 CPU's last
    bits, not for a real change). CPU only: a GPU's float32 products differ in the last bits,
    which training amplifies."""

    def check(per_seed: dict, pinned: dict, rel: float = 1e-4) -> None:
        if jax.default_backend() != "cpu":
            return
        for cell, seeds in pinned.items():
            for seed, values in seeds.items():
                got = per_seed["cells"][cell]["seeds"][str(seed)]
                assert {m: got[m] for m in values} == pytest.approx(values, rel=rel), (cell, seed)

    return check
