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

`ScaledFormat` measures the scales instead (block scaling after the OCP
Microscaling formats, MX, 2023, and the measured per-layer shift): every
message carries, per block of `block_size` elements or per layer piece, the
exponent of the group's current max-abs beside the payload, re-measured at
every hop, so no `pmax` is needed and no worst case `N · M` is paid.

Rounding is to nearest by default. `StochasticRounding` rounds each value
instead to one of its two neighbouring grid points, the upper with
probability equal to the distance from the lower in units of the grid step,
so the rounding is unbiased (Gupta et al., "Deep Learning with Limited
Numerical Precision", ICML 2015, https://arxiv.org/abs/1502.02551).
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
    mant_bits: mantissa bits of a float format (0 for integers).
    min_exp: exponent of the smallest normal of a float format (0 for
      integers); below `2^min_exp` the grid step is the subnormal step.
  """

  name: str
  wire_dtype: Any
  bits: int
  max: float
  eps: float
  integer: bool
  mant_bits: int = 0
  min_exp: int = 0

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
  return CommFormat(name, dtype, info.bits, fmax, unit_roundoff + tiny / fmax, False,
                    int(info.nmant), int(info.minexp))


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

#: The accepted `rounding` values.
ROUNDINGS = ("nearest", "stochastic")

# The rounding key of a train step whose state has no key is
# fold_in(fold_in(PRNGKey(ROUNDING_SEED), _ROUNDING_STREAM), step); with a
# key, the state's key replaces PRNGKey(ROUNDING_SEED).
ROUNDING_SEED = 0
_ROUNDING_STREAM = 0x5352  # "SR": keeps the rounding keys off the dropout keys


def comm_format(comm_dtype: Any) -> CommFormat | None:
  """The `CommFormat` of `comm_dtype`; None for the exact float32 path.

  Raises:
    ValueError: naming `comm_dtype` and the supported formats.
  """
  if comm_dtype is None:
    return None
  try:
    name = jnp.dtype(comm_dtype).name
  except (TypeError, ValueError):  # a dict is a structured-dtype ValueError
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


def resolve_rounding(fmt: CommFormat | None, rounding: Any) -> str:
  """Validates `rounding` against the format: "stochastic" needs one."""
  if not isinstance(rounding, str) or rounding not in ROUNDINGS:
    raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}.")
  if rounding == "stochastic" and fmt is None:
    raise ValueError(
        'rounding="stochastic" needs a low-precision comm_dtype (float32 is '
        'exact, there is nothing to round); pass comm_dtype or rounding="nearest".'
    )
  return rounding


def stochastic_round(fmt: CommFormat, x: jax.Array, key: jax.Array) -> jax.Array:
  """float32 -> a neighbouring value of the format, as float32, unbiased.

  With `lo <= x < hi` the two grid points around x (`hi - lo` the grid step
  at x: 1 for integers; `2^(max(e, min_exp) - mant_bits)` for a float with
  `2^e <= |x| < 2^(e+1)`, the subnormal step below the normals), the result
  is `hi` with probability `(x - lo) / (hi - lo)` and `lo` otherwise, so
  `E[result] = x`; grid values come back unchanged. Values outside
  `[-max, max]`, NaN and values whose grid step is below float32's smallest
  normal (bfloat16 under 2^-119) are rounded to nearest, as `fmt.round`
  does. Integers saturate at ±qmax.

  Args:
    fmt: the format.
    x: the values (float32).
    key: a PRNG key; one uniform draw per element.

  Returns:
    float32 values of the format's grid, shaped like `x`.
  """
  x = x.astype(jnp.float32)
  u = jax.random.uniform(key, x.shape, jnp.float32)
  if fmt.integer:
    lo = jnp.floor(x)
    return jnp.clip(lo + (u < x - lo).astype(jnp.float32), -fmt.max, fmt.max)
  a = jnp.abs(x)
  _, e = jnp.frexp(a)  # a = f · 2^e with 1/2 <= f < 1: floor(log2 a) = e - 1
  e = jnp.maximum(e - 1, fmt.min_exp) - fmt.mant_bits
  # Multiplying by powers of two is exact: lo, hi and p carry no rounding.
  lo = jnp.floor(jnp.ldexp(a, -e))
  p = jnp.ldexp(a, -e) - lo
  out = jnp.ldexp(lo + (u < p).astype(jnp.float32), e)
  inside = a <= fmt.max
  if fmt.min_exp - fmt.mant_bits < -126:  # grid step below float32's normals
    inside &= e >= -126
  return jnp.where(inside, jnp.copysign(out, x), fmt.round(x))


class StochasticRounding:
  """A `CommFormat` whose `round`/`encode` round stochastically.

  Every call draws from its own key, `fold_in(key, i)` for the i-th call:
  the calls of one all-reduce (a device's first rounding, each partial sum
  it sends, the final sum) are made in the same order on every device while
  the program is traced, so they differ from each other, and the device's
  index folded into `key` makes them differ between devices.

  Args:
    fmt: the format.
    key: a PRNG key for this device.
  """

  def __init__(self, fmt: CommFormat, key: jax.Array):
    self.fmt = fmt
    self._key = key
    self._calls = 0

  def __getattr__(self, name: str) -> Any:  # name, wire_dtype, bits, max, ...
    return getattr(self.fmt, name)

  def _next_key(self) -> jax.Array:
    key = jax.random.fold_in(self._key, self._calls)
    self._calls += 1
    return key

  def reserve(self, calls: int) -> int:
    """The rank of the next call; the `calls` calls from it are skipped here
    and made by `at_call` formats (the rounds of a loop)."""
    first = self._calls
    self._calls += calls
    return first

  def at(self, call: Any) -> StochasticRounding:
    """This rounding with its next call the `call`-th (an int or a traced
    int32, e.g. from a loop's index); this one's count is left as it is."""
    out = StochasticRounding(self.fmt, self._key)
    out._calls = call
    return out

  def round(self, x: jax.Array) -> jax.Array:
    """float32 -> a neighbouring value of the format, as float32."""
    return stochastic_round(self.fmt, x, self._next_key())

  def encode(self, x: jax.Array) -> jax.Array:
    """float32 -> wire dtype, stochastically rounded (the cast is exact)."""
    return self.fmt.encode(self.round(x))

  def decode(self, w: jax.Array) -> jax.Array:
    """wire dtype -> float32 (exact)."""
    return self.fmt.decode(w)


def rounding_counter(fmt: Any) -> StochasticRounding | None:
  """The `StochasticRounding` that counts `fmt`'s calls (None: nearest)."""
  fmt = fmt.fmt if isinstance(fmt, ScaledFormat) else fmt
  return fmt if isinstance(fmt, StochasticRounding) else None


def at_call(fmt: Any, call: Any) -> Any:
  """`fmt` whose next stochastic rounding is its `call`-th (`StochasticRounding.at`);
  a format that rounds to nearest is returned as it is."""
  counter = rounding_counter(fmt)
  if counter is None:
    return fmt
  if isinstance(fmt, ScaledFormat):
    return ScaledFormat(counter.at(call), fmt.block_size, fmt.groups)
  return counter.at(call)


def rounding_key(rng: Any, step: jax.Array) -> jax.Array:
  """The stochastic-rounding key of a train step (before the device index).

  `fold_in(fold_in(base, 0x5352), step)` with `base` the state's key, or
  `jax.random.PRNGKey(ROUNDING_SEED)` (seed 0) when the state has none. The
  all-reduce folds in the replica's index over the data axes, so the keys
  depend on (step, replica) only, whatever the process layout.
  """
  base = jax.random.PRNGKey(ROUNDING_SEED) if rng is None else rng
  return jax.random.fold_in(jax.random.fold_in(base, _ROUNDING_STREAM), step)


def device_format(fmt: CommFormat, axes: Any, key: Any) -> Any:
  """`fmt` itself without a key; with one, stochastic rounding whose key has
  this device's row-major index over `axes` folded in."""
  if key is None:
    return fmt
  axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
  index = lax.axis_index(axes if len(axes) > 1 else axes[0])
  return StochasticRounding(fmt, jax.random.fold_in(key, index))


def aps_exponents(maxabs: jax.Array, n: int, fmt_max: float) -> jax.Array:
  """Per-layer shift exponents `k = floor(log2(fmt_max / (n · maxabs)))`.

  Zero or non-finite `maxabs` gives k = 0; k is clipped to ±100. Within the
  clip, k is the largest with `n · maxabs · 2^k <= fmt_max` (checked both
  ways after the logarithm, which may round).
  """
  maxabs = maxabs.astype(jnp.float32)
  ok = (maxabs > 0) & jnp.isfinite(maxabs)
  safe = jnp.where(ok, maxabs, 1.0)
  k = jnp.floor(jnp.log2(jnp.float32(fmt_max)) - jnp.log2(safe * n))
  k = jnp.clip(k, -_MAX_SHIFT, _MAX_SHIFT)
  # The logarithms may round either way: one step down if n·M·2^k overflows,
  # one up if n·M·2^(k+1) still fits (a ratio that is a power of two).
  k = k.astype(jnp.int32)
  k = jnp.where(jnp.ldexp(n * safe, k) > fmt_max, k - 1, k)
  k = jnp.where((k < _MAX_SHIFT) & (jnp.ldexp(n * safe, k + 1) <= fmt_max), k + 1, k)
  return jnp.where(ok, k, 0)


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


# ---------------------------------------------------------------------------
# Scales measured at every hop: block scaling (MX-style) and the measured
# per-layer shift. See docs/algorithms.md ("Block scaling and the measured
# shift").
# ---------------------------------------------------------------------------

#: The accepted range of `block_size` (elements that share one scale).
BLOCK_SIZE_RANGE = (1, 65536)
#: The block size a payload of at most 8 bits gets by default over "ring" or
#: "torus" (with `aps` and `block_size` unset): MX's 32.
DEFAULT_BLOCK_SIZE = 32

# The scale exponent of a group holding a NaN or Inf (MX's E8M0 has a NaN
# code too): the group decodes to NaN on every device. Other exponents lie in
# [-_MAX_SHIFT, _MAX_SHIFT] so that 2^e stays a normal float32.
NONFINITE_EXP = -128


def resolve_scaling(
    fmt: CommFormat | None,
    aps: bool | None,
    block_size: Any,
    measured_shift: Any,
    algorithm: str | None = None,
) -> tuple[bool, int | None, bool]:
  """Validates `block_size`/`measured_shift` and resolves the APS default.

  Returns `(aps, block_size, measured_shift)`. With block scales or the
  measured shift APS defaults to off (the scales measured at every hop
  replace the fixed per-layer shift); `aps=True` beside them is allowed.
  With none of the three given, a format of at most 8 bits gets block
  scales of `DEFAULT_BLOCK_SIZE` over "ring", "torus", "two_shot" or
  "hierarchical" and APS over "psum" (or an unknown algorithm); bfloat16
  gets neither.

  Raises:
    TypeError: `block_size` not an integer, `measured_shift` not a bool.
    ValueError: `block_size` outside `BLOCK_SIZE_RANGE`, either option
      without a low-precision `comm_dtype` or with `algorithm="psum"`, or
      both at once.
  """
  if block_size is not None:
    lo, hi = BLOCK_SIZE_RANGE
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
      raise TypeError(
          f"block_size must be None or an integer in [{lo}, {hi}], got {block_size!r}."
      )
    if not lo <= int(block_size) <= hi:
      raise ValueError(
          f"block_size must be None or an integer in [{lo}, {hi}], got {block_size!r}."
      )
    block_size = int(block_size)
  if not isinstance(measured_shift, (bool, np.bool_)):
    raise TypeError(f"measured_shift must be a bool, got {measured_shift!r}.")
  measured_shift = bool(measured_shift)
  scaled = block_size is not None or measured_shift
  if scaled:
    what = "block_size" if block_size is not None else "measured_shift=True"
    if block_size is not None and measured_shift:
      raise ValueError(
          "block_size and measured_shift=True exclude each other: block scales "
          "are already measured at every hop; pass one of them."
      )
    if fmt is None:
      raise ValueError(
          f"{what} needs a low-precision comm_dtype (float32 is exact, there is "
          "nothing to scale); pass comm_dtype or leave it unset."
      )
    if algorithm == "psum":
      raise ValueError(
          f"{what} needs algorithm 'ring' or 'torus' (or 'two_shot': the scales "
          "travel beside the payload of every message; lax.psum has no messages "
          "to measure), got 'psum'."
      )
  if (aps is None and not scaled and fmt is not None and fmt.bits <= 8
      and algorithm in ("ring", "torus", "two_shot", "hierarchical")):
    # The default for 8 bits or fewer over hops that carry scales: MX-style
    # blocks (docs/guide/low_precision_communication.md, "Which default").
    block_size, scaled = DEFAULT_BLOCK_SIZE, True
  if aps is None and scaled:
    aps = False
  return resolve_aps(fmt, aps), block_size, measured_shift


def group_exponents(maxabs: jax.Array, fmt_max: float) -> jax.Array:
  """The smallest `e` with `maxabs · 2^-e <= fmt_max` (int32), clipped to ±100.

  Zero or non-finite `maxabs` gives 0. It is `-aps_exponents(maxabs, 1,
  fmt_max)`: the APS rule for one value, measured instead of bounded.
  """
  return -aps_exponents(maxabs, 1, fmt_max)


_INT_OF_BITS = {4: jnp.int4, 8: jnp.int8, 16: jnp.int16}


class ScaledFormat:
  """A payload with one power-of-two scale per group, measured on what is sent.

  Every `encode` measures, for each group of the values it is given, the
  max-abs `m` of the finite values and the exponent `e = group_exponents(m)`,
  sends `round(x · 2^-e)` in the format and `e` beside it (one 8-bit
  exponent per group; two 4-bit slots for 4-bit formats, one 16-bit slot for
  bfloat16), packed into one buffer of the format's width. A group holding a
  NaN or Inf sends the exponent -128 and decodes to NaN. Groups are either
  consecutive blocks of `block_size` elements, or given by sorted segment
  ids `gid` in `[0, groups)` (the measured per-layer shift: one group per
  layer piece). The values are not rounded before they are added: the
  device adds its float32 row to the decoded partial sum, because the two
  carry different scales.

  Args:
    fmt: the rounding (a `CommFormat` or a `StochasticRounding`).
    block_size: elements per block, or None for segment ids.
    groups: the number of segment ids (with `block_size=None`).
  """

  def __init__(self, fmt: Any, block_size: int | None = None, groups: int | None = None):
    if (block_size is None) == (groups is None):
      raise ValueError("pass exactly one of block_size and groups.")
    self.fmt = fmt
    self.block_size = block_size
    self.groups = groups
    self.bits = fmt.bits
    self.container = _INT_OF_BITS[fmt.bits]
    self.slots = 2 if fmt.bits == 4 else 1  # wire elements per exponent

  def _num_groups(self, size: int) -> int:
    if self.block_size is None:
      return self.groups
    if size % self.block_size:
      raise ValueError(f"{size} values do not fill blocks of {self.block_size}.")
    return size // self.block_size

  def _per_element(self, e: jax.Array, gid: Any, size: int) -> jax.Array:
    if self.block_size is None:
      return e[gid]
    # A broadcast, not `jnp.repeat` (a gather: on the TPU compiler its
    # compile time grew with the element count, minutes per million).
    return jnp.broadcast_to(e[:, None], (size // self.block_size, self.block_size)).reshape(-1)

  def exponents(self, x: jax.Array, gid: Any = None) -> jax.Array:
    """The exponent of each group of `x` (1-D float32), -128 if non-finite."""
    a = jnp.where(jnp.isfinite(x), jnp.abs(x), 0.0)
    bad = (~jnp.isfinite(x)).astype(jnp.float32)
    if self.block_size is None:
      m = jax.ops.segment_max(a, gid, self.groups, indices_are_sorted=True)
      nf = jax.ops.segment_max(bad, gid, self.groups, indices_are_sorted=True)
      m = jnp.maximum(m, 0.0)  # empty segments give -inf
    else:
      m = a.reshape(-1, self.block_size).max(axis=1)
      nf = bad.reshape(-1, self.block_size).max(axis=1)
    e = group_exponents(m, self.fmt.max)
    return jnp.where(nf > 0, NONFINITE_EXP, e)

  def _pack_exponents(self, e: jax.Array) -> jax.Array:
    if self.bits == 4:  # e = 16·hi + lo + 8 with hi, lo in [-8, 7]
      hi = jnp.floor_divide(e, 16)
      return jnp.stack([hi, e - 16 * hi - 8], axis=-1).reshape(-1).astype(jnp.int4)
    return e.astype(self.container)

  def _unpack_exponents(self, w: jax.Array) -> jax.Array:
    w = w.astype(jnp.int32)
    if self.bits == 4:
      w = w.reshape(-1, 2)
      return 16 * w[:, 0] + w[:, 1] + 8
    return w

  def encode(self, x: jax.Array, gid: Any = None) -> jax.Array:
    """1-D float32 -> one packed message: the payload, then the exponents."""
    x = x.astype(jnp.float32)
    e = self.exponents(x, gid)
    ee = self._per_element(e, gid, x.shape[0])
    scaled = jnp.ldexp(x, -jnp.where(ee == NONFINITE_EXP, 0, ee))
    payload = self.fmt.encode(scaled)
    if payload.dtype != self.container:
      payload = lax.bitcast_convert_type(payload, self.container)
    return jnp.concatenate([payload, self._pack_exponents(e)])

  def decode(self, msg: jax.Array, gid: Any = None) -> jax.Array:
    """A packed message -> float32 values (exact)."""
    length = msg.shape[0]
    if self.block_size is None:
      size = length - self.slots * self.groups
    else:
      size = length * self.block_size // (self.block_size + self.slots)
    payload, e = msg[:size], self._unpack_exponents(msg[size:])
    if self.fmt.wire_dtype != self.container:
      payload = lax.bitcast_convert_type(payload, self.fmt.wire_dtype)
    ee = self._per_element(e, gid, size)
    out = jnp.ldexp(self.fmt.decode(payload), jnp.where(ee == NONFINITE_EXP, 0, ee))
    return jnp.where(ee == NONFINITE_EXP, jnp.nan, out)

  def round(self, x: jax.Array, gid: Any = None) -> jax.Array:
    """float32 -> the values that would arrive, as float32."""
    return self.decode(lax.optimization_barrier(self.encode(x, gid)), gid)
