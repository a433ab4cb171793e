"""The selection benchmark (``fedjax-sel suite``): tasks x scenarios x strategies x paired
seeds, tuned and evaluated as units of work, with a Holm-adjusted leaderboard.

* :mod:`.suite`: the suite file, its cells and its units of work (one compiled program each);
  :mod:`.tuning` its ``[tuning]`` section and strategy knobs.
* :mod:`.tuned`: the self-extending tuning grids, the choice and its position, the curves.
* :mod:`.run`: :func:`run_suite`, locally or sharded (``--shard I/N``); :mod:`.ray_executor`
  on a Ray cluster; :mod:`.units` runs one unit.
* :mod:`.rerun`: one recorded cell again, compared with its record bit for bit.
* :mod:`.leaderboard`: rows, ranking, pictures and the docs page from the records.
* :mod:`.curves`: accuracy against each cost axis, and the rankings at equal client updates.

The records themselves (per-seed files, parts, merging) are
:mod:`fedjax_sel.experiment.records`, shared with the paper studies.
"""

from fedjax_sel.benchmark.run import run_suite
from fedjax_sel.benchmark.suite import load_suite, parse_suite

__all__ = ["load_suite", "parse_suite", "run_suite"]
