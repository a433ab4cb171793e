"""``fedjax-sel bench sweep``: S seeds of one configuration in one compiled program (vmapped
over a leading seed axis, :meth:`Simulation.run_rounds_batch`) against S separate runs.

Both sides run the same rounds of the same configuration after a warm-up call that compiles
them; the seeds share one data partition (``data_seed`` fixed), so the comparison isolates the
cost of the rounds. Reported per row: seconds per seed-round together and separately, and
their ratio (``speedup``). Workloads: logistic regression on LEAF Synthetic (P = 100) and the
MLP on MNIST (P = 10; needs ``mnist.npz`` under ``$FEDJAX_SEL_DATA_DIR`` or tensorflow-datasets).
"""

from __future__ import annotations

import argparse
import time

import jax

from fedjax_sel.base import ConfigError
from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.build import build_simulation, load_data_for
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.experiment.resolve import Resolved, resolve
from fedjax_sel.training.hparams import HParams

WORKLOADS = {
    "logreg": dict(dataset="leaf_synthetic", num_clients=1000, per_round=100, batch_size=32),
    "mlp": dict(
        dataset="mnist", num_clients=100, per_round=10, batch_size=32, partition="dirichlet:0.5"
    ),
}


def workload_config(model: str, rounds: int) -> Resolved:
    """``model``'s workload, resolved (once: the timing reads what it parsed)."""
    if model not in WORKLOADS:
        raise ConfigError(f"bench sweep: unknown workload {model!r}; known: {list(WORKLOADS)}")
    return resolve(
        RunConfig(
            **WORKLOADS[model],
            rounds=rounds,
            eval_every=rounds,
            local_steps=10,
            lr=0.05,
            data_seed=0,
            seed=0,
        )
    )


def time_sweep(resolved: Resolved, seeds: int, repeats: int) -> dict:
    """Seconds per seed-round of ``seeds`` seeds together and separately (best of
    ``repeats``, compilation excluded)."""
    dataset = load_data_for(resolved.config)
    sim = build_simulation(resolved, dataset)
    rounds = resolved.config.rounds
    seed_list = list(range(seeds))
    hparams = HParams.from_config(resolved.config)
    states = sim.init_batch(seed_list, hparams=hparams)
    singles = [sim.init(s, hparams=hparams) for s in seed_list]

    def together():
        out, _ = sim.run_rounds_batch(states, None, rounds)
        return jax.block_until_ready(out.params)

    def separate():
        for st in singles:
            jax.block_until_ready(sim.run_rounds(st, rounds)[0].params)

    t0 = time.perf_counter()
    together()
    compile_together = time.perf_counter() - t0
    separate()  # compiles the single-seed program
    best_t, best_s = float("inf"), float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        together()
        best_t = min(best_t, time.perf_counter() - t0)
        t0 = time.perf_counter()
        separate()
        best_s = min(best_s, time.perf_counter() - t0)
    return {
        "seeds": seeds,
        "rounds": rounds,
        "together_s_per_seed_round": best_t / (seeds * rounds),
        "separate_s_per_seed_round": best_s / (seeds * rounds),
        "speedup": best_s / best_t,
        "together_first_call_s": compile_together,
        "client_parallelism": list(sim.spec.trainer.parallel[:2]),  # mode, chunk
    }


def sweep_main(
    *,
    models: list[str] | None = None,
    seeds: list[int] | None = None,
    rounds: int = 20,
    repeats: int = 3,
    out: str | None = None,
) -> list[dict]:
    """Times :func:`time_sweep` for each workload and seed count; prints a table, writes JSON."""
    rows = []
    info = machine_info()
    for model in models or list(WORKLOADS):
        resolved = workload_config(model, rounds)
        config = resolved.config
        for s in seeds or [1, 4, 16]:
            try:
                row = time_sweep(resolved, int(s), repeats)
            except ConfigError as e:
                print(f"  {model}: skipped ({e})")
                break
            row = {
                "model": model,
                "dataset": config.dataset,
                "per_round": config.per_round,
                "num_clients": config.num_clients,
                **row,
                "machine": info,
            }
            rows.append(row)
            print(
                f"  {model} S={s}: together {row['together_s_per_seed_round'] * 1e3:.2f} ms, "
                f"separate {row['separate_s_per_seed_round'] * 1e3:.2f} ms per seed-round "
                f"({row['speedup']:.2f}x)",
                flush=True,
            )
    print(f"device: {info['device_kind']} ({info['backend']}), jax {info['jax_version']}")
    print_table(
        [
            dict(
                r,
                together_ms=r["together_s_per_seed_round"] * 1e3,
                separate_ms=r["separate_s_per_seed_round"] * 1e3,
            )
            for r in rows
        ],
        [
            ("model", "model", "{}"),
            ("P", "per_round", "{}"),
            ("seeds", "seeds", "{}"),
            ("together ms/seed-round", "together_ms", "{:.3f}"),
            ("separate ms/seed-round", "separate_ms", "{:.3f}"),
            ("speedup", "speedup", "{:.2f}x"),
        ],
    )
    write_json_rows(out, rows)
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench sweep``'s flags."""
    p.add_argument("--model", action="append", help="workloads: logreg, mlp (default both)")
    p.add_argument("--seeds", type=int, action="append", help="seeds together (1 4 16)")
    p.add_argument("--rounds", type=int, default=20, help="rounds of each run")
    p.add_argument("--repeats", type=int, default=5, help="timed calls")
    p.add_argument("--out", default=None, help="JSON output file")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench sweep``: :func:`sweep_main` with the flags."""
    return sweep_main(
        models=a.model, seeds=a.seeds or None, rounds=a.rounds, repeats=a.repeats, out=a.out
    )
