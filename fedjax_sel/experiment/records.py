"""The selection benchmark's records: what a finished cell leaves behind, and how records
written in several places become one.

* :class:`Store`: the per-seed records of one task, ``OUT/per_seed/<task>.json``, keyed by
  phase, scenario, strategy, seed (and lr). A store may stand on a *base* (the folder's merged
  records, read only): a shard or a Ray worker writes only its own records, in a *part*, and
  reuses the base's.
* Parts: ``OUT/parts/<part>/per_seed/<task>.json`` and ``OUT/parts/<part>/invocations.json``,
  written by one shard (``--shard I/N``) or one Ray task each, so that no two writers ever
  share a file. :func:`merge_parts` moves them into ``OUT/per_seed/`` and
  ``OUT/invocations.json`` (each file replaced atomically, then the part removed; a merge cut
  short is merged again, with the same result), refusing a record that would replace another
  configuration's.
* :func:`cell_execution`: how a cell ran (the machine: :func:`.provenance.machine_info`).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.outputs import CONFIG, read_json, write_json
from fedjax_sel.experiment.provenance import cpu_code_target, machine_info

INVOCATIONS = "invocations.json"
PARTS = "parts"
PER_SEED = "per_seed"
MERGED_META = ("deadlines", "tuned_lr", "tuned")  # task facts kept per scenario (and strategy)


class Store:
    """The per-seed records of one task (``OUT/per_seed/<task>.json``): finished cells'
    metrics, keyed by phase (``eval`` or ``tune``), scenario, strategy, seed (and lr).

    ``base``: records this store reads but never writes (a part's view of the merged
    records): :meth:`get` and :meth:`conflicts` look in this store's own records first, then
    in the base's; :meth:`save` writes the own ones only."""

    def __init__(self, path: Path, overwrite: bool = False, base: Store | None = None):
        self.path = Path(path)
        self.overwrite = overwrite  # may records of another configuration be replaced
        self.base = base
        self.records: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {}
        if self.path.exists():
            data = read_json(self.path)
            if not isinstance(data, dict) or not isinstance(data.get("cells", []), list):
                raise ConfigError(f"{self.path}: not a per-seed records file")
            self.meta = dict(data.get("meta", {}))
            for r in data.get("cells", []):
                self.records[self.id(r)] = r

    @staticmethod
    def id(r: Mapping[str, Any]) -> str:
        lr = "" if r.get("lr") is None else f"/lr={r['lr']:g}"
        knobs = "".join(f",{k}={v:g}" for k, v in sorted((r.get("knobs") or {}).items()))
        return f"{r['phase']}/{r['scenario']}/{r['strategy']}/{r['seed']}{lr}{knobs}"

    def lookup(self, ident: Mapping[str, Any]) -> dict[str, Any] | None:
        """The record of ``ident``, whatever its configuration: this store's own, else the
        base's."""
        r = self.records.get(self.id(ident))
        if r is None and self.base is not None:
            r = self.base.lookup(ident)
        return r

    def get(self, ident: Mapping[str, Any], key: str) -> dict[str, Any] | None:
        r = self.lookup(ident)
        return r if r is not None and r.get("key") == key else None

    def put(self, record: dict[str, Any]) -> None:
        self.records[self.id(record)] = record

    def conflicts(self, planned: Sequence[tuple[Mapping[str, Any], str]]) -> list[str]:
        """The ids among ``(ident, key)`` pairs whose record holds another configuration's
        results (another key): running them would replace a finished result."""
        out = []
        for ident, key in planned:
            r = self.lookup(ident)
            if r is not None and r.get("key") != key:
                out.append(self.id(ident))
        return out

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cells = sorted(
            self.records.values(),
            key=lambda r: (
                *(r["phase"], r["scenario"], r["strategy"], r.get("lr") or 0.0, r["seed"]),
                sorted((r.get("knobs") or {}).items()),  # tuned knobs: after the lr and seed
            ),
        )
        # keys sorted: the same records give the same bytes, whoever wrote them in what order
        meta = {
            k: dict(sorted(v.items())) if isinstance(v, dict) else v
            for k, v in sorted(self.meta.items())
        }
        write_json(self.path, {"meta": meta, "cells": cells})


def task_store(out: Path, task: str, overwrite: bool = False) -> Store:
    """The merged records of ``task`` in the suite folder ``out``."""
    return Store(Path(out) / PER_SEED / f"{task}.json", overwrite)


def part_folder(out: Path, part: str) -> Path:
    return Path(out) / PARTS / part


def part_store(out: Path, part: str, task: str, overwrite: bool = False) -> Store:
    """The records one part (a shard, a Ray task) writes for ``task``, on the folder's merged
    records as its base."""
    return Store(
        part_folder(out, part) / PER_SEED / f"{task}.json",
        overwrite,
        base=task_store(out, task),
    )


def merge_meta(into: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """A part's task facts merged into the folder's: its deadlines, tuned learning rates and
    tunings join those already there (the same suite computes the same values)."""
    for key in MERGED_META:
        if key in meta:
            into[key] = {**into.get(key, {}), **meta[key]}
    for key, value in meta.items():
        if key not in MERGED_META:
            into[key] = value


def merge_parts(out: Path, *, overwrite: bool = False, echo: Callable | None = print) -> int:
    """Moves every part's records into the folder's (module docstring). The caller holds
    ``out``'s exclusive lock, so no shard is writing. A part record that would replace a
    record of another configuration (in the folder or in another part) is refused unless
    ``overwrite``. Returns the number of records merged."""
    out = Path(out)
    root = out / PARTS
    if not root.is_dir():
        return 0
    parts = sorted(p for p in root.iterdir() if p.is_dir())
    stores: dict[str, Store] = {}
    from_part: dict[str, str] = {}  # record id (per task) -> the part it came from
    conflicts = []
    merged = 0
    for part in parts:
        for path in sorted((part / PER_SEED).glob("*.json")):
            task = path.stem
            store = stores.setdefault(task, task_store(out, task, overwrite))
            own = Store(path)
            merge_meta(store.meta, own.meta)
            for rid, record in own.records.items():
                there = store.records.get(rid)
                if there is not None and there.get("key") != record.get("key"):
                    where = from_part.get(f"{task}/{rid}", f"{PER_SEED}/{task}.json")
                    conflicts.append(f"{part.name}/{task}: {rid} (against {where})")
                store.put(record)
                from_part[f"{task}/{rid}"] = part.name
                merged += 1
    if conflicts and not overwrite:
        more = f" (and {len(conflicts) - 3} more)" if len(conflicts) > 3 else ""
        raise ConfigError(
            f"{root}: {len(conflicts)} part record(s) hold another configuration's results "
            f"than the records they would replace: {'; '.join(conflicts[:3])}{more}. Remove the "
            "parts that do not belong, or pass --overwrite to let the parts' records win"
        )
    for store in stores.values():
        store.save()
    entries = read_invocations(out)
    for part in parts:
        path = part / INVOCATIONS
        for entry in read_json(path) if path.exists() else []:
            entry = {**entry, "part": part.name}
            if entry not in entries:  # a merge cut short and run again adds nothing twice
                entries.append(entry)
    if entries:
        write_json(out / INVOCATIONS, entries)
    for part in parts:
        shutil.rmtree(part, ignore_errors=True)
    with contextlib.suppress(OSError):
        root.rmdir()
    if merged and echo is not None:
        echo(f"{out}: merged {merged} record(s) from {len(parts)} part(s) into {PER_SEED}/")
    return merged


def read_invocations(out: Path) -> list[dict[str, Any]]:
    path = Path(out) / INVOCATIONS
    return list(read_json(path)) if path.exists() else []


def invocation_entry(**extra: Any) -> dict[str, Any]:
    """A new invocation's entry for ``invocations.json``: this machine, the start time, no
    wall seconds and no cells yet, and ``extra`` (an executor's own fields)."""
    return {
        **machine_info(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_seconds": 0.0,
        "cells_run": 0,
        **extra,
    }


def cell_execution(out_dir: Path | None) -> dict[str, Any]:
    """How a finished cell ran, from its folder's ``config.json``, for its record (a run's last
    bits can depend on all three, :mod:`.batching`): ``batch``, the members vmapped with it
    (``seeds``; ``hparams`` too where grid points shared the batch), the batch ``size``, the
    memory ``bound`` and how the size was chosen (``chosen_by``: ``measured``, ``memory``,
    ``given`` by ``seeds_together``, or ``alone`` for a program of one cell); ``parallel``, the
    client parallelism it ran with (``auto`` resolved); ``cpu_target``, what XLA compiled its
    code for (this machine's :func:`.provenance.cpu_code_target`). Rerun with the same members
    together and this parallelism on a CPU of the same target, a cell gives its record's
    metrics again. The measurement's timings are left out: they change from run to run, the
    choice (cached per machine) does not."""
    if out_dir is None or not (Path(out_dir) / CONFIG).exists():
        return {}
    info = read_json(Path(out_dir) / CONFIG)
    batch: dict[str, Any] = {"seeds": info.get("seeds_vmapped")}
    if "hparams_vmapped" in info:
        batch["hparams"] = info["hparams_vmapped"]
    choice = info.get("batch_choice")
    if choice is None:
        batch.update(size=1, chosen_by="alone")
    else:
        chosen_by = {"cache": "measured"}.get(choice["source"], choice["source"])
        batch.update(size=choice["size"], bound=choice["bound"], chosen_by=chosen_by)
    return {
        "batch": batch,
        "parallel": info.get("config", {}).get("parallel"),
        "cpu_target": cpu_code_target(),
    }


def shard_share(items: Iterable[Any], index: int, count: int) -> list[Any]:
    """Shard ``index`` of ``count`` (1-based) of ``items``: every ``count``-th item from the
    ``index``-th, the same share on every machine for the same suite file."""
    return list(items)[index - 1 :: count]
