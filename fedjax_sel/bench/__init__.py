"""Benchmarks behind ``fedjax-sel bench`` and ``benchmarks/``: they time, write JSON and print
a table (never assert). See :mod:`fedjax_sel.bench.throughput` and
:mod:`fedjax_sel.bench.kernels`.

Kernel benchmarks register themselves with :func:`register_kernel`; every module of this
package whose name starts with ``kernels_`` is imported when the registry is read, so a method
adds its kernels in a module of its own.
"""

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.bench.grid import grid_main
from fedjax_sel.bench.kernels import KERNEL_BENCHMARKS, kernels_main, register_kernel
from fedjax_sel.bench.sweep import sweep_main
from fedjax_sel.bench.throughput import throughput_main

__all__ = [
    "KERNEL_BENCHMARKS",
    "kernels_main",
    "print_table",
    "register_kernel",
    "grid_main",
    "sweep_main",
    "throughput_main",
    "write_json_rows",
]
