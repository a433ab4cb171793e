"""The README's measured tables, formatted from the committed JSON under benchmarks/results/.

Each block is wrapped in ``<!-- numbers: FILES -->`` so ``tests/test_docs.py`` checks every
number in it against those files::

    python tools/readme_tables.py            # every block, one after another
    python tools/readme_tables.py throughput # one block by name
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU = "benchmarks/results/cpu"
MODEL_NAMES = {  # code spans: the numbers check skips them
    "logreg": "`logreg`",
    "mlp": "`mlp`",
    "cnn": "`cnn`",
    "lstm": "`lstm`",
    "UserCNN": "your `nn.Conv` CNN (`examples/user_cnn.py`)",
}


def _load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _block(files: list[str], lines: list[str]) -> str:
    return "\n".join([f"<!-- numbers: {' '.join(files)} -->", "", *lines, "", "<!-- /numbers -->"])


def _mode(row: dict) -> str:
    mode = row["mode"]
    if row.get("parallel_choice"):
        mode = f"auto -> {mode}"
    return mode


def throughput(files: list[str]) -> str:
    lines = [
        "| model | work | P | engine mode | engine upd/s | loop upd/s | speedup | padded steps "
        "| engine GFLOP/s | % of matmul peak |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for f in files:
        for r in _load(f)["rows"]:
            lines.append(
                f"| {MODEL_NAMES.get(r['model'], r['model'])} | {r['work']} | {r['per_round']:,} | "
                f"{_mode(r)} | {r['engine_client_updates_per_s']:,.1f} | "
                f"{r['loop_client_updates_per_s']:,.1f} | {r['speedup_vs_loop']:.2f}x | "
                f"{100 * r['padded_step_fraction']:.1f}% | {r['engine_gflops']:.1f} | "
                f"{100 * r['engine_fraction_of_peak']:.1f}% |"
            )
    return _block(files, lines)


def system_overhead() -> str:
    f = f"{CPU}/throughput_system.json"
    r = _load(f)["rows"][0]
    text = (
        f"Timing costs little: on the 2-core CPU a logistic-regression round of "
        f"{r['per_round']:,} clients takes {r['engine_round_seconds']:.4f} s without a system "
        f"model and {r['system_round_seconds']:.4f} s with `{r['system']}` device profiles "
        f"({100 * r['system_overhead']:+.1f}%, within run-to-run noise); FedBuff's event step "
        f"(concurrency "
        f"{r['per_round']:,}, `{r['asynchronous']}`) runs "
        f"{r['fedbuff_client_updates_per_s']:,.0f} client updates/s against "
        f"{r['sync_system_client_updates_per_s']:,.0f} for the synchronous round "
        f"(`fedjax-sel bench throughput --system lognormal --async fedbuff:buffer=100`)."
    )
    return _block([f], [text])


def cpu_devices() -> str:
    one = f"{CPU}/throughput_steps_logreg.json"
    two = f"{CPU}/throughput_logreg_2devices.json"
    r1 = next(r for r in _load(one)["rows"] if r["mode"] == "vmap" and not r["parallel_choice"])
    r2 = _load(two)["rows"][0]
    text = (
        f"Measured on the 2-core CPU (logistic regression, {r1['per_round']:,} clients per round, "
        f"10 steps): one XLA device runs {r1['engine_client_updates_per_s']:,.0f} client "
        f"updates/s, `--cpu-devices 2` {r2['engine_client_updates_per_s']:,.0f}: one device "
        "already uses both cores, so splitting the host pays only on machines with many cores; "
        "on several GPUs the sharded slot axis is the way to scale."
    )
    return _block([one, two], [text])


def scale(f: str = f"{CPU}/scale.json") -> str:
    rows = _load(f)["rows"]
    lines = [
        "| strategy | K | P | s/round | mean s | selection s | training s | aggregation s "
        "| evaluation s | accuracy | peak GiB | data s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['strategy']} | {r['clients']:,} | {r['per_round']:,} | not measured: "
                f"`{r['error']}` | | | | | | | | |"
            )
            continue
        lines.append(
            f"| {r['strategy']} | {r['clients']:,} | {r['per_round']:,} | "
            f"{r['seconds_per_round']:.3f} | {r['mean_seconds_per_round']:.3f} | "
            f"{r['selection_s']:.3f} | {r['training_s']:.3f} | {r['aggregation_s']:.3f} | "
            f"{r['evaluation_s']:.3f} | {r['test_accuracy']:.3f} | {r['peak_memory_gib']:.2f} | "
            f"{r['data_seconds']:.1f} |"
        )
    return _block([f], lines)


def kernels() -> str:
    files = [f"{CPU}/kernels_1e6.json", f"{CPU}/kernels_1e7.json"]
    lines = ["| kernel | K | ms per call |", "|---|---:|---:|"]
    for f in files:
        data = _load(f)
        for r in data["rows"] if isinstance(data, dict) else data:
            lines.append(f"| `{r['kernel']}` | {r['clients']:,} | {r['milliseconds']:.1f} |")
    return _block(files, lines)


def phases() -> str:
    f = f"{CPU}/phase_split/phase_split.json"
    lines = [
        "| phase | trace (named scopes) | share | `--profile` (compiled apart) | share |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in _load(f)["rows"]:
        lines.append(
            f"| {r['phase']} | {r['trace_seconds']:.3f} s | {100 * r['trace_share']:.1f}% | "
            f"{r['profile_seconds']:.3f} s | {100 * r['profile_share']:.1f}% |"
        )
    return _block([f], lines)


def seeds() -> str:
    f = f"{CPU}/sweep_seeds.json"
    lines = [
        "| workload | seeds | together: s per seed-round | separate: s per seed-round | speedup |",
        "|---|---:|---:|---:|---:|",
    ]
    data = _load(f)
    for r in data["rows"] if isinstance(data, dict) else data:
        lines.append(
            f"| {r['model']} ({r['dataset']}, {r['num_clients']:,} clients, P = "
            f"{r['per_round']:,}) | {r['seeds']} | {r['together_s_per_seed_round']:.5f} | "
            f"{r['separate_s_per_seed_round']:.5f} | {r['speedup']:.2f}x |"
        )
    return _block([f], lines)


def padded() -> str:
    f = f"{CPU}/padded_steps.json"
    lines = [
        # the modes in code spans: names, their chunk sizes not measurements (the number check)
        "| K | P | Dirichlet alpha | client sizes | `vmap` | `chunked:4` | `chunked:2` |",
        "|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in _load(f)["rows"]:
        lo, hi = r["client_examples"]
        lines.append(
            f"| {r['clients']:,} | {r['per_round']:,} | {r['alpha']} | {lo:,}-{hi:,} | "
            f"{100 * r['padded_vmap']:.1f}% | {100 * r['padded_chunked:4']:.1f}% | "
            f"{100 * r['padded_chunked:2']:.1f}% |"
        )
    return _block([f], lines)


def h100() -> str:
    f = "benchmarks/results/h100/summary.json"
    lines = [
        "| model | P | mode | engine upd/s | loop upd/s | speedup | engine TFLOP/s "
        "| % of matmul peak |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in _load(f)["rows"]:
        lines.append(
            f"| {MODEL_NAMES.get(r['model'], r['model'])} | {r['per_round']:,} | {r['mode']} | "
            f"{r['engine_client_updates_per_s']:,.0f} | {r['loop_client_updates_per_s']:,.0f} | "
            f"{r['speedup_vs_loop']:.1f}x | {r['engine_tflops']:.2f} | "
            f"{100 * r['engine_fraction_of_peak']:.1f}% |"
        )
    return _block([f], lines)


def million() -> str:
    f = f"{CPU}/million.json"
    r = _load(f)
    run = r["summary"]
    text = (
        f"On the 2-core CPU with 23 GiB (`benchmarks/million.py`) the command took "
        f"{r['process_wall_seconds']:.1f} s in all, most of it generating the data; the "
        f"{run['rounds_completed']} rounds ran at {run['rounds_per_second']:.2f} rounds/s after "
        f"compilation (the first chunk, compiling, took {run['first_chunk_seconds']:.2f} s), and "
        f"the process peaked at {r['process_peak_memory_gib']:.2f} GiB of memory, while "
        f"assembling the data. The test accuracy stays at chance ({run['final_accuracy']:.4f}): "
        "LEAF Synthetic(1, 1) draws every client's model around a zero mean, so with this many "
        "clients there is no shared model to learn (with a few dozen clients the same run "
        "learns one); the command measures the engine, not a method."
    )
    return _block([f], [text])


def verdicts() -> str:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import verdicts_table

    # the counts are in summary.json (`verdicts_table.py --write`), which the block cites
    files = [str(verdicts_table.summary_path().relative_to(ROOT))]
    return _block(files, verdicts_table.summary_table().splitlines())


BLOCKS = {
    "throughput_epochs": lambda: throughput(
        [f"{CPU}/throughput_epochs.json", f"{CPU}/throughput_user_cnn.json"]
    ),
    "throughput_steps": lambda: throughput(
        [f"{CPU}/throughput_steps_{m}.json" for m in ("logreg", "mlp", "cnn")]
    ),
    "system_overhead": system_overhead,
    "cpu_devices": cpu_devices,
    "scale": scale,
    "scale_xeon": lambda: scale("benchmarks/results/cpu_xeon/scale_all.json"),
    "scale_comparators": lambda: scale(f"{CPU}/scale_comparators.json"),
    "kernels": kernels,
    "phases": phases,
    "seeds": seeds,
    "padded": padded,
    "h100": h100,
    "verdicts": verdicts,
    "million": million,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("blocks", nargs="*", help=f"names: {', '.join(BLOCKS)} (default all)")
    a = p.parse_args()
    for name in a.blocks or BLOCKS:
        print(f"## {name}\n")
        print(BLOCKS[name]())
        print()


if __name__ == "__main__":
    main()
