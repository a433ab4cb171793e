"""Stack Overflow next-word prediction as TensorFlow Federated publishes it: small
``stackoverflow_{train,test}.h5`` and ``stackoverflow.word_count`` files written here (users of
unequal sizes, known words, out-of-vocabulary words, a sentence longer than the sequence),
read back token by token; the per-token masked loss and accuracy of ``lstm_words`` against a
NumPy reference; clear errors for missing and malformed files; a two-round run."""

from __future__ import annotations

import dataclasses
import math

import h5py  # the federated extra, also in the test extra
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_sel.base import ConfigError
from fedjax_sel.cli.main import main
from fedjax_sel.config import RunConfig
from fedjax_sel.data import dataset_stackoverflow as so
from fedjax_sel.data import load_dataset
from fedjax_sel.experiment.build import build_simulation
from fedjax_sel.experiment.resolve import resolve
from fedjax_sel.experiment.run import run_experiment
from fedjax_sel.models import make_model

# the published word counts, most frequent first; the first 6 are the vocabulary below
WORD_COUNTS = [("the", 900), ("to", 800), ("i", 700), ("a", 650), ("python", 600),
               ("list", 500), ("how", 400), ("sort", 300)]  # fmt: skip
V, T = 6, 5  # vocab_size, sequence_length
OOV, BOS, EOS = V + 1, V + 2, V + 3  # TFF: 0 pad, words 1..V, then OOV, BOS, EOS
ID = {w: i + 1 for i, (w, _) in enumerate(WORD_COUNTS[:V])}

TRAIN = {  # users of 1, 3, 6, 2 and 8 sentences
    "00000001": ["how to sort a list"],  # exactly T words: no EOS
    "00000002": ["the list", "i", "python to the a list i the to"],  # the last is cut to T
    "00000003": ["a python", "sort the list", "to", "i i i", "the", "list to python"],
    "00000004": ["how", "the python list"],
    "00000005": ["a", "to a", "the i", "python", "list list", "i to", "a sort", "the end"],
}
TEST = {  # 00000002, 00000004, 00000005 have no test sentences; 00000009 never trained
    "00000001": ["how to sort"],
    "00000003": ["python list", "the a to i python list"],
    "00000009": ["to the"],
}


def _reference(sentence: str, vocab: dict[str, int] = ID, t: int = T) -> list[int]:
    """``[BOS] + ids + [EOS]``, cut to ``t + 1`` and padded with 0 (the brief's wording of
    TFF's ``to_ids``, which appends EOS only below ``t`` words: the same tokens)."""
    ids = [vocab.get(w, OOV) for w in sentence.split(" ")]
    row = ([BOS] + ids + [EOS])[: t + 1]
    return row + [0] * (t + 1 - len(row))


def _write_h5(path, users: dict[str, list[str]], **extra):
    with h5py.File(path, "w") as f:
        for cid, sentences in users.items():
            text = h5py.string_dtype()  # variable-length strings, read back as bytes
            tokens = np.array([s.encode() for s in sentences], object)
            f.create_dataset(f"examples/{cid}/tokens", data=tokens, dtype=text)
            # TFF's other features, never read
            f.create_dataset(f"examples/{cid}/score", data=np.arange(len(sentences)))
            kind = np.array([b"answer"] * len(sentences), object)
            f.create_dataset(f"examples/{cid}/type", data=kind, dtype=text)
        for key, value in extra.items():
            f.create_dataset(key, data=value)


def write_stackoverflow(folder, train=TRAIN, test=TEST, word_counts=True):
    folder.mkdir(parents=True, exist_ok=True)
    _write_h5(folder / "stackoverflow_train.h5", train)
    _write_h5(folder / "stackoverflow_test.h5", test)
    if word_counts:
        lines = "".join(f"{w}\t{c}\n" for w, c in WORD_COUNTS)
        (folder / "stackoverflow.word_count").write_text(lines)
    return folder


@pytest.fixture(scope="module")
def so_dir(tmp_path_factory):
    return write_stackoverflow(tmp_path_factory.mktemp("stackoverflow"))


def _load(folder, **kwargs):
    return load_dataset("stackoverflow", data_path=folder, vocab_size=V, sequence_length=T,
                        **kwargs)  # fmt: skip


def _client(cd, k):
    x, y = cd.client_arrays(k)
    return np.asarray(x), np.asarray(y)


def test_token_ids_the_shift_and_the_client_sizes(so_dir):
    ds = _load(so_dir)
    ids = list(TRAIN)
    assert ds.info["clients"] == ids and ds.num_clients == 5
    assert ds.num_classes == V + 4 and ds.input_shape == (T,)
    assert ds.train.x.dtype == np.uint16 and ds.train.y.dtype == np.uint16
    assert ds.train.target_shape == (T,)
    # 1, 3, 6, 2, 8 sentences: padding to the largest would store 40 rows for 20
    assert [int(c) for c in np.asarray(ds.train.counts)] == [1, 3, 6, 2, 8]
    assert ds.train.layout == "flat" and ds.info["layout"] == "flat"
    assert ds.info["special_tokens"] == {"pad": 0, "oov": [OOV], "bos": BOS, "eos": EOS}
    assert ds.info["vocabulary"].endswith("stackoverflow.word_count (first 6 words)")
    # written out by hand: "how to sort a list" has T words, so no EOS; how and sort are OOV
    x, y = _client(ds.train, 0)
    np.testing.assert_array_equal(x, [[BOS, OOV, 2, OOV, 4]])
    np.testing.assert_array_equal(y, [[OOV, 2, OOV, 4, 6]])
    x, y = _client(ds.train, 1)
    np.testing.assert_array_equal(x, [[BOS, 1, 6, EOS, 0], [BOS, 3, EOS, 0, 0], [BOS, 5, 2, 1, 4]])
    np.testing.assert_array_equal(y, [[1, 6, EOS, 0, 0], [3, EOS, 0, 0, 0], [5, 2, 1, 4, 6]])
    for split, data, users in (("train", ds.train, TRAIN), ("test", ds.test, TEST)):
        for k, cid in enumerate(ids):
            x, y = _client(data, k)
            want = np.array([_reference(s) for s in users.get(cid, [])]).reshape(-1, T + 1)
            np.testing.assert_array_equal(x, want[:, :-1], err_msg=f"{split} {cid}")
            np.testing.assert_array_equal(y, want[:, 1:], err_msg=f"{split} {cid}")
            np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    # per-client test splits of the training users; the central test set is their union
    assert [int(c) for c in np.asarray(ds.test.counts)] == [1, 0, 2, 0, 0]
    assert ds.info["clients_without_test_sentences"] == 3
    assert ds.info["test_users_not_in_training"] == 1  # 00000009
    want = np.array([_reference(s) for s in TEST["00000001"] + TEST["00000003"]])
    np.testing.assert_array_equal(np.asarray(ds.test_x), want[:, :-1])
    np.testing.assert_array_equal(np.asarray(ds.test_y), want[:, 1:])
    assert ds.info["num_train_examples"] == 20 and ds.info["num_test_examples"] == 3
    assert ds.info["train_bytes"] == 20 * T * 2 * 2  # x and y, uint16


def test_a_seeded_subset_is_read_and_only_it(so_dir, monkeypatch):
    read: list[list[str]] = []
    original = so.iter_tff_clients

    def spy(path, features, clients=None):
        read.append(list(clients))
        return original(path, features, clients)

    monkeypatch.setattr(so, "iter_tff_clients", spy)
    ds = _load(so_dir, num_clients=2, seed=3)
    again = _load(so_dir, num_clients=2, seed=3)
    chosen = ds.info["clients"]
    assert chosen == again.info["clients"] and len(chosen) == 2 and set(chosen) < set(TRAIN)
    assert chosen == [c for c in TRAIN if c in chosen]  # kept in file order
    assert ds.info["clients_subsampled"] and ds.info["subsample_seed"] == 3
    assert ds.info["clients_in_files"] == 5
    assert all(set(r) <= set(chosen) for r in read)  # nobody else's sentences were read
    sizes = [len(TRAIN[c]) for c in chosen]
    assert [int(c) for c in np.asarray(ds.train.counts)] == sizes
    for k, cid in enumerate(chosen):
        x, _ = _client(ds.train, k)
        np.testing.assert_array_equal(x, [_reference(s)[:-1] for s in TRAIN[cid]])
    with pytest.raises(ConfigError, match="stackoverflow has 5 clients in its files but 9"):
        _load(so_dir, num_clients=9)


def test_central_test_sample_and_oov_buckets(so_dir):
    ds = _load(so_dir, central_test_examples=2)
    assert ds.test_x.shape == (2, T) and ds.info["central_test_examples"] == 2
    assert [int(c) for c in np.asarray(ds.test.counts)] == [1, 0, 2, 0, 0]  # whole
    two = _load(so_dir, oov_buckets=2)
    assert two.num_classes == V + 5
    assert two.info["special_tokens"] == {"pad": 0, "oov": [7, 8], "bos": 9, "eos": 10}
    x, _ = _client(two.train, 0)  # "how to sort a list": how and sort hashed to a bucket
    assert x[0, 0] == 9 and set(x[0, [1, 3]]) <= {7, 8} and list(x[0, [2, 4]]) == [2, 4]
    # a word always goes to the same bucket
    x3, _ = _client(two.train, 3)  # "how", "the python list"
    assert x3[0, 1] == x[0, 1]


def test_without_word_counts_the_vocabulary_comes_from_the_clients_read(tmp_path):
    folder = write_stackoverflow(tmp_path / "so", word_counts=False)
    with pytest.warns(UserWarning, match=r"building the vocabulary from the 5 training clients"):
        ds = _load(folder)
    assert ds.info["vocabulary"].startswith("built from the 5 training clients read")
    # users per word: list 5; a, python, the, to 4; i, sort 3 (ties in byte order)
    vocab = {w: i + 1 for i, w in enumerate(["list", "a", "python", "the", "to", "i"])}
    x, _ = _client(ds.train, 0)
    np.testing.assert_array_equal(x[0], _reference("how to sort a list", vocab)[:-1])
    with pytest.raises(ConfigError, match="word_counts file .*nowhere.txt' not found"):
        _load(folder, word_counts=str(tmp_path / "nowhere.txt"))


def test_missing_and_malformed_files_get_errors_that_name_them(tmp_path, capsys):
    with pytest.raises(
        ConfigError, match=r"'stackoverflow_train.h5' not found.*stackoverflow\.tar"
    ):
        _load(tmp_path / "nowhere")
    assert main(["run", "--dataset", "stackoverflow", "--data-dir", str(tmp_path / "nowhere"),
                 "--rounds", "1", "--no-progress"]) == 2  # fmt: skip
    assert "stackoverflow_train.h5' not found" in capsys.readouterr().err

    no_examples = tmp_path / "no_examples"
    no_examples.mkdir()
    for split in ("train", "test"):
        with h5py.File(no_examples / f"stackoverflow_{split}.h5", "w") as f:
            f.create_dataset("other/thing", data=np.zeros(2))
    with pytest.raises(ConfigError, match="has no 'examples' group"):
        _load(no_examples)

    no_tokens = write_stackoverflow(tmp_path / "no_tokens")
    with h5py.File(no_tokens / "stackoverflow_train.h5", "a") as f:
        del f["examples/00000003/tokens"]
    with pytest.raises(
        ConfigError, match=r"client '00000003': no feature 'tokens' \(it has \['score', 'type'\]\)"
    ):
        _load(no_tokens)

    empty = write_stackoverflow(tmp_path / "empty", train={**TRAIN, "00000006": []})
    with pytest.raises(ConfigError, match=r"stackoverflow_train.h5, client '00000006': no sent"):
        _load(empty)

    bad_counts = write_stackoverflow(tmp_path / "bad_counts")
    (bad_counts / "stackoverflow.word_count").write_text("the\t900\nto eight hundred\n")
    with pytest.raises(ConfigError, match=r"line 2 is not 'word<TAB>count'"):
        _load(bad_counts)
    with pytest.raises(ConfigError, match="vocab_size must be a positive integer, got 0"):
        load_dataset("stackoverflow", data_path=bad_counts, vocab_size=0)


def _np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_per_token_loss_and_accuracy_match_numpy():
    model = make_model("lstm_words", input_shape=(T,), num_classes=V + 4, embed_dim=4,
                       lstm_hidden=8)  # fmt: skip
    assert model.target_ndim == 1
    rng = np.random.default_rng(0)
    y = np.array([
        [3, 5, EOS, 0, 0],  # two words, EOS, pad
        [OOV, 2, OOV, 4, 6],  # a full sentence with OOV targets
        [OOV, EOS, 0, 0, 0],  # nothing counted by the accuracy
        [1, 2, 3, 4, 5],
    ])  # fmt: skip
    logits = rng.normal(size=(4, T, V + 4)).astype(np.float32)
    # plant predictions: row 0 right on its first word and its EOS, row 3 right everywhere
    logits[0, 0, 3] = logits[0, 2, EOS] = 9.0
    logits[3, np.arange(T), y[3]] = 9.0
    logits[1, 1, 2] = 9.0  # right on the word 2; its OOV targets are never counted
    logp = _np_log_softmax(logits.astype(np.float64))
    ce = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
    nonpad = y != 0
    want_loss = (ce * nonpad).sum(1) / nonpad.sum(1)
    counted = (y >= 1) & (y <= V)
    right = (logits.argmax(-1) == y) & counted
    want_acc = np.where(counted.sum(1) > 0, right.sum(1) / np.maximum(counted.sum(1), 1), 0.0)
    got_loss = np.asarray(model.loss(jnp.asarray(logits), jnp.asarray(y, jnp.uint16)))
    got_acc = np.asarray(model.correct(jnp.asarray(logits), jnp.asarray(y, jnp.uint16)))
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_acc, want_acc, rtol=1e-6)
    assert got_acc[3] == 1.0 and got_acc[2] == 0.0 and got_acc[0] >= 0.5
    # the model's logits are [B, T, V]
    params = model.init(jax.random.key(0))
    assert model.apply(params, jnp.zeros((2, T), jnp.int32)).shape == (2, T, V + 4)


def test_two_rounds_of_next_word_prediction(so_dir):
    ds = _load(so_dir)
    config = RunConfig(
        dataset="stackoverflow",
        data_path=str(so_dir),
        dataset_args={"vocab_size": V, "sequence_length": T},
        model="lstm_words",
        model_args={"embed_dim": 8, "lstm_hidden": 16},
        strategy="uniform",
        per_round=3,
        rounds=2,
        local_steps=2,
        batch_size=4,
        lr=0.5,
        eval_every=1,
        parallel="vmap",
    )
    result = run_experiment(config, None, progress=False, dataset=ds)
    assert len(result.evals) == 2
    for e in result.evals:
        assert math.isfinite(e["test_loss"]) and 0.0 <= e["test_accuracy"] <= 1.0
    assert result.evals[-1]["test_loss"] < math.log(V + 4) + 1.0
    # a one-label model cannot take sequence targets: refused before any compilation
    wrong = dataclasses.replace(config, model="logreg", model_args={})
    with pytest.raises(ConfigError, match=r"model 'logreg' predicts one target per example.*"
                                          r"targets of shape \(5,\).*lstm_words"):  # fmt: skip
        build_simulation(resolve(wrong), ds)


def test_label_histograms_are_refused_for_sequence_targets_with_a_clear_error(so_dir):
    """Sequences have no label histogram: the strategies and availability models that need one
    say why, naming sequence targets, instead of failing inside JAX."""
    from fedjax_sel.availability import from_spec
    from fedjax_sel.base import SimSpec
    from fedjax_sel.strategies import make_strategy

    ds = _load(so_dir)
    with pytest.raises(ConfigError, match="sequences of shape"):
        ds.train.label_counts(ds.num_classes)
    spec = SimSpec(num_clients=ds.num_clients, per_round=2, num_rounds=2,
                   num_examples=ds.train.counts, params={})  # fmt: skip
    with pytest.raises(ConfigError, match="one label per example, not sequence targets"):
        make_strategy("hetero_select", 2).init(jax.random.key(0), spec)
    with pytest.raises(ConfigError, match="one label per example"):
        from_spec("correlated:by=label").init(jax.random.key(0), ds.num_clients, spec)
