"""What the two data-parallel steps over a mesh share: layout, init and calling.

`TrainStep` holds the state's layout on the mesh, `init`, the batch's
placement, the `jit` with declared in/out shardings and the host-side
non-finite check; each subclass holds one program (`_replicas`):
`replicated_step.ReplicatedTrainStep` (`shard_map`) and
`sharded_step.ShardedTrainStep` (GSPMD). What both builders check is in
`step_checks`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
import warnings
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from date_optax._src import batch_schedule as bs_lib
from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.layout import param_sharding as ps
from date_optax._src.parallel.layout.distributed import host_local_to_global, replicate_to_mesh
from date_optax._src.parallel.step import grad_stats as gs_lib
from date_optax._src.parallel.step import local_grads as lg
from date_optax._src.parallel.step import residuals as res_lib
from date_optax._src.parallel.step.batch_tracker import (
    BatchTracker,
    decay_at,
    schedule_progress,
    schedule_step,
)
from date_optax._src.parallel.step.replica_step import ReplicaResult, apply_update
from date_optax._src.parallel.step.step_checks import check_state
from date_optax._src.parallel.step.step_config import StepConfig
from date_optax._src.parallel.step.train_state import Metrics, TrainState, check_metrics
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
    batch_schedule: a `date_optax.BatchSchedule`, or None (every call
      takes any batch that splits over replicas × microbatches).
    max_rows_per_device: with a batch schedule, the most rows of one
      microbatch on one device (None: no cap).

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
      batch_schedule: bs_lib.BatchSchedule | None = None,
      max_rows_per_device: int | None = None,
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
    # Error-feedback residuals (worker and hop): a leading replica axis split
    # over the data axes.
    self.residual_spec = self.batch_spec
    self.batch_sharding = NamedSharding(mesh, self.batch_spec)
    self.replicated = NamedSharding(mesh, P())
    self._compiled: dict[Any, Any] = {}
    # The state the last call returned (weakly) and its program: the next
    # call usually takes that very state, whose structure, shapes and
    # shardings are the program's own, so it skips the host checks.
    self._last_out: tuple[weakref.ref, Any] | None = None
    self._init_cache: dict[Any, Any] = {}
    self.batch_schedule = batch_schedule
    self._tracker = None if batch_schedule is None else BatchTracker(batch_schedule)
    #: The cap on one device's microbatch rows of a growing batch (None: none).
    self.max_rows_per_device = max_rows_per_device
    # Programs compiled ahead by `precompile`, by (jit program, batch rows).
    self._ahead: dict[tuple[int, int], Any] = {}
    self._row_spec: Any = None  # one batch row's shapes, from the last trace
    if batch_schedule is not None and len(batch_schedule.batch_sizes) > MANY_PROGRAMS:
      warnings.warn(
          f"the batch schedule has {len(batch_schedule.batch_sizes)} batch sizes: the "
          f"step compiles {len(batch_schedule.batch_sizes)} programs, each the first time "
          "its size comes up (every host waits for it); step.precompile(state, batch) "
          "compiles them all up front (in the background with background=True).",
          stacklevel=3)
    self.traces = 0  # programs traced by `_step` (one per distinct batch)

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

  @property
  def update_axes(self) -> tuple[Hashable, ...]:
    """The axes `shard_update` splits the update over: the data axes, or with
    `GradSync("hierarchical")` the in-slice ones only (the slices stay pure
    data parallel, so no parameter crosses them)."""
    sync = getattr(self, "grad_sync", None)
    if sync is not None and sync.algorithm == "hierarchical":
      return tuple(self.data_axes[1:])
    return tuple(self.data_axes)

  @property
  def update_shards(self) -> int:
    """Devices one update is split over (`update_axes`' size)."""
    return compat.mesh_axis_sizes(self.mesh, self.update_axes)

  def _update_spec(self, shape: Sequence[int], spec: P) -> P:
    """Layout of a gradient / optimizer-state leaf mirroring a parameter."""
    if not self.shard_update:
      return spec
    return us.sharded_spec(shape, self.update_axes, self.update_shards)

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
        grad_residual=self._residual_shardings(state.grad_residual, state.params, named),
        batch_schedule=jax.tree.map(lambda _: self.replicated, state.batch_schedule),
    )

  #: Whether the state carries error-feedback residuals (set by the builders).
  error_feedback = False

  def _residual_shardings(self, residual: Any, params: PyTree, named: Any) -> Any:
    """The shardings of `state.grad_residual`: each stage laid out as
    `residual_specs` (an `ErrorFeedbackState`, or a bare pytree of residuals)."""
    if residual is None:
      return None
    specs = self.residual_specs(params)
    tree = lambda r: None if r is None else jax.tree.map(lambda _, s: named(s), r, specs)
    if isinstance(residual, ErrorFeedbackState):
      return ErrorFeedbackState(worker=tree(residual.worker), hop=tree(residual.hop))
    return tree(residual)

  def zero_residuals(self, params: PyTree) -> ErrorFeedbackState:
    """Fresh residuals, one per replica (`ErrorFeedbackState.zeros`; the
    slices of "hierarchical" are its first data axis)."""
    slices = compat.mesh_axis_sizes(self.mesh, self.data_axes[:1])
    return ErrorFeedbackState.zeros(params, self.grad_sync, self.num_replicas, slices=slices)

  def residual_specs(self, params: PyTree) -> PyTree:
    """The `PartitionSpec` of every error-feedback residual (a leading replica
    axis split over the data axes)."""
    return jax.tree.map(lambda _: self.residual_spec, params)

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
      A `TrainState` laid out by `state_sharding`. Under `jax.eval_shape`
      (a checkpoint's restore target) it is the state's shapes and dtypes;
      `step.state_sharding(abstract)` gives their shardings.

    Raises:
      TypeError: a parameter leaf that is not a float array (an integer,
        bool, string or other object), named by its path; an `rng` of
        another kind.
    """
    rng = lg.as_key(rng)
    lg.check_params(params)

    def place(x):
      # Under jax.eval_shape (a checkpoint's restore target) the leaves are
      # tracers with no sharding to read; the jitted `create` below places
      # them through its out_shardings.
      return x if isinstance(x, jax.core.Tracer) else replicate_to_mesh(x, self.mesh)

    params = jax.tree.map(place, params)
    model_state = jax.tree.map(place, model_state)
    if rng is not None:
      rng = place(rng)
    inputs = (params, model_state, rng)
    key = (jax.tree.structure(inputs),
           tuple((x.shape, x.dtype) for x in jax.tree.leaves(inputs)))
    if key not in self._init_cache:
      self._check_layout(params)

      def create(p, m, r):
        state = TrainState.create(p, self.optimizer, m, r)
        if self.grad_stats_decay is not None:
          state = state.replace(grad_stats=gs_lib.GradStatsState.zeros())
        if self.error_feedback:
          state = state.replace(grad_residual=self.zero_residuals(p))
        if self.batch_schedule is not None:
          state = state.replace(batch_schedule=self.batch_schedule.init())
        return state

      shardings = self.state_sharding(jax.eval_shape(create, *inputs))
      self._init_cache[key] = jax.jit(create, out_shardings=shardings)
    return self._init_cache[key](*inputs)

  def shard_batch(self, batch: PyTree) -> PyTree:
    """This host's rows of the global batch -> global arrays split over replicas."""
    lg.check_batch(batch, 1)
    return host_local_to_global(batch, self.batch_sharding)

  # -- the step -------------------------------------------------------------

  def _replicas(self, params, batch, model_state, rng, step, residual=None) -> ReplicaResult:
    """The replicas' losses and gradients, reduced: the program of each kind.

    `residual` is the state's `grad_residual` (error feedback), or None.
    """
    raise NotImplementedError

  def _grad_keys(self, params: PyTree) -> PyTree:
    """The reduced gradients' layouts: their parameters' and updates' specs.

    Gradients of one shape share a finiteness reduction only where these
    agree, so no leaf is moved to another's layout to be added to it.
    """
    return jax.tree.map(lambda p, u: repr((p, u)), self.param_specs(params),
                        self._update_specs(params), is_leaf=lambda x: isinstance(x, P))

  def _after_update(self, state: TrainState) -> TrainState:
    return state

  def microbatches_for(self, rows: int) -> int:
    """Microbatches per replica of a growing batch's program for `rows` rows.

    Rows first: the fewest microbatches, at least the step's `microbatches`,
    that divide each device's `rows / replicas` rows into microbatches of
    at most `max_rows_per_device` rows. The schedule's first batch always
    has a split (the builder checks it), and every later batch one of at most
    the first batch's rows per microbatch.

    Args:
      rows: a global batch size the schedule asks for.

    Returns:
      The microbatch count of that program.
    """
    sizes = self.batch_schedule.batch_sizes
    if rows not in sizes:
      raise ValueError(
          f"the batch has {rows} rows, which the batch schedule never asks for "
          f"(its batches: {list(sizes)})."
      )
    per_device = rows // self.num_replicas
    cap = self.max_rows_per_device or per_device
    return next(m for m in range(self.config.microbatches, per_device + 1)
                if per_device % m == 0 and per_device // m <= cap)

  def _step(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    self.traces += 1
    # One row's shapes and dtypes, for `precompile(state)` (once per trace).
    self._row_spec = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), batch)
    rows = int(np.shape(jax.tree.leaves(batch)[0])[0])
    config, extra, decay = self.config, None, self.grad_stats_decay
    if self.batch_schedule is not None:
      config = dataclasses.replace(config, microbatches=self.microbatches_for(rows))
      extra = {"batch_progress": schedule_progress(state.batch_schedule, rows)}
      decay = decay_at(decay, rows, self.batch_schedule)
    lg.check_batch(batch, self.num_replicas, config.microbatches)
    batch = jax.tree.map(
        lambda x: lax.with_sharding_constraint(x, self.batch_sharding), batch
    )
    result = self._replicas(state.params, batch, state.model_state, state.rng, state.step,
                            state.grad_residual, config=config)
    new_state, metrics = apply_update(
        state, result, self.optimizer, config,
        units=self.num_replicas * config.microbatches,
        global_batch=rows,
        grad_stats_decay=decay,
        extra_args=extra,
        grad_keys=self._grad_keys(state.params),
    )
    if self.batch_schedule is not None:
      new_state = schedule_step(self.batch_schedule, state, new_state, metrics, rows, decay)
    return self._after_update(new_state), metrics

  # -- calling --------------------------------------------------------------

  def _prepare(self, batch: PyTree) -> PyTree:
    leaves = jax.tree.leaves(batch)
    if leaves and all(isinstance(x, jax.Array) and x.sharding == self.batch_sharding
                      for x in leaves):
      # Already laid out (shard_batch, or a pipeline that places batches):
      # nothing to move, and the shapes are checked where the step is traced.
      return batch
    lg.check_batch(batch, 1)
    per_process = self.num_replicas // max(1, jax.process_count())

    def to_global(x):
      if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return x
      if isinstance(x, jax.Array) and (
          x.sharding == self.batch_sharding  # the common case, and cheap
          or x.sharding.is_equivalent_to(self.batch_sharding, x.ndim)
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
    last = self._last_out
    if last is not None and last[0]() is state:
      return last[1]
    check_state(state, error_feedback=self.error_feedback,
                grad_stats=self.grad_stats_decay is not None)
    leaves, treedef = jax.tree.flatten(state)
    key = (treedef, tuple(map(_shape_dtype, leaves)))
    if key not in self._compiled:
      shardings = self.state_sharding(state)
      self._compiled[key] = jax.jit(
          self._step,
          in_shardings=(shardings, self.batch_sharding),
          out_shardings=(shardings, self.replicated),
          donate_argnums=(0,) if self.donate else (),
      )
    return self._compiled[key]

  def abstract_state(
      self, params: PyTree, model_state: PyTree = None, rng: Any = None
  ) -> TrainState:
    """The state `init` would build, as `jax.ShapeDtypeStruct` values with their shardings.

    Nothing is allocated, so this works on a mesh of devices this process
    cannot hold arrays on (a TPU slice's from `tpu_slice`): it is what
    `lower`, `compile` and `date_optax.parallel.compile_report` take.

    Args:
      params, model_state, rng: as for `init`; arrays or
        `jax.ShapeDtypeStruct` values (an `rng` may be an int seed).

    Returns:
      A `TrainState` of `jax.ShapeDtypeStruct` values laid out by `state_sharding`.
    """
    shapes = jax.eval_shape(self.init, params, model_state, rng)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, self.state_sharding(shapes))

  def abstract_batch(self, batch: PyTree) -> PyTree:
    """A global batch as `jax.ShapeDtypeStruct` values in the step's batch sharding.

    Args:
      batch: arrays or `jax.ShapeDtypeStruct` values with the global batch's rows.

    Returns:
      The same pytree of `jax.ShapeDtypeStruct` values split over the replicas.
    """
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=self.batch_sharding),
        batch)

  def lower(self, state: TrainState, batch: PyTree) -> jax.stages.Lowered:
    """The lowered step (`.compile().as_text()` shows the collectives).

    `state` and `batch` may be concrete, or abstract: `jax.ShapeDtypeStruct` values
    (`abstract_state`, `abstract_batch`; leaves without a sharding get the
    step's), also on a mesh of devices that this process cannot run, such as
    a TPU slice's (`tpu_slice`). A batch-scheduled step lowers the program of
    the batch's rows.
    """
    if _is_abstract(state):
      state = jax.tree.map(_with_sharding, state, self.state_sharding(state))
    if _is_abstract(batch):
      lg.check_batch(batch, self.num_replicas)
      batch = jax.tree.map(
          lambda x: _with_sharding(x, self.batch_sharding), batch)
    else:
      batch = self._prepare(batch)
    return self._compiled_for(state).lower(state, batch)

  def compile(self, state: TrainState, batch: PyTree) -> jax.stages.Compiled:
    """`lower(state, batch).compile()`: the compiled program, nothing run.

    Its `memory_analysis()`, `cost_analysis()` and `as_text()` are the
    target's; `date_optax.parallel.compile_report` reads them.
    """
    return self.lower(state, batch).compile()

  def precompile(
      self, state: TrainState, batch: PyTree = None, *, background: bool = False,
      max_workers: int | None = None,
  ) -> dict[int, float] | concurrent.futures.Future:
    """Compiles every program of the batch schedule now (or one without).

    A growing batch compiles one program per batch size, by default the
    first time that size comes up, a stall of every host at a moment an
    adaptive schedule does not announce. This compiles them all up front,
    in threads (XLA compiles without the GIL), and the calls then use them.

    Args:
      state: the state the calls will take (concrete or `abstract_state`).
      batch: one batch, any rows (arrays or `jax.ShapeDtypeStruct` values): its
        leaves' trailing shapes and dtypes make each program's batch. None:
        those of the batches this step has run or lowered (a ValueError
        before it has seen one).
      background: return at once with a `concurrent.futures.Future` of the
        result; a call that needs a program before it is ready compiles it
        itself.
      max_workers: compile threads (default: as many as programs, at most 4).

    Returns:
      ``{batch size: compile seconds}`` (or a Future of it), in the
      schedule's order; a step without a schedule compiles `batch`'s size.

    Examples:
      >>> import numpy as np, optax, date_optax
      >>> import date_optax.parallel as dp
      >>> sched = date_optax.BatchSchedule.doubling(16, 64, max_batch=64)
      >>> step = dp.make_train_step(lambda p, b: ((b @ p) ** 2).mean(), optax.sgd(0.1),
      ...                           dp.data_mesh(), batch_schedule=sched)
      >>> state = step.init(np.ones((4, 1), np.float32))
      >>> sorted(step.precompile(state, np.ones((16, 4), np.float32)))
      [16, 32, 64]

    References:
      MaxText, ``train_compile.py`` (compiling ahead of time); Megatron-LM's
      batch ramp (one program per size).
    """
    if batch is None:
      if self._row_spec is None:
        raise ValueError(
            "precompile(state) takes its batch's shapes from a batch this step has "
            "run or lowered, and it has seen none: pass one, precompile(state, batch).")
      batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct((1, *x.shape), x.dtype),
                           self._row_spec)
    sizes = (self.batch_schedule.batch_sizes if self.batch_schedule is not None
             else (int(np.shape(jax.tree.leaves(batch)[0])[0]),))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), state)
    program = self._compiled_for(state)

    def one(rows: int) -> float:
      start = time.perf_counter()
      shaped = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct((rows, *np.shape(x)[1:]), x.dtype), batch)
      self._ahead[(id(program), rows)] = self.compile(abstract, shaped)
      return time.perf_counter() - start

    pool = concurrent.futures.ThreadPoolExecutor(max_workers or min(4, len(sizes)))
    futures = [pool.submit(one, rows) for rows in sizes]

    def collect() -> dict[int, float]:
      return {rows: f.result() for rows, f in zip(sizes, futures)}

    if background:
      done = pool.submit(collect)
      pool.shutdown(wait=False)
      return done
    try:
      return collect()
    finally:
      pool.shutdown()

  def next_batch_size(self, state: TrainState) -> int | None:
    """The global batch the next call on `state` must be given.

    Without a batch schedule, None. With one, read on the host without
    waiting for the steps in flight: a state this step returned is known
    from what was dispatched (an adaptive schedule's decisions are read
    `lag` steps late); any other state (fresh, or restored from a
    checkpoint) is read once, and refused if its schedule differs from this
    step's.
    """
    if self._tracker is None:
      return None
    return self._tracker.next_batch_size(state)

  def __call__(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    state, batch = res_lib.filled(self, state), self._prepare(batch)
    want = None
    if self._tracker is not None:
      want = self._tracker.next_batch_size(state)
      rows = int(np.shape(jax.tree.leaves(batch)[0])[0])
      if rows != want:
        raise ValueError(
            f"the batch schedule asks for a global batch of {want} at step "
            f"{self._tracker.step} (after {self._tracker.examples} examples), got "
            f"{rows} rows; fetch step.next_batch_size(state) examples."
        )
    program = self._compiled_for(state)
    ahead = self._ahead.get((id(program), int(np.shape(jax.tree.leaves(batch)[0])[0])))
    try:
      # A program compiled ahead takes exactly its layouts; anything else
      # (a state restored in another layout) goes through the jit.
      state, metrics = ahead(state, batch) if ahead else program(state, batch)
    except (ValueError, TypeError):
      if ahead is None:
        raise
      state, metrics = program(state, batch)
    self._last_out = (weakref.ref(state), program)
    if want is not None:
      self._tracker.record(want, state, metrics)
    if self.max_consecutive_skips is not None:
      check_metrics(metrics, self.max_consecutive_skips)
    return state, metrics


#: A batch schedule with more sizes than this warns at build (one program each).
MANY_PROGRAMS = 16


def _is_abstract(tree: Any) -> bool:
  return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def _with_sharding(x: Any, sharding: Any) -> Any:
  """A `ShapeDtypeStruct` keeps its own sharding; one without gets `sharding`;
  a concrete leaf is described by its shape and dtype."""
  if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None:
    return x
  return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)


def _shape_dtype(x: Any) -> tuple[tuple[int, ...], Any]:
  """A state leaf's shape and dtype, read from its attributes when it has them.

  This runs for every leaf on every call: an array's own ``shape`` and
  ``dtype`` cost a fraction of a microsecond, ``jnp.result_type`` about two
  and a half (a 79-leaf LAMB state spent 0.2-0.25 ms of host time per step
  on it, more than a small model's step takes on an accelerator).
  """
  dtype = getattr(x, "dtype", None)
  if dtype is None:  # a Python scalar
    return np.shape(x), jnp.result_type(x)
  return x.shape, dtype
