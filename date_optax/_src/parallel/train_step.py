"""Data-parallel train steps: `jit` over a mesh (with `shard_map`) and `pmap`.

Both steps compute each replica's *local* gradient of `loss_fn` on its slice
of the global batch, combine the gradients exactly once with the chosen
all-reduce algorithm (mean over replicas), skip the update when anything is
non-finite, and apply the optimizer. The pieces are shared so that the two
paths compute the same thing.

Why the gradient is local: under `shard_map(check_vma=True)` JAX already sums
the gradient of a replicated parameter over the mesh (it is the transpose of
the implicit broadcast), so reducing it again would multiply it by the number
of replicas. The steps differentiate with respect to a device-varying copy of
the parameters (`compat.to_varying`), which is local under every setting.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from date_optax._src import telemetry, validation
from date_optax._src.parallel import collectives, compat
from date_optax._src.parallel import update_sharding as us
from date_optax._src.parallel.distributed import host_local_to_global, replicate_to_mesh
from date_optax._src.parallel.train_state import TrainState, check_metrics
from date_optax._src.trust_ratio import trust_ratios

PyTree = Any
Metrics = dict[str, Any]
LossFn = Callable[..., Any]


# ---------------------------------------------------------------------------
# Pieces shared by the jit and pmap steps.
# ---------------------------------------------------------------------------


def _cast_floats(tree: PyTree, dtype: Any) -> PyTree:
  if dtype is None:
    return tree

  def cast(x):
    x = jnp.asarray(x)
    return x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

  return jax.tree.map(cast, tree)


def _local_loss_and_grads(
    loss_fn: LossFn, has_aux: bool, compute_dtype: Any, params: PyTree, batch: PyTree
) -> tuple[jax.Array, Any, PyTree]:
  """Loss (float32), aux and gradient of this replica's slice of the batch.

  Under mixed precision the float32 parameters are cast inside the
  differentiated function, so gradients come back in float32.
  """

  def f(p):
    out = loss_fn(_cast_floats(p, compute_dtype), _cast_floats(batch, compute_dtype))
    if has_aux:
      if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError(
            "with has_aux=True, loss_fn must return (loss, aux), got "
            f"{type(out).__name__}."
        )
      loss, aux = out
    else:
      loss, aux = out, None
    loss = jnp.asarray(loss)
    if loss.shape != ():
      raise ValueError(
          "loss_fn must return a scalar loss (the mean over its batch), got shape "
          f"{loss.shape}."
      )
    return loss.astype(jnp.float32), aux

  (loss, aux), grads = jax.value_and_grad(f, has_aux=True)(params)
  return loss, aux, grads


def _scaled(grads: PyTree, n: int) -> PyTree:
  # Divide before summing, in the accumulation dtype: the mean never
  # overflows a low-precision gradient.
  return jax.tree.map(lambda g: g.astype(collectives._acc_dtype(g.dtype)) / n, grads)


def _mean_over_replicas(
    grads: PyTree,
    axes: Any,
    algorithm: str,
    n: int,
    grid: tuple[int, int] | None = None,
) -> PyTree:
  total = collectives.all_reduce(
      _scaled(grads, n), axes, algorithm=algorithm, grid=grid
  )
  return jax.tree.map(lambda t, g: t.astype(g.dtype), total, grads)


def _reduce_aux(aux: Any, axes: Any) -> Any:
  if aux is None:
    return None

  def red(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return lax.pmean(x.astype(jnp.promote_types(x.dtype, jnp.float32)), axes)
    return lax.psum(x, axes)

  return jax.tree.map(red, aux)


def _all_finite(tree: PyTree) -> jax.Array:
  ok = jnp.array(True)
  for x in jax.tree.leaves(tree):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      ok = ok & jnp.all(jnp.isfinite(x))
  return ok


def _global_norm_f32(tree: PyTree) -> jax.Array:
  sq = [jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in jax.tree.leaves(tree)]
  return jnp.sqrt(sum(sq)) if sq else jnp.zeros((), jnp.float32)


def apply_gradients(
    state: TrainState,
    grads: PyTree,
    loss: jax.Array,
    optimizer: optax.GradientTransformation,
    trust_ratio_bounds: tuple[Any, Any] | None = None,
) -> tuple[TrainState, Metrics]:
  """One optimizer step on already-reduced gradients, skipped if non-finite.

  The step is skipped (parameters and optimizer state kept as they were, the
  skip counted) when the loss, a gradient or an update is NaN/Inf. Inside
  `jit` nothing can raise; `check_metrics` does that on the host.
  """
  updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
  new_params = optax.apply_updates(state.params, updates)
  # The barrier materialises the flag once: otherwise XLA fuses the whole
  # finiteness reduction into every select below, which made a ResNet-50-sized
  # step compile ~15x slower (and recompute the check per leaf).
  finite = lax.optimization_barrier(_all_finite((loss, grads, updates)))

  def keep(new, old):
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)

  consecutive = jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32)
  total = (state.total_skips + jnp.where(finite, 0, 1)).astype(jnp.int32)
  opt_state = keep(new_opt_state, state.opt_state)
  new_state = state.replace(
      step=state.step + 1,
      params=keep(new_params, state.params),
      opt_state=opt_state,
      consecutive_skips=consecutive,
      total_skips=total,
  )
  metrics: Metrics = {
      "loss": loss,
      "grad_norm": _global_norm_f32(grads),
      "skipped": jnp.logical_not(finite),
      "consecutive_skips": consecutive,
      "total_skips": total,
  }
  ratios = trust_ratios(opt_state)
  if ratios is not None:
    metrics["trust_ratios"] = ratios
    lower, upper = trust_ratio_bounds or (None, None)
    # Bounds may be schedules of the optimizer's update count.
    count = state.step - state.total_skips
    lower = lower(count) if callable(lower) else lower
    upper = upper(count) if callable(upper) else upper
    metrics.update(
        telemetry.trust_ratio_summary(ratios, lower, upper, prefix="trust_ratio/")
    )
  return new_state, metrics


def _check_common(
    loss_fn, optimizer, grad_reduce, compute_dtype, max_consecutive_skips
):
  if not callable(loss_fn):
    raise TypeError(f"loss_fn must be callable, got {loss_fn!r}.")
  if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
    raise TypeError(
        f"optimizer must be an optax.GradientTransformation, got {optimizer!r}."
    )
  validation.check_choice("grad_reduce", grad_reduce, collectives.ALGORITHMS)
  if compute_dtype is not None:
    try:
      dt = jnp.dtype(compute_dtype)
    except TypeError as e:
      raise TypeError(
          f"compute_dtype must be a float dtype, got {compute_dtype!r}."
      ) from e
    if not jnp.issubdtype(dt, jnp.floating):
      raise TypeError(f"compute_dtype must be a float dtype, got {compute_dtype!r}.")
  if max_consecutive_skips is not None:
    validation.check_int("max_consecutive_skips", max_consecutive_skips, low=0)


def _check_batch(batch: PyTree, n: int) -> None:
  for x in jax.tree.leaves(batch):
    shape = np.shape(x)
    if not shape or shape[0] % n:
      raise ValueError(
          f"every batch leaf needs a leading (batch) dimension divisible by the "
          f"{n} data-parallel replicas, got a leaf of shape {shape}."
      )


# ---------------------------------------------------------------------------
# jit over a mesh.
# ---------------------------------------------------------------------------


class TrainStep:
  """A data-parallel train step over a mesh, as built by `make_train_step`.

  Call it as `state, metrics = step(state, batch)`. `step.init(params)` builds
  a `TrainState` laid out on the mesh (optimizer state split over replicas
  with `shard_update=True`); `step.shard_batch(batch)` turns this host's part
  of the global batch into a global array (done automatically by the call
  for NumPy inputs); `step.batch_sharding` is the batch layout (for
  `prefetch_to_device`); `step.lower(state, batch)` exposes the compiled
  program.

  Args:
    loss_fn, optimizer, mesh: see `make_train_step`, which validates all
      arguments; construct through it.
    **options: the keyword options of `make_train_step`.

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
      grad_reduce: str,
      shard_update: bool,
      compute_dtype: Any,
      donate: bool,
      has_aux: bool,
      data_axes: tuple[Hashable, ...],
      max_consecutive_skips: int | None,
      trust_ratio_bounds: tuple[Any, Any] | None = None,
  ):
    self.trust_ratio_bounds = trust_ratio_bounds
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.mesh = mesh
    self.grad_reduce = grad_reduce
    self.shard_update = shard_update
    self.compute_dtype = compute_dtype
    self.has_aux = has_aux
    self.data_axes = data_axes
    self.max_consecutive_skips = max_consecutive_skips
    self.num_replicas = compat.mesh_axis_sizes(mesh, data_axes)
    self.batch_spec = P(us.axes_entry(data_axes))
    self.batch_sharding = NamedSharding(mesh, self.batch_spec)
    self.replicated = NamedSharding(mesh, P())
    self._jitted = jax.jit(self._step, donate_argnums=(0,) if donate else ())
    self._init_cache: dict[Any, Any] = {}

  # -- layout ---------------------------------------------------------------

  def _spec(self, shape: Sequence[int]) -> P:
    if not self.shard_update:
      return P()
    return us.sharded_spec(shape, self.data_axes, self.num_replicas)

  def state_sharding(self, state: Any) -> Any:
    """NamedShardings for a `TrainState` (or its `jax.eval_shape`)."""

    def spec_tree(tree, split):
      return jax.tree.map(
          lambda x: NamedSharding(self.mesh, self._spec(np.shape(x)) if split else P()),
          tree,
      )

    return state.replace(
        step=self.replicated,
        params=spec_tree(state.params, False),
        opt_state=spec_tree(state.opt_state, True),
        consecutive_skips=self.replicated,
        total_skips=self.replicated,
    )

  def init(self, params: PyTree) -> TrainState:
    """A fresh `TrainState` for `params`, placed on the mesh.

    `params` may be host (NumPy) arrays with the same value on every process.
    """
    params = jax.tree.map(lambda x: replicate_to_mesh(x, self.mesh), params)
    key = (jax.tree.structure(params),
           tuple((x.shape, x.dtype) for x in jax.tree.leaves(params)))
    if key not in self._init_cache:
      create = lambda p: TrainState.create(p, self.optimizer)
      shardings = self.state_sharding(jax.eval_shape(create, params))
      self._init_cache[key] = jax.jit(create, out_shardings=shardings)
    return self._init_cache[key](params)

  def shard_batch(self, batch: PyTree) -> PyTree:
    """This host's rows of the global batch -> global arrays split over replicas."""
    _check_batch(batch, 1)
    return host_local_to_global(batch, self.batch_sharding)

  # -- the step -------------------------------------------------------------

  def _specs_like(self, tree: PyTree) -> PyTree:
    return jax.tree.map(lambda x: self._spec(np.shape(x)), tree)

  def _grads(self, params: PyTree, batch: PyTree) -> tuple[Any, Any, PyTree]:
    """Loss, aux and mean gradient; split over replicas with shard_update."""
    axes, n, alg = self.data_axes, self.num_replicas, self.grad_reduce
    shapes = [np.shape(x) for x in jax.tree.leaves(params)]

    def local(params, batch):
      params = compat.to_varying(params, axes)
      loss, aux, grads = _local_loss_and_grads(
          self.loss_fn, self.has_aux, self.compute_dtype, params, batch
      )
      if self.shard_update:
        grads = _reduce_scatter_mean(grads, shapes, axes, alg, n)
      else:
        grads = _mean_over_replicas(grads, axes, alg, n)
      return lax.pmean(loss, axes), _reduce_aux(aux, axes), grads

    fn = compat.shard_map(
        local,
        mesh=self.mesh,
        in_specs=(P(), self.batch_spec),
        out_specs=(P(), P(), self._specs_like(params)),
    )
    return fn(params, batch)

  def _gather_params(self, params: PyTree) -> PyTree:
    axes, alg = self.data_axes, self.grad_reduce
    shapes = [np.shape(x) for x in jax.tree.leaves(params)]
    specs = self._specs_like(params)
    params = jax.tree.map(
        lambda x, s: lax.with_sharding_constraint(x, NamedSharding(self.mesh, s)),
        params,
        specs,
    )
    fn = compat.shard_map(
        lambda p: _all_gather_params(p, shapes, axes, alg, self.num_replicas),
        mesh=self.mesh,
        in_specs=(specs,),
        out_specs=P(),
    )
    return fn(params)

  def _step(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    _check_batch(batch, self.num_replicas)
    batch = jax.tree.map(
        lambda x: lax.with_sharding_constraint(x, self.batch_sharding), batch
    )
    loss, aux, grads = self._grads(state.params, batch)
    new_state, metrics = apply_gradients(
        state, grads, loss, self.optimizer, self.trust_ratio_bounds
    )
    if self.shard_update:
      new_state = new_state.replace(params=self._gather_params(new_state.params))
    if self.has_aux:
      metrics["aux"] = aux
    out_shardings = self.state_sharding(new_state)
    new_state = jax.tree.map(lax.with_sharding_constraint, new_state, out_shardings)
    return new_state, metrics

  def _prepare(self, batch: PyTree) -> PyTree:
    _check_batch(batch, 1)
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

  def lower(self, state: TrainState, batch: PyTree) -> jax.stages.Lowered:
    """The lowered step (`.compile().as_text()` shows the collectives)."""
    return self._jitted.lower(state, self._prepare(batch))

  def __call__(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    state, metrics = self._jitted(state, self._prepare(batch))
    if self.max_consecutive_skips is not None:
      check_metrics(metrics, self.max_consecutive_skips)
    return state, metrics


# Layout of the split gradients/parameters: a leaf split along axis d is moved
# to (n, rest) blocks whose row k is replica k's shard, the row-major order in
# which PartitionSpec(axes) places shards.


def _to_blocks(x: jax.Array, d: int, n: int) -> jax.Array:
  return jnp.moveaxis(x, d, 0).reshape(n, -1)


def _shard_from_chunk(
    chunk: jax.Array, shape: Sequence[int], d: int, n: int
) -> jax.Array:
  moved = (shape[d] // n,) + tuple(s for i, s in enumerate(shape) if i != d)
  return jnp.moveaxis(chunk.reshape(moved), 0, d)


def _reduce_scatter_mean(
    grads: PyTree, shape_list: list[tuple[int, ...]], axes: Any, algorithm: str, n: int
) -> PyTree:
  """Mean over replicas; split leaves come back as this replica's shard only."""
  leaves, treedef = jax.tree.flatten(_scaled(grads, n))
  orig = jax.tree.leaves(grads)
  dims = [us.shard_axis(s, n) for s in shape_list]
  out: list[Any] = [None] * len(leaves)
  whole = [i for i, d in enumerate(dims) if d is None]
  if whole:
    reduced = collectives.all_reduce(
        [leaves[i] for i in whole], axes, algorithm=algorithm
    )
    for i, r in zip(whole, reduced, strict=True):
      out[i] = r
  groups: dict[Any, list[int]] = {}
  for i, d in enumerate(dims):
    if d is not None:
      groups.setdefault(leaves[i].dtype, []).append(i)
  for idxs in groups.values():
    blocks = [_to_blocks(leaves[i], dims[i], n) for i in idxs]
    chunk = collectives.reduce_scatter_blocks(
        jnp.concatenate(blocks, axis=1), axes, algorithm
    )
    offset = 0
    for i, b in zip(idxs, blocks, strict=True):
      c = b.shape[1]
      out[i] = _shard_from_chunk(chunk[offset : offset + c], shape_list[i], dims[i], n)
      offset += c
  out = [o.astype(g.dtype) for o, g in zip(out, orig, strict=True)]
  return jax.tree.unflatten(treedef, out)


def _all_gather_params(
    params: PyTree, shape_list: list[tuple[int, ...]], axes: Any, algorithm: str, n: int
) -> PyTree:
  """Inverse of the split: every replica gets every parameter in full."""
  leaves, treedef = jax.tree.flatten(params)
  dims = [us.shard_axis(s, n) for s in shape_list]
  out = list(leaves)
  groups: dict[Any, list[int]] = {}
  for i, d in enumerate(dims):
    if d is not None:
      groups.setdefault(leaves[i].dtype, []).append(i)
  for idxs in groups.values():
    chunks = [jnp.moveaxis(leaves[i], dims[i], 0).reshape(-1) for i in idxs]
    full = collectives.all_gather_blocks(jnp.concatenate(chunks), axes, algorithm)
    offset = 0
    for i, c in zip(idxs, chunks, strict=True):
      shape, d = shape_list[i], dims[i]
      moved = (shape[d],) + tuple(s for j, s in enumerate(shape) if j != d)
      piece = full[:, offset : offset + c.size].reshape(moved)
      out[i] = jnp.moveaxis(piece, 0, d)
      offset += c.size
  return jax.tree.unflatten(treedef, out)


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
    trust_ratio_bounds: tuple[Any, Any] | None = None,
) -> TrainStep:
  """Builds a synchronous data-parallel train step, `jit`-compiled over a mesh.

  Every device of `data_axes` holds a full copy of the parameters and a slice
  of the global batch. The step computes each slice's gradient with
  `shard_map`, averages the gradients over the replicas once with
  `grad_reduce`, and applies `optimizer`. (The gradient is taken with respect
  to a device-varying copy of the parameters, so it is local: under
  `shard_map(check_vma=True)` the gradient of a replicated input would come
  back already summed, and a second reduction would scale it by N.) The step
  is skipped (parameters and optimizer state unchanged,
  `consecutive_skips`/`total_skips` counted) when the loss, a gradient or an
  update is NaN/Inf.

  With `shard_update=True` (weight-update sharding) the gradients are
  reduce-scattered instead: each replica receives the summed gradient of its
  1/N slice of every large array, the optimizer state lives split the same
  way, the update is computed on the slices, and the new parameters are
  all-gathered. Norms that the optimizer takes over a layer (trust ratios)
  span all the slices: the compiler sums the per-slice squares across
  replicas, so the result equals the unsharded step. The split axis of each
  array is its largest axis divisible by N; arrays without one stay whole.

  Args:
    loss_fn: `loss_fn(params, batch) -> loss` (or `(loss, aux)` with
      `has_aux=True`), the *mean* loss over the batch it is given; it sees
      one replica's slice of the global batch.
    optimizer: an optax gradient transformation.
    mesh: the device mesh (`data_mesh` or `torus_mesh`).
    grad_reduce: the all-reduce algorithm, "psum", "ring" (one ring over all
      data-parallel devices) or "torus" (needs two data axes).
    shard_update: split the optimizer state and update over the replicas.
    compute_dtype: e.g. `jnp.bfloat16` to run `loss_fn` on bfloat16 copies of
      the float parameters and batch leaves; the parameters, optimizer state,
      loss and gradient reductions stay float32. `None` computes as stored.
    donate: donate the input state's buffers to the output.
    has_aux: `loss_fn` returns `(loss, aux)`; `metrics["aux"]` holds aux with
      float leaves averaged and integer leaves summed over replicas.
    data_axes: the mesh axes that carry replicas (default: all of them).
    max_consecutive_skips: when set, each call reads
      `metrics["consecutive_skips"]` on the host (waiting for the step) and
      raises `NonFiniteError` once it exceeds this number.
    trust_ratio_bounds: the optimizer's `(lower, upper)` ratio bounds
      (floats, schedules of the update count, or None), used for the
      "trust_ratio/frac_at_lower|upper" metrics.

  Returns:
    A `TrainStep`: `state, metrics = step(state, batch)`, with
    `step.init(params)` to build the state. `batch` is a pytree whose leaves
    have the global batch as leading dimension (NumPy arrays are this host's
    rows of it). `metrics` holds "loss" (float32 mean over the global batch),
    "grad_norm" (global L2 norm of the mean gradient), "skipped",
    "consecutive_skips", "total_skips", and, when the optimizer keeps
    per-layer trust ratios, "trust_ratios" (from `date_optax.trust_ratios`)
    with their summary "trust_ratio/min", "/median", "/max",
    "/frac_at_lower" and "/frac_at_upper" (see
    `date_optax.diagnostics.trust_ratio_summary`).

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> def loss_fn(params, batch):
    ...   return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    >>> step = dp.make_train_step(loss_fn, date_optax.lamb(1e-2), mesh)
    >>> state = step.init({"w": np.zeros((3, 1), np.float32)})
    >>> batch = {"x": np.ones((8, 3), np.float32), "y": np.ones((8, 1), np.float32)}
    >>> state, metrics = step(state, batch)
    >>> int(state.step), float(metrics["loss"])
    (1, 1.0)

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018; Xu et al., "Automatic
    Cross-Replica Sharding of Weight Update in Data-Parallel Training", 2020.
  """
  _check_common(loss_fn, optimizer, grad_reduce, compute_dtype, max_consecutive_skips)
  if not isinstance(mesh, jax.sharding.Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}.")
  validation.check_bool("shard_update", shard_update)
  validation.check_bool("donate", donate)
  validation.check_bool("has_aux", has_aux)
  axes = tuple(mesh.axis_names) if data_axes is None else tuple(data_axes)
  unknown = [a for a in axes if a not in mesh.axis_names]
  if not axes or unknown:
    raise ValueError(
        f"data_axes must be a non-empty subset of the mesh axes {mesh.axis_names}, "
        f"got {data_axes!r}."
    )
  if grad_reduce == "torus" and len(axes) != 2:
    raise ValueError(
        f'grad_reduce="torus" needs two data axes (a torus_mesh), got {axes}.'
    )
  return TrainStep(
      loss_fn,
      optimizer,
      mesh,
      grad_reduce=grad_reduce,
      shard_update=bool(shard_update),
      compute_dtype=compute_dtype,
      donate=bool(donate),
      has_aux=bool(has_aux),
      data_axes=axes,
      max_consecutive_skips=max_consecutive_skips,
      trust_ratio_bounds=_check_ratio_bounds(trust_ratio_bounds),
  )


# ---------------------------------------------------------------------------
# pmap.
# ---------------------------------------------------------------------------


class PmapTrainStep:
  """A data-parallel train step with `jax.pmap`, as built by `make_pmap_train_step`.

  The state is replicated with a leading device axis; `step.init(params)`
  builds it. The call takes the *global* batch (leading dimension the global
  batch size), splits it over the devices, and returns the metrics of the
  first device (they are equal on all devices).

  Args:
    loss_fn, optimizer: see `make_pmap_train_step`, which validates all
      arguments; construct through it.
    **options: the keyword options of `make_pmap_train_step`.

  Examples:
    >>> import jax, optax
    >>> import date_optax.parallel as dp
    >>> step = dp.make_pmap_train_step(lambda p, b: (p * b).mean(), optax.sgd(0.1))
    >>> isinstance(step, dp.PmapTrainStep)
    True
    >>> step.num_replicas == jax.local_device_count()
    True

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017.
  """

  def __init__(self, loss_fn, optimizer, *, axis_name, grad_reduce, torus_shape,
               compute_dtype, donate, has_aux, max_consecutive_skips, devices,
               trust_ratio_bounds=None):
    self.trust_ratio_bounds = trust_ratio_bounds
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.axis_name = axis_name
    self.grad_reduce = grad_reduce
    self.compute_dtype = compute_dtype
    self.has_aux = has_aux
    self.max_consecutive_skips = max_consecutive_skips
    self.devices = list(jax.local_devices() if devices is None else devices)
    self.num_replicas = len(self.devices)
    if grad_reduce == "torus":
      if torus_shape is None:
        torus_shape = _most_square(self.num_replicas)
      if int(np.prod(torus_shape)) != self.num_replicas:
        raise ValueError(
            f"torus_shape {tuple(torus_shape)} must multiply to the number of "
            f"devices, {self.num_replicas}."
        )
    self.torus_shape = None if torus_shape is None else tuple(torus_shape)
    self._pmapped = jax.pmap(
        self._body,
        axis_name=axis_name,
        devices=self.devices,
        donate_argnums=(0,) if donate else (),
    )

  def _body(self, state, batch):
    axis = self.axis_name
    loss, aux, grads = _local_loss_and_grads(
        self.loss_fn, self.has_aux, self.compute_dtype, state.params, batch
    )
    grads = _mean_over_replicas(
        grads, axis, self.grad_reduce, self.num_replicas, self.torus_shape
    )
    loss = lax.pmean(loss, axis)
    new_state, metrics = apply_gradients(
        state, grads, loss, self.optimizer, self.trust_ratio_bounds
    )
    if self.has_aux:
      metrics["aux"] = _reduce_aux(aux, axis)
    return new_state, metrics

  def init(self, params: PyTree) -> TrainState:
    """A fresh `TrainState` replicated over the devices (leading device axis)."""
    state = TrainState.create(jax.tree.map(jnp.asarray, params), self.optimizer)
    n = self.num_replicas
    stacked = jax.tree.map(
        lambda x: np.broadcast_to(np.asarray(x), (n,) + np.shape(x)), state
    )
    return jax.pmap(lambda s: s, devices=self.devices)(stacked)

  def shard_batch(self, batch: PyTree) -> PyTree:
    """Reshapes a global batch to (devices, per-device batch, ...)."""
    _check_batch(batch, self.num_replicas)
    n = self.num_replicas
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)

  def __call__(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    state, metrics = self._pmapped(state, self.shard_batch(batch))
    metrics = jax.tree.map(lambda m: m[0], metrics)
    if self.max_consecutive_skips is not None:
      check_metrics(metrics, self.max_consecutive_skips)
    return state, metrics


def _check_ratio_bounds(bounds: Any) -> tuple[Any, Any] | None:
  if bounds is None:
    return None
  if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
    raise TypeError(
        f"trust_ratio_bounds must be None or a (lower, upper) pair, got {bounds!r}."
    )
  lower, upper = bounds
  validation.check_bounds(lower, upper)
  return (lower, upper)


def _most_square(n: int) -> tuple[int, int]:
  """The X×Y grid of n devices closest to square, X <= Y."""
  rows = int(np.floor(np.sqrt(n)))
  while n % rows:
    rows -= 1
  return rows, n // rows


def make_pmap_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    axis_name: str = "batch",
    grad_reduce: str = "psum",
    torus_shape: tuple[int, int] | None = None,
    compute_dtype: Any = None,
    donate: bool = True,
    has_aux: bool = False,
    max_consecutive_skips: int | None = None,
    devices: Sequence[Any] | None = None,
    trust_ratio_bounds: tuple[Any, Any] | None = None,
) -> PmapTrainStep:
  """Builds the same data-parallel train step with `jax.pmap` (older code).

  Equal to `make_train_step` (same local gradients, one reduction, same
  non-finite handling and metrics), for code that keeps per-device copies of
  the state. The "torus" reduction views the single pmap axis as an X×Y grid
  of devices (row-major), as a TPU slice's devices are.

  Args:
    loss_fn: `loss_fn(params, batch) -> loss` (or `(loss, aux)`), the mean
      loss over the per-device batch.
    optimizer: an optax gradient transformation.
    axis_name: the pmap axis name.
    grad_reduce: "psum", "ring" or "torus".
    torus_shape: `(X, Y)` for "torus" (default: the most square grid of the
      devices).
    compute_dtype: e.g. `jnp.bfloat16` for the forward/backward computation;
      parameters, optimizer state, loss and reductions stay float32.
    donate: donate the input state's buffers.
    has_aux: `loss_fn` returns `(loss, aux)`.
    max_consecutive_skips: when set, raise `NonFiniteError` on the host once
      more steps than this in a row were skipped (each call then waits for
      the step).
    devices: the local devices to use (default all).
    trust_ratio_bounds: as in `make_train_step`.

  Returns:
    A `PmapTrainStep`: `state, metrics = step(state, global_batch)` and
    `step.init(params)`; metrics as for `make_train_step`.

  Examples:
    >>> import jax.numpy as jnp, numpy as np
    >>> import date_optax
    >>> import date_optax.parallel as dp
    >>> def loss_fn(params, batch):
    ...   return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)
    >>> step = dp.make_pmap_train_step(loss_fn, date_optax.lars(0.1))
    >>> state = step.init({"w": np.zeros((3, 1), np.float32)})
    >>> batch = {"x": np.ones((8, 3), np.float32), "y": np.ones((8, 1), np.float32)}
    >>> state, metrics = step(state, batch)
    >>> float(metrics["loss"])
    1.0

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018.
  """
  _check_common(loss_fn, optimizer, grad_reduce, compute_dtype, max_consecutive_skips)
  if not isinstance(axis_name, str):
    raise TypeError(f"axis_name must be a str, got {axis_name!r}.")
  if torus_shape is not None:
    if grad_reduce != "torus":
      raise ValueError('torus_shape is only used with grad_reduce="torus".')
    if len(tuple(torus_shape)) != 2:
      raise ValueError(f"torus_shape must be (X, Y), got {torus_shape!r}.")
    for i, d in enumerate(torus_shape):
      validation.check_int(f"torus_shape[{i}]", d, low=1)
  validation.check_bool("donate", donate)
  validation.check_bool("has_aux", has_aux)
  return PmapTrainStep(
      loss_fn,
      optimizer,
      axis_name=axis_name,
      grad_reduce=grad_reduce,
      torus_shape=torus_shape,
      compute_dtype=compute_dtype,
      donate=bool(donate),
      has_aux=bool(has_aux),
      max_consecutive_skips=max_consecutive_skips,
      devices=devices,
      trust_ratio_bounds=_check_ratio_bounds(trust_ratio_bounds),
  )
