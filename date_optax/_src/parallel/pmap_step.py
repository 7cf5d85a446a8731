"""The data-parallel train step with `jax.pmap`, for code with per-device state.

It computes what the `jit` step computes (`local_grads.replica_grads` per
device, one reduction, `train_state.apply_gradients`), on a state with a
leading device axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from date_optax._src import validation
from date_optax._src.parallel import collectives
from date_optax._src.parallel import grad_stats as gs_lib
from date_optax._src.parallel import local_grads as lg
from date_optax._src.parallel import update_sharding as us
from date_optax._src.parallel.train_state import (
    Metrics,
    TrainState,
    apply_gradients,
    check_metrics,
)
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

  def __init__(self, loss_fn, optimizer, *, axis_name, grad_reduce, torus_shape,
               compute_dtype, donate, has_aux, max_consecutive_skips, devices,
               microbatches=1, comm=(None, False, "nearest"), grad_stats_decay=None):
    self.grad_stats_decay = grad_stats_decay
    self.microbatches = microbatches
    self.comm = comm
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
    replica = lax.axis_index(axis)
    with_stats = self.grad_stats_decay is not None
    out = lg.replica_grads(
        self.loss_fn, has_aux=self.has_aux, compute_dtype=self.compute_dtype,
        microbatches=self.microbatches, params=state.params, batch=batch,
        model_state=state.model_state, rng=state.rng, step=state.step,
        replica=replica, with_sq_norms=with_stats,
    )
    loss, aux, grads, model_state = out[:4]
    grads = us.mean_over_replicas(
        grads, axis, self.grad_reduce, self.num_replicas, self.torus_shape,
        comm=self.comm, key=lg.comm_key(self.comm, state.rng, state.step),
    )
    stats = None
    if with_stats:
      # The units' squared norms ride in the loss's scalar all-reduce.
      loss, unit_sq = lax.pmean(jnp.stack([loss, out[4]]), axis)
      global_batch = self.num_replicas * int(np.shape(jax.tree.leaves(batch)[0])[0])
      stats = (unit_sq / self.microbatches, self.num_replicas * self.microbatches,
               global_batch, self.grad_stats_decay)
    else:
      loss = lax.pmean(loss, axis)
    model_state = lg.replicate_model_state(model_state, axis, replica)
    new_state, metrics = apply_gradients(
        state, grads, loss, self.optimizer, model_state, stats
    )
    if self.has_aux:
      metrics["aux"] = lg.mean_aux(aux, axis)
    return new_state, metrics

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
    state, metrics = self._pmapped(state, self.shard_batch(batch))
    metrics = jax.tree.map(lambda m: m[0], metrics)
    if self.max_consecutive_skips is not None:
      check_metrics(metrics, self.max_consecutive_skips)
    return state, metrics


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
    microbatches: int = 1,
    comm_dtype: Any = None,
    aps: bool | None = None,
    rounding: str = "nearest",
    grad_stats: bool = False,
    grad_stats_decay: float | None = None,
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
    microbatches: gradient accumulation over k >= 1 microbatches per device.
    comm_dtype: the gradient payload format, as in `make_train_step`.
    aps: Auto-Precision Scaling, as in `make_train_step`.
    rounding: "nearest" or "stochastic", as in `make_train_step` (same keys:
      the pmap index is the replica index).
    grad_stats: measure gradient-noise statistics, as in `make_train_step`
      (same estimates, state, metrics and `grad_stats=` to the optimizer).
    grad_stats_decay: their moving-average factor, as in `make_train_step`.

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

  References:
    Goyal et al., "Accurate, Large Minibatch SGD", 2017; Ying et al., "Image
    Classification at Supercomputer Scale", 2018; Han, Demmel and You,
    "Auto-Precision Scaling for Distributed Deep Learning", 2020,
    https://arxiv.org/abs/2003.00119; Gupta et al., "Deep Learning with
    Limited Numerical Precision", ICML 2015, https://arxiv.org/abs/1502.02551.
  """
  comm = lg.check_comm(comm_dtype, aps, rounding)
  microbatches = lg.check_common(
      loss_fn, optimizer, grad_reduce, compute_dtype, max_consecutive_skips,
      microbatches, collectives.ALGORITHMS,
  )
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
  n_devices = len(jax.local_devices() if devices is None else list(devices))
  decay = gs_lib.check_options(grad_stats, grad_stats_decay, n_devices, microbatches)
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
      microbatches=microbatches,
      comm=comm,
      grad_stats_decay=decay,
  )
