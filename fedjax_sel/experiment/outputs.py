"""What a run writes, and how it is read back (README, "Running one simulation").

A run folder holds ``config.json`` (the configuration, the data set's description and the
resolved settings), ``metrics.jsonl`` (one JSON object per evaluation, each line written whole
by one write call as it comes), ``summary.json`` (written when the run ends, normally or by
divergence), ``timings.json`` (wall-clock seconds and memory: per evaluation the seconds of
each phase, and the run's totals), ``curves.png`` and, while the run is under way,
``checkpoint.npz`` (see :mod:`.checkpoint`).

What measures this process (wall-clock time, memory) is kept out of ``metrics.jsonl`` and
``summary.json``, so that one configuration run twice on one machine gives byte-identical
files; only ``timings.json`` differs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fedjax_sel.base import ConfigError

CONFIG, METRICS, SUMMARY, CURVES, CHECKPOINT = (
    "config.json",
    "metrics.jsonl",
    "summary.json",
    "curves.png",
    "checkpoint.npz",
)
TIMINGS = "timings.json"

# Keys whose values measure this process (wall-clock timings, memory): they differ between two
# otherwise identical runs, and are written to timings.json (older folders hold them in
# summary.json and, "seconds", in each metrics.jsonl record).
TIMING_KEYS = frozenset(
    {
        "seconds",
        "wall_seconds",
        "train_seconds",
        "rounds_per_second",
        "client_updates_per_second",
        "first_chunk_seconds",
        "compile_seconds",
        "peak_host_memory_bytes",
    }
)


def json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def clean(x: Any) -> Any:
    """NaN/inf -> None, so that the files are standard JSON."""
    if isinstance(x, (float, np.floating)) and not math.isfinite(float(x)):
        return None
    if isinstance(x, Mapping):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(clean(obj), default=json_default, **kw)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Writes ``data`` to ``path`` atomically: a temporary file beside it, flushed to disk,
    then renamed over ``path`` (``os.replace``), so a reader sees the old file or the new one,
    never a part (the folder's lock, :mod:`.outdir`, keeps two writers apart)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def save_figure(fig: Any, path: str | Path, **kwargs: Any) -> Path:
    """``fig.savefig`` to ``path`` through :func:`write_atomic` (format from the suffix)."""
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png", **kwargs)
    return write_atomic(path, buffer.getvalue())


def csv_text(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    """``rows`` as CSV text with a header of ``fields`` (empty without fields)."""
    if not fields:
        return ""
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=list(fields))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_json(path: str | Path, obj: Any) -> Path:
    """Writes ``obj`` as standard JSON atomically (:func:`write_atomic`)."""
    return write_atomic(path, dumps(obj, indent=2) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{str(path)!r} does not exist") from None
    except ValueError as e:
        raise ConfigError(f"{str(path)!r} is not valid JSON: {e}") from None


def append_line(file: BinaryIO, obj: Any) -> None:
    """Appends ``obj`` as one JSON line to ``file`` (opened unbuffered, ``"ab", buffering=0``)
    by one write call of the whole line: a crash leaves a line whole or absent, never half
    written by this process's buffering (only a kill inside the call itself can cut it, which
    a resume's checkpoint record count covers)."""
    data = (dumps(obj) + "\n").encode()
    written = file.write(data)
    while written is not None and written < len(data):  # a short write (signal, full disk)
        written += file.write(data[written:])


def write_jsonl(path: str | Path, records: Sequence[Any]) -> Path:
    """Writes ``records`` as JSON lines atomically (:func:`write_atomic`)."""
    return write_atomic(path, "".join(dumps(r) + "\n" for r in records))


def read_metrics(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (``[]`` when there is none).

    A line that is not a JSON object with a ``round`` raises :class:`ConfigError` naming the
    file and the line (1-based), rather than returning the records before it: a curve cut
    there would be reported as the run's. ``limit``: read the first ``limit`` records only
    and ignore the lines after them (a resume, whose checkpoint says how many records are
    valid: lines past them may be left over, or cut short, by the crash)."""
    records: list[dict[str, Any]] = []
    path = Path(path)
    if not path.exists():
        return records
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{str(path)!r} is not a text file of JSON lines: {e}") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if limit is not None and len(records) >= limit:
            break
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ConfigError(
                f"{str(path)!r} line {number} is not valid JSON ({e}); the file is corrupt"
            ) from None
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            raise ConfigError(
                f"{str(path)!r} line {number} is not an evaluation record (a JSON object with "
                f"an integer round): {line[:80]!r}"
            )
        records.append(record)
    return records


def read_timings(folder: str | Path) -> dict[str, Any]:
    """A finished run folder's wall-clock timings (:data:`TIMINGS`: the totals and, under
    ``evaluations``, each evaluation's ``round`` and phase ``seconds``). A folder written
    before ``timings.json`` existed gives the timing fields of its ``summary.json`` and
    records; ``{}`` when it has neither."""
    folder = Path(folder)
    if (folder / TIMINGS).exists():
        return read_json(folder / TIMINGS)
    summary = read_json(folder / SUMMARY) if (folder / SUMMARY).exists() else {}
    timings = {k: v for k, v in summary.items() if k in TIMING_KEYS}
    evaluations = [
        {"round": r["round"], "seconds": r["seconds"]}
        for r in read_metrics(folder / METRICS)
        if "seconds" in r
    ]
    if evaluations:
        timings["evaluations"] = evaluations
    return timings


def strip_timings(obj: Any) -> Any:
    """``obj`` without its wall-clock timing fields (to compare two runs of one configuration)."""
    if isinstance(obj, Mapping):
        return {k: strip_timings(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [strip_timings(v) for v in obj]
    return obj


def new_figure(width: float, height: float):
    """A matplotlib figure detached from pyplot: saving it needs no backend, and a notebook's
    inline plotting is left as it was (``matplotlib.use("Agg")`` would switch it off)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def subplots(*grid: int, figsize: tuple[float, float], **kwargs):
    """``plt.subplots`` on a :func:`new_figure`: ``(figure, axes)``, no pyplot state."""
    fig = new_figure(*figsize)
    return fig, fig.subplots(*grid, **kwargs)


def plot_curves(
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    path: str | Path,
    *,
    task: str = "classification",
    title: str | None = None,
    bands: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
    x: str = "round",
) -> Path:
    """Test accuracy (or loss) and training loss against ``x`` (rounds), one line per run;
    ``bands`` adds a shaded interval (e.g. a 95% CI over seeds) around a run's line."""
    fig = new_figure(11, 4)
    axes = fig.subplots(1, 2)
    metric = "test_accuracy" if task == "classification" else "test_loss"
    # simulated time reads best in hours
    scale, xlabel = (3600.0, "simulated hours") if x == "sim_time_s" else (1.0, x.replace("_", " "))
    for name, evals in curves.items():
        xs = [e[x] / scale for e in evals]
        ys = [np.nan if e.get(metric) is None else e[metric] for e in evals]
        (line,) = axes[0].plot(xs, ys, label=name)
        if bands and name in bands:
            lo, hi = bands[name]
            axes[0].fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
        train = [np.nan if e.get("train_loss") is None else e["train_loss"] for e in evals]
        axes[1].plot(xs, train, label=name)
    axes[0].set_xlabel(xlabel)
    axes[0].set_ylabel("test accuracy" if task == "classification" else "test loss (MSE)")
    axes[1].set_xlabel(xlabel)
    axes[1].set_ylabel("training loss")
    losses = [e.get("train_loss") for ev in curves.values() for e in ev]
    finite = [v for v in losses if v is not None and math.isfinite(v)]
    if finite and min(finite) > 0:
        axes[1].set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    # fixed margins for this one layout: tight_layout() would draw the figure an extra time,
    # and a sweep writes one of these per run folder
    fig.subplots_adjust(
        left=0.065, right=0.99, bottom=0.12, top=0.88 if title else 0.96, wspace=0.2
    )
    return save_figure(fig, path, dpi=110)


def print_summary_table(summaries: list[dict]) -> None:
    """One line per run: its summary's accuracies and fairness, and the speed columns where
    a dict holds them (pass ``{**result.summary, **result.timings}`` to show them)."""
    cols = [
        ("strategy", "label", "{}"),
        ("seed", "seed", "{}"),
        ("final acc", "final_accuracy", "{:.4f}"),
        ("peak acc", "peak_accuracy", "{:.4f}"),
        ("stable acc", "stable_accuracy", "{:.4f}"),
        ("drop", "stability_drop", "{:.4f}"),
        ("target acc", "target_accuracy", "{:.4f}"),
        ("test loss", "final_test_loss", "{:.4f}"),
        ("sel std", "selection_count_std", "{:.2f}"),
        ("jain", "jain_fairness", "{:.3f}"),
        ("rounds/s", "rounds_per_second", "{:.2f}"),
        ("updates/s", "client_updates_per_second", "{:.1f}"),
    ]
    present = [c for c in cols if any(s.get(c[1]) is not None for s in summaries)]
    rows = [
        [(fmt.format(s[key]) if s.get(key) is not None else "-") for _, key, fmt in present]
        for s in summaries
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, (h, _, _) in enumerate(present)]
    print("  ".join(h.ljust(w) for (h, _, _), w in zip(present, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
