"""One resolution per run: :func:`fedjax_sel.experiment.resolve.resolve` types a configuration's
options and parses its specs once, into a frozen :class:`Resolved` that everything after the
entry point reads; ``config.py`` declares and imports no registry."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import fedjax_sel.registry as registry_lib
import fedjax_sel.training.local as local_lib
from fedjax_sel.base import ConfigError
from fedjax_sel.config import RunConfig
from fedjax_sel.engine.fedbuff import FedBuff
from fedjax_sel.experiment import finished_result, run_experiment
from fedjax_sel.experiment.outdir import stored_config
from fedjax_sel.experiment.outputs import read_json
from fedjax_sel.experiment.resolve import Resolved, Spec, resolve
from fedjax_sel.training.local import Parallel

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = [
    RunConfig(strategy="power_of_choice", strategy_args={"d": "20"}),
    RunConfig(
        per_round=5,
        availability="bernoulli:p=0.9",
        system="lognormal:sigma=0.5",
        asynchronous="fedbuff:concurrency=4,buffer=2",
        parallel="chunked:2",
    ),
    RunConfig(mode="personalized", strategy="sp_cacw", dataset="clustered_mnist"),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["strategy_args", "specs", "personalized"])
def test_resolving_a_resolved_configuration_is_the_identity(config):
    resolved = resolve(config)
    assert isinstance(resolved, Resolved)
    assert resolve(resolved) is resolved  # taken as it is: nothing parsed again
    again = resolve(resolved.config)
    assert again == resolved and again.config.results_key() == resolved.config.results_key()
    with pytest.raises(dataclasses.FrozenInstanceError):
        resolved.config = config  # type: ignore[misc]


def test_the_parsed_values_are_typed():
    r = resolve(CONFIGS[0])
    assert r.strategy_args == r.config.strategy_args == {"d": 20}
    assert CONFIGS[0].strategy_args == {"d": "20"}  # the caller's configuration is unchanged
    assert (r.availability, r.system, r.asynchronous) == (Spec("always", {}), None, None)
    assert r.parallel == Parallel("auto")
    r = resolve(CONFIGS[1])
    assert r.availability == Spec("bernoulli", {"p": 0.9})
    assert r.system == Spec("lognormal", {"sigma": 0.5})
    assert r.asynchronous == FedBuff(4, 2, 0.5)
    assert r.parallel == Parallel("chunked", 2, None)
    # --async sets the clients in flight: the canonical configuration records its concurrency
    assert (CONFIGS[1].per_round, r.config.per_round) == (5, 4)
    # without a concurrency, FedBuff keeps per_round clients in flight
    r = resolve(RunConfig(per_round=6, system="lognormal", asynchronous="fedbuff:buffer=3"))
    assert r.asynchronous == FedBuff(6, 3, 0.5) and r.config.per_round == 6


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"strategy": "power_of_choice", "strategy_args": {"nope": "1"}}, "nope"),
        ({"strategy": "power_of_choice", "strategy_args": {"d": "abc"}}, "d='abc'"),
        ({"strategy": "no_such_strategy"}, "no_such_strategy"),
        ({"availability": "markov:pi=abc"}, "pi='abc'"),
        ({"availability": "markov:nope=1"}, "nope"),
        ({"availability": "sometimes"}, "sometimes"),
        ({"system": "lognormal:sigma=abc"}, "sigma='abc'"),
        ({"system": "lognormal:nope=1"}, "nope"),
        ({"system": "lognormal", "asynchronous": "fedbuff:buffer=abc"}, "buffer='abc'"),
        ({"system": "lognormal", "asynchronous": "fedbuff:nope=1"}, "nope"),
        ({"system": "lognormal", "asynchronous": "fedbuf"}, "fedbuf"),
        ({"parallel": "chunked:x"}, "chunked:x"),
        ({"parallel": "pmap"}, "pmap"),
        ({"model_args": {"nope": "1"}}, "nope"),
        ({"dataset_args": {"nope": "1"}}, "nope"),
    ],
)
def test_a_bad_option_is_a_config_error_naming_it(fields, named):
    with pytest.raises(ConfigError) as e:
        resolve(RunConfig(**fields))
    assert named in str(e.value)


def test_each_spec_is_parsed_once_per_run(tmp_path, monkeypatch):
    """A run (run_experiment -> run_group -> build_simulation) parses the availability, system,
    asynchronous and parallel texts once each: at the entry point."""
    specs, parallel_texts = Counter(), Counter()
    parse_spec, parse_parallel = registry_lib.parse_spec, local_lib.parse_parallel

    def counting_spec(spec, *, what):
        specs[what] += 1
        return parse_spec(spec, what=what)

    def counting_parallel(spec):
        parallel_texts[spec] += 1
        return parse_parallel(spec)

    # every module's own binding of the parsers (``from ... import parse_spec``) counts too
    for module in list(sys.modules.values()):
        if not (getattr(module, "__name__", None) or "").startswith("fedjax_sel"):
            continue
        for original, counting in (
            (parse_spec, counting_spec),
            (parse_parallel, counting_parallel),
        ):
            name = original.__name__
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting)
    config = RunConfig(
        dataset="digits",
        num_clients=10,
        per_round=3,
        rounds=2,
        eval_every=2,
        local_steps=2,
        batch_size=16,
        availability="bernoulli:p=0.9",
        system="lognormal",
        asynchronous="fedbuff:buffer=2",
        parallel="VMAP",  # a spelling of its own: no other text is counted
    )
    out = tmp_path / "run"
    result = run_experiment(config, out, progress=False, echo=lambda *a: None)
    assert specs["availability"] == 1
    assert specs["system model"] == 1
    assert specs["asynchronous mode"] == 1
    assert parallel_texts["VMAP"] == 1
    # config.json records the canonical configuration: read back as it is, it is the run's
    resolved = resolve(config)
    assert result.config == resolved.config
    assert stored_config(read_json(out / "config.json")).results_key() == (
        resolved.config.results_key()
    )
    assert finished_result(resolved.config, out) is not None


def test_config_module_declares_and_imports_no_registry():
    """config.py has no function-level imports, and importing it loads no registry."""
    tree = ast.parse((ROOT / "fedjax_sel" / "config.py").read_text())
    lazy = [
        node.lineno
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    assert lazy == []
    assert not hasattr(RunConfig, "resolve")
    code = (
        "import sys, fedjax_sel.config; "
        "print(sorted(m for m in sys.modules if m.startswith(('fedjax_sel.strategies', "
        "'fedjax_sel.availability', 'fedjax_sel.engine', 'fedjax_sel.models', "
        "'fedjax_sel.data', 'fedjax_sel.personalized', 'fedjax_sel.training'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"
