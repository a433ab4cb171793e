"""Reruns a sample of the committed results and checks every value bit for bit.

A refactor that promises "behaviour unchanged" (issue 57) is checked here against numbers the
code committed before it: the rerun must give the same floats, not close ones. Two samples:

* **suite**: cells of the committed selection benchmark (``benchmarks/selection/cpu.toml``,
  records in ``benchmarks/results/selection/cpu/per_seed/``). Each record keeps its whole
  configuration, its batch and its client parallelism, so each sampled cell is rerun by
  ``fedjax-sel suite FILE --out RESULTS --rerun TASK/SCENARIO/STRATEGY --seed S [--lr X
  --knob K=V]``, which runs the cell's program group as the suite ran it and compares every
  metric and cost series with the record (it writes nothing). The sample: one seed of each
  scenario of a few strategies' evaluations, and one tuning cell of each strategy.
* **studies**: one reproduction per paper at cpu size, a small share of one committed folder
  (``benchmarks/results/reproduce/<paper>/<folder>/``): fewer seeds and one part or table,
  with the batch fixed, run by ``fedjax-sel reproduce`` into a temporary folder; every
  per-seed value of its ``per_seed.json`` (of the configurations named) is compared with the
  committed ``per_seed.json``.

A seed's last bits depend on the seeds vmapped beside it (XLA's reductions take the batch's
shape) and on the CPU XLA compiled for (its vector extensions: a record names its
``cpu_target``, and a cell made on another target is listed under ``other_target`` and left
out of the comparison, never counted as equal), and one flipped bit can change a draw, so a
sample is exact only when it batches as the committed run did: each sample says how its
committed run batched, on which CPU it was made, and what is left out because it does not
reproduce on the code before issue 57 either (docs/performance.md). A sample marked
``committed=False`` is known to differ from its record and is checked only against a
baseline: ``--against FILE`` compares every sample's rerun values with those of an earlier
``--out`` of this script (say, on the code before a change), value by value.

Everything runs through the CLI of whichever ``fedjax_sel`` is importable (``python -m
fedjax_sel`` from the repository root), never by importing a study, so the check survives the
package's moves. Prints a table and writes a JSON (the machine; per sample the values
compared, how many are equal, the largest absolute difference, the seconds, the first
differing values and every rerun value)::

    FEDJAX_SEL_DATA_DIR=../shared/data python benchmarks/check_committed.py \\
        --out benchmarks/results/cpu/check_committed.json [--against BASELINE.json]

Exit status 0 when every value is as expected, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# ---------------------------------------------------------------------------- the sample
SUITE_FILE = "benchmarks/selection/cpu.toml"
SUITE_RESULTS = "benchmarks/results/selection/cpu"
SUITE_TASK = "digits"


@dataclass(frozen=True)
class SuiteSample:
    """Cells of the committed suite rerun one by one (``suite --rerun``): in ``phase`` (eval:
    the first evaluation seed of each scenario; tune: the first recorded tuning cell) of
    ``strategies``."""

    name: str
    phase: str
    strategies: tuple[str, ...]
    note: str
    committed: bool = True  # False: the committed values are known to differ (see ``note``)
    task: str = SUITE_TASK

    def cells(self, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """The records sampled: per strategy and scenario, the one of the smallest seed (and
        lr, then knobs)."""
        chosen: dict[tuple[str, str], Mapping[str, Any]] = {}
        for r in sorted(records, key=_order):
            if r["phase"] == self.phase and r["strategy"] in self.strategies:
                chosen.setdefault((r["strategy"], r["scenario"]), r)
        return list(chosen.values())


def _order(record: Mapping[str, Any]) -> tuple:
    knobs = sorted((record.get("knobs") or {}).items())
    return (record["seed"], record.get("lr") or 0.0, knobs)


SUITE_SAMPLES = (
    SuiteSample(
        "suite tune",
        "tune",
        ("uniform", "power_of_choice", "divfl", "filfl", "fedcor", "full"),
        "one tuning cell (ideal scenario, the first tuning seed and lr) of six strategies, "
        "each rerun with its whole tuning grid's program group",
    ),
    SuiteSample(
        "suite eval",
        "eval",
        ("uniform", "oort", "hetero_select", "ca_fed", "power_of_choice.bundle"),
        "the first evaluation seed of five strategies in every scenario they run in, each "
        "rerun with its 20 seeds' program group",
    ),
    *(
        SuiteSample(
            f"suite {task}",
            "eval",
            ("uniform", "oort"),
            "the first evaluation seed of uniform and Oort in every scenario they run in, "
            "each rerun with its 20 seeds' program group",
            task=task,
        )
        for task in ("synthetic", "mnist", "shakespeare")
    ),
)


@dataclass(frozen=True)
class StudySample:
    """One paper's share: ``fedjax-sel reproduce NAME --profile P --size cpu --seeds S
    --seeds-together B OPTIONS`` compared with ``benchmarks/results/reproduce/FOLDER``
    (``cells``: only those configurations; every one when empty)."""

    name: str
    folder: str
    profile: str
    seeds: int
    together: int
    options: tuple[str, ...]
    note: str
    cells: tuple[str, ...] = ()

    def command(self, out: Path, data_dir: str | None) -> list[str]:
        cmd = ["reproduce", self.name, "--profile", self.profile, "--size", "cpu"]
        cmd += ["--seeds", str(self.seeds), "--seeds-together", str(self.together)]
        for option in self.options:
            cmd += ["--option", option]
        if data_dir:
            cmd += ["--data-dir", data_dir]
        return [*cmd, "--out", str(out)]


STUDIES: tuple[StudySample, ...] = (
    StudySample(
        "ca-fed",
        "ca_fed/code-cpu",
        "code",
        seeds=10,
        together=2,
        options=("parts=control",),
        cells=("control_N=24/CA-Fed",),
        note="CA-Fed in the reference code's control setup (N = 24, T = 150), seeds 0-9 in "
        "batches of 2 as its committed run (Intel Xeon) batched them; AdaFed and Unbiased ran "
        "there in batches of 10, and their test loss moves in the last bit with the batch",
    ),
    StudySample(
        "fedcvr-bolt",
        "fedcvr_bolt/paper-cpu",
        "paper",
        seeds=2,
        together=1,
        options=("tables=1", "table1_seeds=2"),
        cells=tuple(
            f"table1_D={d}_{iid}/{m}"
            for d in (1, 2)
            for iid in ("IID", "Non-IID")
            for m in ("FedAvg", "Power-of-Choice")
        ),
        note="Table 1 (synthetic regression) with 2 seeds, FedAvg and Power-of-Choice rows: "
        "these equal the committed 25-seed run (Intel Xeon) whatever the batch; the coalition "
        "and Active FL rows depend on the seeds vmapped and padded beside them (docs/"
        "fedcvr_bolt.md), and the committed batches were uneven (a resumed run)",
    ),
    StudySample(
        "filfl",
        "filfl/paper-cpu",
        "paper",
        seeds=9,
        together=1,
        options=("parts=ratio",),
        note="Fig. 11's approximation ratio (DGF against the brute-force optimum), all 9 seeds "
        "one at a time (AMD EPYC)",
    ),
    StudySample(
        "hetero-select",
        "hetero_select/paper-cpu-table3",
        "paper",
        seeds=8,
        together=4,
        options=("tables=III", "table3_extras=false"),
        note="Table III's six ablation rows, seeds 0-7 in batches of 4 as the committed "
        "20-seed run (AMD EPYC) batched them (1 or 2 change the last bits)",
    ),
    StudySample(
        "sp-cacw",
        "sp_cacw/paper-cpu-rotate",
        "paper",
        seeds=4,
        together=1,
        options=("parts=mnist_rotate",),
        cells=tuple(
            f"mnist_rotate/{m}"
            for m in (
                "Cosine_similarity",
                "Local_only",
                "Oracle__same_cluster_",
                "SP-CACW",
                "Uniform_weights",
            )
        ),
        note="rotated MNIST, seeds 0-3 (personalized runs: one seed at a time; Intel Xeon, "
        "equal to the AMD EPYC run when committed); FedAvg's and IFCA's final_test_loss "
        "differ from the record by <= 4.2e-8 on the code before issue 57 too, so those two "
        "rows are left out",
    ),
)


# ---------------------------------------------------------------------------- comparing
def numbers(value: Any) -> Iterator[float]:
    """The numbers of a value (a float, or nested lists of them)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from numbers(v)


def same(a: Any, b: Any) -> bool:
    """Exactly equal: the same numbers (NaN equals NaN), nested lists element by element."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def abs_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between two values' numbers (inf: not comparable)."""
    x, y = list(numbers(a)), list(numbers(b))
    if len(x) != len(y) or not x:
        return math.inf
    return max(
        (
            0.0 if (math.isnan(u) and math.isnan(v)) else abs(u - v)
            for u, v in zip(x, y, strict=True)
        ),
        default=0.0,
    )


class Tally:
    """Values compared, how many equal, the largest difference and the first differences."""

    def __init__(self) -> None:
        self.values = self.equal = 0
        self.max_diff = 0.0
        self.differing: list[dict[str, Any]] = []

    def add(self, where: str, expected: Any, rerun: Any) -> None:
        self.values += 1
        if same(expected, rerun):
            self.equal += 1
            return
        self.max_diff = max(self.max_diff, abs_difference(expected, rerun))
        if len(self.differing) < 20:
            self.differing.append({"value": where, "expected": expected, "rerun": rerun})

    def row(self) -> dict[str, Any]:
        return {
            "values": self.values,
            "equal": self.equal,
            "max_abs_difference": self.max_diff,
            "differing": self.differing,
        }


def compare(expected: Mapping[str, Any], rerun: Mapping[str, Any]) -> dict[str, Any]:
    """Every expected value against the rerun's value of the same name (absent: ``None``)."""
    tally = Tally()
    for where, value in expected.items():
        tally.add(where, value, rerun.get(where))
    return tally.row()


# ---------------------------------------------------------------------------- running
def cli(args: Sequence[str], log: Path, env: Mapping[str, str], ok: Sequence[int] = (0,)) -> float:
    """Runs ``python -m fedjax_sel ARGS`` from the repository root (output to ``log``) and
    returns its wall seconds; raises when it exits with a status not in ``ok``."""
    start = time.perf_counter()
    with log.open("w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "fedjax_sel", *args],
            cwd=ROOT,
            env=dict(env),
            stdout=f,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.perf_counter() - start
    if done.returncode not in ok:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"fedjax-sel {' '.join(args)} exited {done.returncode}:\n{tail}")
    return seconds


def rerun_args(record: Mapping[str, Any], task: str = SUITE_TASK) -> list[str]:
    """``suite --rerun --json`` arguments naming a record's cell of ``task``."""
    cell = f"{task}/{record['scenario']}/{record['strategy']}"
    args = ["suite", SUITE_FILE, "--out", SUITE_RESULTS, "--rerun", cell, "--json"]
    args += ["--seed", str(record["seed"])]
    if record.get("lr") is not None:
        args += ["--lr", repr(record["lr"])]
    for name, value in sorted((record.get("knobs") or {}).items()):
        args += ["--knob", f"{name}={value!r}"]
    return args


def check_suite(work: Path, env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The suite samples (module docstring): each sampled cell rerun by ``suite --rerun``
    against the committed records, every metric and cost series compared."""
    rows = []
    for sample in SUITE_SAMPLES:
        per_seed = ROOT / SUITE_RESULTS / "per_seed" / f"{sample.task}.json"
        committed = json.loads(per_seed.read_text())
        expected, rerun, seconds, commands, elsewhere = {}, {}, 0.0, [], []
        for record in sample.cells(committed["cells"]):
            args = rerun_args(record, sample.task)
            log = work / "rerun.json"
            seconds += cli(args, log, env, ok=(0, 1))  # 1: a value differs
            printed = [line for line in log.read_text().splitlines() if line.startswith("{")]
            result = json.loads(printed[-1])
            where = " ".join(args[4:])
            commands.append(f"fedjax-sel {' '.join(args)}")
            if result.get("same_target") is False:  # made where XLA compiled other code
                elsewhere.append(f"{where} ({result['recorded_on']})")
                continue
            expected |= {f"{where}: {k}": v for k, v in result["recorded"].items()}
            rerun |= {f"{where}: {k}": v for k, v in result["rerun"].items()}
        rows.append(
            {
                "sample": sample.name,
                "what": f"{SUITE_RESULTS} {sample.task}, {', '.join(sample.strategies)}: "
                f"{sample.note}",
                "command": commands,
                "seconds": round(seconds, 1),
                "committed": sample.committed,
                **compare(expected, rerun),
                # cells whose record names another CPU target: not comparable here
                "other_target": elsewhere,
                "rerun": rerun,
            }
        )
    return rows


def _study_values(per_seed: Mapping[str, Any], cells: Sequence[str]) -> dict[str, Any]:
    """``cell/seedS:metric`` -> value of a ``per_seed.json`` (``cells``: only those)."""
    out = {}
    for key, cell in per_seed["cells"].items():
        if not cells or key in cells:
            for seed, values in cell["seeds"].items():
                for metric, value in values.items():
                    out[f"{key}/seed{seed}:{metric}"] = value
    return out


def check_study(sample: StudySample, work: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """One paper's share (module docstring), compared seed by seed with the committed folder:
    every value the rerun gives must equal the committed one."""
    out = work / sample.folder.replace("/", "_")
    args = sample.command(out, env.get("FEDJAX_SEL_DATA_DIR"))
    seconds = cli(args, work / f"{out.name}.log", env)
    committed = json.loads((RESULTS / "reproduce" / sample.folder / "per_seed.json").read_text())
    values = _study_values(json.loads((out / "per_seed.json").read_text()), sample.cells)
    old = _study_values(committed, sample.cells)
    return {
        "sample": f"{sample.name} {sample.folder.split('/')[-1]}",
        "what": f"benchmarks/results/reproduce/{sample.folder}: {sample.note}",
        "command": "fedjax-sel " + " ".join(args[:-2]),
        "seconds": round(seconds, 1),
        "committed": True,
        # the rerun's values against the committed ones (the rerun has fewer seeds)
        **compare({k: old.get(k) for k in values}, values),
        "rerun": values,
    }


def machine() -> dict[str, Any]:
    """fedjax_sel's record of this machine (wherever the package keeps it)."""
    try:
        from fedjax_sel.experiment.provenance import machine_info
    except ImportError:  # before issue 57's one machine_info
        from fedjax_sel.bench.common import machine_info
    return machine_info()


def against(rows: list[dict[str, Any]], baseline: Path) -> None:
    """Adds to each row its comparison with the same sample's rerun in ``baseline`` (an
    earlier ``--out`` of this script, e.g. on the code before a change)."""
    earlier = {r["sample"]: r for r in json.loads(baseline.read_text())["samples"]}
    for row in rows:
        base = earlier.get(row["sample"])
        if base is None:
            row["baseline"] = None
            continue
        result = compare(base["rerun"], row["rerun"])
        result["new_values"] = len(set(row["rerun"]) - set(base["rerun"]))
        row["baseline"] = result


def print_table(rows: Sequence[Mapping[str, Any]]) -> None:
    print(
        "| sample | values compared | equal | max abs difference | vs baseline: equal | seconds |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        note = "" if r["committed"] else " (not expected)"
        if r.get("other_target"):
            note += f" ({len(r['other_target'])} cells of another CPU target left out)"
        b = r.get("baseline")
        base = "" if b is None else f"{b['equal']} of {b['values']}"
        print(
            f"| {r['sample']} | {r['values']} | {r['equal']}{note} | "
            f"{r['max_abs_difference']:.3g} | {base} | {r['seconds']:.1f} |"
        )


def verdict(rows: Sequence[Mapping[str, Any]], baseline: bool) -> bool:
    """Every sample expected to equal the committed values does, and (``baseline``) every
    sample equals the baseline's rerun."""
    # a sample whose cells were all made on another CPU target checked nothing
    ok = all(r["equal"] == r["values"] > 0 for r in rows if r["committed"])
    if baseline:
        ok &= all(
            r.get("baseline") is not None and r["baseline"]["equal"] == r["baseline"]["values"]
            for r in rows
        )
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="the JSON to write (default: none)")
    p.add_argument(
        "--against",
        type=Path,
        default=None,
        help="an earlier --out of this script: each sample's rerun must also equal its rerun",
    )
    names = ["suite", *(s.name for s in STUDIES)]
    p.add_argument(
        "--only", default=None, help=f"comma-separated samples to run (of {', '.join(names)})"
    )
    p.add_argument("--keep", type=Path, default=None, help="run in this folder and keep it")
    a = p.parse_args(argv)
    only = names if a.only is None else a.only.split(",")
    unknown = sorted(set(only) - set(names))
    if unknown:
        p.error(f"unknown samples {unknown}; known: {names}")
    env = dict(os.environ)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="check_committed_") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "suite" in only:
            rows += check_suite(work, env)
            print_table(rows)
        for sample in STUDIES:
            if sample.name in only:
                rows.append(check_study(sample, work, env))
                print_table(rows[-1:])
    if a.against is not None:
        against(rows, a.against)
    print()
    print_table(rows)
    ok = verdict(rows, a.against is not None)
    print("every value is as expected" if ok else "some values differ (the JSON lists them)")
    if a.out is not None:
        result = {"machine": machine(), "all_equal": ok, "samples": rows}
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
