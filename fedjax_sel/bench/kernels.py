"""``fedjax-sel bench kernels``: latency of one call of each selection kernel against K.

A kernel benchmark is a builder ``build(num_clients) -> (fn, args)``; the harness jits ``fn``,
calls it once to compile, then reports the median of ``repeats`` calls as a row
``{"kernel": NAME, "clients": K, "seconds": S}`` (plus ``compile_seconds``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import jax

from fedjax_sel.bench.common import print_table, time_call, write_json_rows
from fedjax_sel.experiment.provenance import machine_info
from fedjax_sel.registry import Registry

KERNEL_BENCHMARKS = Registry(
    "kernel benchmark", fixed=("num_clients",), package="fedjax_sel.bench", prefix="kernels_"
)


def register_kernel(
    name: str,
    *,
    default_clients: tuple[int, ...] = (10**3, 10**4, 10**5, 10**6),
    description: str = "",
    max_clients: int | None = None,
) -> Callable:
    """Decorator registering ``build(num_clients) -> (fn, args)``; ``max_clients``: larger K
    cannot fit (e.g. a dense K x K matrix)."""
    return KERNEL_BENCHMARKS.register(
        name,
        description=description,
        default_clients=tuple(default_clients),
        max_clients=max_clients,
    )


def kernels_main(
    kernels: list[str] | None = None,
    clients: list[int] | None = None,
    *,
    repeats: int = 5,
    out: str | None = None,
) -> list[dict]:
    """Times the named kernels (all when ``None``) at each K in ``clients`` (each kernel's
    defaults when ``None``); prints a table and writes the rows as a JSON list to ``out``."""
    names = kernels or sorted(KERNEL_BENCHMARKS)
    entries = [KERNEL_BENCHMARKS[n] for n in names]  # unknown names: a ConfigError naming them
    rows = []
    for name, bench in zip(names, entries, strict=True):
        limit = bench.info["max_clients"]
        for k in clients or bench.info["default_clients"]:
            if limit is not None and k > limit:
                print(f"  {name} K={k}: skipped, above its limit of {limit} clients")
                continue
            fn, args = bench.factory(int(k))
            jfn = jax.jit(fn)
            try:
                t = time_call(lambda jfn=jfn, args=args: jfn(*args), repeats=repeats)
            except jax.errors.JaxRuntimeError as err:
                if "RESOURCE_EXHAUSTED" not in str(err):
                    raise
                print(f"  {name} K={k}: skipped, out of device memory ({str(err)[:120]})")
                continue
            rows.append(
                {
                    "kernel": name,
                    "clients": int(k),
                    "seconds": t["seconds"],
                    "milliseconds": t["seconds"] * 1e3,
                    "min_seconds": t["min_seconds"],
                    "compile_seconds": t["first_seconds"] - t["seconds"],
                }
            )
            print(f"  {name} K={k}: {t['seconds'] * 1e3:.3f} ms", flush=True)
    info = machine_info()
    print(f"device: {info['device_kind']} ({info['backend']}), jax {info['jax_version']}")
    print_table(
        rows,
        [
            ("kernel", "kernel", "{}"),
            ("K", "clients", "{}"),
            ("median ms", "milliseconds", "{:.3f}"),
            ("compile s", "compile_seconds", "{:.2f}"),
        ],
    )
    write_json_rows(out, [dict(r, device=info["device_kind"]) for r in rows])
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``fedjax-sel bench kernels``'s flags."""
    p.add_argument("--kernel", action="append", help="names (default all)")
    p.add_argument("--clients", type=int, action="append", help="K values")
    p.add_argument("--repeats", type=int, default=5, help="timed calls")
    p.add_argument("--out", default=None, help="JSON output file")


def main(a: argparse.Namespace) -> list[dict]:
    """``fedjax-sel bench kernels``: :func:`kernels_main` with the flags."""
    return kernels_main(kernels=a.kernel, clients=a.clients, repeats=a.repeats, out=a.out)
