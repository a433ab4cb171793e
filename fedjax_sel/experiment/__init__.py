"""The experiment layer: one run loop, one output writer, one cache/resume, one sweep driver
and paired comparisons (README, "Comparing strategies").

* :func:`run_experiment`: one configuration to a finished run folder (``fedjax-sel run``).
* :func:`run_sweep`: a grid of strategies x settings x seeds, seeds of one compiled program
  run together (``fedjax-sel sweep``); finished cells are never recomputed.
* :func:`compare`: means and 95% confidence intervals per strategy, paired differences against
  a baseline (``fedjax-sel compare``).

The selection benchmark (``fedjax-sel suite``) is the floor above: :mod:`fedjax_sel.benchmark`.
"""

from fedjax_sel.experiment.build import build_simulation, load_data_for
from fedjax_sel.experiment.checkpoint import load_checkpoint, read_header, save_checkpoint
from fedjax_sel.experiment.compare import compare, load_runs
from fedjax_sel.experiment.loop import RunResult, finished_result, program_key
from fedjax_sel.experiment.outputs import (
    plot_curves,
    read_json,
    read_metrics,
    read_timings,
    strip_timings,
    write_json,
)
from fedjax_sel.experiment.run import run_experiment, run_group
from fedjax_sel.experiment.sweep import (
    Cell,
    Sweep,
    expand_sweep,
    load_sweep,
    run_cells,
    run_sweep,
)

__all__ = [
    "Cell",
    "RunResult",
    "Sweep",
    "build_simulation",
    "compare",
    "expand_sweep",
    "finished_result",
    "load_checkpoint",
    "load_data_for",
    "load_runs",
    "load_sweep",
    "plot_curves",
    "program_key",
    "read_header",
    "read_json",
    "read_metrics",
    "read_timings",
    "run_cells",
    "run_experiment",
    "run_group",
    "run_sweep",
    "save_checkpoint",
    "strip_timings",
    "write_json",
]
