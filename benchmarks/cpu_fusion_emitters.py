"""XLA:CPU's classic fusion emitters against its default MLIR ones: compile time and run time.

The test suite compiles with ``XLA_FLAGS=--xla_cpu_use_fusion_emitters=false`` and
``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` (tests/conftest.py); adding the flag halved the suite's time
on a 2-core CPU. This measures whether the flag would also help a user's runs, which compile
with XLA's optimizations on: for a few workloads, the time to compile one chunk of rounds (the
first call, minus a steady chunk) and the steady seconds per round, with and without the flag,
at both optimization levels. Each measurement is a fresh process (XLA reads its flags when the
backend starts, so the settings cannot share a process); the settings alternate and each
workload is repeated, keeping the fastest. Writes a JSON and prints a table::

    python benchmarks/cpu_fusion_emitters.py --out benchmarks/results/cpu/cpu_fusion_emitters.json

``--data-dir`` adds an MNIST CNN row (slow on a CPU: seconds per round).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

FLAG = "--xla_cpu_use_fusion_emitters=false"
EMITTERS = {"default": "", "classic": FLAG}
OPTIMIZATIONS = {"on": "0", "most off": "1"}  # JAX_DISABLE_MOST_OPTIMIZATIONS
# name -> RunConfig fields; chunk = rounds per compiled chunk
WORKLOADS = {
    "digits MLP, uniform": dict(
        strategy="uniform", dataset="digits", num_clients=30, per_round=10, model="mlp"
    ),
    "digits logreg, FilFL (DivFL inner)": dict(
        strategy="filfl",
        strategy_args={"inner": "divfl"},
        dataset="digits",
        num_clients=30,
        per_round=5,
        model="logreg",
        server_fraction=0.1,
    ),
    "regression, FedCVR-Bolt": dict(
        strategy="fedcvr_bolt",
        strategy_args={"warmup": 1},
        dataset="regression",
        dataset_args={"num_clusters": 2},
        num_clients=100,
        per_round=10,
        model="linreg",
        test_fraction=0.2,
    ),
    "MNIST CNN, uniform": dict(
        strategy="uniform", dataset="mnist", num_clients=100, per_round=10, model="cnn"
    ),
}
CHUNK = 5


def worker(name: str, data_dir: str | None) -> dict:
    """One workload under this process's XLA flags: compile and steady seconds."""
    import jax

    from fedjax_sel.bench.common import time_call
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment.build import build_simulation
    from fedjax_sel.experiment.resolve import resolve
    from fedjax_sel.training import HParams

    fields = dict(WORKLOADS[name], local_steps=10, batch_size=32, lr=0.05, rounds=4 * CHUNK)
    fields["eval_every"] = CHUNK  # rounds per compiled chunk
    if data_dir is not None and fields["dataset"] == "mnist":
        fields["data_path"] = data_dir
    resolved = resolve(RunConfig(**fields))
    sim = build_simulation(resolved)
    state = jax.block_until_ready(sim.init(0, hparams=HParams.from_config(resolved.config)))
    # the first call compiles the chunk, then runs it; the steady chunk is the fastest repeat
    t = time_call(lambda: sim.run_rounds(state, CHUNK)[0], repeats=3, warmup=1)
    first, chunk = t["first_seconds"], t["min_seconds"]
    return {"compile_seconds": first - chunk, "seconds_per_round": chunk / CHUNK}


def measure(name: str, flags: str, disable: str, data_dir: str | None) -> dict:
    env = dict(
        os.environ,
        XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip(),
        JAX_DISABLE_MOST_OPTIMIZATIONS=disable,
    )
    cmd = [sys.executable, __file__, "--worker", name]
    if data_dir is not None:
        cmd += ["--data-dir", data_dir]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder with mnist.npz (MNIST CNN row)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.data_dir)))
        return

    from fedjax_sel.bench.common import print_table, write_json_rows
    from fedjax_sel.experiment.provenance import machine_info

    names = [n for n in WORKLOADS if args.data_dir is not None or "MNIST" not in n]
    rows = []
    for name in names:
        for opt, disable in OPTIMIZATIONS.items():
            best: dict[str, dict] = {}
            for _ in range(args.repeats):
                for setting, flags in EMITTERS.items():
                    r = measure(name, flags, disable, args.data_dir)
                    old = best.get(setting)
                    best[setting] = r if old is None else {k: min(v, old[k]) for k, v in r.items()}
            d, c = best["default"], best["classic"]
            rows.append(
                {
                    "workload": name,
                    "optimizations": opt,
                    "compile_default_s": d["compile_seconds"],
                    "compile_classic_s": c["compile_seconds"],
                    "compile_ratio": d["compile_seconds"] / c["compile_seconds"],
                    "round_default_ms": 1e3 * d["seconds_per_round"],
                    "round_classic_ms": 1e3 * c["seconds_per_round"],
                    "round_ratio": c["seconds_per_round"] / d["seconds_per_round"],
                }
            )
    print_table(
        rows,
        [
            ("workload", "workload", "{}"),
            ("XLA optimizations", "optimizations", "{}"),
            ("compile default s", "compile_default_s", "{:.2f}"),
            ("compile classic s", "compile_classic_s", "{:.2f}"),
            ("compile speed-up", "compile_ratio", "{:.2f}x"),
            ("round default ms", "round_default_ms", "{:.1f}"),
            ("round classic ms", "round_classic_ms", "{:.1f}"),
            ("round time classic/default", "round_ratio", "{:.2f}x"),
        ],
    )
    write_json_rows(
        args.out,
        {"flag": FLAG, "chunk_rounds": CHUNK, "machine": machine_info(), "rows": rows},
    )


if __name__ == "__main__":
    main()
