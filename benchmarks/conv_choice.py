"""Which convolution and client parallelism trains a round of the FEMNIST CNN fastest here.

Under ``vmap`` a per-client convolution becomes a grouped convolution (one group per client),
which XLA runs slowly on NVIDIA GPUs; ``patches`` writes it as im2col + a batched matmul, and
``map`` trains one client at a time. ``--parallel auto`` measures these candidates on the real
round shape and caches the winner (:func:`fedjax_sel.training.autotune.choose_parallel`); this
script runs that measurement uncached, on stand-in data of the FEMNIST recipe's shapes (28x28x1,
62 classes, batch 20, one local epoch, writers of about 198 examples), at the recipe's 10
clients a round and at larger cohorts, and records every candidate's time, the winner and what
the rule (the fallback without measuring, :func:`fedjax_sel.training.local.auto_parallel`)
would have picked. Writes JSON, prints a table::

    python benchmarks/conv_choice.py --out benchmarks/results/gpu/conv_choice.json
"""

from __future__ import annotations

import argparse
import sys

import jax

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.bench.workloads import WORKLOADS, standin
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.models import make_model
from fedjax_sel.training.autotune import choose_parallel
from fedjax_sel.training.local import LocalConfig, auto_parallel


def measure(per_round: int, clients: int, budget_s: float) -> dict:
    w = WORKLOADS["cnn_femnist"]
    ds = standin(w, clients=clients)
    model = make_model(w.model, input_shape=w.input_shape, num_classes=w.num_classes)
    cfg = LocalConfig(batch_size=w.batch, local_steps=None, local_epochs=1)
    choice = choose_parallel(model, cfg, ds.train, per_round, budget_s=budget_s, use_cache=False)
    rule = auto_parallel(model, jax.default_backend())
    best = min(choice.timings.values()) if choice.timings else None
    return {
        "model": w.model,
        "per_round": per_round,
        "measured_clients": choice.measured_clients,
        "winner": choice.parallel,
        "winner_conv": choice.conv_impl,
        "rule": f"{rule[0]}" + ("" if rule[1] is None else f":{rule[1]}"),
        "timings_s": choice.timings,
        "best_s": best,
        "slowest_over_best": None if not best else max(choice.timings.values()) / best,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-round", type=int, nargs="+", default=[10, 100])
    p.add_argument("--clients", type=int, default=400, help="stand-in writers (>= per round)")
    p.add_argument("--budget", type=float, default=60.0, help="measuring seconds per cohort")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if min(a.per_round) < 1 or max(a.per_round) > a.clients:
        p.error(f"--per-round must be in [1, --clients={a.clients}], got {a.per_round}")
    rows = []
    for per_round in a.per_round:
        rows.append(measure(per_round, a.clients, a.budget))
        write_json_rows(a.out, {"machine": machine_info(), "rows": rows})  # after each cohort
    print_table(
        [{**r, "candidates": len(r["timings_s"])} for r in rows],
        [
            ("per round", "per_round", "{}"),
            ("winner", "winner", "{}"),
            ("conv", "winner_conv", "{}"),
            ("best s", "best_s", "{:.4f}"),
            ("slowest/best", "slowest_over_best", "{:.1f}"),
            ("rule", "rule", "{}"),
            ("candidates", "candidates", "{}"),
        ],
    )
    for r in rows:
        for cand, t in sorted(r["timings_s"].items(), key=lambda kv: kv[1]):
            print(f"  per_round {r['per_round']}: {cand:28s} {t:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
