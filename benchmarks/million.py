"""The README's million-client command, timed as a user runs it; writes JSON, prints a line.

Runs ``fedjax-sel run --dataset leaf_synthetic --clients 1000000 --per-round 1000
--dataset-arg max_examples=20 --rounds 20 --eval-every 10`` in a child process and records the
child's wall time and peak resident memory (``ru_maxrss`` of the children) beside the run's own
summary (rounds/s after compilation, the first chunk's seconds, final accuracy). The per-client
arrays of the summary (selection counts, a million entries) are left out of the JSON::

    python benchmarks/million.py --out benchmarks/results/cpu/million.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedjax_sel.experiment.provenance import machine_info

COMMAND = [
    "run",
    "--dataset",
    "leaf_synthetic",
    "--clients",
    "1000000",
    "--per-round",
    "1000",
    "--dataset-arg",
    "max_examples=20",
    "--rounds",
    "20",
    "--eval-every",
    "10",
    "--no-progress",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=1_000_000)
    p.add_argument("--out", default="benchmarks/results/cpu/million.json")
    a = p.parse_args()
    command = [c if c != "1000000" else str(a.clients) for c in COMMAND]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fedjax_sel", *command, "--out", tmp], check=True)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        # the speed and memory totals, kept in the summary of this file as before
        summary.update(json.loads((Path(tmp) / "timings.json").read_text()))
        config = json.loads((Path(tmp) / "config.json").read_text())
    kept = {k: v for k, v in summary.items() if not isinstance(v, list)}
    row = {
        "command": "fedjax-sel " + " ".join(command),
        "clients": a.clients,
        "process_wall_seconds": wall,
        "process_peak_memory_bytes": peak,
        "process_peak_memory_gib": peak / 2**30,
        "summary": kept,
        "dataset": config["dataset"],
        "machine": machine_info(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(row, indent=1) + "\n")
    print(
        f"{a.clients:,} clients: {wall:.1f} s in all, {kept['rounds_per_second']:.2f} rounds/s "
        f"after compilation, peak {peak / 2**30:.2f} GiB; wrote {a.out}"
    )


if __name__ == "__main__":
    main()
