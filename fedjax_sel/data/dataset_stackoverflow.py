"""Stack Overflow next-word prediction by user, read from TensorFlow Federated's HDF5 files.

Files (``--data-dir``: the folder holding them, else ``$FEDJAX_SEL_DATA_DIR/stackoverflow/``):

* ``stackoverflow_train.h5``, ``stackoverflow_test.h5`` from TFF's ``stackoverflow.tar.bz2``
  (https://storage.googleapis.com/tff-datasets-public/stackoverflow.tar.bz2, what
  ``tff.simulation.datasets.stackoverflow.load_data`` downloads; its ``stackoverflow_held_out.h5``
  is not read): ``examples/<user id>/`` with one entry per sentence in ``tokens`` (the
  sentence's words separated by single spaces, lower-cased, punctuation split off) and
  ``title``, ``tags``, ``type``, ``creation_date``, ``score``, of which only ``tokens`` is read.
  342,477 training users with 135,818,730 sentences; 204,088 test users with 16,586,035.
* ``stackoverflow.word_count`` from ``stackoverflow.word_count.tar.bz2`` in the same bucket
  (``load_word_counts``): lines ``word<TAB>count``, most frequent first (the count is the
  number of training users who use the word).

Preprocessing: TFF's canonical task, ``tff.simulation.baselines.stackoverflow``
(``word_prediction_preprocessing.build_to_ids_fn`` with ``create_word_prediction_task``'s
defaults), which Reddi et al. 2021 use:

* vocabulary: the first ``vocab_size`` (10,000) words of ``stackoverflow.word_count``;
* ids: 0 pad, word ``i`` of the vocabulary ``i + 1`` (so ``1..V``), ``V+1..V+B`` the
  ``oov_buckets`` (1) OOV buckets, ``V+B+1`` BOS, ``V+B+2`` EOS; ``num_classes`` is
  ``V+B+3`` (10,004);
* a sentence is split on ``" "``, its first ``sequence_length`` (20) words kept, mapped to ids,
  EOS appended when fewer than ``sequence_length`` words remain, BOS prepended, then padded
  with 0 to ``sequence_length + 1``: the same as ``[BOS] + ids + [EOS]`` cut to 21 tokens;
* one example per sentence: ``x = tokens[:-1]``, ``y = tokens[1:]`` (``[20]`` each).

Departures: with more than one OOV bucket, TFF hashes an unknown word with FarmHash's
``Fingerprint64`` (``tf.lookup.StaticVocabularyTable``); here it is the first 8 bytes of its
BLAKE2b digest, so the buckets are others (one bucket, the default, is exact). An empty
sentence gives ``[BOS, EOS]``. Every sentence of a user is an example (TFF's
``ClientSpec`` may shuffle, repeat and cap them when it batches; here local training draws
minibatches). The test split of a client is its sentences in ``stackoverflow_test.h5`` and
the central test set their union: test users who are no training user are left out
(``info["test_users_not_in_training"]`` counts them; TFF evaluates on every test user).
FedJAX's ``StackoverflowTokenizer`` puts pad, BOS and EOS at 0, 1, 2 and
keeps EOS at the cut: not followed. Without ``stackoverflow.word_count`` the vocabulary is
built from the training clients read (the words used by most of them, ties in byte order),
with a warning and ``info["vocabulary"]`` saying so. The loss and accuracy that go with it:
:mod:`fedjax_sel.models.lstm_words`.

Memory: the files are read client by client (h5py) into one token array of
``sequence_length + 1`` compact ints per sentence (uint16 while the ids fit, 42 bytes at the
defaults), sized from the datasets' shapes first; with ``--clients N`` the users are
subsampled (seeded, recorded in ``info``) before anything is read. Stored: ``x`` and ``y``,
2 x 20 x 2 = 80 bytes a sentence, in the ``flat`` layout, which ``--layout auto`` picks for
Stack Overflow's very unequal users (``padded`` would pad every user to the largest). All
342,477 users: 135,818,730 x 80 = 10,865,498,400 bytes of training data on the device, and
the test sentences twice (per-client splits and the central test set), at most 2 x
16,586,035 x 80 = 2,653,765,600 bytes: 13.5 GB in all, which fits one 80 GB GPU but not a
16 GB one
(there, take ``--clients N``: the figures scale with the users' sentences, 397 a user on
average). Assembling also holds the token array and the row indices of the flat layout on the
host: 72 to 76 bytes a training sentence at the peak (numpy's allocations, measured on a
synthetic 700,071-sentence set), so about 10 GB for every user; on the CPU backend the device
arrays live in the same memory (about 24 GB in all). Reading and tokenizing ran at 85,000 to
110,000 sentences a second on one core of a shared 2-core EPYC: the full files, 152 million
sentences, take about half an hour.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from itertools import repeat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.data.client_data import from_parts
from fedjax_sel.data.dataset_natural import finish_natural, natural_dataset
from fedjax_sel.data.federated_files import (
    ClientExamples,
    find_file,
    iter_tff_clients,
    subsample,
    tff_client_ids,
    tff_feature_lengths,
)

NAME = "stackoverflow"
TRAIN_FILE, TEST_FILE = "stackoverflow_train.h5", "stackoverflow_test.h5"
WORD_COUNT_FILE = "stackoverflow.word_count"
BUCKET = "https://storage.googleapis.com/tff-datasets-public"
PAD = 0


class Tokens(NamedTuple):
    """The id layout of TFF's Stack Overflow task (see the module docstring)."""

    vocab_size: int  # V, words in the vocabulary
    oov_buckets: int  # B
    sequence_length: int  # T: x and y are [T]

    @property
    def first_oov(self) -> int:
        return self.vocab_size + 1

    @property
    def bos(self) -> int:
        return self.vocab_size + self.oov_buckets + 1

    @property
    def eos(self) -> int:
        return self.vocab_size + self.oov_buckets + 2

    @property
    def num_classes(self) -> int:
        return self.vocab_size + self.oov_buckets + 3

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.num_classes <= 1 << 16 else np.int32)

    def as_info(self) -> dict[str, Any]:
        oov = list(range(self.first_oov, self.first_oov + self.oov_buckets))
        return {"pad": PAD, "oov": oov, "bos": self.bos, "eos": self.eos}


# ----------------------------------------------------------------------------- vocabulary
def read_word_counts(path: Path, vocab_size: int) -> list[bytes]:
    """The first ``vocab_size`` distinct words of a ``word<TAB>count`` file (TFF's
    ``load_word_counts`` order: most frequent first)."""
    words: list[bytes] = []
    seen: set[bytes] = set()
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise ConfigError(
                    f"{NAME}: {str(path)!r} line {number} is not 'word<TAB>count': {line[:60]!r}"
                )
            if parts[0] not in seen:
                seen.add(parts[0])
                words.append(parts[0])
                if len(words) == vocab_size:
                    break
    if not words:
        raise ConfigError(f"{NAME}: {str(path)!r} holds no words")
    return words


def vocabulary_from_clients(path: Path, ids: list[str], vocab_size: int) -> list[bytes]:
    """The ``vocab_size`` words used by the most of ``ids`` (TFF's count: users, not
    occurrences), ties in byte order; one client's sentences in memory at a time."""
    users: Counter = Counter()
    for _, arrays in iter_tff_clients(path, ("tokens",), ids):
        words: set[bytes] = set()
        for s in _sentences(arrays["tokens"], f"{NAME} {path.name}"):
            words.update(s.split(b" "))
        words.discard(b"")
        users.update(words)
    ranked = sorted(users.items(), key=lambda kv: (-kv[1], kv[0]))
    if not ranked:
        raise ConfigError(f"{NAME}: the training clients read hold no words")
    return [w for w, _ in ranked[:vocab_size]]


def _word_count_file(train: Path, data_path, word_counts: str | None) -> Path | None:
    """The word-count file: ``word_counts`` if given (it must exist), else next to the
    training file or where :func:`find_file` looks; ``None`` when there is none."""
    if word_counts is not None:
        p = Path(word_counts).expanduser()
        if not p.is_file():
            raise ConfigError(f"{NAME}: word_counts file {str(p)!r} not found")
        return p
    if (train.parent / WORD_COUNT_FILE).is_file():
        return train.parent / WORD_COUNT_FILE
    try:
        return find_file(NAME, data_path, WORD_COUNT_FILE)
    except ConfigError:
        return None


# ----------------------------------------------------------------------------- token ids
def _sentences(tokens: Any, where: str) -> list[bytes]:
    """A client's ``tokens`` entries as byte strings."""
    flat = np.asarray(tokens).reshape(-1)
    if flat.dtype.kind not in "OSU":
        raise ConfigError(f"{where}: 'tokens' must hold strings, got dtype {flat.dtype}")
    items = flat.tolist()
    if all(type(s) is bytes for s in items):  # h5py's variable-length strings
        return items
    out = []
    for s in items:
        if isinstance(s, str):
            s = s.encode("utf-8")
        elif not isinstance(s, bytes):
            raise ConfigError(f"{where}: 'tokens' must hold strings, got {type(s).__name__}")
        out.append(bytes(s))
    return out


def _bucket(word: bytes, buckets: int) -> int:
    digest = hashlib.blake2b(word, digest_size=8).digest()
    return int.from_bytes(digest, "little") % buckets


def encode_sentences(
    sentences: list[bytes], lookup: dict[bytes, int], spec: Tokens, out: np.ndarray
) -> None:
    """Writes the token ids of each sentence into the rows of ``out`` (zeros,
    ``[len(sentences), T + 1]``): ``[BOS] + ids + [EOS]`` cut to ``T + 1`` (module docstring)."""
    t, bos, eos = spec.sequence_length, spec.bos, spec.eos
    get = lookup.get
    if spec.oov_buckets == 1:
        oov = spec.first_oov

        def ids(words: list[bytes]):
            return map(get, words, repeat(oov))
    else:

        def ids(words: list[bytes]):
            return (get(w) or spec.first_oov + _bucket(w, spec.oov_buckets) for w in words)

    flat: list[int] = []
    lengths: list[int] = []
    for s in sentences:
        words = s.split(b" ", t)[:t] if s else []  # at most t + 1 pieces, the first t kept
        flat.append(bos)
        flat.extend(ids(words))
        if len(words) < t:
            flat.append(eos)
        lengths.append(len(words) + 1 + (len(words) < t))
    n = np.asarray(lengths, np.int64)
    rows = np.repeat(np.arange(len(sentences)), n)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(n) - n, n)
    out[rows, cols] = np.asarray(flat, np.int64)


def read_split(
    path: Path, ids: list[str], lookup: dict[bytes, int], spec: Tokens, *, training: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens[N, T + 1], counts[len(ids)])``: the sentences of clients ``ids`` of one file
    as token ids, client after client (sized from the datasets' shapes first, then filled one
    client at a time). A training client without sentences is refused."""
    counts = tff_feature_lengths(path, "tokens", ids)
    if training and np.any(counts == 0):
        cid = ids[int(np.flatnonzero(counts == 0)[0])]
        raise ConfigError(
            f"{NAME} {path.name}, client {cid!r}: no sentences (its 'tokens' is empty); "
            f"every training client needs one ({int(np.sum(counts == 0))} such client(s))"
        )
    tokens = np.zeros((int(counts.sum()), spec.sequence_length + 1), spec.dtype)
    starts = np.cumsum(counts) - counts
    reader = iter_tff_clients(path, ("tokens",), ids)
    for (cid, arrays), start, n in zip(reader, starts, counts, strict=True):
        where = f"{NAME} {path.name}, client {cid!r}"
        sentences = _sentences(arrays["tokens"], where)
        if len(sentences) != n:
            raise ConfigError(f"{where}: {len(sentences)} sentences, its shape said {n}")
        encode_sentences(sentences, lookup, spec, tokens[start : start + n])
    return tokens, counts


def _parts(counts: np.ndarray) -> list[np.ndarray]:
    starts = np.cumsum(counts) - counts
    return [np.arange(s, s + n) for s, n in zip(starts, counts, strict=True)]


# ----------------------------------------------------------------------------- the data set
@natural_dataset(
    NAME,
    description="Stack Overflow next-word prediction by user, TFF's HDF5 files (10,000 "
    "words, 20 tokens)",
    default_model="lstm_words",
    reference="Reddi et al. 2021; tff.simulation.datasets.stackoverflow, "
    "tff.simulation.baselines.stackoverflow",
)
def _stackoverflow(
    *,
    num_clients,
    partition,
    seed,
    data_path,
    test_fraction,
    layout,
    vocab_size: int = 10000,
    sequence_length: int = 20,
    oov_buckets: int = 1,
    word_counts: str | None = None,
    central_test_examples: int | None = None,
):
    """``word_counts``: the ``stackoverflow.word_count`` file (default: next to the HDF5
    files). ``central_test_examples``: a seeded sample of that many sentences as the central
    test set (TFF's baselines validate on 10,000), default every test sentence of the
    clients; their per-client test splits stay whole."""
    for key, value in (("vocab_size", vocab_size), ("sequence_length", sequence_length),
                       ("oov_buckets", oov_buckets)):  # fmt: skip
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ConfigError(f"{NAME}: {key} must be a positive integer, got {value!r}")
    if central_test_examples is not None and int(central_test_examples) < 1:
        raise ConfigError(
            f"{NAME}: central_test_examples must be a positive integer, got "
            f"{central_test_examples!r}"
        )
    try:
        train_path = find_file(NAME, data_path, TRAIN_FILE)
        test_path = find_file(NAME, data_path, TEST_FILE)
    except ConfigError as e:
        raise ConfigError(
            f"{e} (TFF's {BUCKET}/stackoverflow.tar.bz2 holds {TRAIN_FILE} and {TEST_FILE})"
        ) from None
    all_ids = tff_client_ids(train_path)
    ids, sub = subsample(all_ids, num_clients, seed, NAME)

    counts_path = _word_count_file(train_path, data_path, word_counts)
    if counts_path is not None:
        vocab = read_word_counts(counts_path, int(vocab_size))
        vocab_source = f"{counts_path} (first {len(vocab)} words)"
    else:
        looked = train_path.parent / WORD_COUNT_FILE
        warnings.warn(
            f"{NAME}: no {WORD_COUNT_FILE} found (looked next to {str(train_path)!r}: "
            f"{str(looked)!r}); building the vocabulary from the {len(ids)} training clients "
            f"read, not TFF's published one. For TFF's vocabulary download "
            f"{BUCKET}/{WORD_COUNT_FILE}.tar.bz2 and extract it next to {TRAIN_FILE}, or pass "
            f"--dataset-arg word_counts=PATH",
            stacklevel=2,
        )
        vocab = vocabulary_from_clients(train_path, ids, int(vocab_size))
        vocab_source = (
            f"built from the {len(ids)} training clients read ({WORD_COUNT_FILE} not found): "
            f"the {len(vocab)} words used by most of them"
        )
    spec = Tokens(len(vocab), int(oov_buckets), int(sequence_length))
    lookup = {w: i + 1 for i, w in enumerate(vocab)}

    tokens, counts = read_split(train_path, ids, lookup, spec, training=True)
    parts = _parts(counts)
    # x and y are views of one token array: each is copied to the device once
    train = from_parts(tokens[:, :-1], tokens[:, 1:], parts, layout=layout)
    num_train_bytes = int(train.x.nbytes + train.y.nbytes)
    del tokens, parts

    have = set(tff_client_ids(test_path))
    in_test = [c for c in ids if c in have]
    tokens, found = read_split(test_path, in_test, lookup, spec, training=False)
    test_counts = np.zeros(len(ids), np.int64)
    test_counts[[i for i, c in enumerate(ids) if c in have]] = found
    test = from_parts(tokens[:, :-1], tokens[:, 1:], _parts(test_counts), layout=layout,
                      allow_empty=True)  # fmt: skip
    rows = np.arange(len(tokens))
    if central_test_examples is not None and int(central_test_examples) < len(rows):
        rng = np.random.default_rng(seed + 104729)
        rows = np.sort(rng.choice(len(rows), int(central_test_examples), replace=False))
    central = ClientExamples(tokens[rows, :-1], tokens[rows, 1:])
    del tokens

    info = {
        "source": f"TFF HDF5 {train_path.parent}",
        **sub,
        "vocabulary": vocab_source,
        "vocab_size": spec.vocab_size,
        "oov_buckets": spec.oov_buckets,
        "sequence_length": spec.sequence_length,
        "special_tokens": spec.as_info(),
        "token_dtype": spec.dtype.name,
        "clients_without_test_sentences": len(ids) - len(in_test),
        "test_users_not_in_training": len(have - set(all_ids)),
        "train_bytes": num_train_bytes,
        "central_test_examples": None if central_test_examples is None else len(rows),
    }
    return finish_natural(
        NAME, ids, train, test, central, num_classes=spec.num_classes, info=info,
    )  # fmt: skip
