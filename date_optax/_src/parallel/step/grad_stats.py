"""Gradient-noise statistics measured inside the data-parallel step.

The step splits the global batch ``B`` into ``n = replicas × microbatches``
equal *units* of ``b = B/n`` examples and computes each unit's mean gradient
``g_u`` before averaging them into ``ḡ``. With ``S_b = mean_u ‖g_u‖²`` and
``S_B = ‖ḡ‖²``, unbiased estimates of the true gradient's squared norm and
of the per-example covariance trace are (McCandlish et al. 2018, app. A)

    |G|² = (B·S_B − b·S_b)/(B − b) = (n·S_B − S_b)/(n − 1),
    tr Σ = (S_b − S_B)/(1/b − 1/B) = b·n·(S_b − S_B)/(n − 1).

Each unit contributes one scalar, ``‖g_u‖²``; a replica sums its units'
and the sum rides in the scalar all-reduce that already averages the loss
(a stacked ``pmean``), so the statistics add no collective to the step.
``S_B`` comes from the averaged gradient the step holds anyway.

Either estimate alone can be negative on one step, so each is smoothed (an
exponential moving average with bias correction, as fairscale's AdaScale
does) and the smoothed values are divided, never the ratio smoothed.

Under a lossy `GradSync` (a low-precision payload) the reduced gradient is
the compressed, error-fed mean, and its squared norm is not ``S_B``: the
compression error adds to it. There each replica also sends a *sketch* of
its uncompressed gradient in the same scalar all-reduce: every entry times
a random sign (the same signs on every replica, new ones each step), summed
over all axes of its leaf but the last. The sketch is linear, so the mean
of the replicas' sketches is the sketch of the uncompressed mean ``ḡ``, and
the squared norm of a random-sign sketch is an unbiased estimate of the
squared norm of what it sketches (the signs' cross terms have mean zero):
``S_B`` is then measured on uncompressed values, like ``S_b``, at the cost
of one float per last-axis entry of every leaf in the all-reduce (0.32 %
of ResNet-50's gradient). Its randomness averages out in the smoothing.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from date_optax._src import validation
from date_optax._src.gain import (
    GradStats,
    adascale_gain,
    find_gain_state,
    noise_scale,
)


class GradStatsState(flax.struct.PyTreeNode):
  """Smoothed gradient-noise statistics, kept in `TrainState.grad_stats`.

  Attributes:
    sq_norm: the biased EMA of the per-step estimates of ``|G|²``.
    trace_cov: the biased EMA of the per-step estimates of ``tr Σ``.
    weight: the EMA of 1 (``1 − decay^t`` for a constant decay); the
      debiased averages are ``sq_norm / weight`` and ``trace_cov / weight``.
    count: steps whose statistics were folded in (int32).
  """

  sq_norm: jax.Array
  trace_cov: jax.Array
  weight: jax.Array
  count: jax.Array

  @classmethod
  def zeros(cls) -> GradStatsState:
    z = jnp.zeros((), jnp.float32)
    return cls(sq_norm=z, trace_cov=z, weight=z, count=jnp.zeros((), jnp.int32))


#: A growing batch's default smoothing: the decay per start batch of
#: examples (a half-life of about 69 start batches), whatever the devices.
SCHEDULE_DECAY = 0.99


def default_decay(units: int) -> float:
  """fairscale's smoothing: ``max(1 − n/1000, 0) ** n`` per step for n units."""
  return max(1.0 - units / 1000.0, 0.0) ** units


def check_options(
    grad_stats: Any, decay: Any, replicas: int, microbatches: int,
    batch_schedule: Any = None,
) -> float | None:
  """Validates the step's `grad_stats`/`grad_stats_decay`; the decay or None.

  With a `batch_schedule` the decay is per ``batch_schedule.start``
  examples (the step at batch B applies ``decay ** (B / start)``) and its
  default is :data:`SCHEDULE_DECAY`; without, per step, fairscale's.
  """
  on = validation.check_bool("grad_stats", grad_stats)
  if not on:
    if decay is not None:
      raise ValueError("grad_stats_decay is only used with grad_stats=True.")
    return None
  units = replicas * microbatches
  if units < 2:
    raise ValueError(
        "grad_stats=True needs at least two gradients per step to compare: "
        "more than one data-parallel replica, or microbatches >= 2 (got "
        f"{replicas} replica x {microbatches} microbatch). Pass "
        "microbatches=2 (or more) to measure on one device."
    )
  if decay is None:
    return SCHEDULE_DECAY if batch_schedule is not None else default_decay(units)
  return float(
      validation.check_real("grad_stats_decay", decay, low=0.0, high=1.0,
                            high_inclusive=False)
  )


def sq_norm(tree: Any) -> jax.Array:
  """Sum of squares of all leaves, in float32."""
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return jnp.zeros((), jnp.float32)
  return sum(jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in leaves)


#: The sketch's signs: a hash of (SKETCH_SEED, step, leaf index, entry index).
SKETCH_SEED = 0x5CE7


def _mix(x: jax.Array) -> jax.Array:
  """A 32-bit integer finalizer (Wellons' ``lowbias32``): every input bit
  flips about half of the output bits, so consecutive counters give
  uncorrelated outputs."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _signs_flip(shape: tuple[int, ...], seed: jax.Array) -> jax.Array:
  """Booleans, one per entry of `shape`: the top bit of the hashed flat
  index. Built from iotas, so XLA fuses it into the reduction that uses it
  (a random-number generator's bits would be a buffer of the leaf's size)."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(
        stride % 2**32)
    stride *= shape[d]
  return (_mix(index ^ seed) >> 31) == 1


def sketch(grads: Any, step: jax.Array) -> jax.Array:
  """A random-sign sketch of `grads`: its squared norm estimates ``‖grads‖²``.

  Each leaf's entries are multiplied by ±1 signs drawn from `step` (the
  same on every replica, so the sketch of a mean is the mean of the
  sketches) and summed over every axis but the last; a scalar leaf is kept
  as it is. ``E‖sketch‖² = ‖grads‖²`` over the signs. The signs are a
  counter-based hash of the step, the leaf and the entry's flat index
  (an integer finalizer, not a random-number generator), so they cost a
  few integer operations per entry inside the reduction's fusion and no
  memory; a leaf of more than 2**32 entries repeats its sign pattern.

  Args:
    grads: a gradient pytree (any float dtype).
    step: the step number (an int scalar), which picks the signs.

  Returns:
    float32 ``[sum of the leaves' last dimensions]``.
  """
  base = _mix(jnp.asarray(step).astype(jnp.uint32) * jnp.uint32(0x9E3779B9)
              + jnp.uint32(SKETCH_SEED))
  parts = []
  for i, g in enumerate(jax.tree.leaves(grads)):
    g = jnp.asarray(g, jnp.float32)
    if g.ndim == 0:
      parts.append(g[None])
      continue
    seed = _mix(base + jnp.uint32((i * 0x85EBCA6B) % 2**32))
    flip = _signs_flip(g.shape, seed)
    parts.append(jnp.sum(jnp.where(flip, -g, g), axis=tuple(range(g.ndim - 1))))
  return jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.float32)


def estimates(
    mean_unit_sq: jax.Array, mean_sq: jax.Array, units: int, batch_size: int
) -> tuple[jax.Array, jax.Array]:
  """Per-step unbiased ``(|G|², tr Σ)`` from ``S_b`` and ``S_B``.

  Args:
    mean_unit_sq: ``S_b``, the mean over the n units of ``‖g_u‖²``.
    mean_sq: ``S_B = ‖ḡ‖²``.
    units: ``n >= 2``.
    batch_size: ``B`` (a multiple of n).
  """
  n = float(units)
  b = batch_size / n
  g2 = (n * mean_sq - mean_unit_sq) / (n - 1.0)
  tr = (b * n / (n - 1.0)) * (mean_unit_sq - mean_sq)
  return g2.astype(jnp.float32), tr.astype(jnp.float32)


def update(
    state: GradStatsState, g2: jax.Array, tr: jax.Array, decay: float
) -> GradStatsState:
  """Folds one step's estimates into the debiased EMAs."""
  d = jnp.float32(decay)
  return GradStatsState(
      sq_norm=d * state.sq_norm + (1 - d) * g2,
      trace_cov=d * state.trace_cov + (1 - d) * tr,
      weight=d * state.weight + (1 - d),
      count=state.count + 1,
  )


def smoothed(state: GradStatsState, batch_size: int) -> GradStats:
  """The debiased averages as the `GradStats` passed to the optimizer."""
  w = jnp.where(state.weight > 0, state.weight, 1.0)
  return GradStats(
      sq_norm=state.sq_norm / w,
      trace_cov=state.trace_cov / w,
      batch_size=jnp.float32(batch_size),
  )


def metrics(stats: GradStats, opt_state: Any, units: int) -> dict[str, jax.Array]:
  """``grad_noise_scale`` (B_simple) and ``gain``.

  ``gain`` is the gain the optimizer applied when its state records one
  (:func:`date_optax.adascale`, ``date(..., lr_scaling="gain")``); otherwise
  AdaScale's gain of this batch over one unit (``S = n``, fairscale's
  default scale: replicas × microbatches).
  """
  found = find_gain_state(opt_state)
  gain = found.gain if found is not None else adascale_gain(stats, float(units))
  return {"grad_noise_scale": noise_scale(stats), "gain": jnp.asarray(gain, jnp.float32)}

