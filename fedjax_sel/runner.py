"""From a :class:`~fedjax_sel.config.RunConfig` to a finished run with its output files.

``run_experiment(config, out_dir)`` writes (design section 8):

* ``config.json``: the configuration, the data set's description and the resolved settings;
* ``metrics.jsonl``: one JSON object per evaluation (round, test accuracy and loss, mean
  training loss since the previous evaluation, the clients selected in each of those rounds,
  seconds per phase), flushed as it goes, so a run that stops early keeps what it measured;
* ``summary.json``: final/peak/stable accuracy, stability drop, selection fairness, wall
  seconds, rounds/s and client-updates/s (and ``diverged`` when the run blew up);
* ``curves.png``: test accuracy (or test loss for regression) and training loss per round.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_sel import availability as availability_lib
from fedjax_sel import metrics as metrics_lib
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.data.datasets import FederatedDataset, load_dataset
from fedjax_sel.models import make_model
from fedjax_sel.simulation import SimState, Simulation, default_mesh
from fedjax_sel.strategies import make_strategy
from fedjax_sel.training.local import LocalConfig
from fedjax_sel.training.server import server_optimizer


@dataclasses.dataclass
class RunResult:
    """What :func:`run_experiment` returns."""

    config: RunConfig
    evals: list[dict[str, Any]]
    summary: dict[str, Any]
    state: SimState
    simulation: Simulation
    out_dir: Path | None


def load_data_for(config: RunConfig) -> FederatedDataset:
    return load_dataset(
        config.dataset,
        num_clients=config.num_clients,
        partition=config.partition,
        seed=config.seed if config.data_seed is None else config.data_seed,
        data_path=config.data_path,
        test_fraction=config.test_fraction,
        layout=config.layout,
        server_fraction=config.server_fraction,
        **config.dataset_args,
    )


def build_simulation(config: RunConfig, dataset: FederatedDataset | None = None) -> Simulation:
    """Validates ``config`` and builds its :class:`Simulation` (loading the data unless given)."""
    config.validate()
    dataset = dataset if dataset is not None else load_data_for(config)
    if config.per_round > dataset.num_clients:
        raise ConfigError(
            f"per_round={config.per_round} exceeds the number of clients "
            f"({dataset.num_clients}) of data set {config.dataset!r}"
        )
    model_args = dict(config.model_args)
    if "ridge" in model_args:
        model_args["ridge_coef"] = float(model_args.pop("ridge"))
    if "hidden" in model_args and isinstance(model_args["hidden"], str):
        model_args["hidden"] = tuple(int(h) for h in model_args["hidden"].split("-") if h)
    for key in ("embed_dim", "lstm_hidden", "lstm_layers", "width", "groups"):
        if key in model_args:
            model_args[key] = int(model_args[key])
    model = make_model(
        config.model or dataset.default_model,
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
        **model_args,
    )
    strategy = make_strategy(config.strategy, config.per_round, **config.strategy_args)
    local = LocalConfig(
        batch_size=config.batch_size,
        lr=float(config.lr),
        local_steps=config.local_steps,
        local_epochs=config.local_epochs,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
        prox_mu=config.prox_mu,
    )
    server = server_optimizer(
        config.server,
        config.server_lr,
        momentum=config.server_momentum,
        weight_decay=config.server_weight_decay,
    )
    return Simulation(
        dataset,
        model,
        strategy,
        local=local,
        per_round=config.per_round,
        num_rounds=config.rounds,
        availability=availability_lib.from_spec(config.availability),
        server_tx=server,
        parallel=config.parallel,
        persistent_client_state=config.persistent_client_state,
        chunk_size=config.eval_every,
        mesh=default_mesh(),
    )


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def _clean(x):
    """NaN/inf -> None so that the JSON files are standard JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(_clean(obj), indent=2, default=_json_default) + "\n")


def run_experiment(
    config: RunConfig,
    out_dir: str | Path | None = None,
    *,
    progress: bool = True,
    dataset: FederatedDataset | None = None,
    echo=print,
) -> RunResult:
    """Runs ``config`` to the end (or to divergence) and writes the output files.

    Args:
      config: the run.
      out_dir: where ``config.json``, ``metrics.jsonl``, ``summary.json`` and ``curves.png``
        go (nothing is written when ``None``).
      progress: draw a progress bar (rounds, accuracy, rounds/s).
      dataset: an already loaded data set (skips loading).
      echo: where one-line messages go.
    """
    t_start = time.perf_counter()
    sim = build_simulation(config, dataset)
    ds = sim.dataset
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json(
            out / "config.json",
            {
                "config": config.to_dict(),
                "dataset": {"name": ds.name, "num_clients": ds.num_clients, **ds.info},
                "model": sim.model.name,
                "client_parallelism": list(sim.parallel),
                "backend": jax.default_backend(),
                "devices": [str(d) for d in jax.devices()],
                "jax_version": jax.__version__,
            },
        )
        metrics_file = (out / "metrics.jsonl").open("w")
    else:
        metrics_file = None

    state = sim.init(config.seed)
    evals: list[dict[str, Any]] = []
    diverged: dict[str, Any] | None = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.rounds, desc=f"{config.strategy}", unit="round", leave=True)
    client_updates = 0
    train_seconds = 0.0
    chunks: list[tuple[int, int, float]] = []  # (rounds, client updates, seconds) per chunk
    done = 0
    try:
        while done < config.rounds:
            n = min(config.eval_every, config.rounds - done)
            t0 = time.perf_counter()
            if config.profile:
                state, logs, phases = sim.run_rounds_profiled(state, n)
            else:
                state, logs = sim.run_rounds(state, n)
                jax.block_until_ready(state.params)
                phases = {"rounds": time.perf_counter() - t0}
            t1 = time.perf_counter()
            train_seconds += t1 - t0
            scores = sim.evaluate(state)
            t2 = time.perf_counter()
            phases["eval"] = t2 - t1
            done += n
            client_updates += int(np.sum(logs.num_selected))
            chunks.append((n, int(np.sum(logs.num_selected)), t1 - t0))
            bad = (~logs.finite) | ((logs.num_selected > 0) & ~np.isfinite(logs.train_loss))
            record = {
                "round": done,
                **scores,
                "train_loss": float(np.nanmean(logs.train_loss))
                if np.any(np.isfinite(logs.train_loss))
                else None,
                "num_available_mean": float(np.mean(logs.num_available)),
                "num_selected_mean": float(np.mean(logs.num_selected)),
                "selected": [
                    row[m].tolist() for row, m in zip(logs.clients, logs.mask, strict=True)
                ],
                "seconds": phases,
            }
            evals.append(record)
            if metrics_file is not None:
                metrics_file.write(json.dumps(_clean(record), default=_json_default) + "\n")
                metrics_file.flush()
            if bar is not None:
                acc = scores.get("test_accuracy")
                post = (
                    {"acc": f"{acc:.4f}"}
                    if acc is not None and math.isfinite(acc)
                    else {"loss": f"{scores['test_loss']:.4g}"}
                )
                post["r/s"] = f"{n / max(t1 - t0, 1e-9):.1f}"
                bar.set_postfix(post)
                bar.update(n)
            if np.any(bad) or not math.isfinite(scores["test_loss"]):
                first = int(logs.round[np.argmax(bad)]) if np.any(bad) else done - 1
                diverged = {
                    "round": first,
                    "message": (
                        f"run diverged at round {first}: non-finite training loss or parameters "
                        f"(lr={config.lr}, server_lr={config.server_lr}); stopped, metrics up to "
                        f"round {done} are kept"
                    ),
                }
                break
    finally:
        if bar is not None:
            bar.close()
        if metrics_file is not None:
            metrics_file.close()

    wall = time.perf_counter() - t_start
    counts = np.asarray(state.selection_counts)
    summary: dict[str, Any] = {
        "strategy": config.strategy,
        "dataset": config.dataset,
        "model": sim.model.name,
        "rounds_completed": done,
        **(
            metrics_lib.accuracy_summary([e["test_accuracy"] for e in evals])
            if sim.model.task == "classification"
            else {}
        ),
        **metrics_lib.loss_summary([e["test_loss"] for e in evals]),
        **(
            {"final_client_test_accuracy_mean": evals[-1]["client_test_accuracy_mean"]}
            if evals and "client_test_accuracy_mean" in evals[-1]
            else {}
        ),
        **metrics_lib.selection_summary(counts),
        "selection_counts": counts.tolist(),
        "wall_seconds": wall,
        "train_seconds": train_seconds,
        **_throughput(chunks),
        "client_parallelism": list(sim.parallel),
        "diverged": diverged is not None,
    }
    if diverged is not None:
        summary["diverged_at_round"] = diverged["round"]
        summary["message"] = diverged["message"]
        echo(diverged["message"])
    if out is not None:
        write_json(out / "summary.json", summary)
        if evals:
            plot_curves({config.strategy: evals}, out / "curves.png", task=sim.model.task)
    return RunResult(config, evals, summary, state, sim, out)


def _throughput(chunks: list[tuple[int, int, float]]) -> dict[str, Any]:
    """Steady-state rounds/s and client-updates/s: the first chunk (which compiles) is left out
    when there are later ones; its time is reported as ``first_chunk_seconds``."""
    if not chunks:
        return {"rounds_per_second": None, "client_updates_per_second": None}
    steady = chunks[1:] or chunks
    seconds = sum(c[2] for c in steady)
    return {
        "rounds_per_second": sum(c[0] for c in steady) / seconds if seconds > 0 else None,
        "client_updates_per_second": sum(c[1] for c in steady) / seconds if seconds > 0 else None,
        "first_chunk_seconds": chunks[0][2],
    }


def plot_curves(
    curves: dict[str, list[dict[str, Any]]],
    path: str | Path,
    *,
    task: str = "classification",
    title: str | None = None,
    bands: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Plots test accuracy (or loss) and training loss against rounds, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    metric = "test_accuracy" if task == "classification" else "test_loss"
    for name, evals in curves.items():
        rounds = [e["round"] for e in evals]
        (line,) = axes[0].plot(rounds, [e[metric] for e in evals], label=name)
        if bands and name in bands:
            lo, hi = bands[name]
            axes[0].fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2)
        axes[1].plot(
            rounds,
            [np.nan if e["train_loss"] is None else e["train_loss"] for e in evals],
            label=name,
        )
    axes[0].set_xlabel("round")
    axes[0].set_ylabel("test accuracy" if task == "classification" else "test loss (MSE)")
    axes[1].set_xlabel("round")
    axes[1].set_ylabel("training loss (selected clients)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
