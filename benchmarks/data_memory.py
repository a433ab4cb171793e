"""Peak memory of building a generated data set: the generator's rows written straight into
the final arrays, against the paths that first make the whole pool of examples.

Each (K, assembly) pair runs in a fresh child process that builds LEAF Synthetic (at most 20
examples per client) and reports its peak resident memory (``ru_maxrss``), the bytes of the
arrays it holds at the end (train and per-client test splits, central test set) and their
ratio. ``generated`` is ``load_dataset`` today: each chunk of generated rows is scattered
straight into the train, test and central test arrays, and the client parameters are drawn a
block of clients at a time. The two others first make the whole pool on the host
(``synthetic.leaf_synthetic``) and assemble it as every data set read from files is: ``host``
in the final layout on the host, then copied to the device (forced here by raising
:data:`fedjax_sel.data.client_data.CHUNKED_ASSEMBLY_BYTES`), ``chunked`` into a device buffer a
chunk of rows at a time (the default above 256 MiB). All three give the same arrays::

    python benchmarks/data_memory.py --out benchmarks/results/cpu/data_memory.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.experiment.provenance import machine_info

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
    import numpy as np

    from fedjax_sel.data import client_data, datasets, load_dataset, synthetic

    if assembly == "host":
        client_data.CHUNKED_ASSEMBLY_BYTES = float("inf")
    t0 = time.perf_counter()
    if assembly == "generated":
        ds = load_dataset("leaf_synthetic", num_clients=clients, seed=0, max_examples=20)
    else:  # the whole pool first, then assembled from it (what load_dataset did before)
        x, y, client = synthetic.leaf_synthetic(jax.random.key(0), clients, max_examples=20)
        ds = datasets.assemble(
            "leaf_synthetic",
            x,
            y,
            datasets.partition_by_client(client, clients),
            rng=np.random.default_rng(0),
            test_fraction=0.1,
            layout="auto",
            task="classification",
            num_classes=10,
            default_model="logreg",
            info={},
        )
        del x, y, client
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
        for assembly in ("host", "chunked", "generated"):
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
