"""A suite's tracks (issue 54; docs/benchmark.md, "Tracks"): which bundle of aggregation,
local objective and server step each strategy is compared in, and which strategies are ranked.

* ``selection``: every strategy aggregates its kept slots by size-weighted FedAvg
  (``aggregation = "fedavg"``), with no proximal term and FedAvg's server step (``sgd`` at
  server lr 1): only the choice of clients differs. The ranked headline.
* ``bundle``: each strategy as its paper runs it. A ``[[strategies]]`` entry whose paper
  bundle differs from the selection track's gives it in a ``bundle`` table (e.g.
  ``bundle = { aggregation = "strategy", prox_mu = 0.1 }``) and runs a second time, labelled
  ``LABEL.bundle``; an entry without one is its own bundle (its weights are FedAvg's:
  ``tests/test_tracks.py`` checks the suite's claim bit for bit) and counts in both tracks
  from one set of cells.

A suite without ``tracks`` has one track, ``bundle``, and runs every entry as written.

Every ranked strategy trains the task's ``per_round`` clients a round (checked when the suite is
read); an entry with ``reference = true`` (``full``: every client every round) is reported
against the baseline but never ranked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from fedjax_sel.base import ConfigError

TRACKS = ("selection", "bundle")
# what the selection track sets in every cell: only the choice of clients differs
SELECTION_FIELDS = {"aggregation": "fedavg", "prox_mu": 0.0, "server": "sgd", "server_lr": 1.0}
BUNDLE_SUFFIX = ".bundle"


def parse_tracks(value: Any) -> tuple[str, ...]:
    """``[suite] tracks``: a non-empty list of distinct names of :data:`TRACKS`."""
    if value is None:
        return ("bundle",)
    if not isinstance(value, list) or not value or len(set(map(str, value))) != len(value):
        raise ConfigError(
            f"suite: tracks must be a list of distinct names of {TRACKS}, got {value!r}"
        )
    bad = [t for t in value if t not in TRACKS]
    if bad:
        raise ConfigError(f"suite: tracks {bad} unknown; choose from {TRACKS}")
    return tuple(t for t in TRACKS if t in value)  # the ranked one first


def expand(entries: Sequence[Any], tracks: Sequence[str], raw: Sequence[Mapping]) -> list[Any]:
    """The suite's strategies, one :class:`~fedjax_sel.benchmark.suite.Entry` per track it
    runs in (``raw``: the file's ``[[strategies]]`` tables, in the same order)."""
    out = []
    for entry, table in zip(entries, raw, strict=True):
        bundle = table.get("bundle")
        if bundle is not None and not isinstance(bundle, Mapping):
            raise ConfigError(f"suite: strategy {entry.label!r}: bundle must be a table")
        if "selection" not in tracks:
            if bundle is not None:
                raise ConfigError(
                    f"suite: strategy {entry.label!r} gives a bundle table, which needs "
                    "tracks = ['selection', 'bundle'] in [suite]"
                )
            out.append(dataclasses.replace(entry, track="bundle"))
            continue
        clash = {
            k: entry.fields[k]
            for k, v in SELECTION_FIELDS.items()
            if k in entry.fields and entry.fields[k] != v
        }
        if clash:
            raise ConfigError(
                f"suite: strategy {entry.label!r} sets {clash}, which the selection track fixes "
                f"({SELECTION_FIELDS}); put its paper's settings in its bundle table"
            )
        out.append(
            dataclasses.replace(
                entry, fields={**entry.fields, **SELECTION_FIELDS}, track="selection"
            )
        )
        if bundle is not None and "bundle" in tracks:
            fields = {**entry.fields, "aggregation": "strategy", **dict(bundle)}
            out.append(
                dataclasses.replace(
                    entry,
                    label=entry.label + BUNDLE_SUFFIX,
                    fields=fields,
                    track="bundle",
                    strategy_label=entry.label,
                )
            )
    return out


def track_entries(strategies: Sequence[Any], track: str) -> list[Any]:
    """The entries whose records make up ``track``: its own entries, and in the bundle track
    the selection entries that have no bundle of their own (the same cells)."""
    if track == "selection" or not any(e.track == "selection" for e in strategies):
        return [e for e in strategies if e.track == track]
    own = {e.strategy_label for e in strategies if e.track == "bundle"}
    return [
        e
        for e in strategies
        if (e.track == "bundle") or (e.track == "selection" and e.label not in own)
    ]


def track_labels(strategies: Sequence[Any], track: str) -> list[str]:
    """The labels of :func:`track_entries`."""
    return [e.label for e in track_entries(strategies, track)]


def ranked_entries(strategies: Sequence[Any], track: str) -> list[Any]:
    """The entries ``track`` ranks: :func:`track_entries` but the references."""
    return [e for e in track_entries(strategies, track) if not e.reference]


def check_budget(task: Any, entry: Any, per_round: int) -> None:
    """A ranked (non-reference) strategy's cell trains the task's ``per_round`` (``per_round``:
    the cell's)."""
    want = task.fields.get("per_round")
    if entry.reference or want is None or per_round == want:
        return
    raise ConfigError(
        f"suite: strategy {entry.label!r} trains per_round={per_round} clients a round on task "
        f"{task.name!r}, whose ranked strategies all train {want}: give it a budget variant "
        "within the task's per_round, or mark it reference = true (reported, never ranked)"
    )
