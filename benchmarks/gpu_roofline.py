"""Why the MLP stays far below a GPU's matmul peak: its per-client weight traffic.

Reads the H200 throughput files (``benchmarks/results/h200/tp_*.json``, written by
``benchmarks/gpu_check.sh``) and counts, per SGD step of one client, the FLOPs (the analytic
count of each file) and the bytes of weight traffic: every client has its own weights, so a step
reads them for the forward pass and for the backward pass's input gradients, writes their
gradient, and the update reads weights and gradient and writes the weights (five passes of the
weights' bytes at least; activations come on top). FLOPs over those bytes is the step's
arithmetic intensity, and intensity times the memory bandwidth bounds the achievable FLOP/s.
The bandwidth is the H200's datasheet figure (4.8 TB/s), not a measurement. Writes JSON and
prints a table; no GPU is needed::

    python benchmarks/gpu_roofline.py --out benchmarks/results/h200/roofline.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import numpy as np

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.bench.throughput import MODEL_SPECS
from fedjax_sel.models import make_model

RESULTS = Path(__file__).resolve().parent / "results" / "h200"
DATASHEET_BANDWIDTH = 4.8e12  # bytes/s, NVIDIA H200 SXM
WEIGHT_PASSES = 5  # forward read, backward read, gradient write, update read x2 (+ write)


def parameter_count(model: str) -> int:
    shape, classes, _tokens, _ = MODEL_SPECS[model]
    m = make_model(model, input_shape=shape, num_classes=classes)
    params = m.init(jax.random.key(0))
    return int(sum(np.size(p) for p in jax.tree.leaves(params)))


def roofline_row(path: Path) -> dict:
    r = json.loads(path.read_text())
    n = parameter_count(r["model"])
    step_flops = r["flops_per_client_update"] / r["local_steps"]
    step_bytes = WEIGHT_PASSES * 4 * n
    intensity = step_flops / step_bytes
    bound = intensity * DATASHEET_BANDWIDTH / 1e9
    return {
        "source": path.name,
        "model": r["model"],
        "matmul_precision": r["machine"].get("matmul_precision", "default"),
        "per_round": r["per_round"],
        "batch_size": r["batch_size"],
        "parameters": n,
        "flops_per_step": step_flops,
        "weight_bytes_per_step": step_bytes,
        "flops_per_weight_byte": intensity,
        "weight_traffic_bound_gflops": bound,
        "engine_gflops": r["engine_gflops"],
        "matmul_gflops": r["matmul_gflops"],
        "bound_fraction_of_peak": bound / r["matmul_gflops"],
        "engine_fraction_of_bound": r["engine_gflops"] / bound,
        "engine_fraction_of_peak": r["engine_gflops"] / r["matmul_gflops"],
        "machine": r["machine"],
    }


COLUMNS = [
    ("model", "model", "{}"),
    ("precision", "matmul_precision", "{}"),
    ("params", "parameters", "{:,}"),
    ("FLOP/byte", "flops_per_weight_byte", "{:.1f}"),
    ("bound GF/s", "weight_traffic_bound_gflops", "{:,.0f}"),
    ("engine GF/s", "engine_gflops", "{:,.0f}"),
    ("matmul GF/s", "matmul_gflops", "{:,.0f}"),
    ("bound %peak", "bound_fraction_of_peak", "{:.1%}"),
    ("engine %bound", "engine_fraction_of_bound", "{:.0%}"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = [roofline_row(p) for p in sorted(RESULTS.glob("tp_mlp_*.json"))]
    print_table(rows, COLUMNS)
    write_json_rows(a.out, {"bandwidth_bytes_per_s": DATASHEET_BANDWIDTH, "rows": rows})


if __name__ == "__main__":
    main()
