"""The data-parallel train state, its optimizer step, and host-side checks.

`apply_gradients` is the one place where reduced gradients become new
parameters: every train step (jit, GSPMD, pmap) calls it, so they skip
non-finite steps and report metrics the same way.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from date_optax._src import telemetry, validation
from date_optax._src.gain import find_gain_state
from date_optax._src.parallel.step import grad_stats as gs_lib
from date_optax._src.state_readers import (
    current_learning_rate,
    recorded_ratios,
    trust_ratio_bounds,
)

Metrics = dict[str, Any]


class TrainState(flax.struct.PyTreeNode):
  """Everything a data-parallel step updates, as one pytree.

  The optimizer itself is not part of the state (it is a pair of functions
  held by the step), so the state can be checkpointed, sharded and donated as
  plain arrays.

  Attributes:
    step: number of steps taken, skipped ones included (int32).
    params: the parameters (float32 master copy under mixed precision).
    opt_state: the optimizer state.
    consecutive_skips: steps skipped in a row because a gradient (or the loss
      or the update) was NaN/Inf; 0 after every applied step (int32).
    total_skips: steps skipped since the start (int32).
    model_state: state the model updates in its forward pass (flax's
      `batch_stats`), or None. Kept replicated: float leaves are averaged
      over the data replicas after every step.
    rng: the base key of the run, or None. It never changes: each step
      derives its keys from it and the step number, so a resumed run draws
      the same keys.
    grad_stats: the smoothed gradient-noise statistics of a step built with
      `grad_stats=True` (a `GradStatsState`), or None. Checkpointed with
      the rest of the state.
    grad_residual: the error-feedback residuals of a step built with
      `error_feedback=True`, or None: an `ErrorFeedbackState`, per replica
      what its compressed contributions (`worker`) and the messages it
      rounded on ring/torus hops (`hop`, None for "psum") have not yet
      delivered (float32, each shaped like the parameters;
      `sync_gradients` defines them). A step over a mesh keeps a leading
      replica axis sharded over the data axes, so each device holds its
      own; the `pmap` step's state has the device axis already.
      Checkpointed with the rest of the state (or left out:
      `CheckpointManager.save(..., include_residuals=False)`), and kept
      unchanged by a skipped step. None on a step built with error
      feedback (`state.replace(grad_residual=None)`) asks the step for
      zeros, laid out as its own: it makes them before its jit call,
      dropping what the residuals held, at most one step's rounding.
    batch_schedule: the progress of the step's `date_optax.BatchSchedule`
      (a `date_optax.BatchScheduleState`: batch, examples consumed, last
      change, pending growth), or None for a step without one.
      Checkpointed with the rest of the state; a skipped step still counts
      its examples (its data was read).

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> import date_optax.parallel as dp
    >>> state = dp.TrainState.create({"w": jnp.ones(3)}, optax.sgd(0.1))
    >>> int(state.step), int(state.total_skips)
    (0, 0)

  References:
    Micikevicius et al., "Mixed Precision Training", 2018 (skipping steps
    whose gradients overflow).
  """

  step: jax.Array
  params: Any
  opt_state: Any
  consecutive_skips: jax.Array
  total_skips: jax.Array
  model_state: Any = None
  rng: Any = None
  grad_stats: Any = None
  grad_residual: Any = None
  batch_schedule: Any = None

  @classmethod
  def create(
      cls,
      params: Any,
      optimizer: optax.GradientTransformation,
      model_state: Any = None,
      rng: Any = None,
  ) -> TrainState:
    """A fresh state: `optimizer.init(params)` and zero counters."""
    # One buffer per counter: a step that donates the state cannot donate
    # one buffer twice (JAX refuses at the call).
    zero = lambda: jnp.zeros((), jnp.int32)
    return cls(
        step=zero(),
        params=params,
        opt_state=optimizer.init(params),
        consecutive_skips=zero(),
        total_skips=zero(),
        model_state=model_state,
        rng=rng,
    )

  @property
  def applied_steps(self) -> jax.Array:
    """Number of steps whose update was applied (`step - total_skips`)."""
    return self.step - self.total_skips


class NonFiniteError(FloatingPointError):
  """Raised on the host when too many consecutive steps had NaN/Inf gradients.

  Args:
    message: what happened and what to try.

  Examples:
    >>> import date_optax.parallel as dp
    >>> issubclass(dp.NonFiniteError, FloatingPointError)
    True

  References:
    Micikevicius et al., "Mixed Precision Training", 2018.
  """

  def __init__(self, message: str):
    super().__init__(message)


def _fetch(x: Any) -> np.ndarray:
  if isinstance(x, jax.Array):
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def check_metrics(metrics: Mapping[str, Any], max_consecutive_skips: int) -> None:
  """Raises `NonFiniteError` when a run keeps producing non-finite gradients.

  A step cannot raise from inside `jit`; it skips the update and counts the
  skip instead. Call this on the host after a step (or every few steps: the
  counter is cumulative, so nothing is missed) to stop a run that is stuck.
  Reading the counter waits for the step to finish.

  Args:
    metrics: the metrics returned by a train step; uses
      `metrics["consecutive_skips"]` and `metrics["total_skips"]`.
    max_consecutive_skips: the largest number of skipped steps in a row that
      is tolerated, >= 0.

  Returns:
    None.

  Raises:
    NonFiniteError: if `consecutive_skips > max_consecutive_skips`.

  Examples:
    >>> import date_optax.parallel as dp
    >>> dp.check_metrics({"consecutive_skips": 2, "total_skips": 5}, 3)
    >>> dp.check_metrics({"consecutive_skips": 4, "total_skips": 5}, 3)
    Traceback (most recent call last):
      ...
    date_optax._src.parallel.step.train_state.NonFiniteError: 4 consecutive steps ...

  References:
    Micikevicius et al., "Mixed Precision Training", 2018.
  """
  limit = validation.check_int("max_consecutive_skips", max_consecutive_skips, low=0)
  # addressable_data(0): the counters are replicated, possibly over processes.
  consecutive = int(_fetch(metrics["consecutive_skips"]))
  if consecutive > limit:
    total = int(_fetch(metrics["total_skips"]))
    raise NonFiniteError(
        f"{consecutive} consecutive steps had non-finite gradients, loss or "
        f"updates and were skipped (max_consecutive_skips={limit}; "
        f"{total} skipped in all). Lower the learning rate, check the data, "
        "or use loss scaling."
    )


# At most this many leaves are added into one reduction: a kernel's operands
# are bounded (XLA's GPU fusions take about a hundred).
_MAX_GROUP = 32


def sum_squares_or_nan(tree: Any, keys: Any = None) -> jax.Array:
  """Σ x² over the float leaves of `tree`, in float32; NaN iff one is NaN/Inf.

  One reduction serves both the gradient norm and the finiteness test:
  `x - x` is 0 for every finite `x` and NaN for NaN or ±Inf, and adding it
  leaves `x²` unchanged. A sum of finite squares that overflows is +Inf,
  never NaN, so `isnan` of the result says exactly whether some element was
  not finite. XLA fuses the reductions with the producers of the gradients,
  instead of reading them twice (a norm pass and an `isfinite` pass).

  Leaves of one shape and dtype (and one `keys` value: the step passes each
  parameter's sharding, so no two differently laid-out leaves meet) are
  added elementwise, `x₁² + x₂² + ...`, and reduced once: a model whose
  layers repeat one shape pays one reduction for all of them instead of one
  (two, on a GPU) per layer, which is what an accelerator launching one
  kernel at a time pays for. (`x - x` rather than `x * 0`: a constant would
  be broadcast to the leaf's shape, and XLA:CPU writes a broadcast shared by
  several reductions to memory. Each leaf is first multiplied by a 1 of its
  own, through an optimisation barrier, so that its `x * x` is not merged
  with the optimizer's `g * g` (Adam's second moment), which XLA would then
  write out for both.)
  """
  leaves = jax.tree.leaves(tree)
  key_leaves = [None] * len(leaves)
  if keys is not None:
    key_leaves = jax.tree.leaves(keys, is_leaf=lambda k: k is None)
    if len(key_leaves) != len(leaves):
      key_leaves = [None] * len(leaves)
  groups: dict[Any, list[jax.Array]] = {}
  for i, (x, key) in enumerate(zip(leaves, key_leaves)):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      one, _ = lax.optimization_barrier((jnp.float32(1.0), jnp.int32(i)))
      x = x.astype(jnp.float32) * one
      groups.setdefault((x.shape, key), []).append(x * x + (x - x))
  total = jnp.zeros((), jnp.float32)
  for terms in groups.values():
    for j in range(0, len(terms), _MAX_GROUP):
      total = total + jnp.sum(functools.reduce(operator.add, terms[j:j + _MAX_GROUP]))
  return total


def distinct_copy(tree: Any) -> Any:
  """`tree`'s values through a private 1 (0 for integers), for a second output.

  A step that returns one value twice, in the new state and in the metrics,
  makes XLA copy it into the second output buffer: on a GPU, one copy kernel
  per value (the per-layer trust ratios, the skip counters, the learning
  rate). Multiplying by a 1 that XLA cannot see through (an optimisation
  barrier) makes the metric a value of its own, which the fusion that
  computes the original writes beside it.
  """
  one, zero = lax.optimization_barrier((jnp.float32(1.0), jnp.int32(0)))

  def leaf(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
      return x * one.astype(x.dtype)
    if jnp.issubdtype(x.dtype, jnp.integer):
      return x + zero.astype(x.dtype)
    return x

  return jax.tree.map(leaf, tree)


def apply_gradients(
    state: TrainState,
    grads: Any,
    loss: jax.Array,
    optimizer: optax.GradientTransformation,
    model_state: Any = None,
    stats: tuple[Any, ...] | None = None,
    residual: Any = None,
    extra_args: Mapping[str, Any] | None = None,
    grad_keys: Any = None,
) -> tuple[TrainState, Metrics]:
  """One optimizer step on already-reduced gradients, skipped if non-finite.

  The step is skipped (parameters, optimizer state, model state, statistics
  and residual kept as they were, the skip counted) when the loss or a
  gradient is NaN/Inf. Inside `jit` nothing can raise; `check_metrics` does
  that on the host. `model_state` is the new (already replicated) model
  state, or None.

  The decision is made before the optimizer runs, from the loss and the
  gradients' sum of squares (the reduction that also gives "grad_norm"),
  and the whole update (optimizer and `apply_updates`) runs inside one
  `lax.cond` on it: a finite step updates the parameters and the optimizer
  state in place with no pass of the skip's own, a skipped one returns them
  as they were. (Selects `where(finite, new, old)` fused into the update
  were measured 8-11 % slower on the CPU, where XLA copied Adam's moments
  before updating them, and no faster on an H200: docs/RESULTS.md.) The update
  itself is not checked: an optimizer that turns finite gradients into a
  non-finite update (the library's transforms guard their zero norms and
  never do) makes non-finite parameters, whose next loss is then skipped
  and counted until `check_metrics` stops the run.

  Telemetry comes from the optimizer state alone: the per-layer ratios, the
  bounds the optimizer applied (`date_optax.trust_ratio_bounds`) and the
  learning rate (`date_optax.current_learning_rate`) where the state records them.

  `residual` is the new error-feedback residual (`TrainState.grad_residual`),
  or None without error feedback. On a skipped step it is discarded and the
  old one kept: the skipped step's gradient is dropped whole, what it would
  have added to the residual included, and the next step compresses its own
  gradient plus the residual as it was before the skip.

  `stats` is `(S_b, units, batch_size, decay, S_B)` for a step with
  `grad_stats=True` (`S_b` the mean over the units of their squared
  gradient norms; `S_B` the squared norm of the uncompressed mean
  gradient, or None to use `grads`' own): the smoothed
  statistics are updated, passed to the optimizer as `grad_stats=` and
  reported as "grad_noise_scale" and "gain".

  `extra_args` are passed on to `optimizer.update` as keywords (optax's
  extra-args convention; plain transformations ignore them): the growing
  batch's `batch_progress=`.

  `grad_keys` (a pytree like `grads`, or None) tells apart gradients of one
  shape that are laid out differently (the step passes the parameters'
  `PartitionSpec`s): only leaves with equal shapes and keys share a
  reduction (`sum_squares_or_nan`).
  """
  grad_sq = sum_squares_or_nan(grads, grad_keys)  # NaN iff a gradient is not finite
  sq_mean = grad_sq
  # The barrier materialises the flag once: otherwise XLA may fuse the whole
  # reduction into each select below (model state, residual; a ResNet-50-
  # sized step once compiled ~15x slower that way).
  finite = lax.optimization_barrier(jnp.isfinite(loss) & jnp.logical_not(jnp.isnan(grad_sq)))
  new_gs = None
  extra = dict(extra_args or {})
  if stats is not None:
    unit_sq, units, batch_size, decay, measured = stats
    if measured is not None:  # S_B of the uncompressed mean
      sq_mean = measured
    g2, tr = gs_lib.estimates(unit_sq, sq_mean, units, batch_size)
    new_gs = gs_lib.update(state.grad_stats, g2, tr, decay)
    extra["grad_stats"] = gs_lib.smoothed(new_gs, batch_size)

  def update(params, opt_state):
    if extra:
      updates, new_opt_state = optax.with_extra_args_support(optimizer).update(
          grads, opt_state, params, **extra)
    else:
      updates, new_opt_state = optimizer.update(grads, opt_state, params)
    # The state's own dtypes (a transform may return a weakly typed scalar
    # where its init made a strong one): both branches must match.
    new_opt_state = jax.tree.map(lambda n, o: jnp.asarray(n, jnp.result_type(o)),
                                 new_opt_state, opt_state)
    return optax.apply_updates(params, updates), new_opt_state

  # One conditional around the whole update: a skipped step runs no
  # optimizer and returns the parameters and state it was given. The
  # predicate is the same on every device (a global loss and sum), so every
  # device takes the same branch, collectives inside it included.
  new_params, opt_state = lax.cond(
      finite, update, lambda params, opt_state: (params, opt_state),
      state.params, state.opt_state)

  def keep(new, old):
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)

  consecutive = jnp.where(finite, 0, state.consecutive_skips + 1).astype(jnp.int32)
  total = (state.total_skips + jnp.where(finite, 0, 1)).astype(jnp.int32)
  new_state = state.replace(
      step=state.step + 1,
      params=new_params,
      opt_state=opt_state,
      consecutive_skips=consecutive,
      total_skips=total,
  )
  if state.model_state is not None:
    new_state = new_state.replace(model_state=keep(model_state, state.model_state))
  if new_gs is not None:
    new_state = new_state.replace(grad_stats=keep(new_gs, state.grad_stats))
  if residual is not None:
    new_state = new_state.replace(grad_residual=keep(residual, state.grad_residual))
  metrics: Metrics = {
      "loss": loss,
      "grad_norm": jnp.sqrt(grad_sq),
      "skipped": jnp.logical_not(finite),
      # The state returns these too: values of their own, not copies.
      "consecutive_skips": distinct_copy(consecutive),
      "total_skips": distinct_copy(total),
  }
  ratios = recorded_ratios(opt_state)  # one vector (LayerRatios), not a leaf per layer
  if ratios is not None:
    metrics["trust_ratios"] = distinct_copy(ratios)
    bounds = trust_ratio_bounds(opt_state)
    lower, upper = (None, None) if bounds is None else bounds
    metrics.update(
        telemetry.trust_ratio_summary(ratios, lower, upper, prefix="trust_ratio/")
    )
  lr = current_learning_rate(opt_state)
  gain_state = find_gain_state(opt_state)
  if gain_state is not None and lr is not None:  # the gain multiplies the rate
    lr = lr * gain_state.lr_factor
  if lr is not None:
    metrics["learning_rate"] = distinct_copy(jnp.asarray(lr, jnp.float32))
  if new_gs is not None:
    metrics.update(
        gs_lib.metrics(gs_lib.smoothed(new_state.grad_stats, stats[2]), opt_state,
                       stats[1])
    )
  return new_state, metrics
