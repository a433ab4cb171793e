"""``fedjax-sel demo``: a paired comparison of three selection rules at the same budget on the
embedded digits data, under a minute on a CPU."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Declares ``demo`` and its flags."""
    p = sub.add_parser(
        "demo", help="three selection rules at equal budget on embedded data (< 1 min CPU)"
    )
    p.add_argument("--out", default="runs/demo", help="output folder")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--seeds", type=int, default=5, help="paired seeds per strategy (>= 2)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_demo)


def cmd_demo(a: argparse.Namespace) -> int:
    """Runs the demo into ``--out``."""
    from fedjax_sel.demo import run_demo

    run_demo(Path(a.out), rounds=a.rounds, seeds=a.seeds, progress=not a.no_progress)
    return 0
