"""The ``fedjax-sel`` command line (design section 8).

::

    fedjax-sel demo                 # small comparison on the embedded digits data, < 2 min on CPU
    fedjax-sel list                 # strategies, data sets, models, availability models, ...
    fedjax-sel run [--config FILE] [--strategy NAME --dataset NAME ...] --out DIR
    fedjax-sel run --resume DIR     # continue a killed run from its checkpoint
    fedjax-sel sweep FILE.toml --out DIR            # strategies x settings x seeds, compared
    fedjax-sel compare DIR... --baseline NAME --out DIR
    fedjax-sel bench throughput|kernels|sweep ...   # JSON + printed table
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
    if a.resume is None:
        out = Path(a.out or f"runs/{config.strategy}-{config.dataset}")
    result = run_experiment(
        config, out, progress=not a.no_progress, resume=a.resume is not None, echo=_echo
    )
    print_summary_table([result.summary])
    print(f"outputs written to {out}/ (config.json, metrics.jsonl, summary.json, curves.png)")
    return 1 if result.summary.get("diverged") else 0


def _config_fields() -> set[str]:
    import dataclasses

    from fedjax_sel.config import RunConfig

    return {f.name for f in dataclasses.fields(RunConfig)}


def _echo(*args) -> None:
    print(*args, file=sys.stderr)


def cmd_demo(a: argparse.Namespace) -> int:
    from fedjax_sel.demo import run_demo

    run_demo(Path(a.out), rounds=a.rounds, progress=not a.no_progress)
    return 0


def cmd_sweep(a: argparse.Namespace) -> int:
    from fedjax_sel.experiment import run_sweep

    out = Path(a.out or f"runs/sweep-{Path(a.file).stem}")
    together = a.seeds_together
    if together is not None and together != "auto":
        try:
            together = int(together)
        except ValueError:
            raise ConfigError(
                f"--seeds-together must be 'auto' or a number, got {together!r}"
            ) from None
    run_sweep(
        a.file,
        out,
        seeds_together=together,
        progress=not a.no_progress,
        compare_results=not a.no_compare,
    )
    print(f"\nsweep written to {out}/ (runs/, comparison.json, comparison.md, comparison.png)")
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from fedjax_sel.experiment import compare

    compare(
        a.dirs,
        baseline=a.baseline,
        metrics=a.metric,
        at_rounds=a.at_round or (),
        targets=a.target or (),
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

    section("strategies (--strategy; --strategy-arg key=value):", STRATEGIES)
    section(
        "data sets (--dataset; --dataset-arg key=value):",
        DATASETS,
        lambda e: (
            f"default: {e.info['default_clients']} clients, partition "
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
    section("personalized methods (--mode personalized --strategy NAME):", PERSONALIZED_METHODS)
    section("reproductions (fedjax-sel reproduce NAME):", REPRODUCTIONS)
    section("kernel benchmarks (fedjax-sel bench kernels --kernel NAME):", KERNEL_BENCHMARKS)
    return 0


def cmd_bench(a: argparse.Namespace) -> int:
    from fedjax_sel import bench

    if a.what == "throughput":
        rows = bench.throughput_main(
            models=a.model or ["logreg"],
            per_rounds=a.per_round or [None],
            modes=a.mode,
            local_steps=a.local_steps,
            batch_size=a.batch_size,
            repeats=a.repeats,
            out=a.out,
        )
    elif a.what == "sweep":
        rows = bench.sweep_main(
            models=a.model,
            seeds=a.seeds or None,
            rounds=a.rounds,
            repeats=a.repeats,
            out=a.out,
        )
    else:
        rows = bench.kernels_main(kernels=a.kernel, clients=a.clients, repeats=a.repeats, out=a.out)
    return 0 if rows else 1


def cmd_reproduce(a: argparse.Namespace) -> int:
    from fedjax_sel.registry import parse_pairs
    from fedjax_sel.reproduce import REPRODUCTIONS

    REPRODUCTIONS.build(
        a.name,
        seeds=a.seeds,
        out=Path(a.out or f"runs/reproduce-{a.name}/{a.profile}-{a.size}"),
        size=a.size,
        profile=a.profile,
        data_dir=a.data_dir,
        **parse_pairs(a.option, what="--option"),
    )
    return 0


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

    p = sub.add_parser("demo", help="small strategy comparison on embedded data (< 2 min CPU)")
    p.add_argument("--out", default="runs/demo", help="output folder")
    p.add_argument("--rounds", type=int, default=60)
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
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_config_flags(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="run a sweep file (strategies x settings x seeds) + compare")
    p.add_argument("file", help="sweep file (TOML or JSON; see examples/sweep_digits.toml)")
    p.add_argument("--out", default=None, help="output folder (default runs/sweep-<file>)")
    p.add_argument(
        "--seeds-together",
        default=None,
        help="seeds per vmapped batch: auto (by memory) or a number (default: the file's)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-compare", action="store_true", help="skip the comparison at the end")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("compare", help="paired comparison of finished runs over seeds")
    p.add_argument("dirs", nargs="+", help="run or sweep folders (searched recursively)")
    p.add_argument("--baseline", default=None, help="label/strategy to pair the others against")
    p.add_argument("--metric", action="append", help="summary metric (repeatable)")
    p.add_argument("--at-round", type=int, action="append", help="accuracy at round R")
    p.add_argument("--target", type=float, action="append", help="rounds to accuracy A")
    p.add_argument("--out", default=None, help="write comparison.json/csv/md/png here")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="throughput, kernel and sweep benchmarks (JSON + table)")
    p.add_argument("what", choices=("throughput", "kernels", "sweep"))
    p.add_argument("--model", action="append", help="throughput/sweep: logreg, mlp, cnn, lstm")
    p.add_argument("--per-round", type=int, action="append", help="throughput: clients per round")
    p.add_argument(
        "--mode",
        action="append",
        help="throughput: engine modes to time (auto, vmap, map, chunked:C); default auto",
    )
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--kernel", action="append", help="kernels: names (default all)")
    p.add_argument("--clients", type=int, action="append", help="kernels: K values")
    p.add_argument("--seeds", type=int, action="append", help="sweep: seeds together (1 4 16)")
    p.add_argument("--rounds", type=int, default=20, help="sweep: rounds per run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON output file")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("reproduce", help="reproduce a paper's tables and figures")
    p.add_argument("name")
    p.add_argument("--seeds", type=int, default=5, help="paired seeds (default 5)")
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
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="a reproduction's own option (`fedjax-sel list`), e.g. tables=I-II",
    )
    p.set_defaults(func=cmd_reproduce)
    return parser


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
    working directory is searched first."""
    if modules and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
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
    except KeyboardInterrupt:
        print("fedjax-sel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
