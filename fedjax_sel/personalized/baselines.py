"""Model-averaging baselines of the personalized comparison: FedAvg and IFCA.

Both run in rounds of ``local_steps`` SGD steps per client, so that after r rounds every client
has taken ``r * local_steps`` of its own gradient steps, the x-axis of the peer-weighting
methods (one SGD step of a target = one local step). Both return per-target metrics on each
target's own test split, the same as :meth:`PersonalizedSimulation.evaluate`.

* **FedAvg** (McMahan et al. 2017) is the engine's :class:`~fedjax_sel.simulation.Simulation`
  with full participation (strategy ``full``, FedAvg size weights): one global model, evaluated
  on every target's test data.
* **IFCA** (Ghosh et al. 2020; ``reference/algorithms.md`` section 8): ``k`` cluster models; each
  round every client picks ``argmin_j F_i(theta_j)`` (mean loss over its whole training set,
  ties to the lowest index), runs ``local_steps`` SGD steps from that model, and each cluster
  model becomes the uniform mean of its members' models (a cluster without members keeps its
  model). A target is evaluated with the model of the cluster it picks. Model 0 is the shared
  initial model of the comparison, the others independent random initialisations (the MNIST
  reference code initialises all at random).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.flatten_util import ravel_pytree

from fedjax_sel.base import Array, ConfigError
from fedjax_sel.data.client_data import ClientData
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.models import Model
from fedjax_sel.personalized.simulator import check_targets, initial_key
from fedjax_sel.simulation import Simulation
from fedjax_sel.strategies.full import full
from fedjax_sel.training.evaluate import client_losses, evaluate_all_clients
from fedjax_sel.training.local import LocalConfig


def _check(lr: float, batch_size: int, local_steps: int, rounds: int, eval_every: int) -> None:
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"lr must be a positive number, got {lr!r}")
    for name, v in (
        ("batch_size", batch_size),
        ("local_steps", local_steps),
        ("rounds", rounds),
        ("eval_every", eval_every),
    ):
        if not (isinstance(v, int) and v >= 1):
            raise ConfigError(f"{name} must be a positive integer, got {v!r}")


def _per_client_metrics(model: Model, params, dataset: FederatedDataset, ids: np.ndarray) -> dict:
    test_loss, test_acc, _ = evaluate_all_clients(model, params, dataset.test)
    train_loss, train_acc, _ = evaluate_all_clients(model, params, dataset.train)
    return {
        "test_loss": np.asarray(test_loss)[ids],
        "test_accuracy": np.asarray(test_acc)[ids],
        "train_loss": np.asarray(train_loss)[ids],
        "train_accuracy": np.asarray(train_acc)[ids],
    }


def run_fedavg(
    dataset: FederatedDataset,
    model: Model,
    *,
    lr: float,
    batch_size: int,
    local_steps: int,
    rounds: int,
    eval_every: int,
    seed: int = 0,
    targets: Sequence[int] | None = None,
) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    """Full-participation FedAvg on the engine; returns the evaluation steps (local SGD steps
    per client so far) and, at each, the per-target metrics of the global model."""
    _check(lr, batch_size, local_steps, rounds, eval_every)
    ids = check_targets(dataset, targets)
    k = dataset.num_clients
    sim = Simulation(
        dataset,
        model,
        full(per_round=k),
        local=LocalConfig(batch_size=batch_size, lr=float(lr), local_steps=int(local_steps)),
        per_round=k,
        num_rounds=rounds,
        chunk_size=eval_every,
    )
    state = sim.init(seed, params=model.init(initial_key(seed)))
    return evaluate_rounds(
        state,
        lambda st, n, start: sim.run_rounds(st, n)[0],
        lambda st: _per_client_metrics(model, st.params, dataset, ids),
        rounds,
        eval_every,
        local_steps,
    )


def evaluate_rounds(state, advance, evaluate, rounds: int, eval_every: int, local_steps: int):
    """Evaluates at round 0 and every ``eval_every`` rounds: ``advance(state, n, start)`` runs
    rounds ``start .. start + n - 1``; returns the local steps so far and the evaluations."""
    steps, evals = [0], [evaluate(state)]
    done = 0
    while done < rounds:
        n = min(eval_every, rounds - done)
        state = advance(state, n, done)
        done += n
        steps.append(done * local_steps)
        evals.append(evaluate(state))
    return steps, evals


@struct.dataclass
class IFCAState:
    """``params`` float32[k, d] flat cluster models; ``assignment`` int32[K] each client's
    cluster from the latest round."""

    params: Array
    assignment: Array


class IFCA:
    """The Iterative Federated Clustering Algorithm, vectorised over clients and cluster models
    (module docstring). ``init(seed)``, ``run_rounds(state, n)``, ``evaluate(state, targets)``.
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: Model,
        *,
        num_clusters: int,
        lr: float,
        batch_size: int,
        local_steps: int,
    ):
        if not (isinstance(num_clusters, int) and num_clusters >= 1):
            raise ConfigError(f"num_clusters must be a positive integer, got {num_clusters!r}")
        _check(lr, batch_size, local_steps, 1, 1)
        self.dataset, self.model = dataset, model
        self.num_clusters, self.lr = num_clusters, float(lr)
        self.batch_size, self.local_steps = batch_size, local_steps
        _, self.unravel = ravel_pytree(model.init(jax.random.key(0)))
        self._round = jax.jit(self._round_fn)
        self._assign = jax.jit(self._assign_fn)

    def init(self, seed: int = 0) -> IFCAState:
        keys = [initial_key(seed)] + [
            jax.random.fold_in(initial_key(seed), j) for j in range(1, self.num_clusters)
        ]
        params = jnp.stack([ravel_pytree(self.model.init(k))[0] for k in keys])
        assignment = jnp.zeros((self.dataset.num_clients,), jnp.int32)
        return IFCAState(params=params, assignment=assignment)

    def _assign_fn(self, params: Array, data: ClientData) -> Array:
        """``argmin_j F_i(theta_j)`` for every client (whole local training set)."""
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
        losses = jax.vmap(lambda th: client_losses(self.model, self.unravel(th), data, clients))(
            params
        )  # [k, K]
        return jnp.argmin(losses, axis=0).astype(jnp.int32)

    def _local_sgd(self, theta: Array, data: ClientData, client: Array, key) -> Array:
        count = jnp.maximum(data.counts[client], 1)

        def loss(th, x, y):
            p = self.unravel(th)
            out = jnp.mean(self.model.loss(self.model.apply(p, x), y))
            return out + (self.model.regularizer(p) if self.model.regularizer else 0.0)

        def step(th, s):
            pos = jax.random.randint(jax.random.fold_in(key, s), (self.batch_size,), 0, count)
            x, y, _ = data.gather(client, pos)
            return th - self.lr * jax.grad(loss)(th, x, y), None

        return jax.lax.scan(step, theta, jnp.arange(self.local_steps))[0]

    def _round_fn(self, state: IFCAState, data: ClientData, key, r) -> IFCAState:
        assign = self._assign_fn(state.params, data)
        k_round = jax.random.fold_in(key, r)
        clients = jnp.arange(data.num_clients, dtype=jnp.int32)
        trained = jax.vmap(
            lambda c: self._local_sgd(
                state.params[assign[c]], data, c, jax.random.fold_in(k_round, c)
            )
        )(clients)  # [K, d]
        onehot = jax.nn.one_hot(assign, self.num_clusters, dtype=jnp.float32)  # [K, k]
        members = onehot.sum(0)
        mean = (onehot.T @ trained) / jnp.maximum(members, 1.0)[:, None]
        params = jnp.where(members[:, None] > 0, mean, state.params)
        return IFCAState(params=params, assignment=assign)

    def run_rounds(self, state: IFCAState, num_rounds: int, seed: int, start: int) -> IFCAState:
        """Rounds ``start .. start + num_rounds - 1`` (keys folded from ``seed`` and the
        round)."""
        key = jax.random.fold_in(jax.random.key(seed), 7)
        for r in range(start, start + num_rounds):
            state = self._round(state, self.dataset.train, key, jnp.int32(r))
        return state

    def evaluate(self, state: IFCAState, targets: np.ndarray) -> dict[str, np.ndarray]:
        """Each target with the model of the cluster it picks now (argmin of its train loss)."""
        assign = np.asarray(self._assign(state.params, self.dataset.train))
        every = np.arange(self.dataset.num_clients)
        per_model = [
            _per_client_metrics(self.model, self.unravel(state.params[j]), self.dataset, every)
            for j in range(self.num_clusters)
        ]
        out = {
            name: np.stack([m[name] for m in per_model])[assign[targets], targets]
            for name in per_model[0]
        }
        out["cluster"] = assign[targets].astype(np.float32)
        return out


def run_ifca(
    dataset: FederatedDataset,
    model: Model,
    *,
    num_clusters: int,
    lr: float,
    batch_size: int,
    local_steps: int,
    rounds: int,
    eval_every: int,
    seed: int = 0,
    targets: Sequence[int] | None = None,
) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    """IFCA with ``num_clusters`` models; evaluation steps and per-target metrics as
    :func:`run_fedavg`."""
    _check(lr, batch_size, local_steps, rounds, eval_every)
    ids = check_targets(dataset, targets)
    algo = IFCA(
        dataset, model, num_clusters=num_clusters, lr=lr, batch_size=batch_size,
        local_steps=local_steps,
    )  # fmt: skip
    return evaluate_rounds(
        algo.init(seed),
        lambda st, n, start: algo.run_rounds(st, n, seed, start),
        lambda st: algo.evaluate(st, ids),
        rounds,
        eval_every,
        local_steps,
    )
