"""What a strategy and a run read of the model: the :class:`~fedjax_sel.base.ClientOracle` of a
round (closures over the traced data and hyperparameters) and the evaluation of a state."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_sel.base import Array, ClientOracle, ConfigError, Evaluator, Params
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.state import SimData
from fedjax_sel.training import evaluate as ev
from fedjax_sel.training.hparams import HParams


def client_oracle(
    spec: RoundSpec,
    data: SimData,
    hparams: HParams,
    *,
    client_opt_states=None,
    train_key: Array | None = None,
) -> ClientOracle:
    """The :class:`ClientOracle` a strategy sees: closures over the traced data and
    hyperparameters, the clients' kept optimizer states (persistent client state) and the
    round's training key (default ``jax.random.key(0)``)."""
    model, train_data, bs = spec.model, data.train, spec.eval_batch_size

    def loss(params, clients, key=None):
        del key
        return ev.client_losses(model, params, train_data, clients, min(bs, 256))

    def batch_loss(params, clients, key, batch_size):
        return ev.client_batch_losses(model, params, train_data, clients, key, batch_size)

    def all_losses(params):
        rows = ev.eval_rows(model, params, train_data, bs)
        return ev.evaluate_all_clients(model, params, train_data, rows)[0]

    def train(params, clients, key, active=None):
        clients = jnp.asarray(clients, jnp.int32)
        active = jnp.ones(clients.shape, bool) if active is None else active
        states = None
        if client_opt_states is not None:
            states = jax.tree.map(lambda s: s[clients], client_opt_states)
        return spec.trainer.train(
            params, train_data, clients, active, key, opt_states=states, hparams=hparams
        )

    def server_loss(params, size=None):
        if data.server_x is None:
            raise ConfigError(
                "this strategy needs a server-held data set: load the data with "
                "server_fraction > 0 (CLI: --server-fraction)"
            )
        x, y, valid = data.server_x, data.server_y, data.server_valid
        if size is not None:  # a static subset spread evenly over the set
            m = x.shape[0]
            if not 1 <= int(size) <= m:
                raise ConfigError(f"server_loss size={size} must lie in [1, {m}] (server set size)")
            # over the real rows of a padded set (seeds stacked): the same rows as alone
            n = m if valid is None else jnp.sum(valid)
            idx = (jnp.arange(int(size)) * n) // int(size)
            x, y, valid = x[idx], y[idx], None
        return ev.evaluate_central(model, params, x, y, bs, valid)[0]

    def client_test_loss(params, clients):
        if data.test is None:
            raise ConfigError("this strategy needs per-client test splits (test_fraction > 0)")
        return ev.client_losses(model, params, data.test, clients, min(bs, 256))

    if train_key is None:
        train_key = jax.random.key(0)
    return ClientOracle(
        loss, batch_loss, all_losses, train, train_key, server_loss, client_test_loss
    )


def evaluator(spec: RoundSpec, data: SimData, mesh: jax.sharding.Mesh | None = None) -> Evaluator:
    """Evaluation functions over ``data`` (for ``Strategy.metrics`` and notebooks); ``mesh``
    shards the passes over every client's data."""
    model, bs = spec.model, spec.eval_batch_size

    def central(params):
        return ev.evaluate_central(
            model, params, data.test_x, data.test_y, bs, data.test_valid, mesh
        )

    def every_client(params, clients):
        rows = ev.eval_rows(model, params, clients, bs)
        return ev.evaluate_all_clients(model, params, clients, rows, mesh)

    def client_test(params):
        return every_client(params, data.test)

    def client_train(params):
        loss_k, acc_k, _ = every_client(params, data.train)
        return loss_k, acc_k

    return Evaluator(central, client_test if data.test is not None else None, client_train)


def evaluate(
    spec: RoundSpec,
    params: Params,
    strategy_state,
    data: SimData,
    mesh: jax.sharding.Mesh | None = None,
) -> dict[str, Array]:
    """The evaluation's scalars (pure; :meth:`~fedjax_sel.engine.simulation.Simulation.evaluate`
    runs it compiled): central test loss and accuracy; with per-client test splits, the mean
    over clients of each client's test loss and accuracy and the accuracy's spread; and the
    strategy's own ``metrics``."""
    with jax.named_scope("evaluation"):
        return _evaluate(spec, params, strategy_state, data, mesh)


def bottom_tenth_mean(values: Array, has: Array) -> Array:
    """The mean of the lowest ``ceil(n / 10)`` of ``values`` over the ``n`` entries where
    ``has`` (0 when none): the bottom-10% client accuracy. Fixed shapes: the entries without
    data sort last, and a mask on the rank keeps the lowest (``n`` traced)."""
    n = jnp.sum(has.astype(jnp.int32))
    take = (n + 9) // 10  # ceil(n / 10) in integers: 0.1 * n in float32 can round past it
    ranked = jnp.sort(jnp.where(has, values, jnp.inf))
    kept = jnp.arange(values.shape[0]) < take
    return jnp.sum(jnp.where(kept, ranked, 0.0)) / jnp.maximum(take, 1)


def _evaluate(spec: RoundSpec, params: Params, strategy_state, data: SimData, mesh) -> dict:
    scores = evaluator(spec, data, mesh)
    loss, acc = scores.central(params)
    out = {"test_loss": loss, "test_accuracy": acc}
    if scores.client_test is not None:
        loss_k, acc_k, count = scores.client_test(params)
        has = count > 0
        n = jnp.maximum(jnp.sum(has), 1)
        out["client_test_loss_mean"] = jnp.sum(jnp.where(has, loss_k, 0.0)) / n
        mean_acc = jnp.sum(jnp.where(has, acc_k, 0.0)) / n
        out["client_test_accuracy_mean"] = mean_acc
        # the spread of accuracy over clients (population std over those with test data)
        out["client_test_accuracy_std"] = jnp.sqrt(
            jnp.sum(jnp.where(has, (acc_k - mean_acc) ** 2, 0.0)) / n
        )
        # the worst-served clients: the mean accuracy of the lowest tenth of them
        out["client_test_accuracy_bottom10"] = bottom_tenth_mean(acc_k, has)
    if spec.strategy.metrics is not None:
        out.update(spec.strategy.metrics(strategy_state, params, scores))
    return out
