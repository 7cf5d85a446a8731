"""The data-parallel step of sharded parameters: one GSPMD program.

Parameters are laid out over mesh axes by `(regex, PartitionSpec)` rules
(`param_sharding`): axes that carry no data (tensor parallelism), or, with
the compiler's psum, the data axes themselves (FSDP: every device holds a
shard of each parameter and its own rows of the batch; the compiler gathers
a layer's weights where the layer runs and reduce-scatters its gradient).
The replicas' forward passes are a `vmap` whose axis is laid out over the
data axes (`spmd_axis_name`), so each replica still
sees only its slice; the step differentiates the mean of their losses, so the
compiler reduces each gradient as the backward pass produces it, and inserts
the other reductions, including the exact cross-shard sums of trust-ratio
norms. With a `GradSync` other than that float32 `psum` (a low-bit payload,
"ring"/"torus", error feedback) the step keeps one gradient per replica and
reduces them in a `shard_map` island over the data axes
(`sharded_sync.reduce_stacked`); the rest stays in GSPMD.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from date_optax._src import batch_schedule as bs_lib
from date_optax._src.batch_schedule import BatchSchedule
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm.collectives import acc_dtype
from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.comm.sync_config import GradSync, grad_sync_from
from date_optax._src.parallel.layout import param_sharding as ps
from date_optax._src.parallel.step import grad_stats as gs_lib
from date_optax._src.parallel.step import local_grads as lg
from date_optax._src.parallel.step import sharded_sync
from date_optax._src.parallel.step.replica_step import ReplicaResult
from date_optax._src.parallel.step.step_base import TrainStep
from date_optax._src.parallel.step.step_checks import check_step_args
from date_optax._src.parallel.step.step_config import StepConfig
from date_optax._src.types import LossFn, PyTree


class ShardedTrainStep(TrainStep):
  """The step of sharded parameters: one GSPMD program, reductions by the compiler.

  As built by `make_sharded_train_step` (or `make_train_step` with
  `param_sharding`). The replicas are a `vmap` laid out over the data axes;
  the gradient of the mean of their losses is reduced inside the backward
  pass (or, with an explicit `grad_sync`, the replicas' gradients are
  reduced by it in a `shard_map` island over the data axes), and the
  optimizer runs on the sharded state. Its `fsdp` attribute says whether a
  spec names a data axis (FSDP: every device a replica that holds a shard
  of those parameters).

  Args:
    loss_fn, optimizer, mesh: see `make_sharded_train_step`.
    layout: the checked `param_sharding`.
    grad_sync: the `GradSync` (None: the compiler's float32 `psum`).
    **options: those of `TrainStep`.

  Returns:
    The step (a callable object).

  Examples:
    >>> import jax, optax
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
    >>> step = dp.make_sharded_train_step(
    ...     lambda p, b: (p["w"] * b).mean(), optax.sgd(0.1), mesh,
    ...     param_sharding=[("w", P("model"))])
    >>> isinstance(step, dp.ShardedTrainStep), step.data_axes
    (True, ('data',))

  References:
    Xu et al., "GSPMD: General and Scalable Parallelization for ML
    Computation Graphs", 2021; Beyer, Zhai and Kolesnikov, "Big Vision",
    2022, https://github.com/google-research/big_vision.
  """

  def __init__(self, loss_fn, optimizer, mesh, *, layout: ps.Layout,
               grad_sync: GradSync | None = None, **options):
    super().__init__(loss_fn, optimizer, mesh, **options)
    self.param_layout = layout
    # FSDP: a parameter split over an axis that also carries the batch.
    self.fsdp = any(a in self.data_axes for spec in layout.declared_specs()
                    for a in ps.spec_axes(spec))
    self.grad_sync = GradSync() if grad_sync is None else grad_sync
    self.error_feedback = self.grad_sync.error_feedback

  @property
  def grad_reduce(self) -> str:
    """The reduction algorithm (`grad_sync.algorithm`; "psum": the compiler's)."""
    return self.grad_sync.algorithm

  @property
  def explicit_sync(self) -> bool:
    """Whether the gradients are reduced by `grad_sync` in a `shard_map` island
    (any `GradSync` but the default float32 "psum", which the compiler places)."""
    return self.grad_sync != GradSync()

  def residual_specs(self, params: PyTree) -> PyTree:
    """Error-feedback residuals: the parameters' specs behind the replica axis."""
    return jax.tree.map(
        lambda _, s: sharded_sync.stacked_spec(s, self.data_axes),
        params, self.param_specs(params),
    )

  def zero_residuals(self, params: PyTree) -> ErrorFeedbackState:
    """Fresh residuals; flat chunks of each model shard where the algorithm
    keeps them so (`sharded_sync.residual_sizes`: "two_shot"'s server
    residual, "hierarchical"'s shards)."""
    state = super().zero_residuals(params)
    dtype = jnp.dtype(self.grad_sync.residual_dtype)
    zeros = lambda size: jax.tree.map(
        lambda p, s: jnp.zeros(self._chunked(p, s, size)[0], dtype), params,
        self.param_specs(params))
    return self._per_stage(state, zeros)

  def _chunked(self, leaf: Any, spec: P, size: Any) -> tuple[tuple[int, int], P]:
    return sharded_sync.chunked_residual(jnp.shape(leaf), spec, self.mesh, self.data_axes,
                                         size)

  def _per_stage(self, state: ErrorFeedbackState, make: Any) -> ErrorFeedbackState:
    """`state` with `make(size)` in each stage that `residual_sizes` chunks."""
    sizes = sharded_sync.residual_sizes(self.grad_sync, self.mesh, self.data_axes)
    for stage, size in zip(("worker", "hop"), sizes, strict=True):
      if size is not None and getattr(state, stage) is not None:
        state = state._replace(**{stage: make(size)})
    return state

  def _residual_shardings(self, residual: Any, params: PyTree, named: Any) -> Any:
    out = super()._residual_shardings(residual, params, named)
    if not isinstance(out, ErrorFeedbackState):
      return out
    return self._per_stage(out, lambda size: jax.tree.map(
        lambda p, s: named(self._chunked(p, s, size)[1]), params, self.param_specs(params)))

  def param_specs(self, params: PyTree) -> PyTree:
    """The `PartitionSpec` of every parameter, from the declared layout."""
    return ps.resolve(self.param_layout, params, self.mesh)

  def _update_spec(self, shape: Sequence[int], spec: P) -> P:
    if not self.shard_update:
      return spec
    return ps.with_data_axes(shape, spec, self.mesh, self.update_axes, self.update_shards)

  def _check_layout(self, params: PyTree) -> None:
    ps.resolve(self.param_layout, params, self.mesh, warn=True)  # unused rules warn

  def _replicas(self, params, batch, model_state, rng, step, residual=None,
                config=None) -> ReplicaResult:
    """The replicas as a vmap laid out over the data axes."""
    n, axes = self.num_replicas, self.data_axes
    config = self.config if config is None else config
    split = NamedSharding(self.mesh, self.batch_spec)

    def per_replica(x):
      x = x.reshape((n, x.shape[0] // n) + x.shape[1:])
      return lax.with_sharding_constraint(x, split)

    batch = jax.tree.map(per_replica, batch)
    replicas = lax.with_sharding_constraint(jnp.arange(n, dtype=jnp.int32), split)
    # Collectives over the data axis inside loss_fn (cross-replica batch norm)
    # run over the replicas, as they do under shard_map.
    vmap_axes = {"axis_name": axes[0] if len(axes) == 1 else None,
                 "spmd_axis_name": axes if len(axes) > 1 else axes[0]}
    constrain = lambda tree: jax.tree.map(
        lambda g, s: lax.with_sharding_constraint(g, NamedSharding(self.mesh, s)),
        tree,
        self._update_specs(params),
    )
    if self.explicit_sync:
      return self._synced_replicas(params, batch, model_state, rng, step, residual,
                                   config, replicas, vmap_axes)
    with_stats = self.grad_stats_decay is not None
    if not with_stats and (config.microbatches == 1 or self.fsdp):
      # No statistics, one microbatch (or FSDP, whose gradient shards are
      # reduce-scattered as each microbatch makes them, as ZeRO-3 does):
      # differentiate the mean of the replicas' losses, so the compiler
      # sums each gradient inside the backward pass.
      loss, aux, grads, model_state = lg.stacked_replica_grads(
          self.loss_fn, config, params=params, batch=batch, model_state=model_state,
          rng=rng, step=step, replicas=replicas, split=split, vmap_axes=vmap_axes,
      )
      return ReplicaResult(loss, aux, constrain(grads), model_state, None)

    # Statistics need each unit's gradient, and microbatches are accumulated
    # before any reduction: one gradient per replica, stacked. (Left to the
    # compiler, a microbatch loop's gradient of the replicas' mean loss was
    # all-reduced in every microbatch: BERT-large with 8 microbatches on
    # v5p-512, 12.07 GB per device a step against 1.34 GB for one.)
    def one(batch, replica):
      return lg.replica_grads(
          self.loss_fn, config, params=params, batch=batch, model_state=model_state,
          rng=rng, step=step, replica=replica, with_sq_norms=with_stats,
      )

    out = jax.vmap(one, **vmap_axes)(batch, replicas)
    loss, aux, grads, model_state = out[:4]
    # Each replica's gradient laid out as its parameter, behind the replica
    # axis: left to propagation, GSPMD gathered activations over the model
    # axes to make them (1.19x the bytes of the step without statistics on a
    # (4, 2) mesh; 1.07x laid out).
    grads = jax.tree.map(
        lambda g, s: lax.with_sharding_constraint(
            g, NamedSharding(self.mesh, sharded_sync.stacked_spec(s, axes))),
        grads, self.param_specs(params))
    grads = jax.tree.map(
        lambda g: jnp.mean(g.astype(acc_dtype(g.dtype)), axis=0).astype(g.dtype), grads
    )
    return ReplicaResult(
        jnp.mean(loss), lg.mean_stacked_aux(aux), constrain(grads),
        lg.replicate_stacked_model_state(model_state),
        jnp.mean(out[4]) / config.microbatches if with_stats else None,
    )

  def _synced_replicas(self, params, batch, model_state, rng, step, residual, config,
                       replicas, vmap_axes) -> ReplicaResult:
    """One gradient per replica, reduced by `grad_sync` over the data axes.

    The replicas' gradients stay stacked (laid out as their parameters behind
    the replica axis) and `sharded_sync.reduce_stacked` reduces them in a
    `shard_map` island, each device its own model shard.
    """
    with_stats = self.grad_stats_decay is not None

    def one(batch, replica):
      return lg.replica_grads(
          self.loss_fn, config, params=params, batch=batch, model_state=model_state,
          rng=rng, step=step, replica=replica, with_sq_norms=with_stats,
      )

    loss, aux, grads, model_state, *sq = jax.vmap(one, **vmap_axes)(batch, replicas)
    specs = self.param_specs(params)
    grads = jax.tree.map(
        lambda g, s: lax.with_sharding_constraint(
            g, NamedSharding(self.mesh, sharded_sync.stacked_spec(s, self.data_axes))),
        grads, specs,
    )
    uncompressed = grads
    grads, residual = sharded_sync.reduce_stacked(
        grads, residual if self.error_feedback else None, mesh=self.mesh,
        data_axes=self.data_axes, param_specs=specs,
        update_specs=self._update_specs(params), grad_sync=self.grad_sync,
        key=self.grad_sync.rounding_key(rng, step), scatter=self.shard_update,
    )
    mean_sq = None
    if with_stats and self.grad_sync.format is not None:
      # S_B of the uncompressed mean: the replicas' sketches (same signs)
      # averaged; see `grad_stats.sketch`.
      sketches = jax.vmap(lambda g: gs_lib.sketch(g, step))(uncompressed)
      mean_sq = jnp.sum(jnp.square(jnp.mean(sketches, axis=0)))
    return ReplicaResult(
        jnp.mean(loss), lg.mean_stacked_aux(aux), grads,
        lg.replicate_stacked_model_state(model_state),
        jnp.mean(sq[0]) / config.microbatches if with_stats else None,
        residual, mean_sq,
    )



def make_sharded_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    param_sharding: Any,
    grad_sync: GradSync | None = None,
    step_config: StepConfig | None = None,
    shard_update: bool = False,
    data_axes: Sequence[Hashable] | None = None,
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
    batch_schedule: BatchSchedule | None = None,
    max_rows_per_device: int | None = None,
) -> ShardedTrainStep:
  """Builds the data-parallel step of sharded parameters (one GSPMD `jit`).

  Parameters (and the optimizer state that mirrors them) are laid out over
  mesh axes (FSDP, tensor parallelism), declared as data
  the way big_vision declares them: `(regex, PartitionSpec)` rules matched
  (`re.fullmatch`) against '/'-joined parameter paths, first match wins,
  unmatched parameters replicated. The step is one `jax.jit` program with
  the state's shardings as in/out shardings: the replicas are a `vmap` over
  the data axes, and the compiler inserts the reductions (with one
  microbatch, or with FSDP, the gradients are summed inside the backward
  pass; with several microbatches otherwise, each replica accumulates its
  own gradient over its microbatches and the replicas' gradients are
  reduced once, after the loop; trust-ratio norms over sharded layers are
  exact).

  *Low-bit gradient reduction* (`grad_sync`, ZeRO++'s qgZ in JAX). With a
  `GradSync` other than the default float32 "psum" (a low-bit `comm_dtype`
  with its block scales, APS or measured shift, stochastic rounding, error
  feedback, or an explicit "ring"/"torus") the step keeps one gradient per
  replica and reduces them over the data axes only, inside a `shard_map`
  island in which every device holds its replica's gradient of its own
  model shard: each device sends its shard, not the whole layer, in the
  payload format, and no gradient crosses the model axes. The rest of the
  step (forward, backward, optimizer, the exact cross-shard trust-ratio
  norms) stays in GSPMD. With `shard_update=True` the island
  reduce-scatters: replica k keeps block k of its model shard (the layout of
  the sharded optimizer state), and only the new parameters are
  all-gathered, in float32. Scales are measured on each device's shard, so a
  sharded layer rounds as the replicated layer does up to which elements
  share a block: within the format's error bound of it
  (`docs/guide/low_precision_communication.md`). With error feedback the
  residuals live in `state.grad_residual`, float32, one per replica, laid
  out as the parameters behind a leading replica axis split over the data
  axes (`P("data", *param_spec)`), checkpointed with the state and kept by
  a skipped step.

  Args:
    loss_fn: as for `make_train_step`.
    optimizer: an optax gradient transformation.
    mesh: the device mesh, e.g. `jax.make_mesh((4, 2), ("data", "model"))`.
    param_sharding: a sequence of `(regex, PartitionSpec)` rules (or a
      pytree of `PartitionSpec` shaped like the parameters). Specs may name
      axes that carry no data, and with the default `grad_sync` data axes
      too (FSDP: pass ``data_axes`` naming them, e.g. ``("data", "fsdp")``
      with kernels split over "fsdp"; the model should then keep its
      activations unsplit along the features, as MaxText's rules do, so
      the compiler gathers weights rather than reducing activations). A
      rule that matches no parameter warns at `init`.
    grad_sync: how the gradients are reduced over the data axes, a
      `GradSync` (algorithm, payload format, block scales, rounding, error
      feedback; see above). None or `GradSync()`: the compiler's float32
      `psum` inside the backward pass. A torus needs two data axes, or
      `grid=(X, Y)` multiplying to the replicas.
    step_config: a `StepConfig` (default: `StepConfig()`).
    shard_update: also split the optimizer state and update over the data
      axes.
    data_axes: the mesh axes that carry replicas (default: the axes the
      specs do not name).
    grad_stats: as for `make_replicated_train_step`.
    grad_stats_decay: as for `make_replicated_train_step`.
    batch_schedule: as for `make_train_step`.
    max_rows_per_device: as for `make_train_step`.

  Returns:
    A `ShardedTrainStep`, called and initialised as `make_train_step`'s.

  Raises:
    ValueError: a spec that names a data axis with an explicit `grad_sync`,
      or an unknown axis, a pattern
      that is not a regex, a `grad_sync` torus that does not fit the data
      axes, or other arguments out of range.
    TypeError: arguments of the wrong kind (a `grad_sync` that is not a
      `GradSync`).

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> mesh = jax.make_mesh((4, 2), ("data", "model"))
    >>> def loss_fn(params, batch):
    ...   return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    >>> step = dp.make_sharded_train_step(
    ...     loss_fn, date_optax.lamb(1e-2), mesh,
    ...     param_sharding=[("w", P("model", None))])
    >>> state = step.init({"w": np.zeros((4, 1), np.float32)})
    >>> state.params["w"].sharding.spec == P("model", None)
    True
    >>> batch = {"x": np.ones((8, 4), np.float32), "y": np.ones((8, 1), np.float32)}
    >>> state, metrics = step(state, batch)
    >>> float(metrics["loss"])
    1.0

    The same step with the gradients reduced over "data" in int4 with block
    scales and error feedback; the residuals keep the kernel's layout:

    >>> sync = dp.GradSync("ring", comm_dtype="int4", error_feedback=True)
    >>> step = dp.make_sharded_train_step(
    ...     loss_fn, date_optax.lamb(1e-2), mesh,
    ...     param_sharding=[("w", P("model", None))], grad_sync=sync)
    >>> state, metrics = step(step.init({"w": np.zeros((4, 1), np.float32)}), batch)
    >>> state.grad_residual.worker["w"].sharding.spec == P("data", "model", None)
    True
    >>> float(metrics["loss"])
    1.0

    FSDP: the kernel split over "fsdp", which carries rows too, so all 8
    devices are replicas (the compiler gathers the kernel where it is used
    and reduce-scatters its gradient):

    >>> fsdp = jax.make_mesh((4, 2), ("data", "fsdp"))
    >>> step = dp.make_sharded_train_step(
    ...     loss_fn, date_optax.lamb(1e-2), fsdp, data_axes=("data", "fsdp"),
    ...     param_sharding=[("w", P("fsdp", None))])
    >>> step.num_replicas, step.fsdp
    (8, True)
    >>> state, metrics = step(step.init({"w": np.zeros((4, 1), np.float32)}), batch)
    >>> float(metrics["loss"])
    1.0

  References:
    Xu et al., "GSPMD: General and Scalable Parallelization for ML
    Computation Graphs", 2021; Beyer, Zhai and Kolesnikov, "Big Vision",
    2022, https://github.com/google-research/big_vision (sharding rules);
    Wang et al., "ZeRO++: Extremely Efficient Collective Communication for
    Giant Model Training", 2023, https://arxiv.org/abs/2306.10209 (qgZ, the
    quantised gradient reduce-scatter).
  """
  if param_sharding is None:
    raise TypeError(
        "param_sharding must be a sequence of (regex, PartitionSpec) rules or a "
        "pytree of PartitionSpec; for replicated parameters use "
        "make_replicated_train_step."
    )
  if isinstance(mesh, jax.sharding.Mesh):
    named: set[Hashable] = set()
    for spec in ps.check_param_sharding(param_sharding, mesh, ()).declared_specs():
      named.update(ps.spec_axes(spec))
  else:
    named = set()
  mesh, config, axes = check_step_args(
      loss_fn, optimizer, mesh, step_config, shard_update, data_axes, named
  )
  sync = grad_sync_from(grad_sync)
  if sync != GradSync() and named & set(axes):
    raise ValueError(
        f"param_sharding names the data axes {sorted(named & set(axes), key=str)} (FSDP); "
        f"that needs the compiler's float32 psum (grad_sync=None), got {sync!r}: "
        "an explicit grad_sync reduces whole per-replica gradients over the data axes.")
  layout = ps.check_param_sharding(param_sharding, mesh, axes, allow_data=sync == GradSync())
  n = compat.mesh_axis_sizes(mesh, axes)
  sync.check_replicas(axes, n)
  decay = gs_lib.check_options(grad_stats, grad_stats_decay, n, config.microbatches,
                               batch_schedule)
  schedule = bs_lib.check_for_step(batch_schedule, decay is not None, n,
                                   config.microbatches, max_rows_per_device)
  return ShardedTrainStep(
      loss_fn, optimizer, mesh, layout=layout, grad_sync=sync, config=config,
      data_axes=axes,
      shard_update=bool(shard_update), grad_stats_decay=decay,
      batch_schedule=schedule, max_rows_per_device=max_rows_per_device,
  )
