"""The data-parallel train steps compiled with `jax.jit` over a mesh.

Each replica computes the *local* gradient of `loss_fn` on its slice of the
global batch (`local_grads.replica_grads`: microbatches, model state, keys),
the gradients are combined exactly once (mean over replicas), and
`replica_step.apply_update` applies the optimizer, skipping non-finite
steps. Two builders, one program each:

* `make_replicated_train_step` (`ReplicatedTrainStep`): parameters
  replicated; `shard_map` over the data axes runs the per-replica body the
  `pmap` step runs too (`replica_step.replica_step`), whose one reduction is
  `grad_sync.sync_gradients` with any `GradSync` ("psum", "ring", "torus",
  any payload) and, with `shard_update=True`, a reduce-scatter / all-gather.
* `make_sharded_train_step` (`ShardedTrainStep`): parameters sharded over
  non-data axes by `(regex, PartitionSpec)` rules, plain GSPMD. The
  replicas' forward passes are a `vmap` whose axis is laid out over the data
  axes (`spmd_axis_name`), so each replica still sees only its slice; the
  step differentiates the mean of their losses, so the compiler reduces each
  gradient as the backward pass produces it, and inserts the other
  reductions, including the exact cross-shard sums of trust-ratio norms.

`make_train_step` is the one entry with flat keywords that picks between
them.

Why the gradient is local under `shard_map`: with `check_vma=True` JAX already
sums the gradient of a replicated parameter over the mesh (the transpose of
the implicit broadcast), so reducing it again would multiply it by the number
of replicas. The step differentiates with respect to a device-varying copy of
the parameters (`compat.to_varying`), which is local under every setting.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from date_optax._src import validation
from date_optax._src.parallel import compat
from date_optax._src.parallel import grad_stats as gs_lib
from date_optax._src.parallel import local_grads as lg
from date_optax._src.parallel import param_sharding as ps
from date_optax._src.parallel import update_sharding as us
from date_optax._src.parallel.collectives import acc_dtype
from date_optax._src.parallel.distributed import host_local_to_global, replicate_to_mesh
from date_optax._src.parallel.grad_sync import GradSync, grad_sync_from
from date_optax._src.parallel.mesh import auto_axes_mesh
from date_optax._src.parallel.replica_step import ReplicaResult, apply_update, replica_step
from date_optax._src.parallel.step_config import StepConfig, step_config_from
from date_optax._src.parallel.train_state import Metrics, TrainState, check_metrics
from date_optax._src.types import LossFn, PyTree


class TrainStep:
  """A data-parallel train step over a mesh: what both programs share.

  Call it as `state, metrics = step(state, batch)`.
  `step.init(params, model_state=None, rng=None)` builds a `TrainState` laid
  out on the mesh (parameters and optimizer state sharded as declared);
  `step.shard_batch(batch)` turns this host's part of the global batch into
  a global array (done automatically by the call for NumPy inputs);
  `step.batch_sharding` is the batch layout (for `prefetch_to_device`);
  `step.state_sharding(state)` the state's; `step.lower(state, batch)`
  exposes the compiled program. The builders return one of its two kinds,
  `ReplicatedTrainStep` or `ShardedTrainStep`.

  Args:
    loss_fn, optimizer, mesh: see `make_train_step`; the builders validate
      every argument, construct through them.
    config: the `StepConfig`.
    data_axes: the mesh axes that carry replicas.
    shard_update: split the optimizer state and update over the replicas.
    grad_stats_decay: the statistics' decay, or None without them.

  Returns:
    The step (a callable object).

  Examples:
    >>> import optax
    >>> import date_optax.parallel as dp
    >>> step = dp.make_train_step(lambda p, b: (p * b).mean(), optax.sgd(0.1),
    ...                           dp.data_mesh())
    >>> isinstance(step, dp.TrainStep), step.num_replicas == len(step.mesh.devices.flat)
    (True, True)

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017.
  """

  def __init__(
      self,
      loss_fn: LossFn,
      optimizer: optax.GradientTransformation,
      mesh: jax.sharding.Mesh,
      *,
      config: StepConfig,
      data_axes: tuple[Hashable, ...],
      shard_update: bool,
      grad_stats_decay: float | None = None,
  ):
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.mesh = mesh
    self.config = config
    self.data_axes = data_axes
    self.shard_update = shard_update
    self.grad_stats_decay = grad_stats_decay
    self.num_replicas = compat.mesh_axis_sizes(mesh, data_axes)
    self.batch_spec = P(us.axes_entry(data_axes))
    self.batch_sharding = NamedSharding(mesh, self.batch_spec)
    self.replicated = NamedSharding(mesh, P())
    self._compiled: dict[Any, Any] = {}
    self._init_cache: dict[Any, Any] = {}

  # The step-level options, as attributes (read by code written for the flat
  # keywords).
  microbatches = property(lambda self: self.config.microbatches)
  compute_dtype = property(lambda self: self.config.compute_dtype)
  donate = property(lambda self: self.config.donate)
  has_aux = property(lambda self: self.config.has_aux)
  max_consecutive_skips = property(lambda self: self.config.max_consecutive_skips)

  # -- layout ---------------------------------------------------------------

  def param_specs(self, params: PyTree) -> PyTree:
    """The `PartitionSpec` of every parameter (all `P()` when replicated)."""
    return jax.tree.map(lambda _: P(), params)

  def _update_spec(self, shape: Sequence[int], spec: P) -> P:
    """Layout of a gradient / optimizer-state leaf mirroring a parameter."""
    if not self.shard_update:
      return spec
    return us.sharded_spec(shape, self.data_axes, self.num_replicas)

  def _update_specs(self, params: PyTree) -> PyTree:
    return jax.tree.map(
        lambda x, s: self._update_spec(np.shape(x), s),
        params,
        self.param_specs(params),
    )

  def state_sharding(self, state: Any) -> Any:
    """NamedShardings for a `TrainState` (or its `jax.eval_shape`)."""
    named = lambda s: NamedSharding(self.mesh, s)
    param_specs = self.param_specs(state.params)
    update_specs = self._update_specs(state.params)
    opt_specs = ps.state_specs(
        state.opt_state, state.params, update_specs,
        default=lambda shape: self._update_spec(shape, P()),
    )
    return state.replace(
        step=self.replicated,
        params=jax.tree.map(named, param_specs),
        opt_state=jax.tree.map(named, opt_specs),
        consecutive_skips=self.replicated,
        total_skips=self.replicated,
        model_state=jax.tree.map(lambda _: self.replicated, state.model_state),
        rng=None if state.rng is None else self.replicated,
        grad_stats=jax.tree.map(lambda _: self.replicated, state.grad_stats),
    )

  def _check_layout(self, params: PyTree) -> None:
    """Hook run once per parameter structure at `init`."""

  def init(
      self, params: PyTree, model_state: PyTree = None, rng: Any = None
  ) -> TrainState:
    """A fresh `TrainState` for `params`, placed on the mesh.

    Args:
      params: the parameters; host (NumPy) arrays with the same value on
        every process, or arrays already on the mesh.
      model_state: state the model updates in its forward pass (flax's
        `{"batch_stats": ...}`), or None. With one, the step calls
        `loss_fn(params, batch, model_state=...)`.
      rng: an int seed or a key (`jax.random.key` or a raw `PRNGKey`), or
        None. With one, the step calls `loss_fn(..., rng=key)` with a key
        folded from (step, replica, microbatch).

    Returns:
      A `TrainState` laid out by `state_sharding`.
    """
    rng = lg.as_key(rng)
    lg.check_params(params)
    params = jax.tree.map(lambda x: replicate_to_mesh(x, self.mesh), params)
    model_state = jax.tree.map(lambda x: replicate_to_mesh(x, self.mesh), model_state)
    if rng is not None:
      rng = replicate_to_mesh(rng, self.mesh)
    inputs = (params, model_state, rng)
    key = (jax.tree.structure(inputs),
           tuple((x.shape, x.dtype) for x in jax.tree.leaves(inputs)))
    if key not in self._init_cache:
      self._check_layout(params)

      def create(p, m, r):
        state = TrainState.create(p, self.optimizer, m, r)
        if self.grad_stats_decay is not None:
          state = state.replace(grad_stats=gs_lib.GradStatsState.zeros())
        return state

      shardings = self.state_sharding(jax.eval_shape(create, *inputs))
      self._init_cache[key] = jax.jit(create, out_shardings=shardings)
    return self._init_cache[key](*inputs)

  def shard_batch(self, batch: PyTree) -> PyTree:
    """This host's rows of the global batch -> global arrays split over replicas."""
    lg.check_batch(batch, 1)
    return host_local_to_global(batch, self.batch_sharding)

  # -- the step -------------------------------------------------------------

  def _replicas(self, params, batch, model_state, rng, step) -> ReplicaResult:
    """The replicas' losses and gradients, reduced: the program of each kind."""
    raise NotImplementedError

  def _after_update(self, state: TrainState) -> TrainState:
    return state

  def _step(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    lg.check_batch(batch, self.num_replicas, self.microbatches)
    batch = jax.tree.map(
        lambda x: lax.with_sharding_constraint(x, self.batch_sharding), batch
    )
    result = self._replicas(state.params, batch, state.model_state, state.rng, state.step)
    new_state, metrics = apply_update(
        state, result, self.optimizer, self.config,
        units=self.num_replicas * self.microbatches,
        global_batch=int(np.shape(jax.tree.leaves(batch)[0])[0]),
        grad_stats_decay=self.grad_stats_decay,
    )
    return self._after_update(new_state), metrics

  # -- calling --------------------------------------------------------------

  def _prepare(self, batch: PyTree) -> PyTree:
    lg.check_batch(batch, 1)
    per_process = self.num_replicas // max(1, jax.process_count())

    def to_global(x):
      if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x
      if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(
          self.batch_sharding, x.ndim
      ):
        return x
      if np.shape(x)[0] % per_process:
        raise ValueError(
            f"this process's batch rows ({np.shape(x)[0]}) must be divisible by "
            f"its {per_process} data-parallel devices (the global batch by the "
            f"{self.num_replicas} replicas)."
        )
      return host_local_to_global(x, self.batch_sharding)

    return jax.tree.map(to_global, batch)

  def _compiled_for(self, state: TrainState) -> Any:
    """`jax.jit` with the state's in/out shardings declared (cached)."""
    key = (jax.tree.structure(state),
           tuple((np.shape(x), jnp.result_type(x)) for x in jax.tree.leaves(state)))
    if key not in self._compiled:
      shardings = self.state_sharding(state)
      self._compiled[key] = jax.jit(
          self._step,
          in_shardings=(shardings, self.batch_sharding),
          out_shardings=(shardings, self.replicated),
          donate_argnums=(0,) if self.donate else (),
      )
    return self._compiled[key]

  def lower(self, state: TrainState, batch: PyTree) -> jax.stages.Lowered:
    """The lowered step (`.compile().as_text()` shows the collectives)."""
    return self._compiled_for(state).lower(state, self._prepare(batch))

  def __call__(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    state, metrics = self._compiled_for(state)(state, self._prepare(batch))
    if self.max_consecutive_skips is not None:
      check_metrics(metrics, self.max_consecutive_skips)
    return state, metrics


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

  @property
  def grad_reduce(self) -> str:
    """The all-reduce algorithm (`grad_sync.algorithm`)."""
    return self.grad_sync.algorithm

  def _replicas(self, params, batch, model_state, rng, step) -> ReplicaResult:
    axes = self.data_axes

    def body(params, batch, model_state, rng, step):
      return replica_step(
          self.loss_fn, self.config, self.grad_sync,
          params=compat.to_varying(params, axes), batch=batch,
          model_state=model_state, rng=rng, step=step, axes=axes,
          scatter=self.shard_update, with_stats=self.grad_stats_decay is not None,
      )

    fn = compat.shard_map(
        body,
        mesh=self.mesh,
        in_specs=(P(), self.batch_spec, P(), P(), P()),
        out_specs=ReplicaResult(P(), P(), self._update_specs(params), P(), P()),
    )
    return fn(params, batch, model_state, rng, step)

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
            p, shapes, self.data_axes, self.grad_reduce, self.num_replicas,
            self.grad_sync.grid,
        ),
        mesh=self.mesh,
        in_specs=(specs,),
        out_specs=P(),
    )
    return state.replace(params=fn(params))


class ShardedTrainStep(TrainStep):
  """The step of sharded parameters: one GSPMD program, reductions by the compiler.

  As built by `make_sharded_train_step` (or `make_train_step` with
  `param_sharding`). The replicas are a `vmap` laid out over the data axes;
  the gradient of the mean of their losses is reduced inside the backward
  pass, and the optimizer runs on the sharded state.

  Args:
    loss_fn, optimizer, mesh: see `make_sharded_train_step`.
    layout: the checked `param_sharding`.
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

  grad_reduce = "psum"  # the compiler places the reductions

  def __init__(self, loss_fn, optimizer, mesh, *, layout: ps.Layout, **options):
    super().__init__(loss_fn, optimizer, mesh, **options)
    self.param_layout = layout

  def param_specs(self, params: PyTree) -> PyTree:
    """The `PartitionSpec` of every parameter, from the declared layout."""
    return ps.resolve(self.param_layout, params, self.mesh)

  def _update_spec(self, shape: Sequence[int], spec: P) -> P:
    if not self.shard_update:
      return spec
    return ps.with_data_axes(shape, spec, self.mesh, self.data_axes, self.num_replicas)

  def _check_layout(self, params: PyTree) -> None:
    ps.resolve(self.param_layout, params, self.mesh, warn=True)  # unused rules warn

  def _replicas(self, params, batch, model_state, rng, step) -> ReplicaResult:
    """The replicas as a vmap laid out over the data axes."""
    n, axes, config = self.num_replicas, self.data_axes, self.config
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
    if self.grad_stats_decay is None:
      # No statistics: differentiate the mean of the replicas' losses, so
      # the compiler sums each gradient inside the backward pass.
      loss, aux, grads, model_state = lg.stacked_replica_grads(
          self.loss_fn, has_aux=config.has_aux, compute_dtype=config.compute_dtype,
          microbatches=config.microbatches, params=params, batch=batch,
          model_state=model_state, rng=rng, step=step, replicas=replicas,
          split=split, vmap_axes=vmap_axes,
      )
      return ReplicaResult(loss, aux, constrain(grads), model_state, None)

    # Statistics need each unit's gradient: one gradient per replica, stacked.
    def one(batch, replica):
      return lg.replica_grads(
          self.loss_fn, has_aux=config.has_aux, compute_dtype=config.compute_dtype,
          microbatches=config.microbatches, params=params, batch=batch,
          model_state=model_state, rng=rng, step=step, replica=replica,
          with_sq_norms=True,
      )

    loss, aux, grads, model_state, sq = jax.vmap(one, **vmap_axes)(batch, replicas)
    grads = jax.tree.map(
        lambda g: jnp.mean(g.astype(acc_dtype(g.dtype)), axis=0).astype(g.dtype), grads
    )
    return ReplicaResult(
        jnp.mean(loss), lg.mean_stacked_aux(aux), constrain(grads),
        lg.replicate_stacked_model_state(model_state),
        jnp.mean(sq) / config.microbatches,
    )


def make_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    grad_reduce: str = "psum",
    shard_update: bool = False,
    compute_dtype: Any = None,
    donate: bool = True,
    has_aux: bool = False,
    data_axes: Sequence[Hashable] | None = None,
    max_consecutive_skips: int | None = None,
    microbatches: int = 1,
    param_sharding: Any = None,
    comm_dtype: Any = None,
    aps: bool | None = None,
    rounding: str = "nearest",
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
    grad_sync: GradSync | None = None,
    step_config: StepConfig | None = None,
) -> TrainStep:
  """Builds a synchronous data-parallel train step, `jit`-compiled over a mesh.

  Every device of `data_axes` holds a slice of the global batch; the step
  computes each slice's gradient, averages the gradients over the replicas
  once, and applies `optimizer`. The step is skipped (parameters, optimizer
  and model state unchanged, `consecutive_skips`/`total_skips` counted) when
  the loss, a gradient or an update is NaN/Inf.

  *Model state and keys.* Give `step.init` a `model_state` (flax's
  `batch_stats`) and the step calls `loss_fn(params, batch,
  model_state=...)`, which returns `(loss, new_model_state)`; float leaves
  of the new state are averaged over the replicas (so it stays replicated,
  as with cross-replica batch norm), integer leaves are taken from replica
  0. Give it an `rng` and the step also passes `rng=key`, with
  `key = fold_in(fold_in(fold_in(rng, step), replica), microbatch)`: no two
  replicas or microbatches share a dropout mask, and a resumed run draws
  the same keys.

  *Gradient accumulation.* With `microbatches=k` each replica splits its
  slice into k contiguous microbatches run one after the other under
  `lax.scan`; gradients accumulate in float32, the model state passes from
  one microbatch to the next, and the optimizer is applied once: one step
  per global batch, as the LEGW/DATE recipes count steps. Peak activation
  memory falls with k.

  *Sharded parameters.* `param_sharding` lays parameters (and the optimizer
  state that mirrors them) out over mesh axes that carry no data (FSDP or
  tensor parallelism), as a pytree of `PartitionSpec` or a list of
  `(regex, PartitionSpec)` rules matched (`re.fullmatch`) against
  '/'-joined parameter paths, first match wins, unmatched replicated. The
  step is then one GSPMD program (`jax.jit` with the state's shardings as
  in/out shardings): the replicas are a `vmap` over the data axes, and the
  compiler inserts the reductions, so trust-ratio norms over sharded layers
  are exact. Only `grad_reduce="psum"` applies there.

  *Low-precision gradient communication.* With `comm_dtype` the gradient
  payload of the all-reduce travels in bfloat16, float8_e4m3fn, float8_e5m2,
  int8, int4 or float4_e2m1fn: for "ring" and "torus" every partial sum is
  rounded to the format before it is sent (as hardware adding in the format
  would), for "psum" the payload is cast, summed by `lax.psum` on the format
  and cast back. With `aps` (Auto-Precision Scaling, Han, Demmel and You
  2020; on by default for formats of 8 bits or fewer) each layer is first
  multiplied by a power of two chosen from its max-abs over the replicas so
  the sum fills the format's range without overflowing, and divided by it
  after the reduction; the max-abs values travel in one extra small `pmax`
  before the payload. A layer that is NaN/Inf on any replica arrives as NaN,
  so the non-finite skip still sees it. With `shard_update=True` the
  reduce-scatter carries the format and the all-gather of the new
  parameters stays float32. Rules and error bounds: `docs/algorithms.md`.

  *Gradient-noise statistics.* With `grad_stats=True` the step splits the
  global batch B into n = replicas × microbatches units of b = B/n examples
  and, from the units' squared gradient norms (mean S_b) and that of their
  average (S_B), estimates without bias the true gradient's squared norm
  |G|² = (n·S_B − S_b)/(n − 1) and the per-example covariance trace
  tr Σ = b·n·(S_b − S_B)/(n − 1) (McCandlish et al. 2018, appendix A). The
  per-replica scalar travels in the all-reduce that already averages the
  loss, so the statistics add no collective. Both are smoothed in the train
  state (`state.grad_stats`, a debiased moving average with factor
  `grad_stats_decay` per step, checkpointed with the state) and passed to
  the optimizer as `optimizer.update(..., grad_stats=date_optax.GradStats)`
  (optax's extra-args convention; plain transformations ignore them), which
  is what `date_optax.adascale` and `date(..., lr_scaling="gain")` read.
  Metrics gain "grad_noise_scale" (B_simple = tr Σ / |G|², of the smoothed
  values) and "gain" (the AdaScale gain r the optimizer computed if it
  applies one, `adascale` or `date(..., lr_scaling="gain")`, which for an
  adaptive base applies sqrt(r); else AdaScale's gain of B over one unit,
  S = n); "learning_rate" then includes the applied multiplier. A skipped step leaves the
  statistics unchanged. Needs n >= 2.

  *Weight-update sharding.* With `shard_update=True` the gradients are
  reduce-scattered over the data axes instead: the optimizer state lives
  split over the replicas (on top of `param_sharding`), each replica updates
  its slice, and the new parameters are all-gathered. Norms that the
  optimizer takes over a layer span all the slices, so the result equals the
  unsharded step. The split axis of each array is its largest axis that the
  replicas divide; arrays without one stay whole.

  Args:
    loss_fn: `loss_fn(params, batch, *, model_state=..., rng=...)`, the *mean*
      loss over the batch it is given (one microbatch of one replica's slice
      of the global batch). The keywords are passed only when the state has
      a model state / key. Returns `loss`, or `(loss, aux)` with
      `has_aux=True`; with a model state `(loss, new_model_state)` or
      `(loss, (new_model_state, aux))`.
    optimizer: an optax gradient transformation.
    mesh: the device mesh (`data_mesh`, `torus_mesh`, or e.g.
      `jax.make_mesh((4, 2), ("data", "model"))`). The step uses its axes as
      auto (GSPMD) axes.
    grad_reduce: the all-reduce algorithm, "psum", "ring" (one ring over all
      data-parallel devices) or "torus" (needs two data axes).
    shard_update: split the optimizer state and update over the replicas.
    compute_dtype: e.g. `jnp.bfloat16` to run `loss_fn` on bfloat16 copies of
      the float parameters and batch leaves; the parameters, optimizer state,
      model state, loss and gradient reductions stay float32. `None` computes
      as stored.
    donate: donate the input state's buffers to the output.
    has_aux: `loss_fn` returns aux too; `metrics["aux"]` holds it with float
      leaves averaged and integer leaves summed over microbatches and
      replicas.
    data_axes: the mesh axes that carry replicas (default: all mesh axes, or
      with `param_sharding` the axes its specs do not name).
    max_consecutive_skips: when set, each call reads
      `metrics["consecutive_skips"]` on the host (waiting for the step) and
      raises `NonFiniteError` once it exceeds this number.
    microbatches: k >= 1 microbatches per replica (gradient accumulation);
      the global batch must divide by replicas × k.
    param_sharding: None (parameters replicated), a pytree of
      `PartitionSpec` shaped like the parameters, or a list of
      `(regex, PartitionSpec)` rules. Specs may name only non-data axes; a
      rule that matches no parameter warns at `init`.
    comm_dtype: the gradient payload format: None or "float32" (exact,
      float32 accumulation), "bfloat16", "float8_e4m3fn", "float8_e5m2",
      "int8", "int4" or "float4_e2m1fn" (names or dtypes). Not with
      `param_sharding` (the compiler places those reductions).
    aps: Auto-Precision Scaling of each layer before the cast; None means
      True for formats of at most 8 bits and False for bfloat16. Needs a
      low-precision `comm_dtype`.
    rounding: how the payload is rounded to `comm_dtype` at every hop:
      "nearest" (default) or "stochastic" (unbiased; needs a low-precision
      `comm_dtype`). The key of step s is `fold_in(fold_in(rng, 0x5352), s)`
      with the state's `rng`, or with `jax.random.PRNGKey(0)` when the state
      has none; the all-reduce folds in the replica index, so the keys
      depend on (step, replica) only, whatever the process layout.
    grad_stats: measure gradient-noise statistics (see above); needs more
      than one replica or `microbatches >= 2`.
    grad_stats_decay: the moving-average factor per step, in [0, 1); None
      means fairscale AdaScale's default for n units,
      `max(1 - n/1000, 0) ** n` (0.938 for 8 units).
    grad_sync: a `GradSync` holding `grad_reduce`, `comm_dtype`, `aps` and
      `rounding` (and a torus `grid`); give it or those flat keywords.
    step_config: a `StepConfig` holding `microbatches`, `compute_dtype`,
      `donate`, `has_aux` and `max_consecutive_skips`; give it or those
      flat keywords.

  Returns:
    A `TrainStep` (a `ReplicatedTrainStep`, or a `ShardedTrainStep` with
    `param_sharding`): `state, metrics = step(state, batch)`, with
    `step.init(params, model_state=None, rng=None)` to build the state.
    `batch` is a pytree whose leaves have the global batch as leading
    dimension (NumPy arrays are this host's rows of it). `metrics` holds
    "loss" (float32 mean over the global batch), "grad_norm" (global L2 norm
    of the mean gradient), "skipped", "consecutive_skips", "total_skips",
    and, when the optimizer keeps per-layer trust ratios, "trust_ratios"
    (from `date_optax.trust_ratios`) with their summary "trust_ratio/min",
    "/median", "/max", "/frac_at_lower" and "/frac_at_upper" (see
    `date_optax.diagnostics.trust_ratio_summary`; the bounds are those the
    optimizer recorded, `date_optax.trust_ratio_bounds`), and
    "learning_rate" where the optimizer state records it
    (`date_optax.learning_rate`: date_optax's optimizers, `date()`,
    `optax.inject_hyperparams`).

  Raises:
    ValueError: for arguments out of range, `grad_sync` or `step_config`
      given with the flat keywords they hold, a spec that names a data axis or
      an unknown axis, or (at the call) a batch that does not divide over
      replicas × microbatches.
    TypeError: for arguments of the wrong kind, or (at the call) a `loss_fn`
      whose return does not match the state it was given.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> def loss_fn(params, batch):
    ...   return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           microbatches=2)
    >>> state = step.init({"w": np.zeros((3, 1), np.float32)})
    >>> batch = {"x": np.ones((16, 3), np.float32), "y": np.ones((16, 1), np.float32)}
    >>> state, metrics = step(state, batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

    The same step with an int8 payload, stochastically rounded:

    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           grad_reduce="ring", comm_dtype="int8",
    ...                           rounding="stochastic")
    >>> state, metrics = step(step.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

    The same options as configs, the form the two builders take:

    >>> sync = dp.GradSync("ring", comm_dtype="int8", rounding="stochastic")
    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh,
    ...                           grad_sync=sync)
    >>> state, metrics = step(step.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018; Xu et al., "Automatic
    Cross-Replica Sharding of Weight Update in Data-Parallel Training", 2020;
    Xu et al., "GSPMD: General and Scalable Parallelization for ML Computation
    Graphs", 2021; Ioffe and Szegedy, "Batch Normalization", 2015; Han,
    Demmel and You, "Auto-Precision Scaling for Distributed Deep Learning",
    2020, https://arxiv.org/abs/2003.00119; Gupta et al., "Deep Learning
    with Limited Numerical Precision", ICML 2015,
    https://arxiv.org/abs/1502.02551.
  """
  sync = grad_sync_from(
      grad_sync, grad_reduce=grad_reduce, comm_dtype=comm_dtype, aps=aps, rounding=rounding
  )
  config = step_config_from(
      step_config, microbatches=microbatches, compute_dtype=compute_dtype,
      donate=donate, has_aux=has_aux, max_consecutive_skips=max_consecutive_skips,
  )
  options = dict(step_config=config, shard_update=shard_update, data_axes=data_axes,
                 grad_stats=grad_stats, grad_stats_decay=grad_stats_decay)
  if param_sharding is None:
    return make_replicated_train_step(loss_fn, optimizer, mesh, grad_sync=sync, **options)
  lg.check_fn_and_optimizer(loss_fn, optimizer)
  if sync.algorithm != "psum":
    raise ValueError(
        f'param_sharding needs grad_reduce="psum" (the compiler places the '
        f"reductions of a sharded step), got grad_sync={sync!r}."
    )
  if sync.comm_dtype is not None:
    raise ValueError(
        f"comm_dtype={sync.comm_dtype!r} needs replicated parameters: with "
        "param_sharding the compiler places the gradient reductions; pass "
        "comm_dtype=None."
    )
  return make_sharded_train_step(
      loss_fn, optimizer, mesh, param_sharding=param_sharding, **options
  )


def _common(
    loss_fn: Any,
    optimizer: Any,
    mesh: Any,
    step_config: Any,
    shard_update: Any,
    data_axes: Any,
    named: set[Hashable],
) -> tuple[jax.sharding.Mesh, StepConfig, tuple[Hashable, ...]]:
  """Checks what both builders take; the mesh, the config and the data axes."""
  config = step_config_from(step_config)
  lg.check_fn_and_optimizer(loss_fn, optimizer)
  if not isinstance(mesh, jax.sharding.Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
  mesh = auto_axes_mesh(mesh)
  validation.check_bool("shard_update", shard_update)
  if data_axes is None:
    axes = tuple(a for a in mesh.axis_names if a not in named)
  else:
    axes = lg.check_axes("data_axes", data_axes)
  unknown = [a for a in axes if a not in mesh.axis_names]
  if not axes or unknown or len(set(axes)) != len(axes):
    raise ValueError(
        f"data_axes must be a non-empty subset of the mesh axes {mesh.axis_names}, "
        f"got {data_axes!r}."
    )
  return mesh, config, axes


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

  Returns:
    A `ReplicatedTrainStep`: `state, metrics = step(state, batch)`, with
    `step.init(params, model_state=None, rng=None)`; metrics as for
    `make_train_step`.

  Raises:
    ValueError: arguments out of range, or a torus that does not fit the
      data axes.
    TypeError: arguments of the wrong kind.

  Examples:
    >>> import jax.numpy as jnp, numpy as np
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> def loss_fn(params, batch):
    ...   return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
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
  mesh, config, axes = _common(
      loss_fn, optimizer, mesh, step_config, shard_update, data_axes, set()
  )
  n = compat.mesh_axis_sizes(mesh, axes)
  sync.check_replicas(axes, n)
  decay = gs_lib.check_options(grad_stats, grad_stats_decay, n, config.microbatches)
  return ReplicatedTrainStep(
      loss_fn, optimizer, mesh, grad_sync=sync, config=config, data_axes=axes,
      shard_update=bool(shard_update), grad_stats_decay=decay,
  )


def make_sharded_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    mesh: jax.sharding.Mesh,
    *,
    param_sharding: Any,
    step_config: StepConfig | None = None,
    shard_update: bool = False,
    data_axes: Sequence[Hashable] | None = None,
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
) -> ShardedTrainStep:
  """Builds the data-parallel step of sharded parameters (one GSPMD `jit`).

  Parameters (and the optimizer state that mirrors them) are laid out over
  mesh axes that carry no data (FSDP, tensor parallelism), declared as data
  the way big_vision declares them: `(regex, PartitionSpec)` rules matched
  (`re.fullmatch`) against '/'-joined parameter paths, first match wins,
  unmatched parameters replicated. The step is one `jax.jit` program with
  the state's shardings as in/out shardings: the replicas are a `vmap` over
  the data axes, and the compiler inserts the reductions (the gradients are
  summed inside the backward pass; trust-ratio norms over sharded layers
  are exact). There is no reduction option: the compiler's `psum` is the
  only one.

  Args:
    loss_fn: as for `make_train_step`.
    optimizer: an optax gradient transformation.
    mesh: the device mesh, e.g. `jax.make_mesh((4, 2), ("data", "model"))`.
    param_sharding: a sequence of `(regex, PartitionSpec)` rules (or a
      pytree of `PartitionSpec` shaped like the parameters). Specs may name
      only non-data axes; a rule that matches no parameter warns at `init`.
    step_config: a `StepConfig` (default: `StepConfig()`).
    shard_update: also split the optimizer state and update over the data
      axes.
    data_axes: the mesh axes that carry replicas (default: the axes the
      specs do not name).
    grad_stats: as for `make_replicated_train_step`.
    grad_stats_decay: as for `make_replicated_train_step`.

  Returns:
    A `ShardedTrainStep`, called and initialised as `make_train_step`'s.

  Raises:
    ValueError: a spec that names a data axis or an unknown axis, a pattern
      that is not a regex, or other arguments out of range.
    TypeError: arguments of the wrong kind.

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

  References:
    Xu et al., "GSPMD: General and Scalable Parallelization for ML
    Computation Graphs", 2021; Beyer, Zhai and Kolesnikov, "Big Vision",
    2022, https://github.com/google-research/big_vision (sharding rules).
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
  mesh, config, axes = _common(
      loss_fn, optimizer, mesh, step_config, shard_update, data_axes, named
  )
  layout = ps.check_param_sharding(param_sharding, mesh, axes)
  n = compat.mesh_axis_sizes(mesh, axes)
  decay = gs_lib.check_options(grad_stats, grad_stats_decay, n, config.microbatches)
  return ShardedTrainStep(
      loss_fn, optimizer, mesh, layout=layout, config=config, data_axes=axes,
      shard_update=bool(shard_update), grad_stats_decay=decay,
  )
