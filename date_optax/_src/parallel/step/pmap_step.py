"""The data-parallel train step with `jax.pmap`, for code with per-device state.

It runs the body the `shard_map` step runs (`replica_step.replica_step`:
loss, gradient, one `grad_sync` reduction; then `replica_step.apply_update`)
inside `pmap`, on a state with a leading device axis.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from date_optax._src.parallel.comm.collectives import most_square_grid
from date_optax._src.parallel.comm.error_feedback import ErrorFeedbackState
from date_optax._src.parallel.comm.sync_config import GradSync, grad_sync_from
from date_optax._src.parallel.step import grad_stats as gs_lib
from date_optax._src.parallel.step import local_grads as lg
from date_optax._src.parallel.step import residuals as res_lib
from date_optax._src.parallel.step.replica_step import apply_update, replica_step
from date_optax._src.parallel.step.step_checks import (
    check_fn_and_optimizer,
    check_state,
)
from date_optax._src.parallel.step.step_config import StepConfig, step_config_from
from date_optax._src.parallel.step.train_state import Metrics, TrainState, check_metrics
from date_optax._src.types import LossFn, PyTree


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

  def __init__(self, loss_fn, optimizer, *, axis_name: str, grad_sync: GradSync,
               config: StepConfig, devices: Sequence[Any],
               grad_stats_decay: float | None = None):
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.axis_name = axis_name
    self.grad_sync = grad_sync
    self.error_feedback = grad_sync.error_feedback
    self.config = config
    self.grad_stats_decay = grad_stats_decay
    self.devices = list(devices)
    self.num_replicas = len(self.devices)
    self._pmapped = jax.pmap(
        self._body,
        axis_name=axis_name,
        devices=self.devices,
        donate_argnums=(0,) if config.donate else (),
    )

  # The options, as attributes (read by code written for the flat keywords).
  grad_reduce = property(lambda self: self.grad_sync.algorithm)
  grid = property(lambda self: self.grad_sync.grid)
  microbatches = property(lambda self: self.config.microbatches)
  compute_dtype = property(lambda self: self.config.compute_dtype)
  has_aux = property(lambda self: self.config.has_aux)
  max_consecutive_skips = property(lambda self: self.config.max_consecutive_skips)

  @property
  def torus_shape(self) -> tuple[int, int] | None:
    """Deprecated name of `grid`."""
    warnings.warn("PmapTrainStep.torus_shape is deprecated; read .grid.",
                  DeprecationWarning, stacklevel=2)
    return self.grid

  def _body(self, state, batch):
    """One replica's step: loss, gradient, one reduction, update."""
    result = replica_step(
        self.loss_fn, self.config, self.grad_sync, params=state.params, batch=batch,
        model_state=state.model_state, rng=state.rng, step=state.step,
        axes=(self.axis_name,), with_stats=self.grad_stats_decay is not None,
        residual=state.grad_residual if self.error_feedback else None,
    )
    return apply_update(
        state, result, self.optimizer, self.config,
        units=self.num_replicas * self.microbatches,
        global_batch=self.num_replicas * int(np.shape(jax.tree.leaves(batch)[0])[0]),
        grad_stats_decay=self.grad_stats_decay,
    )

  def init(
      self, params: PyTree, model_state: PyTree = None, rng: Any = None
  ) -> TrainState:
    """A fresh `TrainState` replicated over the devices (leading device axis).

    `model_state` and `rng` as for `TrainStep.init`.
    """
    lg.check_params(params)
    state = TrainState.create(
        jax.tree.map(jnp.asarray, params), self.optimizer,
        jax.tree.map(jnp.asarray, model_state), lg.as_key(rng),
    )
    if self.grad_stats_decay is not None:
      state = state.replace(grad_stats=gs_lib.GradStatsState.zeros())
    if self.error_feedback:
      state = state.replace(grad_residual=ErrorFeedbackState.zeros(
          state.params, self.grad_sync, chunks=self.num_replicas))
    n = self.num_replicas
    stacked = jax.tree.map(
        lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), state
    )
    return jax.pmap(lambda s: s, devices=self.devices)(stacked)

  def shard_batch(self, batch: PyTree) -> PyTree:
    """Reshapes a global batch to (devices, per-device batch, ...)."""
    lg.check_batch(batch, self.num_replicas, self.microbatches)
    n = self.num_replicas
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)

  def __call__(self, state: TrainState, batch: PyTree) -> tuple[TrainState, Metrics]:
    state = res_lib.filled_pmap(self, state)  # zeros for a state without residuals
    check_state(state, error_feedback=self.error_feedback,
                grad_stats=self.grad_stats_decay is not None)
    state, metrics = self._pmapped(state, self.shard_batch(batch))
    metrics = jax.tree.map(lambda m: m[0], metrics)
    if self.max_consecutive_skips is not None:
      check_metrics(metrics, self.max_consecutive_skips)
    return state, metrics


def make_pmap_train_step(
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    axis_name: str = "batch",
    grad_reduce: str = "psum",
    grid: tuple[int, int] | None = None,
    compute_dtype: Any = None,
    donate: bool = True,
    has_aux: bool = False,
    max_consecutive_skips: int | None = None,
    devices: Sequence[Any] | None = None,
    microbatches: int = 1,
    comm_dtype: Any = None,
    aps: bool | None = None,
    rounding: str = "nearest",
    block_size: int | None = None,
    measured_shift: bool = False,
    error_feedback: bool = False,
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
    grad_sync: GradSync | None = None,
    step_config: StepConfig | None = None,
    torus_shape: tuple[int, int] | None = None,
) -> PmapTrainStep:
  """Builds the same data-parallel train step with `jax.pmap` (older code).

  Equal to `make_train_step` (same local gradients, one reduction, same
  non-finite handling and metrics), for code that keeps per-device copies of
  the state. The "torus" reduction views the single pmap axis as an X×Y grid
  of devices (row-major), as a TPU slice's devices are.

  Args:
    loss_fn: as in `make_train_step` (with `model_state=`/`rng=` when the
      state has them), the mean loss over the per-device (micro)batch.
    optimizer: an optax gradient transformation.
    axis_name: the pmap axis name.
    grad_reduce: "psum", "ring" or "torus".
    grid: `(X, Y)` for "torus" (default: the most square grid of the
      devices), the name `torus_all_reduce` and `GradSync` use.
    compute_dtype: e.g. `jnp.bfloat16` for the forward/backward computation;
      parameters, optimizer state, loss and reductions stay float32.
    donate: donate the input state's buffers.
    has_aux: `loss_fn` returns `(loss, aux)`.
    max_consecutive_skips: when set, raise `NonFiniteError` on the host once
      more steps than this in a row were skipped (each call then waits for
      the step).
    devices: the local devices to use (default all).
    microbatches: gradient accumulation over k >= 1 microbatches per device.
    comm_dtype: the gradient payload format, as in `make_train_step`.
    aps: Auto-Precision Scaling, as in `make_train_step`.
    rounding: "nearest" or "stochastic", as in `make_train_step` (same keys:
      the pmap index is the replica index).
    block_size: MX-style block scales, as in `make_train_step`.
    measured_shift: the measured per-layer shift, as in `make_train_step`.
    error_feedback: error feedback, as in `make_train_step`; the residuals
      (an `ErrorFeedbackState`) are in `state.grad_residual`, one per device
      along the state's device axis.
    grad_stats: measure gradient-noise statistics, as in `make_train_step`
      (same estimates, state, metrics and `grad_stats=` to the optimizer).
    grad_stats_decay: their moving-average factor, as in `make_train_step`.
    grad_sync: a `GradSync` holding `grad_reduce`, `grid`, `comm_dtype`,
      `aps`, `rounding`, `block_size`, `measured_shift` and
      `error_feedback`; give it or those flat keywords.
    step_config: a `StepConfig` holding `microbatches`, `compute_dtype`,
      `donate`, `has_aux` and `max_consecutive_skips`; give it or those
      flat keywords.
    torus_shape: deprecated name of `grid` (warns; removed in the next
      release).

  Returns:
    A `PmapTrainStep`: `state, metrics = step(state, global_batch)` and
    `step.init(params, model_state=None, rng=None)`; metrics as for
    `make_train_step`.

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
    >>> sr = dp.make_pmap_train_step(loss_fn, date_optax.lars(0.1), grad_reduce="ring",
    ...                              comm_dtype="int8", rounding="stochastic")
    >>> state, metrics = sr(sr.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> float(metrics["loss"])
    1.0
    >>> torus = dp.make_pmap_train_step(
    ...     loss_fn, date_optax.lars(0.1), grad_sync=dp.GradSync("torus", grid=(2, 4)))
    >>> state, metrics = torus(torus.init({"w": np.zeros((3, 1), np.float32)}), batch)
    >>> float(metrics["loss"])
    1.0

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018; Han, Demmel and You,
    "Auto-Precision Scaling for Distributed Deep Learning", 2020,
    https://arxiv.org/abs/2003.00119; Gupta et al., "Deep Learning with
    Limited Numerical Precision", ICML 2015, https://arxiv.org/abs/1502.02551;
    Karimireddy et al., "Error Feedback Fixes SignSGD and other Gradient
    Compression Schemes", ICML 2019, https://arxiv.org/abs/1901.09847.
  """
  grid_name = "grid"
  if torus_shape is not None:
    warnings.warn(
        "make_pmap_train_step(torus_shape=...) is deprecated: pass grid=(X, Y), the "
        "name torus_all_reduce and GradSync use.",
        DeprecationWarning,
        stacklevel=2,
    )
    if grid is not None:
      raise ValueError(
          f"pass grid= or its deprecated name torus_shape=, not both: got "
          f"grid={grid!r} and torus_shape={torus_shape!r}."
      )
    grid, grid_name = torus_shape, "torus_shape"
  try:
    sync = grad_sync_from(grad_sync, grad_reduce=grad_reduce, grid=grid,
                          comm_dtype=comm_dtype, aps=aps, rounding=rounding,
                          block_size=block_size, measured_shift=measured_shift,
      error_feedback=error_feedback)
  except (TypeError, ValueError) as e:
    if grid_name == "grid" or "grid" not in str(e):
      raise
    raise type(e)(f"torus_shape (the deprecated name of grid): {e}") from e
  config = step_config_from(
      step_config, microbatches=microbatches, compute_dtype=compute_dtype,
      donate=donate, has_aux=has_aux, max_consecutive_skips=max_consecutive_skips,
  )
  check_fn_and_optimizer(loss_fn, optimizer)
  if not isinstance(axis_name, str):
    raise TypeError(f"axis_name must be a str, got {axis_name!r}.")
  devices = list(jax.local_devices() if devices is None else devices)
  if sync.algorithm == "torus" and sync.grid is None:
    sync = dataclasses.replace(sync, grid=most_square_grid(len(devices)))
  sync.check_replicas((axis_name,), len(devices), grid_name=grid_name)
  decay = gs_lib.check_options(grad_stats, grad_stats_decay, len(devices),
                               config.microbatches)
  return PmapTrainStep(
      loss_fn, optimizer, axis_name=axis_name, grad_sync=sync, config=config,
      devices=devices, grad_stats_decay=decay,
  )
