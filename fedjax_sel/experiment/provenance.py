"""The code and the machine a result was made by.

The code, so that a finished run or a checkpoint made by other code is recomputed, not mixed
with this code's runs: the record is a digest of the package's source (the bytes of every
``.py`` file under ``fedjax_sel/`` with its path: any edit counts, a comment's included;
parsing the files to ignore comments would cost a second per process) and the package version.
It goes into every run's ``config.json`` and a reproduction's ``run_info.json`` and
``per_seed.json``; :func:`same_code` is what the experiment layer checks before it reuses a
finished cell or resumes a checkpoint. The machine (:func:`machine_info`), so that a timing or
a suite's wall time says where it was measured.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path
from typing import Any


def source_digest_of(root: str | Path) -> str:
    """Hex digest (16 characters) of every ``.py`` file under ``root``, path and bytes."""
    root = Path(root)
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


@functools.cache
def source_digest() -> str:
    """:func:`source_digest_of` the imported ``fedjax_sel`` package (computed once)."""
    import fedjax_sel

    return source_digest_of(Path(fedjax_sel.__file__).parent)


def code_record() -> dict[str, str]:
    """What is recorded with a run: the package version and :func:`source_digest`."""
    import fedjax_sel

    return {"fedjax_sel": fedjax_sel.__version__, "source": source_digest()}


def same_code(stored: Any) -> bool:
    """Whether a stored :func:`code_record` is this code's (a run without one is not)."""
    return isinstance(stored, dict) and stored.get("source") == source_digest()


def _cpuinfo_blocks(cpuinfo: str | Path) -> list[dict[str, str]]:
    """The ``key: value`` blocks of ``/proc/cpuinfo``, one per processor (and Arm's trailing
    ``Hardware``/``Model`` block), in file order; none where the file is missing."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            blocks[-1].setdefault(key.strip(), value.strip())
        elif not line.strip() and blocks[-1]:
            blocks.append({})
    return [b for b in blocks if b]


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name (``model name`` in Linux's ``/proc/cpuinfo``, else the platform's
    processor string): two machines that are both ``x86_64`` can differ twofold in speed."""
    for block in _cpuinfo_blocks(cpuinfo):
        for key, value in block.items():
            if key in ("model name", "Model", "cpu model") and value:
                return value
    return platform.processor() or platform.machine()


# The /proc/cpuinfo flags of the vector extensions XLA's CPU compiler may emit code for: two
# machines that differ in them can give different last bits for the same program (a reduction
# over 16-lane AVX-512 registers adds in another order than over 8-lane AVX2 ones).
VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512dq",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
)


@functools.cache  # read once per process: every suite record names it
def cpu_code_target(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """What XLA compiles CPU code for, in a line: the vendor, family and model (x86) or the
    implementer and part (Arm), and the vector extensions of :data:`VECTOR_FLAGS` present,
    e.g. ``"AuthenticAMD 25/1: sse4_2 avx avx2 fma f16c"``. Where two machines' lines differ,
    XLA compiles different code for them and results can differ in the last bits
    (docs/performance.md, on batches and bits); the same line is as close to the same code as
    ``/proc/cpuinfo`` can say. ``"unknown"`` without it (macOS, Windows)."""
    blocks = _cpuinfo_blocks(cpuinfo)
    if not blocks:
        return "unknown"
    fields = blocks[0]  # the first processor's
    if "vendor_id" in fields:
        ident = f"{fields['vendor_id']} {fields.get('cpu family', '?')}/{fields.get('model', '?')}"
    else:
        ident = f"{fields.get('CPU implementer', '?')}/{fields.get('CPU part', '?')}"
    present = set((fields.get("flags") or fields.get("Features") or "").split())
    return f"{ident}: " + " ".join(f for f in VECTOR_FLAGS if f in present)


def machine_info() -> dict[str, Any]:
    """The machine: backend, devices, CPU model and count, versions. Recorded with every
    measurement (``benchmarks/``) and every suite invocation (``invocations.json``)."""
    import jax
    import jaxlib

    dev = jax.devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": dev[0].device_kind,
        "num_devices": len(dev),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_target": cpu_code_target(),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "python": platform.python_version(),
        # JAX_DEFAULT_MATMUL_PRECISION (bfloat16, tensorfloat32) changes an accelerator's speed
        "matmul_precision": jax.config.jax_default_matmul_precision or "default",
        "devices": [str(d) for d in dev],
    }
