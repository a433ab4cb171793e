"""Federated data: stacked client storage, partitioners, generators and loaders.

A data set is a builder registered with :func:`register_dataset` that returns
:func:`assemble`'s result; any public module of this package may hold one (docs/extending.md,
"Adding a data set").
"""

from fedjax_sel.data.client_data import ClientData, from_client_arrays, from_parts
from fedjax_sel.data.datasets import (
    DATASETS,
    FederatedDataset,
    assemble,
    load_dataset,
    partition_by_client,
    register_dataset,
)
from fedjax_sel.data.partition import dirichlet, iid, natural, parse_partition, shards
from fedjax_sel.data.synthetic import clustered_regression, leaf_synthetic

__all__ = [
    "DATASETS",
    "ClientData",
    "FederatedDataset",
    "assemble",
    "clustered_regression",
    "dirichlet",
    "from_client_arrays",
    "from_parts",
    "iid",
    "leaf_synthetic",
    "load_dataset",
    "natural",
    "parse_partition",
    "partition_by_client",
    "register_dataset",
    "shards",
]
