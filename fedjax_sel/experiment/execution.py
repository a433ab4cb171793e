"""How a reproduction's runs are executed, apart from what they compute (the batch of seeds
vmapped together, a share of the seeds), and the stop a share of the seeds ends with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from fedjax_sel.base import ConfigError


@dataclasses.dataclass(frozen=True)
class Execution:
    """How a reproduction's runs are executed, apart from what they compute.

    Attributes:
      seeds_together: members per vmapped batch (:func:`run_cells`; ``"auto"`` measures it on
        this machine). A seed's last bits can depend on its batch, so a rerun that must give
        the same bits fixes it; ``per_seed.json`` records every cell's batches.
      only_seeds: run only these seeds of every configuration, then stop
        (:class:`SeedsRunOnly`) before anything is aggregated: one machine's share of a
        table that several compute (their ``runs/`` folders copied into one folder, which a
        rerun without it aggregates, reusing every cell the same code finished).
    """

    seeds_together: int | str = "auto"
    only_seeds: tuple[int, ...] | None = None

    def __post_init__(self):
        together = self.seeds_together
        if together != "auto" and not (isinstance(together, int) and together >= 1):
            raise ConfigError(
                f"seeds_together must be 'auto' or a positive integer, got {together!r}"
            )
        if self.only_seeds is not None and (
            not self.only_seeds or any(not isinstance(s, int) or s < 0 for s in self.only_seeds)
        ):
            raise ConfigError(f"only_seeds must be seeds >= 0, got {self.only_seeds!r}")


def parse_seeds_together(value: str | None) -> int | str | None:
    """The command line's ``--seeds-together`` text: ``auto``, a number, or ``None`` (not
    given: a sweep or suite file's own)."""
    if value is None or value == "auto":
        return value
    try:
        together = int(value)
    except ValueError:
        together = 0
    if together < 1:
        raise ConfigError(f"--seeds-together must be 'auto' or a positive number, got {value!r}")
    return together


class SeedsRunOnly(Exception):  # noqa: N818 (a stop, not an error)
    """Raised by :meth:`Study.run` once the ``only_seeds`` runs are done: the reproduction
    stops before aggregating (it has only some seeds of every configuration)."""

    def __init__(self, runs: int, seeds: list[int], out: Path):
        super().__init__(
            f"ran {runs} runs (seeds {seeds} of every configuration) into {out / 'runs'}; "
            "copy them into the folder that holds the other seeds and rerun it without "
            "only_seeds to aggregate: the cells this code finished are reused"
        )
        self.runs, self.seeds, self.out = runs, seeds, out
