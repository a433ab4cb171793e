"""The engine's round with the aggregation inside the trainer against the stacked one, in turns.

Where the clients train one after another (``map``) and the strategy does not read the slots'
models (``Strategy.reads_deltas=False``), the trainer adds each client's update into a running
sum as it finishes (``fedjax_sel.training.local.make_trainer``'s ``aggregate_weights``)
instead of writing the P trained models and reading them back. This script builds the same
round twice, full participation as it is (streamed) and declaring ``reads_deltas=True``
(stacked), and times one round of each in turn, ``--repeats`` times, on ``bench
throughput``'s workload (``--work``, ``--per-round``; ``--model-def`` for a flax module of
yours). Reported: each one's median round, and the median (and range) over the turns of
stacked / streamed. Writes JSON rows, prints a table::

    python benchmarks/streamed_aggregation.py --model mlp --work steps --per-round 100 \\
        --out benchmarks/results/cpu_xeon/streamed_aggregation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fedjax_sel.bench import throughput as tp
from fedjax_sel.bench.common import interleaved_times, print_table, write_json_rows
from fedjax_sel.engine import RoundSpec
from fedjax_sel.engine.phases import streams_aggregate
from fedjax_sel.engine.simulation import Simulation
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.models import make_model
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training import HParams, LocalConfig, parse_parallel


def measure(
    model_name: str,
    work: str,
    per_round: int,
    mode: str,
    repeats: int,
    model_def: str | None = None,
    input_shape: tuple[int, ...] = (28, 28, 1),
    classes: int = 62,
) -> dict:
    if model_def is not None:
        shape, tokens = input_shape, False
        model = tp.load_model_def(model_def, shape, classes)
    else:
        shape, classes, tokens, _ = tp.MODEL_SPECS[model_name]
        model = make_model(model_name, input_shape=shape, num_classes=classes)
    bsz = 32 if work == "steps" else 10
    sizes = tp.client_sizes(work, per_round, 2 * bsz * 10)
    xs, ys, scale = tp.random_clients(shape, classes, tokens, sizes)
    ds = tp.dataset_of(model.name, shape, classes, xs, ys, scale)
    if work == "steps":
        local = LocalConfig(batch_size=bsz, local_steps=10)
    else:
        local = LocalConfig(batch_size=bsz, local_steps=None, local_epochs=1)
    calls = {}
    for label, reads in (("streamed", False), ("stacked", True)):
        strategy = make_strategy("full", per_round)._replace(reads_deltas=reads)
        spec = RoundSpec.create(
            ds, model, strategy, local=local, per_round=per_round, parallel=parse_parallel(mode)
        )
        sim = Simulation(spec, ds, num_rounds=2 * repeats + 4, chunk_size=1)
        if streams_aggregate(spec) == reads:
            raise SystemExit(f"--mode {mode} does not stream the aggregation (use map)")
        state = [sim.init(0, hparams=HParams.of(tp.LR))]

        def one_round(sim=sim, state=state):
            state[0] = sim.run_chunk(state[0])[0]
            return state[0].params

        calls[label] = one_round
    times = interleaved_times(calls, repeats)
    ratios = [
        b / a for a, b in zip(times["streamed"]["times"], times["stacked"]["times"], strict=True)
    ]
    return {
        "model": model.name,
        "work": work,
        "per_round": per_round,
        "mode": mode,
        "repeats": repeats,
        "streamed_seconds": times["streamed"]["seconds"],
        "stacked_seconds": times["stacked"]["seconds"],
        "stacked_over_streamed": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "streamed_times": times["streamed"]["times"],
        "stacked_times": times["stacked"]["times"],
        "machine": machine_info(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="mlp", choices=sorted(tp.MODEL_SPECS))
    p.add_argument("--model-def", default=None, help="FILE.py:NAME, a flax module of yours")
    p.add_argument("--work", default="steps", choices=tp.WORKS)
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--mode", default="map", help="a map mode, e.g. map:conv=xla_nhwc")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", default=None, help="JSON file; rows of other workloads are kept")
    a = p.parse_args()
    row = measure(a.model, a.work, a.per_round, a.mode, a.repeats, a.model_def)
    rows = [row]
    if a.out and Path(a.out).is_file():
        same = ("model", "work", "per_round", "mode")
        old = json.loads(Path(a.out).read_text())["rows"]
        rows = [r for r in old if any(r[k] != row[k] for k in same)] + rows
    print_table(
        rows,
        [
            ("model", "model", "{}"),
            ("work", "work", "{}"),
            ("P", "per_round", "{}"),
            ("mode", "mode", "{}"),
            ("streamed s", "streamed_seconds", "{:.3f}"),
            ("stacked s", "stacked_seconds", "{:.3f}"),
            ("stacked/streamed", "stacked_over_streamed", "{:.3f}"),
        ],
    )
    if a.out:
        command = "python benchmarks/streamed_aggregation.py"
        write_json_rows(a.out, {"command": command, "rows": rows})


if __name__ == "__main__":
    main()
