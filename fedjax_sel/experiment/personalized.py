"""The run loop's engine for ``mode="personalized"`` (SP-CACW and its baselines).

Each evaluation record holds the mean over targets of every per-target metric (so tables,
sweeps and ``compare`` treat a personalized run like any other), the worst target's accuracy,
the per-target values under ``per_target`` and, for peer-weighting methods, the weights
``[targets, clients]`` under ``weights``. A round is one lazy-update period.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.config import RunConfig
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.experiment import run as run_lib
from fedjax_sel.experiment.outputs import CHECKPOINT, METRICS, dumps
from fedjax_sel.metrics import nanmean
from fedjax_sel.personalized.methods import build_program


class PersonalizedEngine:
    """Drives one :class:`~fedjax_sel.personalized.methods.PersonalizedProgram`."""

    task = "classification"

    def __init__(self, program, state, config: RunConfig, dataset: FederatedDataset):
        self.program, self.state = program, state
        self.task = dataset.task
        self.clusters = dataset.info.get("cluster")
        self.logs: list = []
        self.evaluations = 0

    def advance(self, n: int) -> tuple[list[dict], dict[str, float]]:
        t0 = time.perf_counter()
        self.state, log = self.program.advance(self.state, n)
        if log is not None:
            self.logs.append(log)
        fields = {"_client_updates": n * len(self.program.target_ids), "_bad_round": None}
        if log is not None:
            loss = np.asarray(log.train_loss)  # [n, T]
            fields["train_loss"] = float(nanmean(loss))
            bad = ~np.all(np.isfinite(loss), axis=1)
            if np.any(bad):
                fields["_bad_round"] = int(self.state.epoch) - n + int(np.argmax(bad))
        return [fields], {"rounds": time.perf_counter() - t0}

    def evaluate(self) -> list[dict[str, Any]]:
        per_target = self.program.evaluate(self.state)
        out: dict[str, Any] = {k: float(nanmean(v)) for k, v in per_target.items()}
        acc = np.asarray(per_target.get("test_accuracy", np.nan))
        out["worst_target_accuracy"] = float(np.min(acc)) if np.all(np.isfinite(acc)) else None
        out["per_target"] = {k: np.asarray(v).tolist() for k, v in per_target.items()}
        if self.program.weights is not None:
            out["weights"] = np.asarray(self.program.weights(self.state)).tolist()
        return [out]

    def member_state(self, i: int) -> Any:
        return self.state

    def summary(self, i: int, records: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            **personalized_summary(records, self.clusters, self.program.target_ids),
            **self.describe(),
        }

    def describe(self) -> dict[str, Any]:
        return {
            "update_every": self.program.update_every,
            "targets": self.program.target_ids.tolist(),
        }


def personalized_summary(records: list[dict[str, Any]], clusters, targets) -> dict[str, Any]:
    """End-of-run numbers: each target's metrics averaged over the evaluations in the last 20%
    of the run (at least the last one), then over targets; the weight each target puts on
    itself and, with known clusters, on its own cluster."""
    rounds = np.asarray([r["round"] for r in records])
    keep = rounds > 0.8 * rounds[-1]
    keep[-1] = True
    tail = [r for r, k in zip(records, keep, strict=True) if k]

    def final(name):
        return nanmean(np.asarray([r["per_target"][name] for r in tail], np.float64), axis=0)

    acc = final("test_accuracy")
    out: dict[str, Any] = {
        "target_accuracy": float(nanmean(acc)),
        "worst_target_accuracy": float(np.min(acc)) if np.all(np.isfinite(acc)) else None,
        "target_test_loss": float(nanmean(final("test_loss"))),
    }
    if "weights" in records[-1]:
        w = np.asarray(records[-1]["weights"])
        ids = np.asarray(targets)
        out["self_weight"] = float(np.mean(w[np.arange(len(ids)), ids]))
        out["peers_with_weight"] = float(np.mean(np.sum(w > 1e-3, axis=1)))
        if clusters is not None:
            c = np.asarray(clusters)
            same = c[ids][:, None] == c[None, :]
            out["own_cluster_mass"] = float(np.mean(np.sum(np.where(same, w, 0.0), axis=1)))
    return out


def run_personalized(
    config: RunConfig,
    out: Path | None,
    *,
    info: dict[str, Any] | None = None,
    dataset: FederatedDataset | None = None,
    bar: Any = None,
    echo: Callable = print,
    resume: bool = True,
) -> list[run_lib.RunResult]:
    """Runs one personalized configuration through :func:`fedjax_sel.experiment.run.drive`."""
    config.resolve()
    dataset = dataset if dataset is not None else run_lib.load_data_for(config)
    model = run_lib.model_for(config, dataset)
    options = dict(config.strategy_args)
    program = build_program(
        config.strategy,
        dataset,
        model,
        lr=config.lr,
        batch_size=config.batch_size,
        update_every=config.local_steps,
        seed=config.seed,
        **options,
    )
    member = run_lib._Member(config, None if out is None else Path(out), info=dict(info or {}))
    fresh = program.init(config.seed)
    restored = run_lib._restore(member, fresh, echo) if resume else None
    if restored is None and member.out is not None:
        member.out.mkdir(parents=True, exist_ok=True)
        (member.out / METRICS).write_text("")
        (member.out / CHECKPOINT).unlink(missing_ok=True)
    engine = PersonalizedEngine(program, fresh if restored is None else restored, config, dataset)
    run_lib._write_config(member, dataset, engine.describe())
    if restored is None:  # the initial model, evaluated (round 0)
        record = {"round": 0, **engine.evaluate()[0]}
        member.records.append(record)
        if member.out is not None:
            with (member.out / METRICS).open("a") as f:
                f.write(dumps(record) + "\n")
    (result,) = run_lib.drive(engine, [member], bar=bar, echo=echo)
    result.extras = {"epoch_logs": engine.logs, "program": program}
    return [result]
