"""``fedjax-sel reproduce filfl``: FilFL (Fourati et al., ECAI 2024) beside the paper.

Parts (all by default; choose with ``parts=...`` in Python or ``$FEDJAX_SEL_FILFL_PARTS``, a
comma-separated list, from the CLI):

* ``shakespeare_poc`` (Fig. 3): FilFL (DGF, RGF) vs FedAvg, both with Power-of-Choice, on
  Shakespeare filtered on the paper's introduction (N = 143, n = 100, K = 10, m = 34, h = 5).
* ``shakespeare_prox_rs`` (Fig. 5): FilFL vs FedProx, random selection, Shakespeare.
* ``image_prox_rs`` (Fig. 4, FEMNIST): FilFL vs FedProx, random selection (N = 190, n = 50,
  K = 5, h = 5) on the image task.
* ``image_poc`` (appendix E.1): FilFL vs FedAvg with PoC on the image task.
* ``period`` (Fig. 7): FilFL (RGF + PoC) with h in {1, 3, 5, 10, 20}; the available set is
  redrawn every 20 rounds here (a redraw also triggers filtering, so with the usual redraw
  every 5 rounds h = 5, 10 and 20 are the same schedule).
* ``filter_size`` (Fig. 8): FilFL (DGF + PoC) on Shakespeare with m in {34, 17, 8}.
* ``variable`` (Fig. 9): the filtering set is one random available client's validation split.
* ``divfl`` (Fig. 6): FilFL (RS) and FilFL (DGF + DivFL) vs FedAvg (DivFL).
* ``ratio`` (Fig. 11): R(S^f) / R(OPT) of DGF and RGF against the brute force with n = 10.

Filtering rates (Fig. 10) come from the DGF and RGF runs of the PoC comparisons.

The image task is FEMNIST in the paper. ``--full`` uses EMNIST (by-class, Dirichlet 0.3
partition: tensorflow-datasets has no writer split) with the CNN when it can be loaded, and
MNIST otherwise; the paper's CIFAR-10 parts (``variable``, ``divfl``, ``ratio``) use CIFAR-10
with the CNN (not ResNet-18) when it can be loaded, else the image task. The CPU size always
uses MNIST (Dirichlet 0.3) with the 784-200-200-10 MLP.
The CPU size also shrinks Shakespeare (40 roles of at most 400 windows, n = 28, K = 4, a
64-unit LSTM, 10 local steps, 120 rounds): ``--full`` restores the paper's settings.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.experiment import load_data_for, plot_curves, run_experiment, write_json
from fedjax_sel.kernels.double_greedy import set_value_ratio
from fedjax_sel.reproduce import output_dir, register_reproduction, select_parts

PARTS = (
    "shakespeare_poc",
    "shakespeare_prox_rs",
    "image_prox_rs",
    "image_poc",
    "period",
    "filter_size",
    "variable",
    "divfl",
    "ratio",
)
PROX_MU = 0.01

# What the paper reports (percentage points of test accuracy over the baseline; Figs. 3-11).
PAPER = {
    "shakespeare_poc": "DGF and RGF ~ +10 pp over FedAvg (PoC) (Fig. 3)",
    "shakespeare_prox_rs": "DGF ~ +3 pp, RGF ~ +6 pp over FedProx (RS) (Fig. 5)",
    "image_prox_rs": "FEMNIST: DGF ~ +7 pp, RGF ~ +4 pp over FedProx (RS) (Fig. 4)",
    "image_poc": "FEMNIST ~ +7 pp, CIFAR-10 ~ +5 pp over FedAvg (PoC) (appendix E.1)",
    "period": "similar accuracy for every h in {1, 3, 5, 10, 20} (Fig. 7, FEMNIST)",
    "filter_size": "FilFL above FedAvg for m = 34, 17, 8; slightly better for larger m (Fig. 8)",
    "variable": "CIFAR-10: ~ +10 pp over FedAvg (PoC) with a random client's data (Fig. 9)",
    "divfl": "CIFAR-10: FilFL (RS) ~ +10 pp over FedAvg (DivFL) (Fig. 6)",
    "ratio": "R(S^f) >= 0.96 R(OPT) for DGF and RGF over the rounds (Fig. 11, n = 10)",
    "rates": "DGF rejects about half of the available clients, RGF fewer (Fig. 10)",
}


@dataclasses.dataclass(frozen=True)
class Task:
    """A data set, model and training setting with the FilFL sizes (N, n, K, m, h)."""

    name: str
    dataset: str
    num_clients: int
    available: int
    per_round: int
    rounds: int
    eval_every: int
    model: str | None = None
    partition: str | None = None
    dataset_args: dict = dataclasses.field(default_factory=dict)
    model_args: dict = dataclasses.field(default_factory=dict)
    server_fraction: float = 0.0
    test_fraction: float | None = None
    filter_size: int = 0
    period: int = 5
    local_steps: int | None = None
    local_epochs: int | None = None
    batch_size: int = 32
    lr: float = 0.05
    redraw_every: int = 5  # rounds between availability redraws

    def config(self, strategy: str, args: dict, seed: int, **overrides) -> RunConfig:
        cfg = RunConfig(
            strategy=strategy,
            strategy_args=dict(args),
            dataset=self.dataset,
            dataset_args=dict(self.dataset_args),
            partition=self.partition,
            test_fraction=self.test_fraction,
            server_fraction=self.server_fraction,
            model=self.model,
            model_args=dict(self.model_args),
            num_clients=self.num_clients,
            per_round=self.per_round,
            rounds=self.rounds,
            local_steps=self.local_steps,
            local_epochs=self.local_epochs,
            batch_size=self.batch_size,
            lr=self.lr,
            availability=f"subset:n={self.available},every={self.redraw_every}",
            eval_every=self.eval_every,
            seed=seed,
        )
        return dataclasses.replace(cfg, **overrides)


def shakespeare_task(full: bool) -> Task:
    if full:  # paper section 5.1 and the reference configuration (lr 0.8, batch 64, 1 epoch)
        return Task(
            "shakespeare", "shakespeare_filfl", 143, 100, 10, 200, 10, model="lstm",
            filter_size=34, local_epochs=1, batch_size=64, lr=0.8,
        )  # fmt: skip
    return Task(
        "shakespeare", "shakespeare_filfl", 40, 28, 4, 120, 10, model="lstm",
        dataset_args={"max_examples": 400}, model_args={"lstm_hidden": 64}, filter_size=34,
        local_steps=10, batch_size=16, lr=0.8,
    )  # fmt: skip


def image_task(full: bool, data_dir: str | None, available: int | None = None) -> Task:
    if full:
        task = Task(
            "emnist", "emnist", 190, 50, 5, 200, 10, model="cnn", partition="dirichlet:0.3",
            test_fraction=0.1, local_epochs=1, batch_size=32, lr=0.05,
        )  # fmt: skip
        try:
            load_data_for(task.config("uniform", {}, 0, data_path=data_dir, rounds=1))
        except ConfigError as e:
            print(f"EMNIST is not available ({e}); the image task falls back to MNIST")
            task = dataclasses.replace(task, name="mnist", dataset="mnist", model="mlp")
        size = 697932 if task.dataset == "emnist" else 60000
        task = dataclasses.replace(task, server_fraction=2000 / size)  # m = 2000 (Fig. 4)
    else:
        task = Task(
            "mnist", "mnist", 60, 20, 5, 100, 10, model="mlp", partition="dirichlet:0.3",
            test_fraction=0.1, server_fraction=0.01, local_steps=10, batch_size=32, lr=0.05,
        )  # fmt: skip
    if available is not None:
        task = dataclasses.replace(task, available=available)
    return task


def cifar_task(data_dir: str | None) -> Task:
    """Full size only: CIFAR-10 (Dirichlet 0.5, N = 200, n = 30, K = 3, m = 500, h = 5; the
    paper's Figs. 6, 9, 11) with the CNN in place of ResNet-18; the image task when CIFAR-10
    cannot be loaded."""
    task = Task(
        "cifar10", "cifar10", 200, 30, 3, 200, 10, model="cnn", partition="dirichlet:0.5",
        test_fraction=0.1, server_fraction=0.01, local_epochs=1, batch_size=32, lr=0.05,
    )  # fmt: skip
    try:
        load_data_for(task.config("uniform", {}, 0, data_path=data_dir, rounds=1))
    except ConfigError as e:
        print(f"CIFAR-10 is not available ({e}); its parts use the image task")
        return image_task(True, data_dir)
    return task


def baseline_args(selector: str, task: Task) -> tuple[str, dict]:
    """FedAvg/FedProx without filtering: PoC = top-K by loss over the available clients
    (reference code: d = n), RS = uniform; uniform aggregation (Algorithm 1, line 19)."""
    if selector == "poc":
        return "power_of_choice", {"d": task.available, "weighting": "uniform"}
    if selector == "divfl":
        return "divfl", {"weighting": "uniform"}
    return "uniform", {"weighting": "uniform"}


def filfl_args(selector: str, variant: str, task: Task, **extra) -> tuple[str, dict]:
    inner = {"poc": "power_of_choice", "rs": "uniform", "divfl": "divfl"}[selector]
    args = {
        "inner": inner,
        "variant": variant,
        "period": task.period,
        "considered": task.available,
        "filter_size": task.filter_size,
    }
    if selector == "poc":
        args["inner_args"] = f"d={task.available}"
    args.update(extra)
    return "filfl", args


class Runner:
    """Runs configurations once per seed, caching data sets and finished runs."""

    def __init__(self, out: Path, seeds: int, data_dir: str | None):
        self.out, self.seeds, self.data_dir = out, seeds, data_dir
        self.data: dict[tuple, Any] = {}
        self.done: dict[str, list[dict]] = {}

    def run(self, label: str, task: Task, strategy: str, args: dict, **overrides) -> list[dict]:
        key = f"{task.name}/{label}"
        if key in self.done:
            return self.done[key]
        runs = []
        for seed in range(self.seeds):
            cfg = task.config(strategy, args, seed, data_path=self.data_dir, **overrides)
            dkey = (cfg.dataset, cfg.seed, cfg.server_fraction, tuple(sorted(cfg.dataset_args)))
            if dkey not in self.data:
                self.data = {k: v for k, v in self.data.items() if k[1] == seed}
                self.data[dkey] = load_data_for(cfg)
            where = self.out / "runs" / task.name / _slug(label) / f"seed{seed}"
            record = load_finished(where, cfg)
            if record is None:
                result = run_experiment(cfg, where, progress=False, dataset=self.data[dkey])
                log = getattr(result.state.strategy_state, "log", None)
                log = None if log is None else {f: np.asarray(v) for f, v in log._asdict().items()}
                record = {"evals": result.evals, "summary": result.summary, "log": log}
                write_json(where / "filter_log.json", log)
            runs.append(record)
            acc = record["evals"][-1]["test_accuracy"]
            print(
                f"  {task.name:12s} {label:28s} seed {seed}: final accuracy {acc:.4f}", flush=True
            )
        self.done[key] = runs
        return runs


def load_finished(where: Path, cfg: RunConfig) -> dict | None:
    """A finished run of the same configuration in ``where`` (the reproduction resumes), or
    ``None``."""
    import json

    files = [where / n for n in ("config.json", "metrics.jsonl", "summary.json", "filter_log.json")]
    if not all(f.exists() for f in files):
        return None
    saved = json.loads(files[0].read_text())["config"]
    if saved != json.loads(json.dumps(cfg.to_dict())):
        return None
    evals = [json.loads(line) for line in files[1].read_text().splitlines() if line.strip()]
    log = json.loads(files[3].read_text())
    if log is not None:
        log = {k: np.array([np.nan if v is None else v for v in vals]) for k, vals in log.items()}
    summary = json.loads(files[2].read_text())
    if len(evals) * cfg.eval_every < cfg.rounds or summary.get("diverged"):
        return None
    return {"evals": evals, "summary": summary, "log": log}


def _sweep_label(base: str, name: str, value, default) -> str:
    """The sweep's run at the task's own setting is the main comparison's run (reused)."""
    return base if value == default else f"{base} {name}={value}"


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_").lower()


def end_accuracy(evals: list[dict], fraction: float = 0.2) -> float:
    """Mean test accuracy over the evaluations in the last ``fraction`` of the rounds."""
    last = evals[-1]["round"]
    tail = [e["test_accuracy"] for e in evals if e["round"] > (1 - fraction) * last]
    return float(np.mean(tail or [evals[-1]["test_accuracy"]]))


def compare(
    name: str,
    runner: Runner,
    task: Task,
    entries: list[tuple[str, str, dict]],
    baseline: str,
    overrides: dict | None = None,
) -> dict:
    """Runs ``entries`` (label, strategy, args), plots them and reports each label's end
    accuracy (last 20% of the rounds; mean and std over seeds) and its gain over ``baseline`` in
    percentage points, and the same for the mean accuracy over all evaluations (a measure of
    how fast it learns)."""
    overrides = overrides or {}
    results = {label: runner.run(label, task, s, a, **overrides) for label, s, a in entries}
    rows, curves, bands = [], {}, {}
    base = np.array([end_accuracy(r["evals"]) for r in results[baseline]])
    base_mean = np.array(
        [np.mean([e["test_accuracy"] for e in r["evals"]]) for r in results[baseline]]
    )
    for label, runs in results.items():
        ends = np.array([end_accuracy(r["evals"]) for r in runs])
        means = np.array([np.mean([e["test_accuracy"] for e in r["evals"]]) for r in runs])
        rows.append(
            {
                "comparison": name,
                "run": label,
                "end_accuracy": float(ends.mean()),
                "end_accuracy_std": float(ends.std()),
                "gain_pp": float(100 * (ends.mean() - base.mean())),
                "mean_accuracy": float(means.mean()),
                "mean_gain_pp": float(100 * (means.mean() - base_mean.mean())),
                "filtered_fraction": _filtered_fraction(runs, task),
            }
        )
        acc = np.array([[e["test_accuracy"] for e in r["evals"]] for r in runs])
        mean = acc.mean(0)
        curves[label] = [
            dict(e, test_accuracy=float(m)) for e, m in zip(runs[0]["evals"], mean, strict=True)
        ]
        bands[label] = (acc.min(0), acc.max(0))
    plot_curves(
        curves,
        runner.out / f"{name}.png",
        bands=bands,
        title=f"{name}: {task.name}, {runner.seeds} seed(s)",
    )
    return {"rows": rows, "paper": PAPER.get(name, ""), "seeds": runner.seeds}


def _filtered_fraction(runs: list[dict], task: Task) -> float | None:
    """Mean |S^f| / n over the filtering rounds (None without filtering)."""
    sizes = [r["log"]["size"] for r in runs if r["log"] is not None]
    considered = [r["log"]["considered"] for r in runs if r["log"] is not None]
    if not sizes:
        return None
    s, c = np.concatenate(sizes), np.concatenate(considered)
    on = s >= 0
    return float(np.mean(s[on] / np.maximum(c[on], 1)))


def rates_report(runner: Runner, out: Path) -> dict:
    """Fig. 10: |S^f| over the rounds for DGF and RGF (from the PoC comparisons)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = {k: v for k, v in runner.done.items() if "FilFL" in k and v[0]["log"] is not None}
    if not found:
        return {}
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = []
    for key, runs in sorted(found.items()):
        size = np.stack([r["log"]["size"] for r in runs]).astype(float)
        considered = np.stack([r["log"]["considered"] for r in runs]).astype(float)
        rounds = np.flatnonzero(size[0] >= 0)
        frac = size[:, rounds] / np.maximum(considered[:, rounds], 1)
        ax.plot(rounds, size[:, rounds].mean(0), marker=".", label=key)
        rows.append(
            {
                "run": key,
                "mean_filtered_size": float(size[:, rounds].mean()),
                "mean_filtered_fraction": float(frac.mean()),
                "considered": float(considered[:, rounds].mean()),
            }
        )
    ax.set_xlabel("round")
    ax.set_ylabel("|S^f| (filtered-in clients)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "rates.png", dpi=110)
    plt.close(fig)
    return {"rows": rows, "paper": PAPER["rates"]}


def ratio_report(runner: Runner, task: Task) -> dict:
    """Fig. 11: both greedies' values against the brute-force optimum in every filtering
    round of a FilFL run with n = 10 (``track_opt``), as the paper's ratio of
    ``f = 10 - F_V`` and as the offset-free ratio of losses ``F_V(OPT) / F_V(S^f)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategy, args = filfl_args("rs", "dgf", task, track_opt=True)
    runs = runner.run("FilFL DGF (RS) + brute force", task, strategy, args)
    rows = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in ("dgf", "rgf"):
        val = np.concatenate([r["log"][f"value_{variant}"] for r in runs])
        opt = np.concatenate([r["log"]["value_opt"] for r in runs])
        on = np.isfinite(val) & np.isfinite(opt)
        ratio = np.asarray(set_value_ratio(val[on], opt[on]))
        rounds = np.concatenate([np.arange(len(r["log"]["value_opt"])) for r in runs])[on]
        ax.plot(rounds, ratio, marker="o", linestyle="", label=variant.upper())
        loss_ratio = opt[on] / val[on]  # (-F_V(OPT)) / (-F_V(S)) = F_V(OPT) / F_V(S)
        rows.append(
            {
                "variant": variant.upper(),
                "filtering_rounds": int(on.sum()),
                "ratio_mean": float(ratio.mean()),
                "ratio_min": float(ratio.min()),
                "loss_ratio_mean": float(loss_ratio.mean()),
                "loss_ratio_min": float(loss_ratio.min()),
                "optimal_fraction": float(np.mean(val[on] >= opt[on] - 1e-6)),
            }
        )
    ax.axhline(0.96, color="gray", linestyle="--", label="paper's bound 0.96")
    ax.set_xlabel("round")
    ax.set_ylabel("(10 + R(S^f)) / (10 + R(OPT))")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(runner.out / "ratio.png", dpi=110)
    plt.close(fig)
    return {"rows": rows, "paper": PAPER["ratio"], "seeds": runner.seeds}


@register_reproduction(
    "filfl",
    "FilFL (Fourati et al. 2024): filtering vs none with PoC/RS/DivFL on Shakespeare and an image "
    "task; periodicity, filtering-set size and variable-set ablations; filtering rates; "
    "approximation ratios",
)
def run(
    *,
    seeds: int = 3,
    out: Path,
    full: bool = False,
    data_dir: str | None = None,
    parts: tuple[str, ...] | str | None = None,
) -> dict:
    """Runs the parts (see the module docstring) and writes ``summary.json``, one plot per
    comparison, ``rates.png`` and each run's own output folder under ``out``. Runs already
    finished in ``out`` with the same configuration are read back instead of run again, and
    the parts of an earlier ``summary.json`` there are kept."""
    out = output_dir(out)
    parts = select_parts("filfl", parts, "FEDJAX_SEL_FILFL_PARTS", PARTS, PARTS)
    if seeds < 1:
        raise ConfigError(f"seeds must be >= 1, got {seeds}")
    runner = Runner(out, seeds, data_dir)
    shk = shakespeare_task(full)
    img = (
        image_task(full, data_dir)
        if set(parts) - {"shakespeare_poc", "shakespeare_prox_rs", "filter_size"}
        else None
    )
    cif = None
    if set(parts) & {"variable", "divfl", "ratio"}:
        cif = cifar_task(data_dir) if full else img
    report: dict[str, Any] = {"full": full, "seeds": seeds, "tasks": {}}

    def entries(task, selector, prox=False):
        name = "FedProx" if prox else "FedAvg"
        sel = {"poc": "PoC", "rs": "RS", "divfl": "DivFL"}[selector]
        base = (f"{name} ({sel})",) + baseline_args(selector, task)
        return [base] + [
            (f"FilFL {v.upper()} ({sel})",) + filfl_args(selector, v, task) for v in ("dgf", "rgf")
        ], base[0]

    for part in parts:
        print(f"[filfl] {part}", flush=True)
        if part in ("shakespeare_poc", "image_poc"):
            task = shk if part.startswith("shakespeare") else img
            ent, base = entries(task, "poc")
            report[part] = compare(part, runner, task, ent, base)
        elif part in ("shakespeare_prox_rs", "image_prox_rs"):
            task = shk if part.startswith("shakespeare") else img
            ent, base = entries(task, "rs", prox=True)
            report[part] = compare(part, runner, task, ent, base, {"prox_mu": PROX_MU})
        elif part == "period":
            # a redraw of the available set filters too (Algorithm 1, line 3): with the
            # redraw every 5 rounds h = 5, 10, 20 would be one schedule, so redraw every 20
            task = dataclasses.replace(img, name=f"{img.name}_redraw20", redraw_every=20)
            ent, base = entries(task, "poc")
            ent = [ent[0]] + [
                (f"FilFL RGF (PoC) h={h}",) + filfl_args("poc", "rgf", task, period=h)
                for h in (1, 3, 5, 10, 20)
            ]
            report[part] = compare(part, runner, task, ent, base)
        elif part == "filter_size":
            ent, base = entries(shk, "poc")
            ent = [ent[0]] + [
                (_sweep_label("FilFL DGF (PoC)", "m", m, shk.filter_size),)
                + filfl_args("poc", "dgf", shk, filter_size=m)
                for m in (34, 17, 8)
            ]
            report[part] = compare(part, runner, shk, ent, base)
        elif part == "variable":
            ent, base = entries(cif, "poc")
            ent = [
                ent[0],
                ("FilFL RGF (PoC), client V",)
                + filfl_args("poc", "rgf", cif, filter_data="client", filter_size=0),
            ]
            report[part] = compare(part, runner, cif, ent, base)
        elif part == "divfl":
            base = ("FedAvg (DivFL)",) + baseline_args("divfl", cif)
            ent = [
                base,
                ("FilFL RGF (RS)",) + filfl_args("rs", "rgf", cif),
                ("FilFL DGF (DivFL)",) + filfl_args("divfl", "dgf", cif),
            ]
            report[part] = compare(part, runner, cif, ent, base[0])
        elif part == "ratio":
            task = dataclasses.replace(cif, name=f"{cif.name}_n10", available=10, per_round=3)
            report[part] = ratio_report(runner, task)
    report["rates"] = rates_report(runner, out)
    report["tasks"] = {t.name: dataclasses.asdict(t) for t in (shk, img, cif) if t is not None}
    summary_file = out / "summary.json"
    if summary_file.exists():  # parts run earlier into the same folder are kept
        import json

        earlier = json.loads(summary_file.read_text())
        if earlier.get("full") == full:
            rates = {r["run"]: r for r in (earlier.get("rates") or {}).get("rows", [])}
            rates.update({r["run"]: r for r in (report.get("rates") or {}).get("rows", [])})
            report = {**earlier, **report, "tasks": {**earlier.get("tasks", {}), **report["tasks"]}}
            if rates:
                report["rates"] = {"rows": list(rates.values()), "paper": PAPER["rates"]}
    write_json(summary_file, report)
    print_report(report)
    return report


def print_report(report: dict) -> None:
    print("\nFilFL reproduction" + (" (full size)" if report["full"] else " (CPU size)"))
    for part, body in report.items():
        if not isinstance(body, dict) or "rows" not in body:
            continue
        print(f"\n== {part}   paper: {body['paper']}")
        for r in body["rows"]:
            cells = []
            for k, v in r.items():
                if k == "comparison":
                    continue
                cells.append(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}")
            print("  " + "  ".join(cells))
