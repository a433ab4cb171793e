"""One configuration path: the registries' typed options, RunConfig as the single owner of
every setting (flags generated from its fields), bad values named with exit status 2, and the
path from CLI flags to a Simulation for every registered model."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Literal

import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import build_parser, main
from fedjax_sel.config import RunConfig, add_config_flags, config_from_flags
from fedjax_sel.data.datasets import DATASETS
from fedjax_sel.experiment import build_simulation
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.models import MODELS
from fedjax_sel.registry import Registry, convert, parse_pairs, parse_spec
from fedjax_sel.strategies import STRATEGIES


# ----------------------------------------------------------------------------- the registry
def test_one_typed_conversion():
    assert convert("3", int, what="w", key="k") == 3
    assert convert("1e3", int, what="w", key="k") == 1000
    assert convert("0.5", float, what="w", key="k") == 0.5
    assert convert("yes", bool, what="w", key="k") is True
    assert convert("200-200", tuple[int, ...], what="w", key="k") == (200, 200)
    assert convert("0.9/-0.5", tuple[float, ...], what="w", key="k") == (0.9, -0.5)
    assert convert([4, 5], tuple[int, ...], what="w", key="k") == (4, 5)
    assert convert("none", int | None, what="w", key="k") is None
    assert convert("xla", Literal["patches", "xla"], what="w", key="k") == "xla"
    for value, annotation, message in [
        ("abc", int, "is not a valid integer"),
        ("1.5", int, "is not a valid integer"),
        ("abc", float, "is not a valid number"),
        ("maybe", bool, "is not a valid boolean"),
        ("foo", Literal["a", "b"], "choice (one of 'a', 'b')"),
        ("1-x", tuple[int, ...], "sequence of integers"),
    ]:
        with pytest.raises(ConfigError) as e:
            convert(value, annotation, what="model 'm'", key="k")
        assert f"model 'm': k={value!r}" in str(e.value) and message in str(e.value)


def test_parsers():
    assert parse_pairs(["a=1,b=x", "c=2"], what="--flag") == {"a": "1", "b": "x", "c": "2"}
    assert parse_pairs("d=20;variant=cpow", what="inner", sep=";") == {"d": "20", "variant": "cpow"}
    with pytest.raises(ConfigError, match="--flag expects key=value, got 'oops'"):
        parse_pairs("oops", what="--flag")
    assert parse_spec("chunked:8", what="p") == ("chunked", ["8"], {})


def test_registration_rules():
    reg = Registry("widget", fixed=("size",))

    @reg.register("a", description="first")
    def a(*, size, depth: int = 2, mode: Literal["x", "y"] = "x"):
        return (size, depth, mode)

    assert reg.build("a", size=1, depth="5", mode="y") == (1, 5, "y")
    assert list(reg["a"].options) == ["depth", "mode"]
    reg.register("a", description="first again")(a)  # the same function: a notebook rerun
    with pytest.raises(ConfigError, match="already registered"):

        @reg.register("a", description="another")
        def other(*, size):
            return size

    reg.register("a", description="replaced", replace=True)(lambda *, size: -size)
    assert reg.build("a", size=3) == -3
    with pytest.raises(ConfigError, match="unknown widget 'b'; known: a"):
        reg["b"]
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['nope'\]"):
        reg.resolve("a", {"nope": 1})


# ----------------------------------------------------------------------------- RunConfig
def test_every_field_has_one_generated_flag_and_no_duplicated_default():
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {f.name for f in dataclasses.fields(RunConfig)}
    # defaults live in RunConfig only: the parser's namespace holds just the flags given
    assert vars(parser.parse_args([])) == {}
    ns = parser.parse_args(["--clients", "17", "--strategy-arg", "d=3", "--no-profile"])
    assert vars(ns) == {"num_clients": 17, "strategy_args": ["d=3"], "profile": False}
    config = config_from_flags(ns)
    assert config.num_clients == 17 and config.strategy_args == {"d": "3"}
    assert config.local_steps == 10  # neither steps nor epochs given: 10 steps


def test_resnet_width_is_a_documented_model_option():
    """The bug the single path removes: resnet18's documented options used to be refused."""
    resolved = resolve(RunConfig(model="resnet18", model_args={"width": "32"}, dataset="cifar10"))
    assert resolved.config.model_args == {"width": 32}


def test_validation_names_values():
    for kw, message in [
        ({"lr": 0.0}, "lr must be a positive number, got 0.0"),
        ({"per_round": 0}, "per_round must be >= 1, got 0"),
        ({"momentum": 1.0}, "momentum must be >= 0 and < 1, got 1.0"),
        ({"test_fraction": 1.0}, "test_fraction must be >= 0 and < 1"),
        ({"server": "rmsprop"}, "server='rmsprop' is not a valid choice"),
        ({"rounds": "ten"}, "rounds='ten' is not a valid integer"),
        ({"local_steps": 3, "local_epochs": 2}, "give --local-steps or --local-epochs, not both"),
        # a target no accuracy can reach is refused, each number of the tuple checked
        ({"accuracy_targets": (0.8, 1.5)}, "accuracy_targets must be > 0 and <= 1, got (0.8, 1.5)"),
        ({"accuracy_targets": (0.0,)}, "accuracy_targets must be > 0 and <= 1"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            RunConfig(**kw).validate()
    with pytest.raises(ConfigError, match="unknown configuration key"):
        RunConfig.from_dict({"roundz": 3})


def test_seeds_are_whole_numbers_in_the_range_a_key_keeps():
    """jax.random.key keeps 32 bits (2**32 would repeat seed 0) and NumPy refuses negative
    seeds: anything outside 0 .. 2**32 - 1, or a bool, is one named error."""
    top = 2**32 - 1
    assert RunConfig(seed=top, data_seed=top).validate().seed == top
    for kw, message in [
        ({"seed": -1}, f"seed must be in 0 .. {top}, got -1"),
        ({"seed": 2**32}, f"seed must be in 0 .. {top}, got {2**32}"),
        ({"seed": 10**23}, f"seed must be in 0 .. {top}, got {10**23}"),
        ({"data_seed": -5}, f"data_seed must be in 0 .. {top}, got -5"),
        ({"seed": True}, "seed=True is not a valid integer"),
    ]:
        with pytest.raises(ConfigError, match=message):
            RunConfig(**kw).validate()


def test_more_clients_a_round_than_clients_is_refused_when_validated():
    with pytest.raises(ConfigError, match=r"per_round=10 exceeds the number of clients \(5\)"):
        RunConfig(num_clients=5, per_round=10).validate()
    with pytest.raises(ConfigError, match=r"per_round=8 \(--async's concurrency\) exceeds"):
        resolve(
            RunConfig(
                num_clients=5, per_round=3, system="lognormal", asynchronous="fedbuff:concurrency=8"
            )
        )
    # mode=personalized trains every client: per_round is not read there
    assert RunConfig(mode="personalized", strategy="sp_cacw", num_clients=5).validate()


def test_a_files_numbers_must_not_be_quoted_and_integers_fit_int32():
    """``rounds = "5"`` in a file is refused, naming the key and the value (the command line's
    text is typed by its flags); integers beyond int32 and absurd chunks are refused."""
    for key, value in [("lr", "0.1"), ("rounds", "5"), ("num_clients", "12")]:
        with pytest.raises(ConfigError, match=f"f.toml: {key}='{value}' is text where a number"):
            RunConfig.from_dict({key: value}, source="f.toml")
    assert RunConfig.from_dict({"num_clients": "none"}).num_clients == "none"  # TOML's null
    with pytest.raises(ConfigError, match="rounds must be at most 2147483647, got 10"):
        RunConfig(rounds=10**20).validate()
    with pytest.raises(ConfigError, match="eval_every=2000000000 is more than the 1 rounds"):
        RunConfig(rounds=1, eval_every=2 * 10**9).validate()


def test_personalized_mode_refuses_the_settings_it_would_ignore():
    base = dict(mode="personalized", strategy="sp_cacw", dataset="clustered_mnist")
    with pytest.raises(ConfigError, match=r"ignores --per-round: leave them out"):
        resolve(RunConfig(**base, per_round=5))
    with pytest.raises(ConfigError, match=r"ignores --availability, --server-lr, --parallel"):
        resolve(RunConfig(**base, availability="markov", server_lr=0.5, parallel="vmap"))
    # the settings it reads are accepted, and a global run keeps every setting
    resolve(RunConfig(**base, lr=0.1, local_steps=5, batch_size=16))
    resolve(RunConfig(strategy="uniform", per_round=5, availability="markov", parallel="vmap"))


def _options(registry):
    for name in sorted(registry):
        for key, opt in registry[name].options.items():
            yield name, key, opt


def _bad_text(annotation) -> str | None:
    """A text value the option's type refuses (None for free-form strings)."""
    alternatives = typing.get_args(annotation) or (annotation,)
    if any(a is str for a in alternatives) and typing.get_origin(annotation) is not Literal:
        return None
    return "abc" if typing.get_origin(annotation) is not Literal else "not-a-choice"


@pytest.mark.parametrize(
    "flag, registry, field",
    [
        ("--strategy-arg", STRATEGIES, "strategy"),
        ("--model-arg", MODELS, "model"),
        ("--dataset-arg", DATASETS, "dataset"),
    ],
)
def test_every_registered_option_refuses_a_bad_value_with_status_2(flag, registry, field, capsys):
    checked = 0
    for name, key, opt in _options(registry):
        bad = _bad_text(opt.annotation)
        if bad is None:
            continue
        base = {"model": ["--dataset", "cifar10"], "dataset": [], "strategy": []}[field]
        if field == "model" and name in ("logreg", "mlp"):
            base = []
        if field == "model" and name == "linreg":
            base = ["--dataset", "regression"]
        if field == "model" and name == "lstm":
            base = ["--dataset", "shakespeare"]
        rc = main(["run", f"--{field}", name, *base, flag, f"{key}={bad}", "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2, (name, key, err)
        assert f"{key}={bad!r}" in err and "Traceback" not in err, (name, key, err)
        checked += 1
    assert checked >= {"strategy": 60, "model": 5, "dataset": 10}[field]


def test_bad_model_values_the_type_accepts_are_refused(capsys):
    for args, message in [
        (["--model-arg", "hidden=0"], "hidden[0] must be a positive integer, got 0"),
        (["--model-arg", "ridge=-1"], "ridge coefficient must be >= 0"),
        (["--dataset-arg", "alpha=abc", "--dataset", "leaf_synthetic"], "alpha='abc'"),
    ]:
        assert main(["run", *args, "--no-progress"]) == 2
        assert message in capsys.readouterr().err


# ----------------------------------------------------------------------------- to a Simulation
def _fake_cifar(path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (200, 32, 32, 3)).astype(np.uint8)
    y = np.arange(200) % 10
    np.savez(path / "cifar10.npz", x_train=x, y_train=y, x_test=x[:20], y_test=y[:20])
    return path


def _tiny_stackoverflow(path):
    """TFF's Stack Overflow layout, three users and a two-word vocabulary."""
    import h5py

    text = h5py.string_dtype()
    for split, users in (("train", {"1": ["a b", "b"], "2": ["a"], "3": ["b c a"]}),
                         ("test", {"1": ["b a"], "3": ["a"]})):  # fmt: skip
        with h5py.File(path / f"stackoverflow_{split}.h5", "w") as f:
            for cid, sentences in users.items():
                tokens = np.array([s.encode() for s in sentences], object)
                f.create_dataset(f"examples/{cid}/tokens", data=tokens, dtype=text)
    (path / "stackoverflow.word_count").write_text("a\t3\nb\t2\n")
    return path


@pytest.mark.parametrize("model", sorted(MODELS))
def test_cli_flags_to_a_simulation_for_every_registered_model(model, tmp_path, data_dir):
    """Flags -> RunConfig -> Simulation, for each model on a data set of its input kind."""
    flags = {
        "logreg": ["--dataset", "digits"],
        "mlp": ["--dataset", "digits", "--model-arg", "hidden=16-8"],
        "linreg": ["--dataset", "regression", "--clients", "10"],
        "cnn": ["--dataset", "mnist", "--data-dir", str(data_dir / "mnist.npz"), "--clients", "20"],
        "lstm": [
            "--dataset",
            "shakespeare",
            "--data-dir",
            str(data_dir / "shakespeare"),
            "--clients",
            "4",
            "--dataset-arg",
            "max_examples=80",
            "--model-arg",
            "lstm_hidden=16,lstm_layers=1",
        ],
        "lstm_words": [
            "--dataset",
            "stackoverflow",
            "--data-dir",
            str(_tiny_stackoverflow(tmp_path)),
            "--dataset-arg",
            "vocab_size=2,sequence_length=4",
            "--model-arg",
            "embed_dim=4,lstm_hidden=8",
        ],
        "resnet18": [
            "--dataset",
            "cifar10",
            "--data-dir",
            str(_fake_cifar(tmp_path)),
            "--clients",
            "5",
            "--model-arg",
            "width=4",
        ],
    }[model]
    ns = build_parser().parse_args(["run", "--model", model, "--per-round", "2", *flags])
    resolved = resolve(config_from_flags(ns))
    config = resolved.config
    sim = build_simulation(resolved)
    assert sim.spec.model.name == model and sim.spec.per_round == 2
    assert sim.dataset.num_clients == (config.num_clients or {"lstm_words": 3}.get(model, 20))
    x = sim.dataset.test_x[:2]
    import jax

    params = jax.eval_shape(sim.spec.model.init, jax.random.key(0))
    out = jax.eval_shape(sim.spec.model.apply, params, x)
    assert out.shape[0] == 2


def test_every_spec_option_refuses_a_bad_value_with_status_2(capsys):
    """--availability, --system and --async specs: a bad option value exits 2 naming it."""
    from fedjax_sel.availability import AVAILABILITY
    from fedjax_sel.engine.fedbuff import ASYNC
    from fedjax_sel.engine.system import SYSTEMS

    checked = 0
    for flag, registry, extra in (
        ("--availability", AVAILABILITY, []),
        ("--system", SYSTEMS, []),
        ("--async", ASYNC, ["--system", "lognormal"]),
    ):
        for name, key, opt in _options(registry):
            bad = _bad_text(opt.annotation)
            if bad is None:
                continue
            rc = main(["run", flag, f"{name}:{key}={bad}", *extra, "--no-progress"])
            err = capsys.readouterr().err
            assert rc == 2, (flag, name, key, err)
            assert key in err and bad in err and "Traceback" not in err, (flag, name, key, err)
            checked += 1
    assert checked >= 25
