"""Latency of each registered selection kernel against the number of clients K.

Same code as ``fedjax-sel bench kernels``; writes a JSON list of
``{"kernel", "clients", "seconds"}`` rows and prints a table. Example::

    python benchmarks/kernels.py --kernel markov_step --clients 1000 --clients 1000000
"""

from __future__ import annotations

import argparse

from fedjax_sel.bench import kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    kernels.add_arguments(p)  # the flags of fedjax-sel bench kernels
    kernels.main(p.parse_args())


if __name__ == "__main__":
    main()
