"""The ``fedjax-sel`` command line.

::

    fedjax-sel demo                 # paired comparison on the embedded digits data, < 1 min on CPU
    fedjax-sel list                 # strategies, data sets, models, availability models, ...
    fedjax-sel run [--config FILE] [--strategy NAME --dataset NAME ...] --out DIR
    fedjax-sel run --resume DIR     # continue a killed run from its checkpoint
    fedjax-sel sweep FILE.toml --out DIR            # strategies x settings x seeds, compared
    fedjax-sel compare DIR... --baseline NAME --out DIR
    fedjax-sel suite FILE.toml --out DIR            # the selection benchmark: leaderboard
    fedjax-sel bench throughput|kernels|sweep|grid|scale|workloads ...   # JSON + table
    fedjax-sel reproduce NAME --profile paper|code --size cpu|paper --seeds N --out DIR

``run``'s flags are generated from :class:`fedjax_sel.config.RunConfig` (one flag per field);
a ``--config`` file (TOML or JSON, e.g. a run's own ``config.json``) gives the same fields, and
flags on the command line override it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from fedjax_sel.base import ConfigError
from fedjax_sel.experiment.outputs import print_summary_table


def cmd_run(a: argparse.Namespace) -> int:
    from fedjax_sel.config import config_from_flags, read_config_file
    from fedjax_sel.experiment import run_experiment

    primary = True
    if a.distributed:
        from fedjax_sel import distributed

        distributed.initialize(a.coordinator, a.num_processes, a.process_id)
        primary = distributed.is_primary()
    elif a.coordinator or a.num_processes is not None or a.process_id is not None:
        raise ConfigError("--coordinator, --num-processes and --process-id need --distributed")
    base = {}
    if a.resume is not None:
        resume = Path(a.resume)
        given = [k for k in vars(a) if k in _config_fields()]
        if given or a.config is not None:
            raise ConfigError(
                f"--resume takes the configuration from {resume / 'config.json'}; do not give "
                f"settings with it (got {sorted(given) or ['--config']})"
            )
        base = read_config_file(resume / "config.json")
        out = resume
    elif a.config is not None:
        base = read_config_file(a.config)
    config = config_from_flags(a, base).resolve()
    if a.distributed and config.mode != "global":
        raise ConfigError("--distributed runs global-model strategies (mode=global) only")
    if a.resume is None:
        out = Path(a.out or f"runs/{config.strategy}-{config.dataset}")
    result = run_experiment(
        config,
        out,
        progress=not a.no_progress and primary,
        resume=a.resume is not None,
        echo=_echo if primary else _quiet,
        trace_dir=a.trace,
        overwrite=a.overwrite,
    )
    if not primary:  # process 0 reports and writes
        return 1 if result.summary.get("diverged") else 0
    print_summary_table([{**result.summary, **result.timings}])
    print(
        f"outputs written to {out}/ (config.json, metrics.jsonl, summary.json, timings.json, "
        "curves.png)"
    )
    return 1 if result.summary.get("diverged") else 0


def _config_fields() -> set[str]:
    import dataclasses

    from fedjax_sel.config import RunConfig

    return {f.name for f in dataclasses.fields(RunConfig)}


def _echo(*args) -> None:
    print(*args, file=sys.stderr)


def _quiet(*args) -> None:
    del args


def cmd_demo(a: argparse.Namespace) -> int:
    from fedjax_sel.demo import run_demo

    run_demo(Path(a.out), rounds=a.rounds, seeds=a.seeds, progress=not a.no_progress)
    return 0


def _seeds_together(value: str | None) -> int | str | None:
    """``--seeds-together``: ``auto``, a number, or ``None`` (the file's)."""
    if value is None or value == "auto":
        return value
    try:
        together = int(value)
    except ValueError:
        together = 0
    if together < 1:
        raise ConfigError(f"--seeds-together must be 'auto' or a positive number, got {value!r}")
    return together


def _seed_list(value: str | None) -> list[int] | None:
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


def _spec_with_overrides(a: argparse.Namespace, section: str) -> dict:
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
    from fedjax_sel.experiment import run_sweep

    out = Path(a.out or f"runs/sweep-{Path(a.file).stem}")
    together = _seeds_together(a.seeds_together)
    spec = _spec_with_overrides(a, "sweep")
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
    from fedjax_sel.benchmark import leaderboard
    from fedjax_sel.benchmark.ray_executor import UnitsFailed
    from fedjax_sel.benchmark.run import parse_shard, run_suite
    from fedjax_sel.benchmark.suite import parse_suite
    from fedjax_sel.experiment.outdir import owned
    from fedjax_sel.experiment.records import merge_parts

    spec = _spec_with_overrides(a, "suite")
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
    if (a.seed is not None or a.lr is not None) and a.rerun is None:
        raise ConfigError("--seed and --lr go with --rerun TASK/SCENARIO/STRATEGY")
    if a.rerun is not None:
        return _rerun(suite, out, a)
    shard = None if a.shard is None else parse_shard(a.shard)
    if a.report_only and (shard is not None or a.executor != "local"):
        raise ConfigError("--report-only runs nothing: it takes no --shard or --executor")
    if a.report_only and not out.is_dir():
        raise ConfigError(f"--report-only: {str(out)!r} is not a suite's output folder")
    if not a.report_only:
        together = _seeds_together(a.seeds_together)
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
    with owned(out, _echo):  # the leaderboard's files have one writer too
        merge_parts(out, overwrite=a.overwrite, echo=_echo)
        leaderboard.write(suite, out)
    return 0


def _rerun(suite, out: Path, a: argparse.Namespace) -> int:
    """``suite --rerun``: one recorded cell run again and compared with its record (exit 0
    when every metric is identical, 1 when one differs)."""
    from fedjax_sel.benchmark.rerun import print_rerun, rerun_cell

    if a.seed is None:
        raise ConfigError("--rerun needs --seed S (the cell's seed)")
    result = rerun_cell(suite, out, a.rerun, a.seed, lr=a.lr, echo=_echo)
    print_rerun(result)
    return 1 if result["differs"] else 0


def cmd_compare(a: argparse.Namespace) -> int:
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


def cmd_list(a: argparse.Namespace) -> int:
    del a
    from fedjax_sel.availability import AVAILABILITY
    from fedjax_sel.bench import KERNEL_BENCHMARKS
    from fedjax_sel.data.datasets import DATASETS
    from fedjax_sel.data.partition import PARTITIONS
    from fedjax_sel.models import MODELS
    from fedjax_sel.personalized.methods import PERSONALIZED_METHODS
    from fedjax_sel.reproduce import REPRODUCTIONS
    from fedjax_sel.strategies import STRATEGIES

    def section(title, registry, extra=None):
        print(title)
        for name in sorted(registry):
            e = registry[name]
            print(f"  {name:18s} {e.description}")
            opts = registry.describe(name)
            if opts:
                print(f"  {'':18s}   {opts}")
            if extra:
                line = extra(e)
                if line:
                    print(f"  {'':18s}   {line}")
        print()

    section(
        "strategies (--strategy; --strategy-arg key=value):",
        STRATEGIES,
        lambda e: (
            "traced (a grid of them shares one program): " + ", ".join(e.info["traced"])
            if e.info.get("traced")
            else ""
        ),
    )
    section(
        "data sets (--dataset; --dataset-arg key=value):",
        DATASETS,
        lambda e: (
            f"default: {e.info['default_clients'] or 'all'} clients, partition "
            f"{e.info['default_partition']}, model {e.info['default_model']}"
        ),
    )
    section("partitions (--partition NAME:value,key=value):", PARTITIONS)
    section("models (--model; --model-arg key=value):", MODELS)
    section(
        "availability (--availability NAME:key=value,...):",
        AVAILABILITY,
        lambda e: "; ".join(f"{k}: {v}" for k, v in e.info.get("params", {}).items()),
    )
    from fedjax_sel.engine.fedbuff import ASYNC
    from fedjax_sel.engine.system import SYSTEMS

    section("system models (--system NAME:key=value,...):", SYSTEMS)
    section("asynchronous modes (--async NAME:key=value,...):", ASYNC)
    section("personalized methods (--mode personalized --strategy NAME):", PERSONALIZED_METHODS)
    section("reproductions (fedjax-sel reproduce NAME):", REPRODUCTIONS)
    section("kernel benchmarks (fedjax-sel bench kernels --kernel NAME):", KERNEL_BENCHMARKS)
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from fedjax_sel import bench

    if a.repeats < 1:  # the medians (and the scale rows' fused rounds) need one timing at least
        raise ConfigError(f"--repeats must be >= 1, got {a.repeats}")
    _check_counts(
        a, "max_examples", "per_round", "local_steps", "batch_size", "classes", "clients",
        "seeds", "rounds", "repeats",
    )  # fmt: skip
    if a.what == "throughput":
        from fedjax_sel.registry import convert

        shape = None
        if a.input_shape is not None:
            shape = convert(
                a.input_shape.replace(",", "-"), tuple[int, ...], what="--input-shape", key="shape"
            )
        rows = bench.throughput_main(
            models=a.model or ["logreg"],
            per_rounds=a.per_round or [None],
            modes=a.mode,
            work=a.work,
            local_steps=a.local_steps,
            batch_size=a.batch_size,
            repeats=a.repeats,
            out=a.out,
            model_def=a.model_def,
            input_shape=shape,
            classes=a.classes,
            trace=a.trace,
            system=a.system,
            asynchronous=a.asynchronous,
        )
    elif a.what == "phases":
        from fedjax_sel.bench.trace_phases import phase_seconds, plot_phases

        if a.trace is None:
            raise ConfigError("bench phases needs --trace DIR (a trace written by run --trace)")
        seconds = phase_seconds(a.trace)
        total = sum(seconds.values())
        for name, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
            print(f"  {name:16s} {s * 1e3:9.2f} ms  {100 * s / total:5.1f}%")
        rows = [seconds]
        if a.out:
            print(f"wrote {plot_phases(a.trace, a.out)}")
    elif a.what == "scale":
        from fedjax_sel.bench.scale import scale_main

        per_round = a.per_round or [1000]
        if len(per_round) != 1:
            raise ConfigError("bench scale takes one --per-round (capped at K / 10 per row)")
        rows = scale_main(
            strategies=a.strategy,
            clients=a.clients,
            per_round=per_round[0],
            rounds=a.repeats,
            max_examples=a.max_examples,
            out=a.out,
        )
    elif a.what == "workloads":
        from fedjax_sel.bench.workloads import workloads_main

        if a.clients is not None and len(a.clients) != 1:
            raise ConfigError("bench workloads takes one --clients (a subset of each workload's)")
        rows = workloads_main(
            a.workload,
            data_dir=a.data_dir,
            rounds=a.rounds,
            clients=a.clients[0] if a.clients else None,
            out=a.out,
        )
    elif a.what == "grid":
        rows = bench.grid_main(
            models=a.model,
            rounds=a.rounds or 20,
            seeds=a.seeds[0] if a.seeds else 4,
            seeds_together=_seeds_together(a.seeds_together or "auto"),
            out=a.out,
        )
    elif a.what == "sweep":
        rows = bench.sweep_main(
            models=a.model,
            seeds=a.seeds or None,
            rounds=a.rounds or 20,
            repeats=a.repeats,
            out=a.out,
        )
    else:
        rows = bench.kernels_main(kernels=a.kernel, clients=a.clients, repeats=a.repeats, out=a.out)
    return 0 if rows else 1


def _check_counts(a: argparse.Namespace, *names: str) -> None:
    """Refuses a count flag (one number, or a list of them) outside 1 .. 2**31 - 1."""
    from fedjax_sel.config import INT_MAX

    for name in names:
        value = getattr(a, name, None)
        for v in value if isinstance(value, list) else [value]:
            if v is not None and not 1 <= v <= INT_MAX:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be a whole number in 1 .. {INT_MAX}, got {v}")


def cmd_reproduce(a: argparse.Namespace) -> int:
    from fedjax_sel.registry import parse_pairs
    from fedjax_sel.reproduce import run_reproduction

    run_reproduction(
        a.name,
        seeds=a.seeds,  # None: the reproduction's default
        out=Path(a.out or f"runs/reproduce-{a.name}/{a.profile}-{a.size}"),
        size=a.size,
        profile=a.profile,
        data_dir=a.data_dir,
        seeds_together=_seeds_together(a.seeds_together or "auto"),
        only_seeds=_seed_list(a.only_seeds),
        **parse_pairs(a.option, what="--option"),
    )
    return 0


def _add_cell_flags(p: argparse.ArgumentParser) -> None:
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
    _add_overwrite_flag(p)


def _add_overwrite_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace results of another configuration found in --out (refused without it)",
    )


def build_parser() -> argparse.ArgumentParser:
    from fedjax_sel.config import add_config_flags

    parser = argparse.ArgumentParser(
        prog="fedjax-sel",
        description="Vectorized simulator for client selection in federated learning (JAX).",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="split the host CPU into N XLA devices and shard clients over them (default: "
        "$FEDJAX_SEL_CPU_DEVICES, else 1); must come before the command",
    )
    parser.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        help="import MODULE first (a module of yours that registers strategies, models, data "
        "sets ...); repeatable; must come before the command",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "demo", help="paired comparison of three strategies on embedded data (< 1 min CPU)"
    )
    p.add_argument("--out", default="runs/demo", help="output folder")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--seeds", type=int, default=5, help="paired seeds per strategy (>= 2)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("list", help="strategies, data sets, models, availability models, ...")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "run",
        help="run one simulation and write its outputs",
        description="Every setting below is a field of fedjax_sel.config.RunConfig; --config "
        "FILE gives them from a TOML/JSON file (a run's config.json reruns it exactly) and "
        "flags override the file.",
    )
    p.add_argument("--config", default=None, metavar="FILE", help="TOML or JSON configuration")
    p.add_argument(
        "--resume", default=None, metavar="DIR", help="continue the run in DIR from its checkpoint"
    )
    p.add_argument("--out", default=None, help="output folder (default runs/<strategy>-<dataset>)")
    _add_overwrite_flag(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="write a jax.profiler trace of the second chunk of rounds (Perfetto, TensorBoard)",
    )
    dist = p.add_argument_group(
        "several processes (hosts)",
        "one process per host runs the same command; jax.distributed joins them, clients are "
        "sharded over every device of every host, process 0 writes the outputs",
    )
    dist.add_argument(
        "--distributed",
        action="store_true",
        help="join the other processes (without the three flags below JAX reads the cluster "
        "from the environment: SLURM, Open MPI, ...)",
    )
    dist.add_argument(
        "--coordinator", default=None, metavar="HOST:PORT", help="process 0's address"
    )
    dist.add_argument("--num-processes", type=int, default=None, help="number of processes")
    dist.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1")
    add_config_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a sweep file (strategies x settings x seeds) + compare")
    p.add_argument("file", help="sweep file (TOML or JSON; see examples/sweep_digits.toml)")
    p.add_argument("--out", default=None, help="output folder (default runs/sweep-<file>)")
    _add_cell_flags(p)
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
    _add_cell_flags(p)
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
        help="rerun one recorded cell of --out (with --seed; a tuning cell with --lr) and "
        "compare its metrics with the record: exit 0 when identical, 1 when not; writes nothing",
    )
    p.add_argument("--seed", type=int, default=None, help="the seed of the --rerun cell")
    p.add_argument("--lr", type=float, default=None, help="the lr of a tuning --rerun cell")
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

    p = sub.add_parser("bench", help="throughput, kernel and sweep benchmarks (JSON + table)")
    p.add_argument(
        "what",
        choices=("throughput", "kernels", "sweep", "grid", "phases", "scale", "workloads"),
    )
    p.add_argument(
        "--workload",
        action="append",
        help="workloads: logreg_mnist, cnn_femnist, resnet18_cifar100, lstm_shakespeare "
        "(default all); --rounds N runs N rounds of each (default: the workload's own)",
    )
    p.add_argument("--data-dir", default=None, help="workloads: folder of the real data files")
    p.add_argument(
        "--strategy", action="append", help="scale: strategies (default: the million-client set)"
    )
    p.add_argument(
        "--max-examples", type=int, default=20, help="scale: examples per client at most"
    )
    p.add_argument("--model", action="append", help="throughput/sweep/grid: logreg, mlp, cnn, lstm")
    p.add_argument("--per-round", type=int, action="append", help="throughput: clients per round")
    p.add_argument(
        "--mode",
        action="append",
        help="throughput: engine modes to time (auto, vmap, map, chunked:C); default auto",
    )
    p.add_argument(
        "--work",
        choices=("steps", "epochs"),
        default="steps",
        help="throughput: fixed local steps, or one local epoch over LogNormal-sized clients",
    )
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=None, help="default 32 (steps) or 10 (epochs)")
    p.add_argument(
        "--model-def",
        default=None,
        metavar="FILE.py:NAME",
        help="throughput: a flax module of yours",
    )
    p.add_argument("--input-shape", default=None, help="with --model-def, e.g. 28,28,1")
    p.add_argument("--classes", type=int, default=None, help="with --model-def")
    p.add_argument("--trace", default=None, metavar="DIR", help="a jax.profiler trace here")
    p.add_argument(
        "--system",
        default=None,
        metavar="SPEC",
        help="throughput: also time the round with this system model (its overhead)",
    )
    p.add_argument(
        "--async",
        dest="asynchronous",
        default=None,
        metavar="SPEC",
        help="throughput: also FedBuff's client updates/s at concurrency P (fedbuff:buffer=B)",
    )
    p.add_argument("--kernel", action="append", help="kernels: names (default all)")
    p.add_argument("--clients", type=int, action="append", help="kernels/scale: K values")
    p.add_argument(
        "--seeds", type=int, action="append", help="sweep: seeds together (1 4 16); grid: seeds"
    )
    p.add_argument(
        "--seeds-together", default=None, help="grid: members per vmapped batch (default auto)"
    )
    p.add_argument("--rounds", type=int, default=None, help="sweep (default 20), workloads")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed calls; throughput: turns of one loop round and one round of each mode, "
        "the speedup being the median of the turns' ratios",
    )
    p.add_argument("--out", default=None, help="JSON output file")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("reproduce", help="reproduce a paper's tables and figures")
    p.add_argument("name")
    p.add_argument(
        "--seeds", type=int, default=None, help="paired seeds (default: the reproduction's, >= 5)"
    )
    p.add_argument(
        "--profile",
        choices=("paper", "code"),
        default="paper",
        help="paper: the text; code: how the reference code ran it",
    )
    p.add_argument(
        "--size",
        choices=("cpu", "paper"),
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

    p = sub.add_parser("trace", help="availability traces: convert FedScale's behaviour trace")
    tsub = p.add_subparsers(dest="trace_command", required=True)
    t = tsub.add_parser(
        "convert",
        help="FedScale client_behave_trace (pickle or JSON) -> T x K trace for "
        "--availability trace:path=OUT",
    )
    t.add_argument("input", help="FedScale behaviour trace (pickle, or JSON of the same shape)")
    t.add_argument("output", help="the T x K trace to write (.npy, .npz, .csv or .txt)")
    t.add_argument("--round-seconds", type=float, required=True, help="seconds per round")
    t.add_argument("--rounds", type=int, required=True, help="T, rows of the trace")
    t.add_argument(
        "--clients", type=int, default=None, help="K (default: the number of trace entries)"
    )
    t.add_argument("--start", type=float, default=0.0, help="time of round 0 in seconds")
    t.add_argument(
        "--rule",
        choices=("interval", "fedscale"),
        default="interval",
        help="interval: online inside [active_i, inactive_i]; fedscale: FedScale's stateful "
        "is_active cursor",
    )
    t.set_defaults(func=cmd_trace)
    return parser


def cmd_trace(a: argparse.Namespace) -> int:
    from fedjax_sel.availability.fedscale_trace import convert_behaviour_trace, save_trace

    _check_counts(a, "rounds", "clients")

    trace = convert_behaviour_trace(
        a.input,
        round_seconds=a.round_seconds,
        rounds=a.rounds,
        clients=a.clients,
        start=a.start,
        rule=a.rule,
    )
    path = save_trace(trace, a.output)
    per_client = trace.mean(0)
    print(
        f"wrote {path}: {trace.shape[0]} rounds x {trace.shape[1]} clients, online "
        f"{trace.mean():.1%} of client-rounds (per client {per_client.min():.0%} .. "
        f"{per_client.max():.0%}); use --availability trace:path={path}"
    )
    return 0


def set_cpu_devices(n: int | None) -> None:
    """Asks XLA for ``n`` host (CPU) devices; must run before JAX initialises its backends.

    The simulator then shards the slots of a round over them (``Simulation(mesh=...)``), which
    puts every core to work on models whose per-client matmuls are too small to be threaded.
    """
    import os

    if n is None:
        env = os.environ.get("FEDJAX_SEL_CPU_DEVICES")
        n = int(env) if env else None
    if n is None or n == 1:
        return
    if n < 1:
        raise ConfigError(f"--cpu-devices must be >= 1, got {n}")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def load_plugins(modules: list[str] | None) -> None:
    """Imports the user's modules (they register strategies, models, ... on import); the
    working directory is searched too, last (appended to the import path), so a folder there
    named like an installed package (``tqdm/``) does not shadow it."""
    if modules and str(Path.cwd()) not in sys.path:
        sys.path.append(str(Path.cwd()))
    for name in modules or []:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"--plugin {name!r} cannot be imported: {e}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        set_cpu_devices(args.cpu_devices)
        load_plugins(args.plugin)
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"fedjax-sel: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # a size no check foresaw: still one line, not a traceback
        print(f"fedjax-sel: error: out of memory ({e or 'MemoryError'}): the settings ask "
              "for more memory than this machine has", file=sys.stderr)  # fmt: skip
        return 2
    except Exception as e:  # noqa: BLE001 - only XLA's out-of-memory is turned into a line
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        print(f"fedjax-sel: error: out of device memory ({str(e).splitlines()[0][:200]}): the "
              "settings ask for more memory than this device has", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("fedjax-sel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
