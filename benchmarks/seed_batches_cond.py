"""Seeds batched (``vmap``) over strategies whose round branches: seconds per member-round.

DivFL's round branches on its warm start (round 0 only) and FilFL's on whether it filters this
round. Under the members' vmap of :meth:`Simulation.run_rounds_batch` a ``lax.cond`` on a
member's state becomes a select: each member ran both branches every round (DivFL trained
every client every round). :func:`fedjax_sel.members.members_cond` runs a branch only when
some member takes it. This script times ``rounds`` rounds after the first (the warm start
excluded) for one seed alone (unbatched, as a run of one seed) and for ``members`` seeds
vmapped, on LEAF Synthetic with logistic regression, and reports seconds per member-round.
Public functions only, so the same file times an older checkout
(``PYTHONPATH=<checkout>``, ``--label``)::

    python benchmarks/seed_batches_cond.py --label after \\
        --out benchmarks/results/cpu_xeon/seed_batches_cond.json
"""

from __future__ import annotations

import argparse

import jax
from labelled_runs import write_labelled_run

from fedjax_sel.bench.common import print_table, time_call
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment.build import build_simulation, load_data_for
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.training import HParams

CASES = {
    "divfl": {},  # warm start in round 0, then the regular round
    "filfl": {"period": 5},  # filters every 5th round (and when availability changes)
}


def seconds_per_member_round(sim, hparams, seeds: list[int], rounds: int, repeats: int) -> float:
    """Best of ``repeats`` timed calls of ``rounds`` rounds after round 0 (compiled first),
    per member-round; one seed runs unbatched, as a run of one seed does."""
    if len(seeds) == 1:
        state, _ = sim.run_rounds(sim.init(seeds[0], hparams=hparams), 1)  # DivFL's warm start

        def call():
            return jax.block_until_ready(sim.run_rounds(state, rounds)[0].params)

    else:
        states, _ = sim.run_rounds_batch(sim.init_batch(seeds, hparams=hparams), None, 1)

        def call():
            return jax.block_until_ready(sim.run_rounds_batch(states, None, rounds)[0].params)

    return time_call(call, repeats=repeats)["min_seconds"] / (len(seeds) * rounds)


def measure(num_clients: int, per_round: int, members: int, rounds: int, repeats: int):
    rows = []
    for strategy, args in CASES.items():
        config = RunConfig(
            dataset="leaf_synthetic",
            num_clients=num_clients,
            per_round=per_round,
            strategy=strategy,
            strategy_args=args,
            rounds=rounds + 1,
            eval_every=rounds + 1,
            local_steps=10,
            batch_size=32,
            lr=0.05,
            data_seed=0,
            seed=0,
            parallel="vmap",
            server_fraction=0.1 if strategy == "filfl" else 0.0,  # FilFL's filter set
        )
        resolved = resolve(config)
        sim = build_simulation(resolved, load_data_for(resolved.config))
        hparams = HParams.from_config(resolved.config)
        alone = seconds_per_member_round(sim, hparams, [0], rounds, repeats)
        batched = seconds_per_member_round(sim, hparams, list(range(members)), rounds, repeats)
        rows.append(
            {
                "strategy": strategy,
                "strategy_args": args,
                "num_clients": num_clients,
                "per_round": per_round,
                "members": members,
                "rounds": rounds,
                "one_member_seconds_per_round": alone,
                "batched_seconds_per_member_round": batched,
                "per_member_ratio": batched / alone,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--label", default="this checkout", help="names these rows in the JSON")
    ap.add_argument("--out", help="JSON file; rows of other labels already there are kept")
    a = ap.parse_args()
    rows = measure(a.clients, a.per_round, a.members, a.rounds, a.repeats)
    for r in rows:
        r["label"] = a.label
    print_table(
        rows,
        [
            ("label", "label", "{}"),
            ("strategy", "strategy", "{}"),
            ("members", "members", "{}"),
            ("1 member s/round", "one_member_seconds_per_round", "{:.4f}"),
            ("batched s/member-round", "batched_seconds_per_member_round", "{:.4f}"),
            ("ratio", "per_member_ratio", "{:.2f}"),
        ],
    )
    if a.out:
        write_labelled_run(a.out, "python benchmarks/seed_batches_cond.py", a.label, rows)


if __name__ == "__main__":
    main()
