"""What a round's program is built from: :class:`RoundSpec`, a static value (every field is
``pytree_node=False``: the spec holds no arrays, so traced hyperparameters and data vary freely
between calls of one compiled program), and :meth:`RoundSpec.create`, which checks the
settings against each other and the data set."""

from __future__ import annotations

import functools

import jax
import optax
from flax import struct

from fedjax_sel.availability import always
from fedjax_sel.base import AvailabilityModel, ConfigError, Strategy
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.engine.fedbuff import FedBuff
from fedjax_sel.engine.system import SystemModel, lognormal, model_kbit, overcommitted
from fedjax_sel.models import Model
from fedjax_sel.models.base import with_conv_impl
from fedjax_sel.models.flops import example_flops
from fedjax_sel.training.hparams import HParams
from fedjax_sel.training.local import AUTO_PARALLEL, LocalConfig, Parallel, Trainer, make_trainer
from fedjax_sel.training.server import ServerOptimizer, server_spec

_static = functools.partial(struct.field, pytree_node=False)


def _check_asynchronous(
    mode: FedBuff,
    num_clients: int,
    per_round: int,
    strategy: Strategy,
    system: SystemModel | None,
    deadline: float | None,
    overcommit: float,
    dropout: float,
    persistent_client_state: bool,
) -> None:
    """Asynchronous FL's preconditions, each refused with the setting that breaks it."""
    mode.validate(num_clients)
    if per_round != mode.concurrency:
        raise ConfigError(
            f"asynchronous FL runs concurrency={mode.concurrency} clients at once; per_round "
            f"({per_round}) must equal it (the strategy picks that many candidates per step)"
        )
    if system is None:
        raise ConfigError(
            "asynchronous FL needs device profiles for its clock: give a system model "
            "(CLI: --system lognormal, see `fedjax-sel list`)"
        )
    if deadline is not None or overcommit != 1.0 or dropout != 0.0:
        raise ConfigError(
            "deadline, overcommit and dropout are synchronous-round settings; asynchronous "
            f"FL takes none of them (got deadline={deadline}, overcommit={overcommit}, "
            f"dropout={dropout})"
        )
    if persistent_client_state:
        raise ConfigError("asynchronous FL does not keep persistent client optimizer state")
    if not strategy.asynchronous or strategy.start_params is not None:
        raise ConfigError(
            f"strategy {strategy.name!r} cannot pick clients asynchronously; use one with "
            "Strategy.asynchronous (uniform, power_of_choice, oort)"
        )


AGGREGATIONS = ("strategy", "fedavg")


@struct.dataclass
class RoundSpec:
    """What a round's program is built from (every field static: a spec holds no arrays).

    Attributes:
      model: the model.
      strategy: the selection strategy.
      availability: the availability model.
      trainer: local training of a round's slots (a :class:`~fedjax_sel.training.local.
        Trainer`).
      local: the local-training settings (batch size and step counts for the system model).
      server_tx: the server optimizer (a :class:`~fedjax_sel.training.server.ServerOptimizer`,
        at the traced ``HParams.server_lr``, or a fixed optax transformation).
      per_round: clients whose updates a round keeps.
      slots: slots the strategy fills (``per_round`` times the over-commitment).
      system: the device profiles, or ``None`` (no virtual clock).
      deadline: seconds after which a round stops waiting, or ``None``.
      dropout: probability that a selected client sends nothing.
      persistent_client_state: clients keep their optimizer state between rounds.
      eval_batch_size: batch of the oracle's loss passes.
      kbit: the model's size in kilobits (communication time).
      example_flops: FLOPs of one example's forward pass (the model's analytic count,
        :func:`fedjax_sel.models.flops.forward_flops`; 0 for a model without a flax module):
        the cost axes' client FLOPs (:mod:`fedjax_sel.engine.cost`).
      asynchronous: FedBuff's settings, or ``None`` for synchronous rounds.
      aggregation: ``strategy`` (the strategy's own weights) or ``fedavg`` (size-weighted
        FedAvg over the selected slots, whatever the strategy: the selection-only comparison).
    """

    model: Model = _static()
    strategy: Strategy = _static()
    availability: AvailabilityModel = _static()
    trainer: Trainer = _static()
    local: LocalConfig = _static()
    server_tx: ServerOptimizer | optax.GradientTransformation = _static()
    per_round: int = _static()
    slots: int = _static()
    system: SystemModel | None = _static(default=None)
    deadline: float | None = _static(default=None)
    dropout: float = _static(default=0.0)
    persistent_client_state: bool = _static(default=False)
    eval_batch_size: int = _static(default=1024)
    kbit: float = _static(default=0.0)
    example_flops: float = _static(default=0.0)
    asynchronous: FedBuff | None = _static(default=None)
    aggregation: str = _static(default="strategy")

    @classmethod
    def create(
        cls,
        dataset: FederatedDataset,
        model: Model,
        strategy: Strategy,
        *,
        local: LocalConfig,
        per_round: int,
        availability: AvailabilityModel | None = None,
        server_tx: ServerOptimizer | optax.GradientTransformation | None = None,
        parallel: Parallel = AUTO_PARALLEL,
        persistent_client_state: bool = False,
        eval_batch_size: int = 1024,
        mesh: jax.sharding.Mesh | None = None,
        n_max: int | None = None,
        system: SystemModel | None = None,
        deadline: float | None = None,
        overcommit: float = 1.0,
        dropout: float = 0.0,
        asynchronous: FedBuff | None = None,
        aggregation: str = "strategy",
    ) -> RoundSpec:
        """Checks the settings against each other and the data set (each refusal names the
        setting that breaks it) and builds the spec: the trainer in the given parallelism,
        the default availability (always on), server optimizer (FedAvg) and, for strategies
        that read durations, device profile (log-normal).

        Args:
          dataset: the federated data set (its shapes; the data itself is passed to each call).
          model: the model (``fedjax_sel.models.make_model``).
          strategy: the selection strategy; its ``per_round`` is the number of slots.
          local: the static local-training settings.
          per_round: clients whose updates a round keeps.
          availability: who is online each round (always-on by default).
          server_tx: the server optimizer (plain SGD by default: FedAvg at ``server_lr=1``).
          parallel: the client parallelism (:func:`fedjax_sel.training.local.parse_parallel`);
            ``auto`` applies the backend's rule (:func:`fedjax_sel.training.local.
            auto_parallel`); the measured choice of ``--parallel auto`` is made before the spec
            is built (:func:`fedjax_sel.training.autotune.resolve_parallel`).
          persistent_client_state: keep each client's optimizer state (momentum) across rounds.
          eval_batch_size: batch of the evaluation passes (the least: the passes over every
            client's data take more rows where a small model's activations allow,
            :func:`fedjax_sel.training.evaluate.eval_rows`).
          mesh: a one-axis ``jax.sharding.Mesh`` named ``clients`` over which local training
            shards a round's slots.
          n_max: the largest client any simulated data set holds (default: ``dataset``'s);
            larger when the data of several seeds run stacked.
          system: device profiles (:mod:`fedjax_sel.engine.system`): every round gets a
            simulated duration and the virtual clock advances; ``None``: no time, every
            client equally fast (a strategy that reads durations, e.g. Oort, gets every
            client at the log-normal profile's median speed: equal durations for equal work,
            so its system utility is flat; its run then keeps that equal-speed clock).
          deadline: seconds after which a round stops waiting (stragglers contribute the local
            steps they finished; needs ``system``).
          overcommit: select ``ceil(per_round * overcommit)`` clients and keep the first
            ``per_round`` finishers (needs ``system``); the strategy must select that many.
          dropout: probability that a selected client fails and sends nothing.
          asynchronous: asynchronous FL instead of synchronous rounds
            (:class:`fedjax_sel.engine.fedbuff.FedBuff`; needs ``system``): a "round" is then
            one server update, its ``per_round`` the concurrency.
          aggregation: ``strategy`` or ``fedavg`` (the class docstring).
        """
        if aggregation not in AGGREGATIONS:
            raise ConfigError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
        local.validate()
        k = dataset.num_clients
        if per_round < 1 or per_round > k:
            raise ConfigError(
                f"per_round={per_round} must lie in [1, number of clients]: it exceeds the "
                f"number of clients ({k})"
                if per_round > k
                else f"per_round must be >= 1, got {per_round}"
            )
        if model.task != dataset.task:
            raise ConfigError(
                f"model {model.name!r} solves {model.task} but data set {dataset.name!r} is "
                f"{dataset.task}"
            )
        targets = dataset.train.target_shape
        if model.target_ndim != len(targets):
            raise ConfigError(
                f"model {model.name!r} predicts "
                + ("a token sequence" if model.target_ndim else "one target")
                + f" per example but data set {dataset.name!r} has targets of shape "
                f"{targets or '()'}"
                + (" (next-word prediction: use --model lstm_words)" if targets else "")
            )
        if system is None and (deadline is not None or overcommit != 1.0):
            raise ConfigError(
                "a deadline or over-commitment needs device profiles: give a system model "
                "(CLI: --system lognormal, see `fedjax-sel list`)"
            )
        if deadline is not None and not deadline > 0:
            raise ConfigError(f"deadline must be a positive number of seconds, got {deadline!r}")
        if not overcommit >= 1.0:
            raise ConfigError(f"overcommit must be >= 1, got {overcommit!r}")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), got {dropout!r}")
        if asynchronous is not None:
            _check_asynchronous(
                asynchronous,
                k,
                per_round,
                strategy,
                system,
                deadline,
                overcommit,
                dropout,
                persistent_client_state,
            )
        if system is None and strategy.needs_system:  # equal speeds, not a hidden profile
            system = lognormal(sigma=0.0, bandwidth_sigma=0.0)
        if parallel.conv is not None:  # the spec's model is the one the trainer runs
            model = with_conv_impl(model, parallel.conv)
        trainer = make_trainer(
            model,
            local,
            int(n_max or dataset.train.n_max),
            parallel=parallel,
            persistent_state=persistent_client_state,
            mesh=mesh,
        )
        return cls(
            model=model,
            strategy=strategy,
            availability=availability or always(),
            trainer=trainer,
            local=local,
            # a ServerOptimizer's learning rate is traced (state.hparams.server_lr); a given
            # optax transformation is used as it is
            server_tx=server_tx or server_spec("sgd"),
            per_round=int(per_round),
            slots=overcommitted(per_round, overcommit, k),
            system=system,
            deadline=deadline,
            dropout=float(dropout),
            persistent_client_state=persistent_client_state,
            eval_batch_size=int(eval_batch_size),
            kbit=model_kbit(jax.eval_shape(model.init, jax.random.key(0))),
            example_flops=example_flops(
                model.module,
                dataset.train.feature_shape,
                "float32" if dataset.train.x_scale is not None else dataset.train.x.dtype,
            ),
            asynchronous=asynchronous,
            aggregation=aggregation,
        )

    def server_transform(self, hparams: HParams) -> optax.GradientTransformation:
        """The server optimizer at ``hparams``' (traced) server learning rate."""
        if not isinstance(self.server_tx, ServerOptimizer):
            return self.server_tx
        return self.server_tx.build(hparams.server_lr)
