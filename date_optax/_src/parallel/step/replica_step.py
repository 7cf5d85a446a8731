"""The body every replicated data-parallel step runs, as flax's `train_step` reads.

`replica_step` runs on one replica, inside `shard_map` or `pmap`: the loss
and the gradient of its slice of the batch (`local_grads.replica_grads`), the
one reduction over the replicas (`grad_sync.sync_gradients`), and the means
of what else the replicas computed. `apply_update` then applies the
optimizer. The `pmap` step calls both inside `pmap`; the `shard_map` step
calls `replica_step` inside `shard_map` and `apply_update` on the mesh (so
that, with weight-update sharding, norms over split layers stay exact); the
GSPMD step of sharded parameters computes the same `ReplicaResult` as one
program and calls the same `apply_update`.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from date_optax._src.parallel.comm.grad_sync import sync_gradients
from date_optax._src.parallel.comm.sync_config import GradSync
from date_optax._src.parallel.step import grad_stats as gs_lib
from date_optax._src.parallel.step import local_grads as lg
from date_optax._src.parallel.step.step_config import StepConfig
from date_optax._src.parallel.step.train_state import Metrics, TrainState, apply_gradients
from date_optax._src.types import LossFn, PyTree


class ReplicaResult(NamedTuple):
  """What the replicas agree on after the reduction."""

  loss: jax.Array  # mean over the global batch, float32
  aux: Any  # float leaves averaged, integer leaves summed (None without has_aux)
  grads: PyTree  # the mean gradient (or this replica's shards of it)
  model_state: Any  # float leaves averaged, others from replica 0 (or None)
  unit_sq: jax.Array | None  # mean squared gradient norm of one unit (grad_stats)
  residual: Any = None  # this replica's new error-feedback residual (or None)
  # S_B measured on the uncompressed mean (a lossy sync with grad_stats), or
  # None: then the reduced gradient's own squared norm is S_B.
  mean_sq: jax.Array | None = None


def replica_step(
    loss_fn: LossFn,
    config: StepConfig,
    grad_sync: GradSync,
    *,
    params: PyTree,
    batch: PyTree,
    model_state: Any,
    rng: Any,
    step: jax.Array,
    axes: tuple[Hashable, ...],
    scatter: bool = False,
    with_stats: bool = False,
    residual: Any = None,
) -> ReplicaResult:
  """One replica's loss and gradient, and their one reduction over `axes`.

  With `grad_sync.error_feedback`, `residual` is this replica's residual
  (`TrainState.grad_residual` without the replica axis) and the result
  carries the new one.
  """
  if grad_sync.error_feedback and residual is None:
    raise ValueError(
        "error_feedback=True needs state.grad_residual: build the state with "
        "this step's init (TrainState.create leaves it None)."
    )
  replica = lg.replica_index(axes)
  loss, aux, local, model_state, *sq = lg.replica_grads(
      loss_fn, config, params=params, batch=batch, model_state=model_state,
      rng=rng, step=step, replica=replica, with_sq_norms=with_stats,
  )
  grads = sync_gradients(
      local, axes, grad_sync, key=grad_sync.rounding_key(rng, step), scatter=scatter,
      residual=residual if grad_sync.error_feedback else None,
  )
  if grad_sync.error_feedback:
    grads, residual = grads
  unit_sq = mean_sq = None
  if with_stats:  # the units' squared norms ride in the loss's scalar all-reduce
    lossy = grad_sync.format is not None  # then the uncompressed gradient's sketch too
    scalars = jnp.concatenate([jnp.stack([loss, sq[0]]),
                               gs_lib.sketch(local, step) if lossy else jnp.zeros(0)])
    scalars = lax.pmean(scalars, axes)
    loss, unit_sq = scalars[0], scalars[1] / config.microbatches
    mean_sq = jnp.sum(jnp.square(scalars[2:])) if lossy else None
  else:
    loss = lax.pmean(loss, axes)
  # Multislice: the statistics cross the slices as the gradient does, a
  # 1/M shard per device, exact in float32.
  mean = (functools.partial(sync_gradients, axis_name=axes,
                            grad_sync=GradSync("hierarchical", dcn_algorithm=None))
          if grad_sync.algorithm == "hierarchical" else None)
  model_state = lg.replicate_model_state(model_state, axes, replica, mean)
  return ReplicaResult(loss, lg.mean_aux(aux, axes), grads, model_state, unit_sq,
                       residual if grad_sync.error_feedback else None, mean_sq)


def apply_update(
    state: TrainState,
    result: ReplicaResult,
    optimizer: optax.GradientTransformation,
    config: StepConfig,
    *,
    units: int,
    global_batch: int,
    grad_stats_decay: float | None,
    extra_args: Any = None,
    grad_keys: Any = None,
) -> tuple[TrainState, Metrics]:
  """The optimizer step on the reduced gradient (`train_state.apply_gradients`).

  `units` is replicas × microbatches and `global_batch` the rows of the
  global batch, for the gradient-noise statistics; `grad_keys` the
  gradients' layouts (the parameters' `PartitionSpec`s), or None.
  """
  stats = None
  if result.unit_sq is not None:
    stats = (result.unit_sq, units, global_batch, grad_stats_decay, result.mean_sq)
  new_state, metrics = apply_gradients(
      state, result.grads, result.loss, optimizer, result.model_state, stats,
      result.residual, extra_args, grad_keys,
  )
  if config.has_aux:
    metrics["aux"] = result.aux
  return new_state, metrics
