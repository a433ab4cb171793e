"""Local training, evaluation and server optimizers."""

from fedjax_sel.training.evaluate import (
    client_batch_losses,
    client_losses,
    evaluate_all_clients,
    evaluate_central,
    padded_client_sums,
    segment_sums,
)
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import (
    PARALLEL_MODES,
    LocalConfig,
    Parallel,
    Trainer,
    auto_parallel,
    client_optimizer,
    make_client_update,
    make_trainer,
    parse_parallel,
)
from fedjax_sel.training.server import (
    SERVER_OPTIMIZERS,
    ServerOptimizer,
    server_optimizer,
    server_spec,
    server_step,
    weighted_delta,
)

__all__ = [
    "PARALLEL_MODES",
    "SERVER_OPTIMIZERS",
    "HParams",
    "ServerOptimizer",
    "LocalConfig",
    "Parallel",
    "Trainer",
    "auto_parallel",
    "client_batch_losses",
    "client_losses",
    "client_optimizer",
    "evaluate_all_clients",
    "evaluate_central",
    "make_client_update",
    "make_trainer",
    "parse_parallel",
    "padded_client_sums",
    "segment_sums",
    "server_optimizer",
    "server_spec",
    "server_step",
    "weighted_delta",
]
