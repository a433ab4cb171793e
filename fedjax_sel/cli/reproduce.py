"""``fedjax-sel reproduce NAME``: a paper's tables and figures, with verdicts on its claims.

The reproductions are registered by the study packages the registry finds
(:mod:`fedjax_sel.experiment.reproductions`): the repository's ``studies/``, installed beside
the library, or a module given with ``--plugin``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.options import seed_list
from fedjax_sel.experiment.execution import parse_seeds_together
from fedjax_sel.experiment.reproductions import PROFILES, SIZES


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Declares ``reproduce`` and its flags."""
    p = sub.add_parser("reproduce", help="reproduce a paper's tables and figures")
    p.add_argument("name")
    p.add_argument(
        "--seeds", type=int, default=None, help="paired seeds (default: the reproduction's, >= 5)"
    )
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default="paper",
        help="paper: the text; code: how the reference code ran it",
    )
    p.add_argument(
        "--size",
        choices=SIZES,
        default="cpu",
        help="cpu: minutes on a CPU; paper: the paper's sizes",
    )
    p.add_argument("--out", default=None)
    p.add_argument("--data-dir", default=None, help="local data folder")
    p.add_argument(
        "--seeds-together",
        default=None,
        help="seeds per vmapped batch (default auto: measured on this machine); a seed's last "
        "bits can depend on its batch, so fix it to rerun a committed folder bit for bit",
    )
    p.add_argument(
        "--only-seeds",
        default=None,
        metavar="A-B",
        help="run only these seeds of every configuration and stop before aggregating: one "
        "machine's share; copy the runs/ folders together and rerun without it to aggregate",
    )
    p.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a reproduction's own option (`fedjax-sel list`), e.g. tables=I-II",
    )
    p.set_defaults(func=cmd_reproduce)


def cmd_reproduce(a: argparse.Namespace) -> int:
    """Runs reproduction ``NAME`` into ``--out``."""
    from fedjax_sel.experiment.reproductions import REPRODUCTIONS, run_reproduction
    from fedjax_sel.registry import parse_pairs

    if not REPRODUCTIONS:  # the library installed without the studies, and no --plugin
        raise ConfigError(
            "no reproductions are registered: install the repository (pip install -e .) or "
            "give --plugin studies from the folder that holds studies/ (docs/reproductions.md)"
        )
    run_reproduction(
        a.name,
        seeds=a.seeds,  # None: the reproduction's default
        out=Path(a.out or f"runs/reproduce-{a.name}/{a.profile}-{a.size}"),
        size=a.size,
        profile=a.profile,
        data_dir=a.data_dir,
        seeds_together=parse_seeds_together(a.seeds_together or "auto"),
        only_seeds=seed_list(a.only_seeds),
        **parse_pairs(a.option, what="--option"),
    )
    return 0
