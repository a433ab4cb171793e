"""``fedjax-sel bench workloads``: the canonical cross-device workloads, each as FLUTE's table
gives its recipe (FedAvg, one local epoch, SGD, 10 clients per round), timed in our engine.

Each workload runs on its real federated files when they are found (``--data-dir`` or
``$FEDJAX_SEL_DATA_DIR``), else on generated stand-in data of the same shapes, classes and
client-size distribution (random features and labels: its accuracy means nothing and is not
reported). Shakespeare's real data is, in this order, TFF's HDF5 files, LEAF's JSON or the
plays' Gutenberg texts split by speaking role as LEAF does (``shakespeare``: 715 of its roles,
seeded); ``dataset`` and ``dataset_info`` in the row say which. It runs ``rounds_run`` rounds
(the whole schedule where that is cheap) and projects the recipe's schedule from the steady
seconds per round: ``projected_total_s = compile_s + rounds * seconds_per_round`` (training
only; the evaluations are not counted); ``wall_s`` is what the ``rounds_run`` rounds took end to
end (data on device, compile, every round and evaluation), the figure to set beside a
published total when the whole schedule ran (``--rounds``). The accuracy is measured on a
seeded sample of at most ``EVAL_EXAMPLES`` examples of the central test set (``eval_examples``
in the row; the whole test set of Shakespeare's LSTM would cost more than the training
rounds), after ``rounds_run`` rounds (stand-in data: ``STANDIN_EVAL_EXAMPLES``, as nothing is
reported); per-client test metrics are not evaluated. Every workload runs in a fresh process,
so its peak memory is its own.

The published figures beside ours (``PUBLISHED``) come from other hardware: references to
cite, never ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError

EVAL_EXAMPLES = 10_000  # as TFF's baselines validate on (10,000 Stack Overflow sentences)
STANDIN_EVAL_EXAMPLES = 256  # random labels: no accuracy is reported, the evaluation only runs


@dataclasses.dataclass(frozen=True)
class Workload:
    """One recipe: the model, clients, batch, learning rate and rounds of the published table,
    the real data sets to try (in order) and the stand-in's shapes and client sizes."""

    name: str
    task: str
    model: str
    clients: int
    batch: int
    lr: float
    rounds: int
    real: tuple[tuple[str, dict[str, Any]], ...]
    input_shape: tuple[int, ...]
    num_classes: int
    tokens: bool = False
    size_mean: float = 100.0
    size_sigma: float = 0.0  # log-normal spread of client sizes; 0: every client size_mean
    rounds_run: int = 3
    per_round: int = 10
    published: str = ""


WORKLOADS = {
    w.name: w
    for w in (
        Workload(
            "logreg_mnist",
            "logistic regression, MNIST",
            "logreg",
            1000,
            10,
            0.03,
            100,
            real=(("mnist", {"partition": "iid", "num_clients": 1000}),),
            input_shape=(28, 28, 1),
            num_classes=10,
            size_mean=60.0,
            rounds_run=100,
            published="FLUTE 1m35s (GPU) / 3m20s (CPU), about 81%; Flower 1.0 30m14s (CPU)",
        ),
        Workload(
            "cnn_femnist",
            "CNN (2 conv + 2 dense), Federated EMNIST",
            "cnn",
            3400,
            20,
            0.1,
            1500,
            real=(("femnist", {}), ("emnist_writers", {})),
            input_shape=(28, 28, 1),
            num_classes=62,
            size_mean=198.0,
            size_sigma=0.5,
            rounds_run=4,
            published="FLUTE 8m22s, about 83%; FedML 5h50m",
        ),
        Workload(
            "resnet18_cifar100",
            "ResNet-18 with GroupNorm, CIFAR-100 (Pachinko)",
            "resnet18",
            500,
            20,
            0.1,
            4000,
            real=(("cifar100_tff", {}),),
            input_shape=(32, 32, 3),
            num_classes=100,
            size_mean=100.0,
            rounds_run=2,
            published="FLUTE 1h42m, about 33%",
        ),
        Workload(
            "lstm_shakespeare",
            "RNN (2 LSTM + dense), Shakespeare",
            "lstm",
            715,
            4,
            0.8,
            1200,
            real=(
                ("shakespeare_tff", {}),
                ("shakespeare_leaf", {}),
                ("shakespeare", {"num_clients": 715}),
            ),
            input_shape=(80,),
            num_classes=80,
            tokens=True,
            size_mean=3743.0,
            size_sigma=1.15,
            rounds_run=2,
            published="FLUTE 21m50s, about 57%",
        ),
    )  # fmt: skip
}


def standin(w: Workload, seed: int = 0, clients: int | None = None):
    """Generated data of ``w``'s shapes and client sizes (log-normal around ``size_mean``,
    LEAF's published per-client statistics), 20% of each client held out as its test split."""
    from fedjax_sel.data.dataset_natural import assemble_natural
    from fedjax_sel.data.federated_files import ClientExamples

    rng = np.random.default_rng(seed)
    k = clients or w.clients
    if w.size_sigma > 0:  # the mean of exp(N(mu, s^2)) is exp(mu + s^2 / 2)
        mu = np.log(w.size_mean) - w.size_sigma**2 / 2
        sizes = np.maximum(np.rint(rng.lognormal(mu, w.size_sigma, k)), 2).astype(int)
    else:
        sizes = np.full(k, int(w.size_mean))
    train, test = {}, {}
    for i, n in enumerate(sizes):
        shape = (int(n), *w.input_shape)
        high = w.num_classes if w.tokens else 256
        x = rng.integers(0, high, shape, dtype=np.uint8)
        y = rng.integers(0, w.num_classes, int(n)).astype(np.int32)
        n_test = max(1, int(round(0.2 * n)))
        train[str(i)] = ClientExamples(x[n_test:], y[n_test:])
        test[str(i)] = ClientExamples(x[:n_test], y[:n_test])
    ds = assemble_natural(
        f"{w.name}_standin", [str(i) for i in range(k)], train, test, layout="auto",
        num_classes=w.num_classes, default_model=w.model,
        info={"source": "generated stand-in", "size_mean": w.size_mean,
              "size_sigma": w.size_sigma},
        x_scale=None if w.tokens else 1.0 / 255.0,
    )  # fmt: skip
    return ds


def _real(w: Workload, data_dir: str | None, clients: int | None):
    from fedjax_sel.data import load_dataset

    for name, options in w.real:
        options = dict(options)
        default = options.pop("num_clients", None)  # None: every client of the files
        n = clients or default
        try:
            return name, load_dataset(name, num_clients=n, data_path=data_dir, **options)
        except ConfigError:
            continue
    return None, None


def evaluation_sample(ds, examples: int = EVAL_EXAMPLES, seed: int = 0):
    """``ds`` with its central test set cut to a seeded sample of ``examples`` (the whole set
    when smaller) and no per-client test splits."""
    total = int(ds.test_x.shape[0])
    info = dict(ds.info, eval_examples=min(examples, total), test_examples=total)
    if total <= examples:
        return dataclasses.replace(ds, test=None, info=info)
    rows = np.sort(np.random.default_rng(seed).choice(total, examples, replace=False))
    return dataclasses.replace(
        ds, test=None, test_x=ds.test_x[rows], test_y=ds.test_y[rows], info=info
    )


def run_one(name: str, *, data_dir: str | None, rounds: int | None, clients: int | None) -> dict:
    """Times workload ``name`` in this process and returns its row."""
    from fedjax_sel.config import RunConfig
    from fedjax_sel.experiment import run_experiment
    from fedjax_sel.experiment.provenance import machine_info

    w = WORKLOADS[name]
    real_name, ds = _real(w, data_dir, clients)
    data = "real" if ds is not None else "standin"
    if ds is None:
        ds = standin(w, clients=clients)
    ds = evaluation_sample(ds, EVAL_EXAMPLES if data == "real" else STANDIN_EVAL_EXAMPLES)
    run_rounds = rounds or w.rounds_run
    config = RunConfig(
        strategy="uniform", dataset=real_name or "digits", model=w.model,
        num_clients=ds.num_clients, per_round=min(w.per_round, ds.num_clients),
        rounds=run_rounds, local_epochs=1, batch_size=w.batch, lr=w.lr,
        eval_every=max(1, run_rounds // 10) if run_rounds > 1 else 1, seed=0,
    )  # fmt: skip
    start = time.perf_counter()
    result = run_experiment(config, None, progress=False, dataset=ds, echo=lambda *_: None)
    wall = time.perf_counter() - start  # end to end: compile, every round and evaluation
    s = {**result.summary, **result.timings}
    spr = 1.0 / s["rounds_per_second"] if s.get("rounds_per_second") else None
    first_rounds = config.eval_every
    compile_s = None
    if spr is not None and s.get("first_chunk_seconds") is not None:
        compile_s = max(0.0, s["first_chunk_seconds"] - first_rounds * spr)
    return add_flop_rate(
        {
            "workload": w.name,
            "task": w.task,
            "data": data,
            "dataset": real_name or "standin",
            "model": w.model,
            "clients": ds.num_clients,
            "per_round": config.per_round,
            "batch": w.batch,
            "lr": w.lr,
            "rounds": w.rounds,
            "rounds_run": run_rounds,
            "compile_s": compile_s,
            "seconds_per_round": spr,
            "projected_total_s": None if spr is None else (compile_s or 0.0) + w.rounds * spr,
            "projected": run_rounds < w.rounds,
            "wall_s": round(wall, 2),
            "peak_memory_bytes": s.get("peak_host_memory_bytes"),
            "peak_memory_gib": None
            if s.get("peak_host_memory_bytes") is None
            else round(s["peak_host_memory_bytes"] / 2**30, 2),
            "accuracy": s.get("final_accuracy") if data == "real" else None,
            "eval_examples": ds.info["eval_examples"],
            "published": w.published,
            "dataset_info": {  # without the per-client lists (ids, role names)
                k: v
                for k, v in ds.info.items()
                if not (isinstance(v, (list, tuple)) and len(v) > 20)
            },
            "machine": machine_info(),
        }
    )


def add_flop_rate(row: dict) -> dict:
    """``row`` with the model's analytic training FLOPs per example
    (:func:`fedjax_sel.models.flops.train_step_flops`), those of a round of clients of the mean
    training size and the rate they would run at (``gflops_per_second_mean_client``: a
    round's actual clients are drawn at random, so this is a scale, not an exact rate)."""
    import jax.numpy as jnp

    from fedjax_sel.models import make_model
    from fedjax_sel.models.flops import train_step_flops

    w = WORKLOADS[row["workload"]]
    model = make_model(w.model, input_shape=w.input_shape, num_classes=w.num_classes)
    x = jnp.zeros((1, *w.input_shape), jnp.int32 if w.tokens else jnp.float32)
    per_example = train_step_flops(model.module, x)
    mean_size = row["dataset_info"]["num_train_examples"] / row["clients"]
    per_round = row["per_round"] * mean_size * per_example
    rate = None if not row["seconds_per_round"] else per_round / row["seconds_per_round"] / 1e9
    return {
        **row,
        "train_flops_per_example": per_example,
        "round_flops_mean_client": per_round,
        "gflops_per_second_mean_client": rate,
    }


def workloads_main(
    names: list[str] | None = None,
    *,
    data_dir: str | None = None,
    rounds: int | None = None,
    clients: int | None = None,
    out: str | Path | None = None,
) -> list[dict]:
    """Every workload (or ``names``) in a fresh process each; prints the table and writes
    ``out`` (JSON) when given."""
    names = names or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise ConfigError(f"unknown workload(s) {unknown}; choose from {list(WORKLOADS)}")
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "row.json"
            argv = [sys.executable, "-m", "fedjax_sel.bench.workloads", name, str(path)]
            for flag, value in (("--data-dir", data_dir), ("--rounds", rounds),
                                ("--clients", clients)):  # fmt: skip
                if value is not None:
                    argv += [flag, str(value)]
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"workload {name} failed:\n{done.stderr[-3000:]}")
            rows.append(json.loads(path.read_text()))
        print(table(rows[-1:]), flush=True)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))
    return rows


def table(rows: list[dict]) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [
        "| workload | data | clients | per round | batch | rounds run | compile s | s/round | "
        "projected total | wall s | peak GiB | accuracy |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        total = (
            f(r["projected_total_s"], ",.0f") + " s" + (" (projected)" if r["projected"] else "")
        )
        lines.append(
            f"| {r['workload']} | {r['data']} | {r['clients']:,} | {r['per_round']} | "
            f"{r['batch']} | {r['rounds_run']} of {r['rounds']:,} | {f(r['compile_s'], '.1f')} | "
            f"{f(r['seconds_per_round'], '.3f')} | {total} | {f(r.get('wall_s'), ',.1f')} | "
            f"{f(r.get('peak_memory_gib'), '.2f')} | "
            f"{f(r['accuracy'], '.4f')} |"
        )
    return "\n".join(lines)


def _child(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("name")
    p.add_argument("out")
    p.add_argument("--data-dir")
    p.add_argument("--rounds", type=int)
    p.add_argument("--clients", type=int)
    a = p.parse_args(argv)
    row = run_one(a.name, data_dir=a.data_dir, rounds=a.rounds, clients=a.clients)
    Path(a.out).write_text(json.dumps(row))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench workloads``' flags."""
    p.add_argument(
        "--workload",
        action="append",
        help="logreg_mnist, cnn_femnist, resnet18_cifar100, lstm_shakespeare (default all); "
        "--rounds N runs N rounds of each (default: the workload's own)",
    )
    p.add_argument("--data-dir", default=None, help="folder of the real data files")
    p.add_argument("--rounds", type=int, default=None, help="rounds of each workload")
    p.add_argument("--clients", type=int, action="append", help="a subset of each workload's")
    p.add_argument("--out", default=None, help="JSON output file")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench workloads``: :func:`workloads_main` with the flags."""
    if a.clients is not None and len(a.clients) != 1:
        raise ConfigError("bench workloads takes one --clients (a subset of each workload's)")
    return workloads_main(
        a.workload,
        data_dir=a.data_dir,
        rounds=a.rounds,
        clients=a.clients[0] if a.clients else None,
        out=a.out,
    )


if __name__ == "__main__":
    _child(sys.argv[1:])
