"""Peak memory of building a generated data set, chunked device assembly against the host one.

Each (K, assembly) pair runs in a fresh child process that builds LEAF Synthetic (at most 20
examples per client) with ``load_dataset`` and reports its peak resident memory
(``ru_maxrss``), the bytes of the arrays it holds at the end (train and per-client test splits,
central test set) and their ratio. ``host`` is the path every data set took before: the
arrays assembled on the host in their final layout, then copied to the device (forced here by
raising :data:`fedjax_sel.data.client_data.CHUNKED_ASSEMBLY_BYTES`); ``chunked`` is today's
default above 256 MiB, a device buffer filled a chunk of rows at a time::

    python benchmarks/data_memory.py --out benchmarks/results/cpu/data_memory.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from fedjax_sel.bench.common import machine_info, print_table, write_json_rows

COLUMNS = [
    ("K", "clients", "{:,}"),
    ("assembly", "assembly", "{}"),
    ("data GiB", "data_gib", "{:.2f}"),
    ("peak GiB", "peak_gib", "{:.2f}"),
    ("peak / data", "peak_over_data", "{:.2f}"),
    ("seconds", "seconds", "{:.1f}"),
]


def child(clients: int, assembly: str) -> dict:
    import jax

    from fedjax_sel.data import client_data, load_dataset

    if assembly == "host":
        client_data.CHUNKED_ASSEMBLY_BYTES = float("inf")
    t0 = time.perf_counter()
    ds = load_dataset("leaf_synthetic", num_clients=clients, seed=0, max_examples=20)
    jax.block_until_ready(ds.train.x)
    seconds = time.perf_counter() - t0
    arrays = [ds.train.x, ds.train.y, ds.test_x, ds.test_y]
    if ds.test is not None:
        arrays += [ds.test.x, ds.test.y]
    data = sum(int(a.size) * a.dtype.itemsize for a in arrays)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "clients": clients,
        "assembly": assembly,
        "layout": ds.train.layout,
        "data_bytes": data,
        "data_gib": data / 2**30,
        "peak_bytes": peak,
        "peak_gib": peak / 2**30,
        "peak_over_data": peak / data,
        "seconds": seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, action="append", help="K (default 10^5 and 10^6)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rows = []
    for k in a.clients or [100_000, 1_000_000]:
        for assembly in ("host", "chunked"):
            r = subprocess.run(
                [sys.executable, __file__, "--child", json.dumps([k, assembly])],
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            print(f"K={k:,} {assembly}: peak {rows[-1]['peak_gib']:.2f} GiB", file=sys.stderr)
    info = machine_info()
    print(f"device: {info['device_kind']} ({info['backend']}, {info['cpu_count']} CPUs)")
    print_table(rows, COLUMNS)
    write_json_rows(a.out, {"machine": info, "rows": rows})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(*json.loads(sys.argv[2]))))
    else:
        main()
