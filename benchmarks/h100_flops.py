"""Recount the H100 throughput figures with the analytic FLOP count; writes JSON, prints a table.

The H100 runs (``benchmarks/results/h100/tp_*.json``, one NVIDIA H100 80GB, jax 0.11.2)
recorded XLA's cost analysis as FLOPs per client update, which depends on the backend's
fusions (10.7 GFLOP for the CNN there against 23.5 on the CPU). This script keeps the measured
updates/s and the same-process matmul peak of each file and replaces the FLOP count with
:func:`fedjax_sel.models.flops.train_step_flops` (one count per model, the same everywhere),
so the percent-of-peak figures are comparable across machines. No GPU is needed::

    python benchmarks/h100_flops.py --out benchmarks/results/h100/summary.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax.numpy as jnp

from fedjax_sel.bench.throughput import MODEL_SPECS
from fedjax_sel.models import make_model
from fedjax_sel.models.flops import train_step_flops

RESULTS = Path(__file__).resolve().parent / "results" / "h100"


def analytic_flops_per_update(model: str, batch_size: int, local_steps: int) -> float:
    shape, classes, tokens, _ = MODEL_SPECS[model]
    module = make_model(model, input_shape=shape, num_classes=classes).module
    xb = jnp.zeros((batch_size,) + tuple(shape), jnp.int32 if tokens else jnp.float32)
    return float(train_step_flops(module, xb) * local_steps)


def recount(files: list[Path]) -> list[dict]:
    rows = []
    for path in files:
        measured = json.loads(path.read_text())
        for r in measured["rows"]:
            flops = analytic_flops_per_update(r["model"], r["batch_size"], r["local_steps"])
            engine_gflops = r["engine_client_updates_per_s"] * flops / 1e9
            loop_gflops = r["loop_client_updates_per_s"] * flops / 1e9
            rows.append(
                {
                    "source": path.name,
                    "model": r["model"],
                    "per_round": r["per_round"],
                    "mode": r["mode"],
                    "engine_client_updates_per_s": r["engine_client_updates_per_s"],
                    "loop_client_updates_per_s": r["loop_client_updates_per_s"],
                    "speedup_vs_loop": r["speedup_vs_loop"],
                    "xla_flops_per_client_update": r["flops_per_client_update"],
                    "flops_per_client_update": flops,
                    "engine_tflops": engine_gflops / 1e3,
                    "matmul_tflops": r["matmul_gflops"] / 1e3,
                    "engine_fraction_of_peak": engine_gflops / r["matmul_gflops"],
                    "loop_fraction_of_peak": loop_gflops / r["matmul_gflops"],
                    "machine": measured["machine"],
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default=str(RESULTS / "summary.json"))
    a = p.parse_args()
    files = [RESULTS / f"tp_{m}.json" for m in ("logreg", "mlp", "cnn", "lstm")]
    rows = recount([f for f in files if f.exists()])
    Path(a.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(
        "| model | P | mode | engine upd/s | loop upd/s | speedup | GFLOP/update "
        "(XLA -> analytic) | engine TFLOP/s | % of matmul peak |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['per_round']:,} | {r['mode']} | "
            f"{r['engine_client_updates_per_s']:,.0f} | {r['loop_client_updates_per_s']:,.0f} | "
            f"{r['speedup_vs_loop']:.1f}x | {r['xla_flops_per_client_update'] / 1e9:.3g} -> "
            f"{r['flops_per_client_update'] / 1e9:.3g} | {r['engine_tflops']:.2f} | "
            f"{100 * r['engine_fraction_of_peak']:.1f}% |"
        )


if __name__ == "__main__":
    main()
