"""``fedjax-sel list``: every name a flag can take, with its options."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Declares ``list``."""
    p = sub.add_parser("list", help="strategies, data sets, models, availability models, ...")
    p.set_defaults(func=cmd_list)


def cmd_list(a: argparse.Namespace) -> int:
    """Prints every registry: names, descriptions and options."""
    del a
    from fedjax_sel.availability import AVAILABILITY
    from fedjax_sel.bench import KERNEL_BENCHMARKS
    from fedjax_sel.data.datasets import DATASETS
    from fedjax_sel.data.partition import PARTITIONS
    from fedjax_sel.engine.fedbuff import ASYNC
    from fedjax_sel.engine.system import SYSTEMS
    from fedjax_sel.experiment.reproductions import REPRODUCTIONS
    from fedjax_sel.models import MODELS
    from fedjax_sel.personalized.methods import PERSONALIZED_METHODS
    from fedjax_sel.strategies import STRATEGIES
    from fedjax_sel.strategies.registry import traced_values

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
            "traced (a grid of them shares one program): " + ", ".join(traced)
            # what the strategy traces at its defaults, with a run's default 10 slots
            if (traced := traced_values(e.name, 10, {}))
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
    section("system models (--system NAME:key=value,...):", SYSTEMS)
    section("asynchronous modes (--async NAME:key=value,...):", ASYNC)
    section("personalized methods (--mode personalized --strategy NAME):", PERSONALIZED_METHODS)
    section("reproductions (fedjax-sel reproduce NAME):", REPRODUCTIONS)
    section("kernel benchmarks (fedjax-sel bench kernels --kernel NAME):", KERNEL_BENCHMARKS)
    return 0
