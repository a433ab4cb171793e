"""What several commands share: flags, the parsing of seed counts and lists, and the echo
functions that keep standard output for results."""

from __future__ import annotations

import argparse
import sys

from fedjax_sel.base import ConfigError


def echo(*args) -> None:
    """Progress and notes: to standard error, so standard output holds only results."""
    print(*args, file=sys.stderr)


def quiet(*args) -> None:
    """The echo of a process that does not report (not process 0 of a distributed run)."""
    del args


def seed_list(value: str | None) -> list[int] | None:
    """``--only-seeds``: ``A-B`` (both included) or ``A,B,...``; ``None`` when not given."""
    if value is None:
        return None
    from fedjax_sel.input_checks import MAX_SEEDS, SEED_MAX

    try:
        seeds: set[int] = set()
        for part in value.split(","):
            lo, sep, hi = part.partition("-")
            first, last = int(lo), int(hi if sep else lo)
            if not 0 <= first <= SEED_MAX or not 0 <= last <= SEED_MAX:
                raise ValueError
            if last - first + 1 + len(seeds) > MAX_SEEDS:  # before the list is built
                raise ValueError
            seeds.update(range(first, last + 1))
    except ValueError:
        seeds = set()
    if not seeds:  # a minus sign never parses as a seed's: "-2" and "3-1" select nothing
        raise ConfigError(
            f"--only-seeds must be seeds 0 .. {SEED_MAX} as A-B or A,B,... (at most "
            f"{MAX_SEEDS}), got {value!r}"
        )
    return sorted(seeds)


def check_counts(a: argparse.Namespace, *names: str) -> None:
    """Refuses a count flag (one number, or a list of them) outside 1 .. 2**31 - 1."""
    from fedjax_sel.config import INT_MAX

    for name in names:
        value = getattr(a, name, None)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not 1 <= v <= INT_MAX:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be a whole number in 1 .. {INT_MAX}, got {v}")


def add_overwrite_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace results of another configuration found in --out (refused without it)",
    )


def add_cell_flags(p: argparse.ArgumentParser) -> None:
    """The flags sweeps and suites share: batching, overrides and seeds."""
    p.add_argument(
        "--seeds-together",
        default=None,
        help="seeds per vmapped batch: auto (by memory) or a number (default: the file's)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a setting in every cell (e.g. rounds=2 for a quick check); repeatable",
    )
    p.add_argument("--seeds", type=int, default=None, help="override the file's (evaluation) seeds")
    add_overwrite_flag(p)
