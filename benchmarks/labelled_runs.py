"""The JSON of a benchmark that times several checkouts under labels (``--label``): each run of
the script replaces its label's entry and keeps the others. Lives beside the scripts, not in
``fedjax_sel``, so a script run with ``PYTHONPATH=<older checkout>`` (whose package lacks it)
still imports it: ``python benchmarks/<script>.py`` puts this folder on ``sys.path``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import fedjax_sel
from fedjax_sel.bench.common import write_json_rows
from fedjax_sel.experiment.provenance import machine_info


def checkout() -> tuple[str, str]:
    """``(folder, short commit)`` of the ``fedjax_sel`` being timed (``unknown`` outside git)."""
    source = str(Path(fedjax_sel.__file__).resolve().parent.parent)
    try:
        commit = subprocess.run(
            ["git", "-C", source, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return source, commit


def write_labelled_run(out: str, command: str, label: str, rows: list[dict], **extra: Any):
    """Replaces ``label``'s run in ``out`` (rows, checkout, machine, ``extra``), keeping the
    runs of other labels."""
    source, commit = checkout()
    old = json.loads(Path(out).read_text()) if Path(out).is_file() else {"runs": []}
    runs = [r for r in old["runs"] if r["label"] != label]
    run = {"label": label, "source": source, "commit": commit, "machine": machine_info()}
    runs.append({**run, **extra, "rows": rows})
    write_json_rows(out, {"command": command, "runs": runs})
