"""``fedjax-sel sweep``, ``suite`` and ``compare``: many cells from one file, run together,
and the paired comparison of finished runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.options import add_cell_flags, echo
from fedjax_sel.experiment.execution import parse_seeds_together


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Declares ``sweep``, ``suite`` and ``compare`` and their flags."""
    p = sub.add_parser("sweep", help="run a sweep file (strategies x settings x seeds) + compare")
    p.add_argument("file", help="sweep file (TOML or JSON; see examples/sweep_digits.toml)")
    p.add_argument("--out", default=None, help="output folder (default runs/sweep-<file>)")
    add_cell_flags(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-compare", action="store_true", help="skip the comparison at the end")
    p.add_argument(
        "--allow-diverged",
        action="store_true",
        help="exit 0 when some cells diverged (default: exit 3, naming them)",
    )
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "suite",
        help="the selection benchmark: tasks x scenarios x strategies x paired seeds, resumable, "
        "with a leaderboard",
    )
    p.add_argument("file", help="suite file (TOML or JSON; see benchmarks/selection/cpu.toml)")
    p.add_argument("--out", default=None, help="output folder (default runs/suite-<file>)")
    add_cell_flags(p)
    p.add_argument("--tasks", default=None, help="run only these tasks (comma-separated)")
    p.add_argument("--no-tuning", action="store_true", help="skip tuning: every task's own lr")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: merge the shards' records (OUT/parts/) and rebuild the leaderboard "
        "from the per-seed records in --out",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run the I-th of N deterministic shares of the jobs (a strategy on a task) into "
        "OUT/parts/ (a SLURM array; shards may share --out); merge with --report-only",
    )
    p.add_argument(
        "--executor",
        default="local",
        metavar="local|ray|ray:ADDRESS",
        help="where the cells run: here (default), or on Ray (RAY_ADDRESS's cluster, ADDRESS's, "
        "else a local one); pip install 'fedjax-sel[ray]'",
    )
    p.add_argument(
        "--job-cpus", type=float, default=1.0, help="CPUs each Ray task declares (default 1)"
    )
    p.add_argument(
        "--job-gpus",
        type=float,
        default=None,
        help="GPUs each Ray task declares (default: 1 where the cluster has GPUs, else 0)",
    )
    p.add_argument(
        "--ray-cpus", type=int, default=None, help="CPUs of a local Ray cluster (default: all)"
    )
    p.add_argument(
        "--rerun",
        default=None,
        metavar="TASK/SCENARIO/STRATEGY",
        help="rerun one recorded cell of --out (with --seed; a tuning cell with --lr and "
        "--knob) and compare its metrics and cost series with the record: exit 0 when "
        "identical, 1 when not; writes nothing",
    )
    p.add_argument("--seed", type=int, default=None, help="the seed of the --rerun cell")
    p.add_argument("--lr", type=float, default=None, help="the lr of a tuning --rerun cell")
    p.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a tuned knob's value of a tuning --rerun cell (repeatable)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="--rerun: print the recorded and rerun values as JSON instead of a table",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_suite)

    p = sub.add_parser("compare", help="paired comparison of finished runs over seeds")
    p.add_argument("dirs", nargs="+", help="run or sweep folders (searched recursively)")
    p.add_argument("--baseline", default=None, help="label/strategy to pair the others against")
    p.add_argument("--metric", action="append", help="summary metric (repeatable)")
    p.add_argument("--at-round", type=int, action="append", help="accuracy at round R")
    p.add_argument("--target", type=float, action="append", help="rounds to accuracy A")
    p.add_argument("--time-to", type=float, action="append", help="simulated seconds to accuracy A")
    p.add_argument(
        "--percent",
        action="store_true",
        help="accuracies in %% and their differences in percentage points (targets stay fractions)",
    )
    p.add_argument("--out", default=None, help="write comparison.json/csv/md/png here")
    p.set_defaults(func=cmd_compare)


def spec_with_overrides(a: argparse.Namespace, section: str) -> dict:
    """A sweep or suite file's mapping with ``--set`` (its ``[override]``) and ``--seeds``
    (in ``[section]``) applied."""
    from fedjax_sel.config import read_config_file, typed_settings
    from fedjax_sel.registry import parse_pairs

    spec = dict(read_config_file(a.file))
    if a.set:
        spec["override"] = {}
        for item in a.set:
            spec["override"].update(typed_settings(parse_pairs(item, what="--set"), what="--set"))
    if a.seeds is not None and isinstance(spec.get(section, {}), dict):  # else its parser says
        spec[section] = {**spec.get(section, {}), "seeds": a.seeds}
    return spec


def cmd_sweep(a: argparse.Namespace) -> int:
    """Runs a sweep file and compares its cells; exit 3 when some diverged."""
    from fedjax_sel.experiment import run_sweep

    out = Path(a.out or f"runs/sweep-{Path(a.file).stem}")
    together = parse_seeds_together(a.seeds_together)
    spec = spec_with_overrides(a, "sweep")
    run_sweep(
        spec,
        out,
        seeds_together=together,
        progress=not a.no_progress,
        compare_results=not a.no_compare,
        overwrite=a.overwrite,
    )
    tuned = ", tuning.json, tuned/" if "tune" in spec.get("sweep", {}) else ""
    print(
        f"\nsweep written to {out}/ (runs/, comparison.json, comparison.md, comparison.png{tuned})"
    )
    return _diverged_status(out, a.allow_diverged)


# the exit status of a sweep some of whose cells diverged (1: a run's, 2: a bad input)
EXIT_DIVERGED = 3


def _diverged_status(out: Path, allowed: bool) -> int:
    """A finished sweep's exit status: :data:`EXIT_DIVERGED`, with a message naming the
    diverged cells, when some diverged and ``--allow-diverged`` was not given; else 0."""
    from fedjax_sel.experiment.sweep import diverged_cells

    names = diverged_cells(out)
    if not names:
        return 0
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    print(
        f"fedjax-sel: {len(names)} sweep cell(s) diverged: {shown}; the comparison leaves them "
        "out and counts them (its diverged column)"
        + ("" if allowed else "; exit status 3 (--allow-diverged: 0)"),
        file=sys.stderr,
    )
    return 0 if allowed else EXIT_DIVERGED


def cmd_suite(a: argparse.Namespace) -> int:
    """Runs the selection benchmark (or a shard of it, or one cell again) and writes its
    leaderboard."""
    from fedjax_sel.benchmark import report
    from fedjax_sel.benchmark.ray_executor import UnitsFailed
    from fedjax_sel.benchmark.run import parse_shard, run_suite
    from fedjax_sel.benchmark.suite import parse_suite
    from fedjax_sel.experiment.outdir import owned
    from fedjax_sel.experiment.records import merge_parts

    spec = spec_with_overrides(a, "suite")
    if a.no_tuning:
        spec.pop("tuning", None)
    suite = parse_suite(spec)
    out = Path(a.out or f"runs/suite-{Path(a.file).stem}")
    tasks = None
    if a.tasks:
        tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
        unknown = sorted(set(tasks) - {t.name for t in suite.tasks})
        if unknown:
            raise ConfigError(
                f"--tasks names {unknown}, not tasks of {a.file} ({[t.name for t in suite.tasks]})"
            )
    if (a.seed is not None or a.lr is not None or a.knob or a.json) and a.rerun is None:
        raise ConfigError("--seed, --lr, --knob and --json go with --rerun TASK/SCENARIO/STRATEGY")
    if a.rerun is not None:
        return _rerun(suite, out, a)
    shard = None if a.shard is None else parse_shard(a.shard)
    if a.report_only and (shard is not None or a.executor != "local"):
        raise ConfigError("--report-only runs nothing: it takes no --shard or --executor")
    if a.report_only and not out.is_dir():
        raise ConfigError(f"--report-only: {str(out)!r} is not a suite's output folder")
    if not a.report_only:
        together = parse_seeds_together(a.seeds_together)
        try:
            run_suite(
                suite,
                out,
                seeds_together=together,
                progress=not a.no_progress,
                only_tasks=tasks,
                overwrite=a.overwrite,
                shard=shard,
                executor=a.executor,
                job_cpus=a.job_cpus,
                job_gpus=a.job_gpus,
                ray_cpus=a.ray_cpus,
            )
        except UnitsFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if shard is not None:
        print(
            f"shard {a.shard} recorded in {out}/parts/; once every shard has run: "
            f"fedjax-sel suite {a.file} --out {out} --report-only"
        )
        return 0
    with owned(out, echo):  # the leaderboard's files have one writer too
        merge_parts(out, overwrite=a.overwrite, echo=echo)
        report.write(suite, out)
    return 0


def _rerun(suite, out: Path, a: argparse.Namespace) -> int:
    """``suite --rerun``: one recorded cell run again and compared with its record (exit 0
    when every metric is identical, 1 when one differs)."""
    from fedjax_sel.benchmark.rerun import print_rerun, rerun_cell

    if a.seed is None:
        raise ConfigError("--rerun needs --seed S (the cell's seed)")
    knobs = {}
    for pair in a.knob:
        name, sep, value = pair.partition("=")
        try:
            knobs[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ConfigError(f"--knob takes NAME=VALUE with a number, got {pair!r}")
    quiet = a.json  # the JSON alone on stdout
    result = rerun_cell(
        suite, out, a.rerun, a.seed, lr=a.lr, knobs=knobs, echo=(lambda *_: None) if quiet else echo
    )
    if a.json:
        print(json.dumps(result))
    else:
        print_rerun(result)
    return 1 if result["differs"] else 0


def cmd_compare(a: argparse.Namespace) -> int:
    """Compares finished runs over seeds, paired against a baseline."""
    from fedjax_sel.experiment import compare

    compare(
        a.dirs,
        baseline=a.baseline,
        metrics=a.metric,
        at_rounds=a.at_round or (),
        targets=a.target or (),
        time_targets=a.time_to or (),
        percent=a.percent,
        out=a.out,
    )
    if a.out:
        print(f"written: {a.out}/comparison.json, comparison.csv, comparison.md, comparison.png")
    return 0
