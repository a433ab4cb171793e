"""Personalized mode: each target client trains its own model on a weighted sum of peer gradients.

SP-CACW (arXiv:2606.29322, Algorithm 1 and appendices D-F) at every step t of a target:

1. broadcasts the target's model ``w_t``; every participating client i (``z_i ~ Bernoulli(p)``,
   the target always) returns a stochastic gradient ``g_i`` of its own loss at ``w_t``;
2. tracks each peer's bias by an EMA, ``b_i <- (1 - beta) b_i + beta (g_i - g_0)``;
3. aggregates ``G_t = sum_i alpha_i z_i / p_i g_i`` and steps ``w_{t+1} = w_t - eta G_t``;
4. every ``update_every`` steps (lazy weight updates; the paper: once per local epoch),
   re-estimates the smoothness ``L`` by power iteration with Hessian-vector products and sets
   ``alpha`` from the bound ``alpha^T H alpha + lambda_reg sum alpha^3`` over the simplex: by
   follow-the-approximate-leader over the history of bounds (the paper's rule, default) or by
   minimising the latest bound (``solver="pgd"``), see :mod:`.weighting`. Only peers observed
   at least once may get weight: an unobserved peer has no estimates yet (``H_ii = 0``).

Everything runs for every target at once: targets are independent, so one target's whole run
(``lax.scan`` over steps and epochs) is vmapped over targets (or ``lax.map``-ed in chunks of
``target_chunk`` to bound memory), and inside a target the M peer gradients are one vmap.
Parameters are flattened (``ravel_pytree``) so that gradients, biases and EMAs are plain
``float32[M, d]`` arrays. Client i's minibatch at step t is drawn with ``fold_in(fold_in(
fold_in(seed key, purpose), step), i)``, shared by every target that queries client i at that
step (so it is gathered once, not once per target); participation draws and power-iteration
vectors also fold in the target's id. A target's run therefore does not depend on which other
targets are simulated alongside it.

The per-peer minibatch variance ``sigma_i^2`` comes for free from two half-batch gradients:
``g = (g_a + g_b) / 2`` and ``E ||g_a - g_b||^2 / 4 = Var(g)`` when the halves are independent
(positions drawn with replacement); ``<g_a, g_b>`` is an unbiased estimate of
``||grad f_0(w_t)||^2``, which feeds the running risk bound (see :class:`TargetState`). That
bound is a descent guarantee only while ``a = 1 - 2 L eta >= 0`` (``L eta <= 1/2``; ``L eta <= 1``
for ``bound="descent"``, whose derivation needs ``eta <= 1/L``): each target records whether this
premise held at every step so far, and its risk bound is reported only where it did.

Baseline weightings share this machinery: ``local`` (only the target's own gradient),
``uniform`` (1/M), ``oracle`` (uniform over the target's true cluster) and ``similarity``
(``alpha_i ∝ max(cos, 0)`` of EMA gradients, updated lazily like SP-CACW). FedAvg and IFCA
live in :mod:`.methods`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_sel.base import Array, ConfigError, PRNGKey
from fedjax_sel.data.client_data import ClientData
from fedjax_sel.data.datasets import FederatedDataset
from fedjax_sel.kernels.smoothness import power_iteration
from fedjax_sel.models import Model
from fedjax_sel.personalized import weighting
from fedjax_sel.personalized.state import (
    EpochLog,
    PersonalizedConfig,
    PersonalizedState,
    TargetState,
)

# fold_in purposes of the simulation key
_STEP, _POWER, _INIT = 0, 1, 2


def _ema(old: Array, obs: Array, beta: float, first: Array, on: Array) -> Array:
    """EMA update where ``on``; the first observation initialises it."""
    new = jnp.where(first, obs, (1.0 - beta) * old + beta * obs)
    return jnp.where(on, new, old)


class PersonalizedSimulation:
    """Every target client trains its own model with weighted peer gradients (module docstring).

    Args:
      dataset: a federated data set with per-client test splits (``dataset.test``).
      model: the model (:func:`fedjax_sel.models.make_model`).
      config: :class:`PersonalizedConfig`.
      targets: client ids that are targets (all clients when ``None``).
      clusters: int[K] true cluster of every client (``oracle`` needs it; defaults to
        ``dataset.info["cluster"]`` when the data set records one).
      eval_batch_size: examples per forward pass in evaluation.

    >>> sim = PersonalizedSimulation(ds, model, PersonalizedConfig(method="sp_cacw"))
    >>> state = sim.init(seed=0)
    >>> state, log = sim.run_epochs(state, 10)
    >>> sim.evaluate(state)["test_accuracy"]  # one value per target
    """

    def __init__(
        self,
        dataset: FederatedDataset,
        model: Model,
        config: PersonalizedConfig,
        *,
        targets: Sequence[int] | None = None,
        clusters: Sequence[int] | None = None,
        eval_batch_size: int = 256,
    ):
        self.config = config.validate()
        if model.task != dataset.task:
            raise ConfigError(
                f"model {model.name!r} solves {model.task} but data set {dataset.name!r} is "
                f"{dataset.task}"
            )
        k = dataset.num_clients
        self.dataset, self.model, self.num_clients = dataset, model, k
        ids = check_targets(dataset, targets)
        self.target_ids = jnp.asarray(ids, jnp.int32)
        if clusters is None and "cluster" in dataset.info:
            clusters = dataset.info["cluster"]
        self.clusters = None if clusters is None else jnp.asarray(np.asarray(clusters), jnp.int32)
        if self.clusters is not None and self.clusters.shape != (k,):
            raise ConfigError(f"clusters must hold one id per client ({k}), got {len(clusters)}")
        if config.method == "oracle" and self.clusters is None:
            raise ConfigError("method 'oracle' needs the clients' true clusters (clusters=...)")
        counts = np.asarray(dataset.train.counts)
        self.update_every = int(
            config.update_every or max(1, math.ceil(float(np.median(counts)) / config.batch_size))
        )
        if config.method == "local":
            self.peer_ids = self.target_ids[:, None]
            self.self_index = jnp.zeros((len(ids),), jnp.int32)
        else:
            self.peer_ids = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (len(ids), k))
            self.self_index = self.target_ids
        self.num_peers = int(self.peer_ids.shape[1])
        self.eval_batch_size = int(eval_batch_size)
        params0 = model.init(jax.random.key(0))
        flat0, self.unravel = ravel_pytree(params0)
        self.dim = int(flat0.shape[0])
        self._run = jax.jit(self._run_fn, static_argnums=(2,))
        self._evaluate = jax.jit(self._evaluate_fn, static_argnums=(3,))
        self._init_targets = jax.jit(self._init_targets_fn)

    # ------------------------------------------------------------------------------ losses
    def _loss(self, theta: Array, x: Array, y: Array, w: Array) -> Array:
        """Weighted mean loss (plus the model's regulariser) of flat params ``theta``."""
        p = self.unravel(theta)
        per_example = self.model.loss(self.model.apply(p, x), y)
        out = jnp.sum(per_example * w) / jnp.maximum(jnp.sum(w), 1.0)
        if self.model.regularizer is not None:
            out = out + self.model.regularizer(p)
        return out

    def _batch(self, data: ClientData, client: Array, key: PRNGKey, size: int):
        """``size`` positions drawn uniformly with replacement from ``client``'s examples."""
        pos = jax.random.randint(key, (size,), 0, jnp.maximum(data.counts[client], 1))
        return data.gather(client, pos)

    def _peer_grads(self, theta: Array, data: ClientData, peer: Array, key: PRNGKey):
        """Two half-batch gradients of ``peer``'s loss at ``theta``: losses float32[2] and
        gradients float32[2, d] (the first and the second ``batch_size / 2`` positions of one
        draw, each half its own forward and backward pass)."""
        b = self.config.batch_size
        x, y, _ = self._batch(data, peer, key, b)
        x = x.reshape((2, b // 2) + x.shape[1:])
        y = y.reshape((2, b // 2) + y.shape[1:])
        ones = jnp.ones((b // 2,), jnp.float32)
        value_and_grad = jax.value_and_grad(lambda th, xh, yh: self._loss(th, xh, yh, ones))
        losses, grads = jax.vmap(value_and_grad, in_axes=(None, 0, 0))(theta, x, y)
        return losses, grads

    def _smoothness(self, theta: Array, data: ClientData, client: Array, key: PRNGKey) -> Array:
        """Power-iteration estimate of ``||Hess f_client(theta)||_2`` on a fresh minibatch."""
        k_batch, k_vec = jax.random.split(key)
        x, y, _ = self._batch(data, client, k_batch, self.config.batch_size)
        w = jnp.ones((self.config.batch_size,), jnp.float32)
        grad = jax.grad(lambda th: self._loss(th, x, y, w))

        def matvec(v):
            return jax.jvp(grad, (theta,), (v,))[1]

        v0 = jax.random.normal(k_vec, theta.shape, jnp.float32)
        return power_iteration(matvec, v0, self.config.power_iters)[0]

    # ------------------------------------------------------------------------- the method
    def _participation(self, peers: Array, target: Array) -> Array:
        """float32[P] participation probabilities (1 for the target itself)."""
        return jnp.where(peers == target, 1.0, self.config.participation).astype(jnp.float32)

    def _lr_and_coefficients(self, smoothness: Array):
        cfg = self.config
        if cfg.lr_rule == "fixed":
            lr = jnp.asarray(cfg.lr, jnp.float32)
        else:
            c = 1.0 if cfg.bound == "descent" else 2.0
            lr = jnp.minimum(cfg.lr, 1.0 / jnp.maximum(c * smoothness, 1e-12))
        a, c_b = weighting.bound_coefficients(cfg.bound, smoothness * lr)
        return lr, a, c_b

    def _premise(self, lr_times_l: Array) -> Array:
        """Whether ``L eta`` keeps the bound a descent guarantee: ``a = 1 - 2 L eta >= 0`` for
        ``appendix_d``, ``eta <= 1/L`` for ``descent`` (a relative float32 slack, so that
        ``lr_rule="smoothness"``'s ``eta = 1/(c L)`` passes)."""
        limit = 1.0 if self.config.bound == "descent" else 0.5
        return lr_times_l <= limit * (1.0 + 1e-5)

    def _initial_alpha(self, target: Array, peers: Array) -> Array:
        cfg, p = self.config, self.num_peers
        if cfg.method == "local":
            return jnp.ones((1,), jnp.float32)
        if cfg.method == "oracle":
            return weighting.cluster_weights(self.clusters[peers], self.clusters[target])
        if cfg.method == "uniform" or cfg.init_weights == "uniform":
            return weighting.uniform_weights(p)
        return (peers == target).astype(jnp.float32)

    def _init_targets_fn(self, params: Array, key: PRNGKey, data: ClientData) -> TargetState:
        p, d = self.num_peers, self.dim

        def one(target, peers):
            smooth = self._smoothness(
                params, data, target, jax.random.fold_in(jax.random.fold_in(key, _INIT), target)
            )
            lr, _, _ = self._lr_and_coefficients(smooth)
            f0 = self._client_loss_acc(params, data, target)[0]
            zero = jnp.zeros((), jnp.float32)
            return TargetState(
                params=params,
                alpha=self._initial_alpha(target, peers),
                bias=jnp.zeros((p, d), jnp.float32),
                own_grad=jnp.zeros((d,), jnp.float32),
                var=jnp.zeros((p,), jnp.float32),
                sq_norm=jnp.zeros((p,), jnp.float32),
                num_obs=jnp.zeros((p,), jnp.int32),
                smoothness=smooth,
                lr=lr,
                lam=zero,
                bound=zero,
                risk_bound=f0,
                premise=jnp.ones((), bool),
                ftal_quad=jnp.zeros((p, p), jnp.float32),
                ftal_lin=jnp.zeros((p,), jnp.float32),
            )

        return jax.vmap(one)(self.target_ids, self.peer_ids)

    def _step(self, ts: TargetState, t: Array, target, peers, self_idx, key, data):
        """One SGD step of one target (Algorithm 1, lines 3-6)."""
        cfg = self.config
        k_step = jax.random.fold_in(jax.random.fold_in(key, _STEP), t)
        # A client's minibatch at step t depends on (t, client) only: every target that
        # queries it gets the same one (each target's run has the same law as alone, and the
        # batch is gathered once for all targets: no target axis when every client is a peer).
        batch_of = jnp.arange(self.num_clients) if self.num_peers > 1 else peers
        batch_keys = jax.vmap(lambda q: jax.random.fold_in(k_step, q))(batch_of)
        losses, grads = jax.vmap(self._peer_grads, in_axes=(None, None, 0, 0))(
            ts.params, data, batch_of, batch_keys
        )
        k = jax.random.fold_in(k_step, target)
        p_i = self._participation(peers, target)
        draws = jax.vmap(lambda q: jax.random.uniform(jax.random.fold_in(k, q)))(peers)
        z = (draws < p_i) | (peers == target)
        g = 0.5 * (grads[:, 0] + grads[:, 1])  # [P, d]
        var_obs = 0.25 * jnp.sum(jnp.square(grads[:, 0] - grads[:, 1]), axis=1)
        own = g[self_idx]
        grad_norm_sq = jnp.vdot(grads[self_idx, 0], grads[self_idx, 1])
        # Line 4: bias EMAs of the participating peers.
        first = ts.num_obs == 0
        bias = _ema(ts.bias, g - own[None], cfg.ema, first[:, None], z[:, None])
        var = _ema(ts.var, var_obs, cfg.ema, first, z)
        sq_norm = _ema(ts.sq_norm, jnp.sum(jnp.square(g), axis=1), cfg.ema, first, z)
        own_grad = jnp.where(t == 0, own, (1.0 - cfg.ema) * ts.own_grad + cfg.ema * own)
        # Lines 5-6: aggregate with 1/p scaling and step.
        scale = ts.alpha * z.astype(jnp.float32) / p_i
        update = scale @ g
        # Running risk bound with the plug-in bound at this step.
        _, a, c_b = self._lr_and_coefficients(ts.smoothness)
        v = weighting.peer_variances(var, sq_norm, p_i)
        phi = weighting.bound_value(ts.alpha, bias, v, c_b, ts.smoothness * ts.lr)
        risk = ts.risk_bound + 0.5 * ts.lr * (phi - a * grad_norm_sq)
        ts = ts.replace(
            params=ts.params - ts.lr * update,
            bias=bias,
            own_grad=own_grad,
            var=var,
            sq_norm=sq_norm,
            num_obs=ts.num_obs + z.astype(jnp.int32),
            risk_bound=risk,
            premise=ts.premise & self._premise(ts.smoothness * ts.lr),
        )
        return ts, (jnp.mean(losses[self_idx]), grad_norm_sq)

    def _update_weights(self, ts: TargetState, target, peers, self_idx, epoch, key, data):
        """The lazy weight update at the end of an epoch (Algorithm 1, line 7; appendix F)."""
        cfg = self.config
        kp = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, _POWER), epoch), target)
        smooth = self._smoothness(ts.params, data, target, kp)
        lr, _, c_b = self._lr_and_coefficients(smooth)
        lr_l = smooth * lr
        v = weighting.peer_variances(ts.var, ts.sq_norm, self._participation(peers, target))
        lam = weighting.regularization(cfg.reg_gamma, ts.var[self_idx])
        alpha, quad, lin = ts.alpha, ts.ftal_quad, ts.ftal_lin
        # A peer never observed has zero estimates (H_ii = 0, or the target's own gradient for
        # the similarity rule) and would look ideal: only observed peers may get weight.
        observed = (ts.num_obs > 0) if cfg.observed_only else None
        if cfg.method == "sp_cacw":
            noise = None
            if cfg.debias:
                noise = weighting.ema_noise_gram(ts.var, ts.num_obs, cfg.ema, self_idx)
            h = weighting.bound_matrix(ts.bias, v, c_b, lr_l, noise)
            alpha, quad, lin = weighting.sp_cacw_weights(
                h, lam, alpha, quad, lin, solver=cfg.solver, num_steps=cfg.pgd_steps,
                mask=observed,
            )  # fmt: skip
        elif cfg.method == "similarity":
            alpha = weighting.similarity_weights(
                ts.bias + ts.own_grad[None], self_idx, mask=observed
            )
        bound = weighting.bound_value(alpha, ts.bias, v, c_b, lr_l)
        return ts.replace(
            alpha=alpha,
            smoothness=smooth,
            lr=lr,
            lam=lam,
            bound=bound,
            ftal_quad=quad,
            ftal_lin=lin,
        )

    def _target_epoch(self, ts, epoch, target, peers, self_idx, key, data):
        u = self.update_every
        steps = epoch * u + jnp.arange(u)

        def body(ts, t):
            return self._step(ts, t, target, peers, self_idx, key, data)

        ts, (losses, gsq) = jax.lax.scan(body, ts, steps)
        ts = self._update_weights(ts, target, peers, self_idx, epoch, key, data)
        log = EpochLog(
            alpha=ts.alpha,
            bound=ts.bound,
            risk_bound=jnp.where(ts.premise, ts.risk_bound, jnp.nan),
            lam=ts.lam,
            smoothness=ts.smoothness,
            lr=ts.lr,
            train_loss=jnp.mean(losses),
            grad_norm_sq=jnp.mean(gsq),
            premise=ts.premise,
            unobserved_weight=jnp.sum(jnp.where(ts.num_obs > 0, 0.0, ts.alpha)),
        )
        return ts, log

    def _run_fn(self, state: PersonalizedState, data: ClientData, num_epochs: int):
        def per_target(args):
            ts, target, peers, self_idx = args

            def body(ts, e):
                return self._target_epoch(
                    ts, state.epoch + e, target, peers, self_idx, state.key, data
                )

            return jax.lax.scan(body, ts, jnp.arange(num_epochs))

        xs = (state.targets, self.target_ids, self.peer_ids, self.self_index)
        if self.config.target_chunk is None:
            targets, logs = jax.vmap(per_target)(xs)
        else:
            targets, logs = jax.lax.map(per_target, xs, batch_size=self.config.target_chunk)
        logs = jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1), logs)  # [epochs, T, ...]
        return state.replace(epoch=state.epoch + num_epochs, targets=targets), logs

    # ----------------------------------------------------------------------------- public
    def initial_params(self, seed: int) -> Array:
        """The flat initial model shared by every target (and by the baselines)."""
        return ravel_pytree(self.model.init(initial_key(seed)))[0]

    def init(self, seed: int = 0) -> PersonalizedState:
        """The state before the first step: every target starts from the same model."""
        key = jax.random.key(seed)
        params = self.initial_params(seed)
        targets = self._init_targets(params, key, self.dataset.train)
        chex.assert_shape(targets.params, (len(self.target_ids), self.dim))
        chex.assert_shape(targets.alpha, (len(self.target_ids), self.num_peers))
        return PersonalizedState(epoch=jnp.zeros((), jnp.int32), key=key, targets=targets)

    def run_epochs(
        self, state: PersonalizedState, num_epochs: int
    ) -> tuple[PersonalizedState, EpochLog]:
        """Runs ``num_epochs`` lazy-update periods of ``update_every`` steps for every target
        in one compiled call; returns the new state and the host-side :class:`EpochLog`."""
        if num_epochs < 1:
            raise ConfigError(f"num_epochs must be >= 1, got {num_epochs}")
        state, logs = self._run(state, self.dataset.train, int(num_epochs))
        return state, jax.tree.map(np.asarray, logs)

    # ------------------------------------------------------------------------- evaluation
    def _client_loss_acc(self, theta: Array, data: ClientData, client: Array):
        """Mean loss and accuracy of flat params on all of ``client``'s examples in ``data``
        (NaN when it holds none; accuracy NaN for regression)."""
        loss_sum, correct_sum, count = self._client_sums(theta, data, client)
        denom = jnp.where(count > 0, count, jnp.nan)
        acc = correct_sum / denom if self.model.correct is not None else jnp.full((), jnp.nan)
        return loss_sum / denom, acc

    def _client_sums(self, theta, data, client):
        bsz = self.eval_batch_size
        p = self.unravel(theta)
        count = data.counts[client]

        def body(state):
            j, loss, correct = state
            x, y, mask = data.gather(client, j * bsz + jnp.arange(bsz))
            out = self.model.apply(p, x)
            m = mask.astype(jnp.float32)
            loss = loss + jnp.sum(self.model.loss(out, y) * m)
            if self.model.correct is not None:
                correct = correct + jnp.sum(self.model.correct(out, y) * m)
            return j + 1, loss, correct

        zero = jnp.zeros((), jnp.float32)
        _, loss, correct = jax.lax.while_loop(
            lambda s: s[0] * bsz < count, body, (jnp.zeros((), jnp.int32), zero, zero)
        )
        return loss, correct, count.astype(jnp.float32)

    def _gradient_moments(self, theta: Array, data: ClientData, client: Array):
        """Exact full-data gradient ``grad f_i(theta)`` float32[d] and the mean squared
        per-example gradient norm of ``client`` (per-example gradients, chunked)."""
        bsz = min(self.eval_batch_size, 32)
        count = data.counts[client]
        one = jnp.ones((1,), jnp.float32)

        def example_grad(x, y):
            return jax.grad(lambda th: self._loss(th, x[None], y[None], one))(theta)

        def body(state):
            j, gsum, sq = state
            x, y, mask = data.gather(client, j * bsz + jnp.arange(bsz))
            g = jax.vmap(example_grad)(x, y) * mask[:, None].astype(jnp.float32)
            return j + 1, gsum + jnp.sum(g, 0), sq + jnp.sum(jnp.square(g))

        init = (jnp.zeros((), jnp.int32), jnp.zeros((self.dim,), jnp.float32), jnp.zeros(()))
        _, gsum, sq = jax.lax.while_loop(lambda s: s[0] * bsz < count, body, init)
        n = jnp.maximum(count, 1).astype(jnp.float32)
        return gsum / n, sq / n

    def _true_bound(self, ts: TargetState, target, peers, self_idx, data):
        """The bound's terms with exact full-data quantities at the target's current model:
        true biases ``b_i`` and variances ``v_i`` (minibatch of ``batch_size`` drawn with
        replacement, Bernoulli participation), hence

        * ``bound_true = c_b ||B alpha||^2 + L eta sum alpha_i^2 v_i`` (the same formula as the
          algorithm's, with true ``B`` and ``v`` instead of the online estimates), and
        * ``grad_error = E||G(alpha) - grad f_0||^2 = ||B alpha||^2 + sum alpha_i^2 v_i``,
          the quantity the bound controls, exactly."""
        # lax.map over peers: per-example gradients of one peer at a time bound the memory.
        grads, second = jax.lax.map(lambda q: self._gradient_moments(ts.params, data, q), peers)
        own = grads[self_idx]
        bias = grads - own[None]
        sq_norm_grad = jnp.sum(jnp.square(grads), axis=1)
        sigma2 = jnp.maximum(second - sq_norm_grad, 0.0) / self.config.batch_size
        p_i = self._participation(peers, target)
        v = weighting.peer_variances(sigma2, sigma2 + sq_norm_grad, p_i)
        _, a, c_b = self._lr_and_coefficients(ts.smoothness)
        lr_l = ts.smoothness * ts.lr
        mixed = ts.alpha @ bias
        return {
            "bound_true": weighting.bound_value(ts.alpha, bias, v, c_b, lr_l),
            "grad_error": jnp.sum(jnp.square(mixed)) + jnp.sum(jnp.square(ts.alpha) * v),
            "bias_term": jnp.sum(jnp.square(mixed)),
            "grad_norm_sq": jnp.sum(jnp.square(own)),
            "descent_coef": a,
        }

    def _evaluate_fn(
        self, state: PersonalizedState, train: ClientData, test: ClientData, track: bool
    ):
        def one(ts, target, peers, self_idx):
            test_loss, test_acc = self._client_loss_acc(ts.params, test, target)
            train_loss, train_acc = self._client_loss_acc(ts.params, train, target)
            observed = ts.num_obs > 0
            out = {
                "test_loss": test_loss,
                "test_accuracy": test_acc,
                "train_loss": train_loss,
                "train_accuracy": train_acc,
                "bound": ts.bound,
                # a descent guarantee only where its premise held at every step (TargetState)
                "risk_bound": jnp.where(ts.premise, ts.risk_bound, jnp.nan),
                "bound_premise": ts.premise.astype(jnp.float32),
                "lr_times_smoothness": ts.smoothness * ts.lr,
                "self_weight": ts.alpha[self_idx],
                "unobserved_weight": jnp.sum(jnp.where(observed, 0.0, ts.alpha)),
                "observed_fraction": jnp.mean(observed.astype(jnp.float32)),
            }
            if self.clusters is not None:
                same = self.clusters[peers] == self.clusters[target]
                out["own_cluster_weight"] = jnp.sum(jnp.where(same, ts.alpha, 0.0))
            if track:
                out.update(self._true_bound(ts, target, peers, self_idx, train))
            return out

        return jax.vmap(one)(state.targets, self.target_ids, self.peer_ids, self.self_index)

    def evaluate(
        self, state: PersonalizedState, track_bound: bool = False
    ) -> dict[str, np.ndarray]:
        """Per-target metrics (float arrays ``[T]``): test/train loss and accuracy on the
        target's own data; the estimated ``bound`` ``Phi(alpha)``; ``risk_bound`` (NaN where
        its premise failed), ``bound_premise`` (1 where ``L eta`` stayed within the premise at
        every step) and ``lr_times_smoothness`` (the current ``L eta``); the weight on the
        target itself (``self_weight``), on peers never observed (``unobserved_weight``), on
        the own true cluster (``own_cluster_weight``, clusters known) and the fraction of
        clients observed so far; with ``track_bound`` also the exact terms of
        :meth:`_true_bound` (costs M full-data gradients per target)."""
        out = self._evaluate(state, self.dataset.train, self.dataset.test, bool(track_bound))
        return {k: np.asarray(v) for k, v in out.items()}

    def weights(self, state: PersonalizedState) -> np.ndarray:
        """float[T, K] current weights of every target over all clients (``local``: one-hot)."""
        alpha = np.asarray(state.targets.alpha)
        if self.num_peers == self.num_clients:
            return alpha
        full = np.zeros((len(self.target_ids), self.num_clients), np.float32)
        full[np.arange(len(self.target_ids)), np.asarray(self.target_ids)] = alpha[:, 0]
        return full


def check_targets(dataset: FederatedDataset, targets: Sequence[int] | None) -> np.ndarray:
    """int64[T] validated target ids (all clients when ``None``); the data set must have
    per-client test splits, on which every target is evaluated."""
    if dataset.test is None:
        raise ConfigError(
            f"data set {dataset.name!r} has no per-client test splits; personalized mode "
            "evaluates each target on its own test data (use test_fraction > 0)"
        )
    k = dataset.num_clients
    ids = np.arange(k) if targets is None else np.asarray(list(targets), np.int64)
    if ids.ndim != 1 or len(ids) == 0 or ids.min() < 0 or ids.max() >= k:
        raise ConfigError(f"targets must be client ids in [0, {k}), got {targets!r}")
    if len(np.unique(ids)) != len(ids):
        raise ConfigError(f"targets must be distinct, got {list(ids)}")
    return ids


def initial_key(seed: int) -> PRNGKey:
    """The key of the initial model shared by every method of a comparison."""
    return jax.random.fold_in(jax.random.key(seed), 10**6)
