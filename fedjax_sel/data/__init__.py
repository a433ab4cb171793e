"""Federated data: stacked client storage, partitioners, generators and loaders."""

from fedjax_sel.data.client_data import ClientData, from_client_arrays, from_parts
from fedjax_sel.data.datasets import DATASETS, FederatedDataset, load_dataset, register_dataset
from fedjax_sel.data.partition import dirichlet, iid, natural, parse_partition, shards
from fedjax_sel.data.synthetic import clustered_regression, leaf_synthetic

__all__ = [
    "DATASETS",
    "ClientData",
    "FederatedDataset",
    "clustered_regression",
    "dirichlet",
    "from_client_arrays",
    "from_parts",
    "iid",
    "leaf_synthetic",
    "load_dataset",
    "natural",
    "parse_partition",
    "register_dataset",
    "shards",
]
