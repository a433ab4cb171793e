"""``fedjax-sel bench scale``: rounds at K = 10^3 ... 10^6 clients, seconds per phase and peak
memory, for every registered strategy (the large-K approximations named in
:data:`SCALE_STRATEGIES`).

Each (strategy, K) runs in a fresh child process (its peak memory is its own): LEAF Synthetic
(logistic regression, ``max_examples`` examples per client at most, the flat layout when it is
smaller), ``per_round`` slots, one compiled round per call. Reported per row:

* ``seconds_per_round``: the median fused round (availability, selection, training,
  aggregation, strategy update in one compiled program), after a compiling warm-up, and
  ``mean_seconds_per_round`` (FilFL's filtering rounds come every 5th round);
* ``phases``: availability, selection, training and aggregation timed as separately compiled
  pieces (``Simulation.run_rounds_profiled``; availability alone jitted), and one evaluation of
  the central test set;
* ``peak_memory_bytes``: the child's peak resident memory (``ru_maxrss``), and on an
  accelerator the device's ``peak_bytes_in_use``;
* ``data_seconds`` and ``compile_seconds``;
* ``test_accuracy``: the central test accuracy after ``rounds_trained`` rounds (60), on LEAF
  Synthetic with a shared model (``personal_scale`` 0.5), so that every K has something to
  learn.

The selection kernels alone at larger K: ``fedjax-sel bench kernels --clients 10000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.bench.common import print_table, write_json_rows
from fedjax_sel.experiment.provenance import machine_info

# row label -> (strategy args, availability); a label ``NAME:OPTION`` runs strategy NAME.
# Every registered strategy has a row; the large-K approximations are named in the args:
# FedCVR-Bolt's landmark coalitions (m = 128) with k-means fitted on 20 clients per coalition
# and a 100-coordinate sketch, DivFL's greedy on a pool of 10 P clients per round.
SCALE_STRATEGIES: dict[str, tuple[dict[str, Any], str]] = {
    "uniform": ({}, "always"),
    "power_of_choice": ({}, "always"),  # d = min(2 P, K) candidates, set per row
    # the paper's loss of every client under the current model: N forward passes per round
    "hetero_select": ({}, "always"),
    # the loss each client reported at its last participation: O(K) per round
    "hetero_select:last": ({"loss_source": "last"}, "always"),
    "oort": ({}, "always"),
    "active_fl": ({}, "always"),
    # n = min(2 P, K) considered clients, set per row; V is one random considered client's
    # validation split (section 5.3.3): a server-held set would be a data-set option
    "filfl": ({"filter_data": "client"}, "always"),
    "divfl": ({"sketch_dim": 100}, "always"),  # pool = min(10 P, K), set per row
    "fedcvr_bolt": (
        {"coalitions": "landmark", "landmarks": 128, "warmup": 0, "sketch_dim": 100},
        "always",
    ),
    "ca_fed": ({}, "markov"),
    "unbiased": ({}, "markov"),
    "more_available": ({}, "markov"),
    "adafed": ({}, "markov"),
    "f3ast": ({}, "markov"),
    "ifca": ({}, "always"),
    "fesem": ({"sketch_dim": 100}, "always"),
    "full": ({}, "always"),
    # Clustered Sampling: Alg. 1 is O(K log K); Alg. 2's Ward runs on a pool of
    # R = min(max(2 P, 128), K) representatives (set per row) over a 100-coordinate sketch
    "clustered_size": ({}, "always"),
    "clustered_similarity": ({"sketch_dim": 100}, "always"),
    # OCS/AOCS: all P cohort slots train; expected = max(1, P // 10) senders, set per row
    "ocs": ({}, "always"),
    "aocs": ({}, "always"),
    # every participant trains twice (sigma^ from two independent runs): O(K) law, O(P d) scores
    "delta": ({}, "always"),
    # O(P K B) per sequential draw, 6 draws (FedProphet's repeats); class histograms K x B
    "fedcbs": ({}, "always"),
    # the deadline greedy over ceil(0.5 K) resource reports: O(P K) per round
    "fedcs": ({}, "always"),
    # Oort's ranking (O(K log K)) with the bench's local work (10 steps of 10 examples)
    "pyramidfl": ({"local_steps": 10, "batch_size": 10}, "always"),
    # the exact low-rank GP (Woodbury, O(K D^2) per Adam step; greedy O(P K D)); warm-up
    # ends after round 1 (its 1000-step fit and every client's loss pass fall in the rows)
    "fedcor": ({"warmup": 1}, "always"),
    # the large-K paths: the rule on a uniform pool of C = min(10 P, K) available clients a
    # round (set per row; the exact rule at C = K), O(repeats P C B) and a greedy O(P C D)
    "fedcbs:pool": ({}, "always"),
    "fedcor:pool": ({"warmup": 1}, "always"),
}
# LEAF Synthetic(1, 1) with each client's model drawn around one shared model (personal
# noise 0.5): a federation that has a global model to learn at any K (the plain recipe's
# accuracy stays at chance at 10^5-10^6 clients)
PERSONAL_SCALE = 0.5
# slots at most, per strategy: FedCVR-Bolt forms one coalition per slot (k-means in a
# P-dimensional embedding costs O(K P^2)); DivFL's greedy costs O(P pool^2) = O(P^3)
MAX_PER_ROUND = {"fedcvr_bolt": 100, "divfl": 100, "clustered_similarity": 100}
# clients at most, with the reason a larger K is not run
MAX_CLIENTS = {
    "full": (100_000, "trains every client every round (10^6 local trainings per round)"),
}


def row_args(strategy: str, clients: int, per_round: int) -> dict[str, Any]:
    """The strategy arguments of one row (those that depend on K and P)."""
    args, _ = SCALE_STRATEGIES[strategy]
    name = strategy.partition(":")[0]
    if name == "power_of_choice":
        args = {**args, "d": min(2 * per_round, clients)}
    if name == "filfl":
        args = {**args, "considered": min(2 * per_round, clients)}
    if name == "divfl":
        args = {**args, "pool": min(10 * per_round, clients)}
    if name == "clustered_similarity":
        args = {**args, "pool": min(max(2 * per_round, 128), clients)}
    if strategy in ("fedcbs:pool", "fedcor:pool"):
        args = {**args, "pool": min(10 * per_round, clients)}
    if name in ("ocs", "aocs"):
        args = {**args, "expected": float(max(1, per_round // 10))}
    return args


COLUMNS = [
    ("strategy", "strategy", "{}"),
    ("K", "clients", "{:,}"),
    ("P", "per_round", "{:,}"),
    ("s/round", "seconds_per_round", "{:.3f}"),
    ("mean s", "mean_seconds_per_round", "{:.3f}"),
    ("avail", "availability_s", "{:.3f}"),
    ("select", "selection_s", "{:.3f}"),
    ("train", "training_s", "{:.3f}"),
    ("aggregate", "aggregation_s", "{:.3f}"),
    ("eval", "evaluation_s", "{:.3f}"),
    ("acc", "test_accuracy", "{:.3f}"),
    ("peak GiB", "peak_memory_gib", "{:.2f}"),
    ("data s", "data_seconds", "{:.1f}"),
    ("compile s", "compile_seconds", "{:.1f}"),
]


def measure_one(
    strategy: str,
    clients: int,
    per_round: int,
    *,
    rounds: int = 5,
    max_examples: int = 20,
    local_steps: int = 10,
    batch_size: int = 10,
    accuracy_rounds: int = 60,
) -> dict[str, Any]:
    """One row, in this process (the child's work)."""
    import jax
    import jax.numpy as jnp

    from fedjax_sel.availability import from_spec as availability_from_spec
    from fedjax_sel.data import load_dataset
    from fedjax_sel.engine import RoundSpec
    from fedjax_sel.engine.simulation import Simulation
    from fedjax_sel.models import make_model
    from fedjax_sel.strategies import make_strategy
    from fedjax_sel.training import HParams, LocalConfig, Parallel

    _, availability = SCALE_STRATEGIES[strategy]
    name = strategy.partition(":")[0]
    args = row_args(strategy, clients, per_round)
    t0 = time.perf_counter()
    ds = load_dataset(
        "leaf_synthetic",
        num_clients=clients,
        seed=0,
        max_examples=max_examples,
        layout="auto",
        personal_scale=PERSONAL_SCALE,
    )
    data_seconds = time.perf_counter() - t0
    spec = RoundSpec.create(
        ds,
        make_model("logreg", input_shape=ds.input_shape, num_classes=ds.num_classes),
        make_strategy(name, per_round, **args),
        local=LocalConfig(batch_size=batch_size, local_steps=local_steps),
        per_round=per_round,
        availability=availability_from_spec(availability),
        parallel=Parallel("vmap"),
    )
    sim = Simulation(spec, ds, num_rounds=max(accuracy_rounds, 2 * rounds + 2), chunk_size=1)
    state = sim.init(0, hparams=HParams.of(0.05))
    t0 = time.perf_counter()
    state, _ = jax.block_until_ready(sim.run_rounds(state, 1, donate=True))
    compile_seconds = time.perf_counter() - t0
    fused = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        state, _ = jax.block_until_ready(sim.run_rounds(state, 1, donate=True))
        fused.append(time.perf_counter() - t0)
    # phases, each compiled on its own (a warm-up call first)
    state, _, _ = sim.run_rounds_profiled(state, 1, donate=True)
    state, _, phases = sim.run_rounds_profiled(state, rounds, donate=True)
    step = jax.jit(sim.spec.availability.step)
    key = jax.random.key(1)
    jax.block_until_ready(step(state.availability_state, key))
    t0 = time.perf_counter()
    for i in range(rounds):
        jax.block_until_ready(step(state.availability_state, jax.random.fold_in(key, i)))
    availability_s = (time.perf_counter() - t0) / rounds
    sim.evaluate(state)
    t0 = time.perf_counter()
    sim.evaluate(state)
    evaluation_s = time.perf_counter() - t0
    # what the strategy reaches: train on to accuracy_rounds rounds in all
    done = 2 * rounds + 2
    if accuracy_rounds > done:
        state, _ = jax.block_until_ready(sim.run_rounds(state, accuracy_rounds - done, donate=True))
    accuracy = float(sim.evaluate(state)["test_accuracy"])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    device_peak = None
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    if stats:
        device_peak = stats.get("peak_bytes_in_use")
    fused.sort()
    del jnp
    return {
        "strategy": strategy,
        "strategy_args": args,
        "availability": availability,
        "clients": clients,
        "per_round": per_round,
        "examples": int(ds.train.counts.sum()),
        "layout": ds.train.layout,
        "seconds_per_round": fused[len(fused) // 2],
        # FilFL filters every 5th round, DivFL warms up once: the mean counts those rounds
        "mean_seconds_per_round": sum(fused) / len(fused),
        "availability_s": availability_s,
        "selection_s": max(phases["select"] / rounds - availability_s, 0.0),
        "training_s": phases["train"] / rounds,
        "aggregation_s": phases["aggregate"] / rounds,
        "evaluation_s": evaluation_s,
        "peak_memory_bytes": peak,
        "peak_memory_gib": peak / 2**30,
        "device_peak_bytes": device_peak,
        "data_seconds": data_seconds,
        "compile_seconds": compile_seconds - fused[len(fused) // 2],
        "max_examples": max_examples,
        "personal_scale": PERSONAL_SCALE,
        "rounds_trained": max(accuracy_rounds, done),
        "test_accuracy": accuracy,
        "local_steps": local_steps,
        "batch_size": batch_size,
    }


def scale_main(
    strategies: list[str] | None = None,
    clients: list[int] | None = None,
    per_round: int = 1000,
    *,
    rounds: int = 5,
    max_examples: int = 20,
    out: str | None = None,
    timeout: float = 3600.0,
) -> list[dict]:
    """Runs every (strategy, K) in a child process; prints the table, writes JSON."""
    strategies = strategies or list(SCALE_STRATEGIES)
    unknown = sorted(set(strategies) - set(SCALE_STRATEGIES))
    if unknown:
        raise ConfigError(
            f"bench scale: unknown strategies {unknown}; choose {list(SCALE_STRATEGIES)}"
        )
    clients = clients or [1000, 10_000, 100_000, 1_000_000]
    rows = []
    for k in clients:
        for s in strategies:
            p = min(per_round, max(1, k // 10), MAX_PER_ROUND.get(s, per_round))
            if s == "full":  # every client, every round
                p = k
            spec = dict(
                strategy=s, clients=k, per_round=p, rounds=rounds, max_examples=max_examples
            )
            limit, reason = MAX_CLIENTS.get(s, (k, ""))
            if k > limit:
                rows.append({**spec, "error": f"not run above K = {limit:,}: {reason}"})
                continue
            t0 = time.perf_counter()
            r = subprocess.run(
                [sys.executable, "-m", "fedjax_sel.bench.scale", json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=os.environ,
            )
            if r.returncode != 0:
                tail = (r.stderr or r.stdout)[-1500:]
                error = tail.strip().splitlines()[-1] if tail.strip() else "no output"
                if r.returncode < 0:  # a signal: out of memory, or stopped by hand
                    error = f"killed by signal {-r.returncode}"
                row = {**spec, "error": error}
                print(f"{s} K={k:,}: failed ({row['error']})", file=sys.stderr)
            else:
                row = json.loads(r.stdout.strip().splitlines()[-1])
            row["wall_seconds"] = time.perf_counter() - t0
            rows.append(row)
            if "error" not in row:
                print(
                    f"{s} K={k:,}: {row['seconds_per_round']:.3f} s/round, peak "
                    f"{row['peak_memory_gib']:.2f} GiB ({row['wall_seconds']:.0f} s)",
                    file=sys.stderr,
                )
    info = machine_info()
    print(f"device: {info['device_kind']} ({info['backend']}, {info['cpu_count']} CPUs)")
    print_table([r for r in rows if "error" not in r], COLUMNS)
    write_json_rows(out, {"machine": info, "rows": rows})
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench scale``'s flags."""
    p.add_argument(
        "--strategy", action="append", help="strategies (default: the million-client set)"
    )
    p.add_argument("--clients", type=int, action="append", help="K values")
    p.add_argument(
        "--per-round", type=int, action="append", help="clients per round (default 1000)"
    )
    p.add_argument("--max-examples", type=int, default=20, help="examples per client at most")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds")
    p.add_argument("--out", default=None, help="JSON output file")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench scale``: :func:`scale_main` with the flags."""
    per_round = a.per_round or [1000]
    if len(per_round) != 1:
        raise ConfigError("bench scale takes one --per-round (capped at K / 10 per row)")
    return scale_main(
        strategies=a.strategy,
        clients=a.clients,
        per_round=per_round[0],
        rounds=a.repeats,
        max_examples=a.max_examples,
        out=a.out,
    )


if __name__ == "__main__":  # the child: one row as the last line of stdout
    spec = json.loads(sys.argv[1])
    print(json.dumps(measure_one(**spec)))
