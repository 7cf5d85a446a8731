"""Low-precision gradient payloads and Auto-Precision Scaling (APS).

A *communication format* says how a float32 gradient travels between
devices: `encode` rounds float32 values to the format and returns the wire
array (what `ppermute`/`psum` carry), `decode` widens it back to float32.
The ring and torus all-reduces round every partial sum to the format before
it is sent, as hardware that adds in the format would; see
`docs/algorithms.md` ("Low-precision all-reduce and APS") for the rules and
the error bound.

APS (Han, Demmel and You, "Auto-Precision Scaling for Distributed Deep
Learning", 2020, https://arxiv.org/abs/2003.00119) multiplies each layer's
gradient by a power of two before the cast, chosen from the layer's max-abs
over all replicas so that the sum over N replicas fills the format's range
without overflowing:

    k_l = floor(log2(fmt_max / (N · M_l)))     M_l = max over replicas of max|g_l|

and divides by `2^k_l` after the reduction. `M_l` comes from one small
`pmax` over the replicas of a vector with two entries per layer (its max-abs
and a non-finite flag), taken before the payload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

# The shift exponent is clipped to this range so that 2^k stays a normal
# float32 (layers with max-abs below ~1e-30 are shifted by 2^100 only).
_MAX_SHIFT = 100


class CommFormat(NamedTuple):
  """A gradient payload format.

  Attributes:
    name: the `comm_dtype` name.
    wire_dtype: the dtype that travels (native JAX/ml_dtypes type).
    bits: bits per value on the wire (cost model).
    max: the largest finite magnitude (for integers the symmetric `qmax`).
    eps: the error of one rounding relative to the range APS fills (the
      sum's bound `N · M · 2^k`, which exceeds `max / 2`): for a float
      format with m mantissa bits `2^-(m+1) + smallest_subnormal / max`
      (relative rounding plus underflow), for an integer grid `1 / qmax`
      (half a unit against `qmax / 2`).
    integer: True for integer grids (round to nearest, saturate at ±max).
  """

  name: str
  wire_dtype: Any
  bits: int
  max: float
  eps: float
  integer: bool

  def encode(self, x: jax.Array) -> jax.Array:
    """float32 -> wire dtype, rounding to nearest (integers saturate)."""
    if self.integer:
      return jnp.clip(jnp.round(x), -self.max, self.max).astype(self.wire_dtype)
    return x.astype(self.wire_dtype)

  def decode(self, w: jax.Array) -> jax.Array:
    """wire dtype -> float32 (exact)."""
    return w.astype(jnp.float32)

  def round(self, x: jax.Array) -> jax.Array:
    """float32 -> the nearest value of the format, as float32.

    The optimization barrier keeps XLA from folding the two converts away
    (it may, by default, keep excess precision across a convert pair).
    """
    return self.decode(lax.optimization_barrier(self.encode(x)))


def _float_format(name: str, dtype: Any, unit_roundoff: float) -> CommFormat:
  info = ml_dtypes.finfo(dtype)
  fmax, tiny = float(info.max), float(info.smallest_subnormal)
  return CommFormat(name, dtype, info.bits, fmax, unit_roundoff + tiny / fmax, False)


_FORMATS: dict[str, CommFormat] = {
    "bfloat16": _float_format("bfloat16", jnp.bfloat16, 2.0**-8),
    "float8_e4m3fn": _float_format("float8_e4m3fn", jnp.float8_e4m3fn, 2.0**-4),
    "float8_e5m2": _float_format("float8_e5m2", jnp.float8_e5m2, 2.0**-3),
    "int8": CommFormat("int8", jnp.int8, 8, 127.0, 1.0 / 127.0, True),
    "int4": CommFormat("int4", jnp.int4, 4, 7.0, 1.0 / 7.0, True),
    "float4_e2m1fn": _float_format("float4_e2m1fn", jnp.float4_e2m1fn, 2.0**-2),
}

#: The accepted `comm_dtype` values (names; the dtypes themselves work too).
COMM_DTYPES = ("float32",) + tuple(_FORMATS)


def comm_format(comm_dtype: Any) -> CommFormat | None:
  """The `CommFormat` of `comm_dtype`; None for the exact float32 path.

  Raises:
    ValueError: naming `comm_dtype` and the supported formats.
  """
  if comm_dtype is None:
    return None
  try:
    name = jnp.dtype(comm_dtype).name
  except TypeError:
    name = comm_dtype if isinstance(comm_dtype, str) else None
  if name == "float32":
    return None
  if name not in _FORMATS:
    raise ValueError(
        f"comm_dtype must be None or one of {COMM_DTYPES} (a name or the dtype), "
        f"got {comm_dtype!r}."
    )
  return _FORMATS[name]


def resolve_aps(fmt: CommFormat | None, aps: bool | None) -> bool:
  """The APS default (on for formats of 8 bits or fewer) and its validation."""
  if aps is not None and not isinstance(aps, (bool, np.bool_)):
    raise TypeError(f"aps must be None or a bool, got {aps!r}.")
  if fmt is None:
    if aps:
      raise ValueError(
          "aps=True needs a low-precision comm_dtype (float32 is exact, there "
          "is nothing to scale); pass comm_dtype or leave aps=None."
      )
    return False
  return fmt.bits <= 8 if aps is None else bool(aps)


def aps_exponents(maxabs: jax.Array, n: int, fmt_max: float) -> jax.Array:
  """Per-layer shift exponents `k = floor(log2(fmt_max / (n · maxabs)))`.

  Zero or non-finite `maxabs` gives k = 0; k is clipped to ±100. The result
  satisfies `n · maxabs · 2^k <= fmt_max` (checked and corrected after the
  logarithm, which may round).
  """
  maxabs = maxabs.astype(jnp.float32)
  ok = (maxabs > 0) & jnp.isfinite(maxabs)
  safe = jnp.where(ok, maxabs, 1.0)
  k = jnp.floor(jnp.log2(jnp.float32(fmt_max)) - jnp.log2(safe * n))
  k = jnp.clip(k, -_MAX_SHIFT, _MAX_SHIFT)
  k = jnp.where(jnp.ldexp(n * safe, k.astype(jnp.int32)) > fmt_max, k - 1, k)
  return jnp.where(ok, k, 0.0).astype(jnp.int32)


def layer_stats(leaves: Sequence[jax.Array], axes: Any) -> tuple[jax.Array, jax.Array]:
  """(max-abs of the finite values, any non-finite) per leaf, over replicas.

  One `pmax` of a float32 vector of 2·len(leaves) entries.
  """
  m = [jnp.max(jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0), initial=0.0) for x in leaves]
  bad = [jnp.any(~jnp.isfinite(x)).astype(jnp.float32) for x in leaves]
  s = lax.pmax(jnp.stack(m + bad), axes)
  return s[: len(leaves)], s[len(leaves) :] > 0


class Scaling(NamedTuple):
  """What the payload needs after the reduction: per-leaf shifts and flags."""

  exponents: jax.Array  # int32 k per leaf (0 without APS)
  nonfinite: jax.Array  # bool per leaf: some replica had NaN/Inf there

  def undo(self, i: int, reduced: jax.Array) -> jax.Array:
    """Inverse shift of leaf i; NaN where any replica's leaf was non-finite."""
    out = jnp.ldexp(reduced, -self.exponents[i])
    return jnp.where(self.nonfinite[i], jnp.nan, out)


def prepare(
    leaves: Sequence[jax.Array], axes: Any, n: int, fmt: CommFormat, aps: bool
) -> tuple[list[jax.Array], Scaling]:
  """float32 leaves -> shifted leaves (APS) and the `Scaling` to undo it.

  The non-finite flags are gathered with or without APS: integer and e2m1
  formats have no NaN, and a NaN gradient must reach the step's non-finite
  check as a NaN, not as finite garbage.
  """
  maxabs, nonfinite = layer_stats(leaves, axes)
  if aps:
    k = aps_exponents(maxabs, n, fmt.max)
    leaves = [jnp.ldexp(x, k[i]) for i, x in enumerate(leaves)]
  else:
    k = jnp.zeros(len(leaves), jnp.int32)
  return list(leaves), Scaling(k, nonfinite)


def split_floats(leaves: Sequence[Any]) -> tuple[list[int], list[int]]:
  """Indices of the inexact leaves and of the others."""
  floats, others = [], []
  for i, x in enumerate(leaves):
    (floats if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact) else others).append(i)
  return floats, others
