"""What a round costs (docs/time.md, "Costs"): the client updates the server received, the
bytes clients uploaded, the FLOPs clients spent, and the seconds the strategy's oracle work
(:class:`~fedjax_sel.base.ClientWork`) adds to the virtual clock.

FLOPs are the model's analytic count (:mod:`fedjax_sel.models.flops`): one example forward is
``spec.example_flops``, a training example three of them (forward and backward), and a local
step processes ``samples_k / steps_k`` examples (``min(batch, n_k)`` with fixed local steps),
the same work the system model times (:func:`fedjax_sel.engine.system.client_work`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from fedjax_sel.base import Array, ClientWork
from fedjax_sel.engine.spec import RoundSpec
from fedjax_sel.engine.system import AUGMENTATION, client_work


class RoundCost(NamedTuple):
    """One round's cost (scalars; a run's records keep the running totals)."""

    client_updates: Array  # int32: model updates received (kept slots + the strategy's uploads)
    uplink_bytes: Array  # float32: those updates' bytes (float32 models)
    client_flops: Array  # float32: local training plus the strategy's oracle work


def examples_per_step(spec: RoundSpec, counts: Array) -> Array:
    """float32[K]: examples one local SGD step of each client processes."""
    samples, steps = client_work(
        counts, spec.local.batch_size, spec.local.local_steps, spec.local.local_epochs
    )
    return samples / jnp.maximum(steps, 1).astype(jnp.float32)


def model_bytes(spec: RoundSpec) -> float:
    """Bytes of one model upload (``spec.kbit`` is one transfer in kilobits)."""
    return spec.kbit * 1000.0 / 8.0


def round_cost(
    spec: RoundSpec,
    counts: Array,
    clients: Array,
    mask: Array,
    num_steps: Array,
    work: ClientWork | None,
) -> RoundCost:
    """The cost of a round whose slots ``clients`` (kept where ``mask``) ran ``num_steps``
    local steps and whose strategy asked ``work`` of clients."""
    per_step = examples_per_step(spec, counts)
    step_examples = jnp.sum(jnp.where(mask, num_steps * per_step[clients], 0.0))
    train_examples = AUGMENTATION * step_examples
    uploads = jnp.sum(mask).astype(jnp.float32)
    if work is not None:
        train_examples += AUGMENTATION * jnp.sum(work.train_steps * per_step)
        train_examples += jnp.sum(work.forward_examples)
        uploads += jnp.sum(work.uploads)
    return RoundCost(
        client_updates=jnp.round(uploads).astype(jnp.int32),
        uplink_bytes=(uploads * model_bytes(spec)).astype(jnp.float32),
        client_flops=(train_examples * spec.example_flops).astype(jnp.float32),
    )


def work_seconds(
    spec: RoundSpec,
    work: ClientWork | None,
    counts: Array,
    compute: Array,
    comm: Array,
) -> Array:
    """Seconds the strategy's oracle work holds the round up before training starts: the
    slowest client it asked, each paying one model download, its forward examples and extra
    steps at its own speed, and its extra uploads (``compute``, ``comm``: per client, the
    seconds of the round's full local work and of one download plus one upload, as
    :func:`fedjax_sel.engine.phases.client_durations` gives them)."""
    if work is None:
        return jnp.zeros((), jnp.float32)
    samples, _ = client_work(
        counts, spec.local.batch_size, spec.local.local_steps, spec.local.local_epochs
    )
    per_example = compute / jnp.maximum(samples, 1.0)  # a training example's seconds
    per_step = examples_per_step(spec, counts)
    asked = (work.forward_examples > 0) | (work.train_steps > 0) | (work.uploads > 0)
    seconds = per_example * (
        work.forward_examples / AUGMENTATION + work.train_steps * per_step
    ) + 0.5 * comm * (1.0 + work.uploads)
    return jnp.max(jnp.where(asked, seconds, 0.0)).astype(jnp.float32)
