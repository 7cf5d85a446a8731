"""Per-layer sums of squares in float32, and ``‖d + λw‖`` without cancellation.

The numerics under every trust ratio (LARS, bounded LARS, LAMB): norms as
float32 reductions of squares, and the weight-decayed sum ``d + λw`` with
λ·w carried exactly (Dekker's two-product), so its norm stays accurate
where ``d ≈ -λw``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def compute_dtype(*xs: Any) -> Any:
  """float32 for real inputs up to float32, complex64 for complex ones.

  The dtype the trust-ratio kernel computes in: bf16/f16 are upcast, complex
  values keep their imaginary part (a float32 cast would drop it).
  """
  dt = jnp.result_type(*[jnp.asarray(x).dtype for x in xs])
  return jnp.promote_types(dt, jnp.float32)


def sum_squares(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
  """Per-layer ``Σ |x|²`` in float32, keeping dims for broadcasting.

  A plain reduction of squares (as optax's ``safe_norm``), never a dot: XLA
  fuses it with the ops that produce ``x`` and with the other reductions over
  the same inputs, so a norm costs no pass of its own. bf16/f16 inputs are
  squared and summed in float32; complex ones contribute ``re² + im²``.
  """
  x = jnp.asarray(x)
  if jnp.iscomplexobj(x):
    rdt = jnp.promote_types(jnp.real(x).dtype, jnp.float32)
    re, im = jnp.real(x).astype(rdt), jnp.imag(x).astype(rdt)
    sq = re * re + im * im
  else:
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    sq = x * x
  return jnp.sum(sq, axis=axes, keepdims=True).astype(jnp.float32)


# Veltkamp's splitting factor for float32: 2^12 + 1.
_SPLIT = 4097.0


def _split(a: jax.Array, factor: Any = _SPLIT) -> tuple[jax.Array, jax.Array]:
  # Veltkamp's split of a float32 into two halves of 12 significant bits.
  c = factor * a
  hi = c - (c - a)
  return hi, a - hi


def decay_scalars(wd: Any) -> tuple[jax.Array, ...]:
  """``(λ, λ_hi, λ_lo, f)``: λ in float32, its Veltkamp halves, the factor."""
  lam = jnp.asarray(wd, jnp.float32)
  return (lam, *_split(lam), jnp.asarray(_SPLIT, jnp.float32))


def _add_scaled_exact(g: jax.Array, scalars: tuple, w: jax.Array) -> jax.Array:
  """``g + λ·w`` in float32 with λ·w carried exactly (Dekker's two-product).

  Near the steady state of L2-regularised training ``g ≈ -λw`` and the sum
  cancels: rounding ``λ·w`` to float32 first would leave an error of
  ``2⁻²⁴·‖λw‖``, as large as the result itself when
  ``‖g+λw‖/‖g‖ ≈ 1e-7``. Splitting ``λ·w = p + e`` exactly makes ``g + p``
  exact under cancellation (Sterbenz) and each element accurate to one or
  two float32 roundings of the *result*. ``scalars`` is
  :func:`decay_scalars`'s.
  """
  lam, a_hi, a_lo, factor = scalars
  p = lam * w
  b_hi, b_lo = _split(w, factor)
  e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
  return (g + p) + e


def add_decay(
    d: jax.Array, wd: Any, w: jax.Array, *, scalars: tuple | None = None,
) -> jax.Array:
  """``d + λw`` in ``compute_dtype(d, w)``, with λ·w carried exactly.

  ``scalars`` (:func:`decay_scalars` of ``wd``) may be given instead of
  being derived from ``wd`` here.
  """
  if scalars is None:
    scalars = decay_scalars(wd)
  dt = compute_dtype(d, w)
  d = d.astype(dt)
  w = w.astype(dt)
  if jnp.iscomplexobj(d):
    re = _add_scaled_exact(jnp.real(d), scalars, jnp.real(w))
    im = _add_scaled_exact(jnp.imag(d), scalars, jnp.imag(w))
    return jax.lax.complex(re, im)
  return _add_scaled_exact(d, scalars, w)


def norm_of_sum_sq(
    d: jax.Array, w: jax.Array, wd: Any, axes: tuple[int, ...],
    *, v: jax.Array | None = None,
) -> jax.Array:
  """Per-layer ``‖d + λw‖²`` accurate to float32 rounding under cancellation.

  One reduction over ``v = d + λw`` formed with λ·w carried exactly
  (:func:`add_decay`), so the result is accurate to a few float32 roundings
  of itself even where ``d ≈ -λw`` (the steady state of L2-regularised
  training), with no branch: the expansion ``‖d‖² + 2λ⟨d, w⟩ + λ²‖w‖²`` would
  lose every digit there.

  Without ``v`` the reduction forms its own ``d + λw`` from ``d`` and ``w``
  with private copies of its scalars (λ, its halves and the splitting
  factor, through an optimisation barrier that also holds the layer's
  arrays), so XLA cannot merge it with the ``d + λw`` the update scales: the
  reduction reads ``d`` and ``w``, the update's kernel reads them again, and
  the sum is never written to memory. Merged, it is a parameter-sized
  temporary that both kernels read (on XLA:CPU a scalar broadcast shared by
  a reduction and an elementwise kernel is materialised too), most of the
  cost of ``'norm_of_sum'`` on a large layer (docs/RESULTS.md). The barrier
  moves no data on any backend as long as its arrays are the step's inputs
  (a computed ``d`` would be written out for it). Pass ``v`` (``d + λw``
  from :func:`add_decay`) where ``d`` is itself computed in the step, as
  LAMB's Adam direction: it is written to memory anyway, and its exact sum
  is then formed once.
  """
  if v is None:
    # The layer's own arrays ride along, so no two layers' barriers are one
    # (XLA would merge identical ones and share their broadcasts again).
    *scalars, d, w = jax.lax.optimization_barrier((*decay_scalars(wd), d, w))
    v = add_decay(d, wd, w, scalars=tuple(scalars))
  return sum_squares(v, axes)
