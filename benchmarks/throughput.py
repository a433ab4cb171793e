"""Throughput of one FedAvg round: engine vs a Python loop of jitted client trainers vs matmul.

Same code as ``fedjax-sel bench throughput``; writes JSON and prints a table. Examples::

    python benchmarks/throughput.py --model logreg --per-round 1000 --out logreg.json
    python benchmarks/throughput.py --model mlp --model cnn --mode all
    FEDJAX_SEL_CPU_DEVICES=2 python benchmarks/throughput.py --model logreg   # both cores
"""

from __future__ import annotations

import argparse
import os

if os.environ.get("FEDJAX_SEL_CPU_DEVICES"):  # before JAX starts its backends
    from fedjax_sel.cli.main import set_cpu_devices

    set_cpu_devices(None)

from fedjax_sel.bench import throughput  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    throughput.add_arguments(p)  # the flags of fedjax-sel bench throughput
    p.set_defaults(repeats=3)
    a = p.parse_args()
    a.model = a.model or ["logreg", "mlp", "cnn"]
    throughput.main(a)


if __name__ == "__main__":
    main()
