"""The data-parallel step of replicated parameters: `shard_map`, one explicit reduction.

Each replica runs the body the `pmap` step runs too
(`replica_step.replica_step`: loss, gradient, `grad_sync.sync_gradients`
with any `GradSync`), inside `shard_map` over the data axes; the optimizer
runs on the mesh, and with `shard_update=True` the gradients are
reduce-scattered and the new parameters all-gathered.

Why the gradient is local under `shard_map`: with `check_vma=True` JAX already
sums the gradient of a replicated parameter over the mesh (the transpose of
the implicit broadcast), so reducing it again would multiply it by the number
of replicas. The step differentiates with respect to a device-varying copy of
the parameters (`compat.to_varying`), which is local under every setting.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import jax
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from date_optax._src import batch_schedule as bs_lib
from date_optax._src.batch_schedule import BatchSchedule
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.comm.sync_config import GradSync, grad_sync_from
from date_optax._src.parallel.step import grad_stats as gs_lib
from date_optax._src.parallel.step.replica_step import ReplicaResult, replica_step
from date_optax._src.parallel.step.step_base import TrainStep
from date_optax._src.parallel.step.step_checks import check_step_args
from date_optax._src.parallel.step.step_config import StepConfig
from date_optax._src.parallel.step.train_state import TrainState
from date_optax._src.types import LossFn


class ReplicatedTrainStep(TrainStep):
  """The step of replicated parameters: `shard_map` and one explicit reduction.

  As built by `make_replicated_train_step` (or `make_train_step` without
  `param_sharding`). Each replica runs `replica_step` (loss, gradient, the
  `grad_sync` reduction) inside `shard_map`; the optimizer runs on the mesh;
  with `shard_update` the new parameters are all-gathered.

  Args:
    loss_fn, optimizer, mesh: see `make_replicated_train_step`.
    grad_sync: the `GradSync`.
    **options: those of `TrainStep`.

  Returns:
    The step (a callable object).

  Examples:
    >>> import optax
    >>> import date_optax.parallel as dp
    >>> step = dp.make_replicated_train_step(
    ...     lambda p, b: (p * b).mean(), optax.sgd(0.1), dp.data_mesh(),
    ...     grad_sync=dp.GradSync("ring"))
    >>> isinstance(step, dp.ReplicatedTrainStep), step.grad_reduce
    (True, 'ring')

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Xu et al.,
    "Automatic Cross-Replica Sharding of Weight Update in Data-Parallel
    Training", 2020.
  """

  def __init__(self, loss_fn, optimizer, mesh, *, grad_sync: GradSync, **options):
    super().__init__(loss_fn, optimizer, mesh, **options)
    self.grad_sync = grad_sync
    self.error_feedback = grad_sync.error_feedback

  @property
  def grad_reduce(self) -> str:
    """The all-reduce algorithm (`grad_sync.algorithm`)."""
    return self.grad_sync.algorithm

  def _replicas(self, params, batch, model_state, rng, step, residual=None,
                config=None) -> ReplicaResult:
    axes = self.data_axes
    config = self.config if config is None else config
    if not self.error_feedback:
      residual = None  # a residual the step does not use stays in the state

    def body(params, batch, model_state, rng, step, residual):
      own = None if residual is None else jax.tree.map(lambda e: e[0], residual)
      result = replica_step(
          self.loss_fn, config, self.grad_sync,
          params=compat.to_varying(params, axes), batch=batch,
          model_state=model_state, rng=rng, step=step, axes=axes,
          scatter=self.shard_update, with_stats=self.grad_stats_decay is not None,
          residual=own,
      )
      if result.residual is None:
        return result
      return result._replace(residual=jax.tree.map(lambda e: e[None], result.residual))

    spec = self.residual_spec
    fn = compat.shard_map(
        body,
        mesh=self.mesh,
        in_specs=(P(), self.batch_spec, P(), P(), P(), spec),
        out_specs=ReplicaResult(P(), P(), self._update_specs(params), P(), P(), spec, P()),
    )
    return fn(params, batch, model_state, rng, step, residual)

  def _after_update(self, state: TrainState) -> TrainState:
    if not self.shard_update:
      return state
    params = state.params
    shapes = [np.shape(x) for x in jax.tree.leaves(params)]
    specs = self._update_specs(params)
    params = jax.tree.map(
        lambda x, s: lax.with_sharding_constraint(x, NamedSharding(self.mesh, s)),
        params,
        specs,
    )
    fn = compat.shard_map(
        lambda p: us.all_gather_params(
            p, shapes, self.update_axes, self.grad_reduce, self.update_shards,
            self.grad_sync.grid,
        ),
        mesh=self.mesh,
        in_specs=(specs,),
        out_specs=P(),
    )
    return state.replace(params=fn(params))



def make_replicated_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    grad_sync: GradSync | None = None,
    step_config: StepConfig | None = None,
    shard_update: bool = False,
    data_axes: Sequence[Hashable] | None = None,
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
    batch_schedule: BatchSchedule | None = None,
    max_rows_per_device: int | None = None,
) -> ReplicatedTrainStep:
  """Builds the data-parallel step of replicated parameters (`shard_map`).

  Every device of `data_axes` holds the parameters and a slice of the global
  batch. The step reads as flax's `train_step`: each replica computes its
  loss and gradient, the gradients are reduced once by
  `sync_gradients(grads, data_axes, grad_sync)` (any algorithm, any payload
  format), and the optimizer is applied; non-finite steps are skipped. The
  `pmap` step runs the same per-replica body. Model state, keys,
  microbatches, statistics and weight-update sharding are as described on
  `make_train_step`.

  Args:
    loss_fn: `loss_fn(params, batch, *, model_state=..., rng=...)`, the mean
      loss over the (micro)batch it is given, as for `make_train_step`.
    optimizer: an optax gradient transformation.
    mesh: the device mesh (`data_mesh`, `torus_mesh`, ...).
    grad_sync: how the gradients are reduced, a `GradSync` (default: exact
      `lax.psum`). A torus needs two data axes, or `grid=(X, Y)` with one.
    step_config: a `StepConfig` (default: `StepConfig()`).
    shard_update: split the optimizer state and update over the replicas
      (the gradients are reduce-scattered, the parameters all-gathered).
    data_axes: the mesh axes that carry replicas (default: all mesh axes).
    grad_stats: measure gradient-noise statistics (needs two or more units).
    grad_stats_decay: their moving-average factor, in [0, 1).
    batch_schedule: a `date_optax.BatchSchedule` (see `make_train_step`).
    max_rows_per_device: as for `make_train_step`.

  Returns:
    A `ReplicatedTrainStep`: `state, metrics = step(state, batch)`, with
    `step.init(params, model_state=None, rng=None)`; metrics as for
    `make_train_step`.

  Raises:
    ValueError: arguments out of range, or a torus that does not fit the
      data axes.
    TypeError: arguments of the wrong kind.

  Examples:
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> import jax.numpy as jnp, numpy as np
    >>> def loss_fn(params, batch):  # mean squared error of a linear model
    ...   residual = batch["x"] @ params["w"] - batch["y"]
    ...   return jnp.mean(residual**2)
    >>> step = dp.make_replicated_train_step(
    ...     loss_fn, date_optax.lamb(1e-2), dp.data_mesh(),
    ...     grad_sync=dp.GradSync("ring", comm_dtype="bfloat16"),
    ...     step_config=dp.StepConfig(microbatches=2))
    >>> state = step.init({"w": np.zeros((3, 1), np.float32)})
    >>> batch = {"x": np.ones((16, 3), np.float32), "y": np.ones((16, 1), np.float32)}
    >>> state, metrics = step(state, batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

  References:
    Heek et al., "Flax: A neural network library and ecosystem for JAX",
    2023 (examples/imagenet/train.py, the train step it reads as); Goyal et
    al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018; Xu et al., "Automatic
    Cross-Replica Sharding of Weight Update in Data-Parallel Training", 2020.
  """
  sync = grad_sync_from(grad_sync)
  mesh, config, axes = check_step_args(
      loss_fn, optimizer, mesh, step_config, shard_update, data_axes, set()
  )
  n = compat.mesh_axis_sizes(mesh, axes)
  sync.check_replicas(axes, n)
  decay = gs_lib.check_options(grad_stats, grad_stats_decay, n, config.microbatches,
                               batch_schedule)
  schedule = bs_lib.check_for_step(batch_schedule, decay is not None, n,
                                   config.microbatches, max_rows_per_device)
  return ReplicatedTrainStep(
      loss_fn, optimizer, mesh, grad_sync=sync, config=config, data_axes=axes,
      shard_update=bool(shard_update), grad_stats_decay=decay,
      batch_schedule=schedule, max_rows_per_device=max_rows_per_device,
  )
