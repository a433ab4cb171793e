"""Host-side partitioners: split a pool of examples among K clients.

Each partitioner returns a list of K index arrays into the pool. All randomness comes from the
``numpy.random.Generator`` passed in, so a partition is a function of its seed.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

from fedjax_sel.base import ConfigError
from fedjax_sel.registry import Registry, parse_spec


def iid(num_examples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffles the pool and deals it into ``num_clients`` near-equal parts."""
    _check_clients(num_clients, num_examples)
    return [np.sort(p) for p in np.array_split(rng.permutation(num_examples), num_clients)]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    *,
    min_size: int = 10,
    balance: bool = True,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Dirichlet label skew (Hsu et al. 2019; the NIID-Bench ``noniid-labeldir`` recipe).

    For each class, proportions ``p ~ Dir(alpha * 1_K)`` split that class's examples among the
    clients. With ``balance`` (the common recipe), a client already holding ``N / K`` examples
    gets no share of later classes, which keeps sizes from exploding at small ``alpha``. The draw
    is repeated until every client holds at least ``min_size`` examples.

    Args:
      labels: int labels of the pool, ``[N]``.
      num_clients: K.
      alpha: concentration; small values give strong label skew.
      rng: host random generator.
      min_size: smallest acceptable client.
      balance: apply the ``N / K`` cap described above.
      max_tries: redraws before giving up with a :class:`ConfigError`.
    """
    if not alpha > 0 or not np.isfinite(alpha):
        raise ConfigError(f"dirichlet alpha must be a positive number, got {alpha!r}")
    labels = np.asarray(labels)
    n = len(labels)
    _check_clients(num_clients, n)
    if min_size * num_clients > n:
        raise ConfigError(
            f"dirichlet min_size={min_size} x {num_clients} clients needs {min_size * num_clients}"
            f" examples but the pool has {n}; lower min_size or the number of clients"
        )
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, np.int64)
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                p = p * (sizes < n / num_clients)
                p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)) for p in parts]
    raise ConfigError(
        f"dirichlet partition with alpha={alpha} could not give every one of {num_clients} "
        f"clients at least min_size={min_size} examples in {max_tries} draws; raise alpha or "
        f"lower min_size"
    )


def dirichlet_groups(
    labels: np.ndarray,
    num_clients: int,
    groups: int,
    alpha: float,
    rng: np.random.Generator,
    **dirichlet_options,
) -> list[np.ndarray]:
    """Label skew across groups, none within: homogeneous data inside each group of clients,
    heterogeneous across groups (CA-Fed Fig. 5b, with the groups its availability clusters).

    The pool is split among ``groups`` by :func:`dirichlet`; group ``g``'s examples are then
    split uniformly at random among its clients, the contiguous block of ids ``k`` with
    ``k * groups // num_clients == g`` (the block layout of ``markov_clustered``).
    """
    if int(groups) != groups or not 1 <= groups <= num_clients:
        raise ConfigError(f"groups must be an integer in [1, {num_clients}], got {groups}")
    groups = int(groups)
    block = np.arange(num_clients) * groups // num_clients
    size = dirichlet_options.pop("min_size", 10) * int(np.max(np.bincount(block)))
    parts = dirichlet(labels, groups, alpha, rng, min_size=size, **dirichlet_options)
    out: list[np.ndarray] = [np.zeros(0, np.int64)] * num_clients
    for g, idx in enumerate(parts):
        members = np.flatnonzero(block == g)
        for k, chunk in zip(
            members, np.array_split(rng.permutation(idx), len(members)), strict=True
        ):
            out[k] = np.sort(chunk)
    return out


def shards(
    labels: np.ndarray, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Pathological non-IID split of McMahan et al. (2017).

    Sorts the pool by label, cuts it into ``num_clients * shards_per_client`` equal shards and
    gives each client ``shards_per_client`` random shards.
    """
    labels = np.asarray(labels)
    if shards_per_client < 1:
        raise ConfigError(f"shards per client must be >= 1, got {shards_per_client}")
    num_shards = num_clients * shards_per_client
    _check_clients(num_shards, len(labels), what="shards")
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_shards)
    assign = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in assign]


def natural(groups: np.ndarray, num_clients: int | None = None) -> list[np.ndarray]:
    """One client per natural group (writer, speaking role), in group-id order.

    Args:
      groups: int group id of every example.
      num_clients: keep only the first ``num_clients`` groups (all when ``None``).
    """
    groups = np.asarray(groups)
    ids = np.unique(groups)
    if num_clients is not None:
        if num_clients > len(ids):
            raise ConfigError(
                f"natural partition has {len(ids)} groups but {num_clients} clients were asked"
            )
        ids = ids[:num_clients]
    order = np.argsort(groups, kind="stable")
    sorted_groups = groups[order]
    starts = np.searchsorted(sorted_groups, ids, side="left")
    ends = np.searchsorted(sorted_groups, ids, side="right")
    return [np.sort(order[s:e]) for s, e in zip(starts, ends, strict=True)]


def split_train_test(
    parts: Sequence[np.ndarray], test_fraction: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Splits every client's indices into train and test (at least one training example):
    :func:`split_train_test_flat`'s parts, one array per client."""
    train, test = split_train_test_flat(parts, test_fraction, rng)
    return list(train), list(test)


@dataclasses.dataclass(frozen=True, eq=False)
class FlatParts(Sequence):
    """Every client's pool rows in one array, client after client: ``parts[k]`` is
    ``rows[offsets[k] : offsets[k] + counts[k]]`` (a view). A sequence of index arrays, as the
    partitioners return, without an array object per client (at 10^6 clients a list of
    per-client arrays is ~0.3 GiB per list, and its freed pieces stay in the process heap)."""

    rows: np.ndarray
    counts: np.ndarray

    @functools.cached_property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    @classmethod
    def ranges(cls, sizes: np.ndarray) -> FlatParts:
        """Client ``k`` holds the ``sizes[k]`` rows after those of clients ``0 ... k - 1``."""
        sizes = np.asarray(sizes, np.int64)
        return cls(np.arange(int(sizes.sum()), dtype=np.int64), sizes)

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, k):
        if not isinstance(k, (int, np.integer)):
            raise TypeError(f"FlatParts takes one client index, got {k!r}")
        o = int(self.offsets[k])
        return self.rows[o : o + int(self.counts[k])]

    def __iter__(self):
        for o, n in zip(self.offsets.tolist(), self.counts.tolist(), strict=True):
            yield self.rows[o : o + n]


def split_train_test_flat(
    parts: Sequence[np.ndarray], test_fraction: float, rng: np.random.Generator
) -> tuple[FlatParts, FlatParts]:
    """Splits every client's indices into train and test, two :class:`FlatParts` (no array
    object per client is kept): each client's indices permuted by ``rng``, the first
    ``round(test_fraction * n)`` (at most ``n - 1``: at least one training example) sorted into
    its test part, the rest into its train part."""
    if not 0.0 <= test_fraction < 1.0:
        raise ConfigError(f"test fraction must be in [0, 1), got {test_fraction!r}")
    flat = isinstance(parts, FlatParts)
    counts = parts.counts if flat else np.array([len(p) for p in parts], np.int64)
    # int(round(f * n)) per client: the same float64 product, rounded half to even
    n_test = np.minimum(np.round(test_fraction * counts).astype(np.int64), counts - 1)
    test_counts = np.where(counts == 0, 0, n_test)
    train_counts = counts - test_counts
    small = flat and int(np.max(parts.rows, initial=0)) < 2**31
    dtype = np.int32 if small else np.int64
    test = np.empty(int(test_counts.sum()), dtype)
    train = np.empty(int(train_counts.sum()), dtype)
    t = r = 0
    for p, m, a, b in zip(
        parts, n_test.tolist(), test_counts.tolist(), train_counts.tolist(), strict=True
    ):
        p = rng.permutation(p)
        test[t : t + a] = np.sort(p[:m])
        train[r : r + b] = np.sort(p[m:])
        t, r = t + a, r + b
    return FlatParts(train, train_counts), FlatParts(test, test_counts)


PARTITIONS = Registry("partition", fixed=("labels", "num_clients", "rng", "natural_groups"))


@PARTITIONS.register("iid", description="shuffle the pool and deal it into K near-equal parts")
def _iid_partition(*, labels, num_clients, rng, natural_groups=None):
    del natural_groups
    return iid(len(labels), num_clients, rng)


@PARTITIONS.register(
    "dirichlet",
    description="label skew: class proportions ~ Dir(alpha) (dirichlet:0.1); groups=G: skew "
    "across G contiguous blocks of clients only, iid within a block",
    reference="Hsu et al. 2019; NIID-Bench noniid-labeldir",
    positional=("alpha",),
    required=("alpha",),
)
def _dirichlet_partition(
    *,
    labels,
    num_clients,
    rng,
    natural_groups=None,
    alpha: float = 0.0,
    min_size: int = 10,
    balance: bool = True,
    groups: int | None = None,
):
    del natural_groups
    if groups is not None:
        return dirichlet_groups(
            labels, num_clients, groups, alpha, rng, min_size=min_size, balance=balance
        )
    return dirichlet(labels, num_clients, alpha, rng, min_size=min_size, balance=balance)


@PARTITIONS.register(
    "shards",
    description="sort by label, give each client shards_per_client equal shards (shards:2)",
    reference="McMahan et al. 2017",
    positional=("shards_per_client",),
)
def _shards_partition(*, labels, num_clients, rng, natural_groups=None, shards_per_client: int = 2):
    del natural_groups
    return shards(labels, num_clients, shards_per_client, rng)


@PARTITIONS.register("natural", description="one client per natural group (writer, role)")
def _natural_partition(*, labels, num_clients, rng, natural_groups=None):
    del labels, rng
    if natural_groups is None:
        raise ConfigError("this data set has no natural clients; use iid, dirichlet or shards")
    return natural(natural_groups, num_clients)


def parse_partition(spec: str) -> tuple[str, dict]:
    """Parses ``iid``, ``natural``, ``dirichlet:0.1``, ``dirichlet:alpha=0.1,min_size=5``,
    ``dirichlet:alpha=0.5,groups=10`` (skew across groups of clients only), ``shards:2`` into
    ``(name, typed options)``."""
    name, positional, pairs = parse_spec(spec, what="partition")
    return name, PARTITIONS.resolve(name, pairs, positional)


def partition(
    name: str,
    kwargs: dict,
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    groups: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Runs the partitioner ``name`` with ``kwargs`` (see :func:`parse_partition`);
    ``groups`` are the examples' natural group ids (writers, roles) when the data has them."""
    return PARTITIONS.build(
        name, labels=labels, num_clients=num_clients, rng=rng, natural_groups=groups, **kwargs
    )


def _check_clients(num_clients: int, num_examples: int, what: str = "clients") -> None:
    if num_clients < 1:
        raise ConfigError(f"number of {what} must be >= 1, got {num_clients}")
    if num_clients > num_examples:
        raise ConfigError(f"cannot split {num_examples} examples among {num_clients} {what}")
