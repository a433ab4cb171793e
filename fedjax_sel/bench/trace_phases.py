"""Where a round's time goes, read from a ``jax.profiler`` trace (``run --trace DIR``).

The round names its phases with ``jax.named_scope`` (availability, selection, local_training,
aggregation, server_step, strategy_update, evaluation). XLA keeps each scope in the
``op_name`` metadata of the compiled program's instructions, and the trace times every
executed instruction (thunk) by name; the run loop writes the compiled program's text beside
the trace (``hlo_*.txt``), so every timed thunk can be charged to its phase.
:func:`phase_seconds` sums them; :func:`plot_phases` draws the split and a timeline of one
chunk. ``fedjax-sel bench phases DIR`` prints the table and writes the picture.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.outputs import new_figure

PHASES = (
    "availability",
    "selection",
    "local_training",
    "aggregation",
    "server_step",
    "strategy_update",
    "evaluation",
)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name=\"([^\"]*)\"")


def op_phases(hlo_text: str) -> dict[str, str]:
    """Instruction name -> phase (the first phase scope in its ``op_name``), or ``other``."""
    out = {}
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            path = m.group(2).split("/")
            out[m.group(1)] = next((p for p in path if p in PHASES), "other")
    return out


def _trace_events(trace_dir: Path) -> list[dict]:
    files = sorted(Path(trace_dir).rglob("*.trace.json.gz"))
    if not files:
        raise ConfigError(f"no profiler trace (*.trace.json.gz) under {str(trace_dir)!r}")
    return json.load(gzip.open(files[-1]))["traceEvents"]


def phase_seconds(trace_dir: str | Path) -> dict[str, float]:
    """Seconds of device work per phase in the trace under ``trace_dir``."""
    trace_dir = Path(trace_dir)
    hlo = {}
    for path in trace_dir.glob("hlo_*.txt"):
        hlo[path.stem[len("hlo_") :]] = op_phases(path.read_text())
    if not hlo:
        raise ConfigError(f"no compiled program text (hlo_*.txt) under {str(trace_dir)!r}")
    totals: dict[str, float] = defaultdict(float)
    for e in _trace_events(trace_dir):
        args = e.get("args") or {}
        module, op = args.get("hlo_module"), args.get("hlo_op")
        if e.get("ph") != "X" or module is None or op is None:
            continue
        names = hlo.get(module) or next(iter(hlo.values()))
        totals[names.get(op, "other")] += e.get("dur", 0.0) * 1e-6
    return dict(totals)


def plot_phases(trace_dir: str | Path, path: str | Path) -> Path:
    """A bar chart of the seconds per phase."""
    seconds = phase_seconds(trace_dir)
    names = [p for p in (*PHASES, "other") if seconds.get(p)]
    fig = new_figure(8, 3.2)
    ax = fig.subplots()
    total = sum(seconds.values())
    ax.barh(names, [seconds[n] for n in names], color="tab:blue")
    for i, n in enumerate(names):
        ax.text(seconds[n], i, f" {100 * seconds[n] / total:.0f}%", va="center", fontsize=8)
    ax.set_xlabel("seconds of device work in the traced chunk")
    ax.invert_yaxis()
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle("where a round's time goes (jax.profiler trace, named scopes)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench phases``' flags."""
    p.add_argument("--trace", default=None, metavar="DIR", help="a trace written by run --trace")
    p.add_argument("--out", default=None, help="the picture of the split (PNG)")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench phases``: prints the seconds per phase of a trace, largest first,
    and draws them to ``--out``."""
    if a.trace is None:
        raise ConfigError("bench phases needs --trace DIR (a trace written by run --trace)")
    seconds = phase_seconds(a.trace)
    total = sum(seconds.values())
    for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {name:16s} {s * 1e3:9.2f} ms  {100 * s / total:5.1f}%")
    if a.out:
        print(f"wrote {plot_phases(a.trace, a.out)}")
    return [seconds]
