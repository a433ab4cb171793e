"""Where a round's time goes, two ways that must agree: the named scopes of a ``jax.profiler``
trace of the fused round (``fedjax-sel run --trace DIR``) and ``--profile``'s separately
compiled phases (select / train / aggregate, each timed on the host).

The same configuration runs twice (MNIST, MLP, Power-of-Choice with d = 30 so that selection
does real work, 100 clients, 10 per round, 5 local steps, chunks of 5 rounds). The trace's
phases are grouped as ``--profile`` splits the round: selection = availability + selection;
training = local_training; aggregation = aggregation + server_step + strategy_update.

    python benchmarks/phase_split.py --out benchmarks/results/cpu/phase_split
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.bench.trace_phases import phase_seconds, plot_phases
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import run_experiment
from fedjax_sel.experiment.provenance import machine_info

GROUPS = {
    "select": ("availability", "selection"),
    "train": ("local_training",),
    "aggregate": ("aggregation", "server_step", "strategy_update"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("FEDJAX_SEL_DATA_DIR", "../shared/data"))
    p.add_argument("--out", default="benchmarks/results/cpu/phase_split")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    config = RunConfig(
        strategy="power_of_choice",
        strategy_args={"d": 30},
        dataset="mnist",
        data_path=a.data_dir,
        partition="dirichlet:0.3",
        num_clients=100,
        per_round=10,
        rounds=15,
        eval_every=5,
        local_steps=5,
        batch_size=32,
        lr=0.05,
        model="mlp",
    )
    with tempfile.TemporaryDirectory() as tmp:
        trace_dir = Path(tmp) / "trace"
        run_experiment(config, Path(tmp) / "traced", progress=False, trace_dir=trace_dir)
        traced = phase_seconds(trace_dir)
        plot_phases(trace_dir, out / "phases.png")
        profiled = run_experiment(config.replace(profile=True), None, progress=False)
    # --profile's seconds of the chunks after the first (which compiles)
    host = {k: 0.0 for k in GROUPS}
    for record in profiled.timings["evaluations"][1:]:
        for k in GROUPS:
            host[k] += record["seconds"][k]
    trace_groups = {k: sum(traced.get(p, 0.0) for p in parts) for k, parts in GROUPS.items()}
    rows = []
    for k in GROUPS:
        rows.append(
            {
                "phase": k,
                "trace_seconds": trace_groups[k],
                "trace_share": trace_groups[k] / sum(trace_groups.values()),
                "profile_seconds": host[k],
                "profile_share": host[k] / sum(host.values()),
            }
        )
    print_table(
        rows,
        [
            ("phase", "phase", "{}"),
            ("trace s", "trace_seconds", "{:.4f}"),
            ("trace share", "trace_share", "{:.1%}"),
            ("--profile s", "profile_seconds", "{:.4f}"),
            ("--profile share", "profile_share", "{:.1%}"),
        ],
    )
    write_json_rows(
        out / "phase_split.json",
        {
            "machine": machine_info(),
            "config": config.to_dict(),
            "trace_phases_seconds": traced,
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
