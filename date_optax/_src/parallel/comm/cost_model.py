"""Alpha-beta cost model of all-reduce algorithms: rings, 2-D tori, two-shot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from date_optax._src import validation
from date_optax._src.parallel.comm import low_precision

COST_ALGORITHMS = ("ring", "torus", "two_shot")


class AllReduceCost(NamedTuple):
  """Predicted cost of one all-reduce.

  Attributes:
    latency_steps: neighbour exchanges on the critical path (each costs
      `alpha`).
    bytes_per_link: bytes carried by the busiest link in one direction.
    seconds: `alpha · latency_steps + beta · bytes_per_link`.
  """

  latency_steps: int
  bytes_per_link: float
  seconds: float


def _ring(p: int, m: float, per_message: float = 0.0) -> tuple[int, float]:
  """Steps and bytes per link of a ring over p devices moving m bytes, plus
  `per_message` bytes on each of its 2(p-1) messages."""
  return 2 * (p - 1), 2 * (p - 1) / p * m + 2 * (p - 1) * per_message


def _torus(x: int, y: int, m: float, per_message: float = 0.0) -> tuple[int, float]:
  # A vertical ring moves (X-1)/X of what it is given, once to scatter and once
  # to gather: half A whole (M/2) in its first phase, half B after its y-phase
  # left 1/Y of it (M/(2Y)) in its second; 4(X-1) messages in all.
  vertical = 2 * (x - 1) / x * (m / 2 + m / (2 * y)) + 4 * (x - 1) * per_message
  horizontal = 2 * (y - 1) / y * (m / 2 + m / (2 * x)) + 4 * (y - 1) * per_message
  return 2 * (x - 1) + 2 * (y - 1), max(vertical, horizontal)


def _two_shot(p: int, m: float, per_message: float = 0.0) -> tuple[int, float]:
  """An all-to-all and an all-gather: 2 steps; each device's link carries the
  (p-1)/p of M that leaves it in each, in p-1 messages per collective."""
  return 2, 2 * (p - 1) / p * m + 2 * (p - 1) * per_message


def _scale_bits(fmt: Any) -> int:
  """Bits of one scale exponent on the wire: 8, in a 16-bit slot for bfloat16."""
  return max(8, fmt.bits)


def allreduce_cost(
    algorithm: str,
    mesh_shape: int | Sequence[int],
    nbytes: float,
    *,
    alpha: float,
    beta: float,
    comm_dtype: Any = None,
    block_size: int | None = None,
    measured_shift: bool = False,
    aps: bool = False,
    layers: int | None = None,
) -> AllReduceCost:
  """Predicts latency steps, link traffic and time of one all-reduce.

  The alpha-beta model: a message of `b` bytes between neighbours costs
  `alpha + beta · b` seconds; rings are unidirectional and every device can
  send on each of its links at once.

  * "ring": one ring over all `P` devices (the mesh shape is flattened):
    `2(P-1)` steps, `2(P-1)/P · M` bytes per link,
    `2(P-1)·alpha + 2(P-1)/P · M · beta` seconds (Patarasuk and Yuan, 2009).
  * "torus": the two-phase algorithm on an X×Y torus, as
    `torus_all_reduce` runs it. Each half of the buffer makes a ring
    reduce-scatter along one axis and then the other, and the gather in
    reverse; the two halves advance in the same rounds (round k carries the
    k-th message of each), so the critical path is one half's chain,
    `2(X-1) + 2(Y-1)` steps. A vertical link carries half A's first phase
    (`M/2`) and half B's second (`M/(2Y)`), scatter and gather, i.e.
    `(X-1)/X · M · (1 + 1/Y)` bytes, and symmetrically for horizontal links.
    The busiest link sets the bandwidth term. When X ≠ Y both halves are on
    the same axis for `|X-Y|` rounds of the scatter and of the gather, and share
    its links there; the model counts those bytes in the link totals but not
    the queueing they add. On a 1×P torus this is exactly the ring over P
    devices.
  * "two_shot": 1-bit Adam's compressed reduce-scatter (`GradSync("two_shot")`)
    on a switched network where each device has one link to it: one
    all-to-all and one all-gather, `2` steps whatever `P` (a collective's
    `P-1` messages leave at once), and each device's link carries
    `2(P-1)/P · M` bytes, as a ring's does. On a torus without a switch
    the all-to-all's messages would travel several hops; the model does
    not price that routing. The mesh shape is flattened.

  *Payload dtype.* `nbytes` is the size of the buffer in float32, as the
  gradients are stored; with `comm_dtype` the payload that moves is
  `nbytes · bits / 32` (16 bits for bfloat16, 8 for the float8 formats and
  int8, 4 for int4 and float4_e2m1fn, counted as 4 bits whatever container
  an emulation uses). The latency term is unchanged.

  *Scales.* With `block_size` B every block carries one 8-bit exponent
  (a 16-bit slot for bfloat16) beside its payload, so each element costs
  `bits + 8/B` bits: `M · (bits + 8/B) / 32` bytes move instead of
  `M · bits / 32` (leaf padding to whole blocks is not counted). With
  `measured_shift` every message carries one exponent per layer, `layers`
  bytes (as `all_reduce` sends them: all layers' slots, an upper bound on the
  pieces one message holds) on each of the `2(P-1)` messages a ring link
  carries, `4(X-1)` and `4(Y-1)` on the torus's vertical and horizontal
  links. With `aps=True` the `pmax` that Auto-Precision Scaling issues
  before the payload (a float32 max-abs and a non-finite flag per layer,
  `8 · layers` bytes) is priced as one more all-reduce of the same algorithm
  on the critical path: its steps and bytes per link are added. `all_reduce`
  issues it by default for formats of 8 bits or fewer without block scales
  or the measured shift; the default here (False) keeps the payload alone.

  Args:
    algorithm: "ring", "torus" or "two_shot".
    mesh_shape: number of devices, or the torus shape `(X, Y)` ("torus" needs
      two dimensions; "ring" flattens any shape).
    nbytes: size `M` of the buffer to sum, in bytes.
    alpha: seconds per message (latency), >= 0.
    beta: seconds per byte on one link (1 / bandwidth), >= 0.
    comm_dtype: None or "float32" (payload = `nbytes`), or one of
      `date_optax.parallel.COMM_DTYPES` (names or dtypes).
    block_size: elements per block scale (None: no block scales); an integer
      in [1, 65536]; needs a low-precision `comm_dtype`.
    measured_shift: price one exponent per layer on every message (needs a
      low-precision `comm_dtype` and `layers`; excludes `block_size`).
    aps: price the APS `pmax` (needs a low-precision `comm_dtype` and
      `layers`).
    layers: the number of layers (parameter leaves), >= 1.

  Returns:
    An `AllReduceCost(latency_steps, bytes_per_link, seconds)`.

  Examples:
    >>> import date_optax.parallel as dp
    >>> dp.allreduce_cost("ring", 256, 1e6, alpha=1e-6, beta=1e-9).latency_steps
    510
    >>> dp.allreduce_cost("torus", (16, 16), 1e6, alpha=1e-6, beta=1e-9).latency_steps
    60
    >>> full = dp.allreduce_cost("ring", 256, 1e6, alpha=0.0, beta=1e-9)
    >>> fp8 = dp.allreduce_cost("ring", 256, 1e6, alpha=0.0, beta=1e-9,
    ...                         comm_dtype="float8_e4m3fn")
    >>> round(full.seconds / fp8.seconds, 6)
    4.0

    Block scales of 32 elements add 8/32 bit per element to int8:

    >>> mx = dp.allreduce_cost("ring", 256, 1e6, alpha=0.0, beta=1e-9,
    ...                        comm_dtype="int8", block_size=32)
    >>> round(mx.bytes_per_link / fp8.bytes_per_link, 6)
    1.03125

    Two-shot: two rounds, the ring's bytes per link.

    >>> dp.allreduce_cost("two_shot", 256, 1e6, alpha=1e-6, beta=1e-9).latency_steps
    2

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018,
    https://arxiv.org/abs/1811.06992; Patarasuk and Yuan, "Bandwidth optimal
    all-reduce algorithms for clusters of workstations", 2009;
    Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
    Operations in MPICH", 2005 (the alpha-beta model); Han, Demmel and You,
    "Auto-Precision Scaling for Distributed Deep Learning", 2020,
    https://arxiv.org/abs/2003.00119 (low-precision payloads); Tang et al.,
    "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
    Convergence Speed", ICML 2021, https://arxiv.org/abs/2102.02888
    (two-shot).
  """
  validation.check_choice("algorithm", algorithm, COST_ALGORITHMS)
  shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
  if not shape:
    raise ValueError("mesh_shape must name at least one dimension.")
  for i, d in enumerate(shape):
    validation.check_int(f"mesh_shape[{i}]", d, low=1)
  validation.check_nonnegative("nbytes", nbytes)
  validation.check_nonnegative("alpha", alpha)
  validation.check_nonnegative("beta", beta)
  fmt = low_precision.comm_format(comm_dtype)
  _, block_size, measured_shift = low_precision.resolve_scaling(
      fmt, False, block_size, measured_shift
  )
  aps = validation.check_bool("aps", aps)
  if aps and fmt is None:
    raise ValueError("aps=True needs a low-precision comm_dtype; pass comm_dtype.")
  if layers is not None:
    layers = validation.check_int("layers", layers, low=1)
  if (aps or measured_shift) and layers is None:
    raise ValueError(
        "aps=True and measured_shift=True need layers (an integer >= 1): their "
        "cost is per layer."
    )
  bits = 32.0 if fmt is None else float(fmt.bits)
  if block_size is not None:
    bits += _scale_bits(fmt) / block_size
  m = float(nbytes) * bits / 32
  per_message = layers * _scale_bits(fmt) / 8 if measured_shift else 0.0
  if algorithm == "torus" and len(shape) != 2:
    raise ValueError(
        f"the torus algorithm needs mesh_shape=(X, Y), got mesh_shape={mesh_shape!r}."
    )
  cost = {"ring": lambda *a: _ring(math.prod(shape), *a), "torus": lambda *a: _torus(
      *shape, *a), "two_shot": lambda *a: _two_shot(math.prod(shape), *a)}[algorithm]
  steps, per_link = cost(m, per_message)
  if aps:
    extra = cost(8.0 * layers)
    steps, per_link = steps + extra[0], per_link + extra[1]
  return AllReduceCost(steps, per_link, alpha * steps + beta * per_link)
