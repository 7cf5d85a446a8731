"""Alpha-beta cost model of all-reduce algorithms: rings, 2-D tori, two-shot, hierarchical."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from date_optax._src import validation
from date_optax._src.parallel.comm import hierarchical, low_precision

COST_ALGORITHMS = ("ring", "torus", "two_shot", "hierarchical")


class AllReduceCost(NamedTuple):
  """Predicted cost of one all-reduce.

  Attributes:
    latency_steps: neighbour exchanges on the critical path (each costs
      `alpha`; for "hierarchical" the in-slice and cross-slice ones).
    bytes_per_link: bytes carried by the busiest link in one direction (for
      "hierarchical" the busiest in-slice link).
    seconds: `alpha · latency_steps + beta · bytes_per_link`; for
      "hierarchical" the in-slice part at `(alpha, beta)` plus the
      cross-slice part at `(dcn_alpha, dcn_beta)`.
    dcn_latency_steps: the cross-slice steps among `latency_steps` (0 but
      for "hierarchical").
    dcn_bytes_per_link: bytes each device sends across the slices, in one
      direction (0 but for "hierarchical").
  """

  latency_steps: int
  bytes_per_link: float
  seconds: float
  dcn_latency_steps: int = 0
  dcn_bytes_per_link: float = 0.0


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


def _hierarchical(
    s: int, m: int, nbytes: float, payload: float, per_message: float, dcn_algorithm: str,
) -> tuple[tuple[int, float], tuple[int, float]]:
  """`((steps, bytes) in a slice, (steps, bytes) across slices)`: a float32
  ring reduce-scatter and all-gather of `nbytes` over the m devices of a
  slice, and the cross-slice algorithm over the s slices on each device's
  1/m of the `payload` bytes."""
  ici = _ring(m, nbytes)
  if s == 1:
    return ici, (0, 0.0)
  cross = _two_shot if dcn_algorithm == "two_shot" else _ring
  return ici, cross(s, payload / m, per_message)


def _check_dcn(algorithm: str, shape: tuple[int, ...], dcn_alpha: Any, dcn_beta: Any,
               dcn_algorithm: Any) -> str | None:
  """The cross-slice options: needed by "hierarchical", refused by the others."""
  dcn_algorithm = hierarchical.check_dcn_algorithm(algorithm, dcn_algorithm)
  given = [name for name, v in (("dcn_alpha", dcn_alpha), ("dcn_beta", dcn_beta))
           if v is not None]
  if algorithm != "hierarchical":
    if given:
      raise ValueError(
          f"{' and '.join(given)} price the cross-slice network of algorithm="
          f'"hierarchical", got algorithm={algorithm!r}; leave them None.')
    return None
  if len(given) != 2:
    raise ValueError(
        'algorithm="hierarchical" needs dcn_alpha and dcn_beta (the latency and seconds '
        "per byte of the network between slices, each >= 0); got dcn_alpha="
        f"{dcn_alpha!r}, dcn_beta={dcn_beta!r}.")
  validation.check_nonnegative("dcn_alpha", dcn_alpha)
  validation.check_nonnegative("dcn_beta", dcn_beta)
  if len(shape) != 2:
    raise ValueError(
        'algorithm="hierarchical" needs mesh_shape=(S, N_ici), the slices and the '
        f"devices of one slice, got mesh_shape={shape!r}.")
  return dcn_algorithm


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
    dcn_alpha: float | None = None,
    dcn_beta: float | None = None,
    dcn_algorithm: str | None = None,
) -> AllReduceCost:
  r"""Predicts latency steps, link traffic and time of one all-reduce.

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
  * "hierarchical": the Multislice sync (`GradSync("hierarchical")`) over
    `mesh_shape=(S, N)`, S slices of N devices, with two networks: inside a
    slice `(alpha, beta)`, between slices `(dcn_alpha, dcn_beta)`. A float32
    ring reduce-scatter and all-gather over the N devices of a slice move
    the whole buffer, `M` bytes whatever the payload; the cross-slice
    "two_shot" (or "ring", `dcn_algorithm`) over the S slices moves each
    device's shard, `m = M / N` bytes of float32, in the payload format
    (`m_p` below: `m · bits / 32`, with the block scales' bits):

    .. math::

      t = 2(N-1)\alpha + \frac{2(N-1)}{N} M \beta
          + s_S \alpha_{dcn} + \frac{2(S-1)}{S} m_p \beta_{dcn},

    `s_S = 2` for "two_shot" (`2(S-1)` for "ring", and 0 when S = 1). The
    measured shift's exponents ride on the cross-slice messages only; the
    APS `pmax` is priced as one more hierarchical all-reduce of
    `8 · layers` float32 bytes. `latency_steps` counts both networks'
    steps, `bytes_per_link` the in-slice link's bytes;
    `dcn_latency_steps` and `dcn_bytes_per_link` the cross-slice part.

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
    algorithm: "ring", "torus", "two_shot" or "hierarchical".
    mesh_shape: number of devices, or the torus shape `(X, Y)` ("torus" needs
      two dimensions; "ring" flattens any shape), or `(S, N)` for
      "hierarchical": S slices of N devices.
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
    dcn_alpha: seconds per message between slices, >= 0; "hierarchical"
      needs it, the others refuse it.
    dcn_beta: seconds per byte between slices (1 / the data-center
      network's bandwidth per device), >= 0; as `dcn_alpha`.
    dcn_algorithm: the cross-slice algorithm of "hierarchical", "two_shot"
      (None: the default) or "ring"; refused with the others.

  Returns:
    An `AllReduceCost(latency_steps, bytes_per_link, seconds, ...)`.

  Raises:
    ValueError: an unknown algorithm or format, a mesh dimension below 1,
      negative sizes or times, "torus" or "hierarchical" without two mesh
      dimensions, `aps` or `measured_shift` without `layers`, and
      `dcn_alpha`/`dcn_beta`/`dcn_algorithm` missing with "hierarchical"
      or given with another algorithm.

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

    Hierarchical over 2 slices of 4 devices, int8 across the slices at
    3 GB/s, float32 inside at 50 GB/s: 6 in-slice steps moving 1.5 MB and 2
    cross-slice steps moving 1/4 of the 1 MB in int8, halved.

    >>> h = dp.allreduce_cost("hierarchical", (2, 4), 1e6, alpha=1e-6, beta=1 / 50e9,
    ...                       dcn_alpha=1e-5, dcn_beta=1 / 3e9, comm_dtype="int8")
    >>> h.latency_steps, h.dcn_latency_steps, h.bytes_per_link, h.dcn_bytes_per_link
    (8, 2, 1500000.0, 62500.0)

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
    (two-shot); Google Cloud, "Cloud TPU Multislice overview",
    https://cloud.google.com/tpu/docs/multislice-introduction (hierarchical).
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
  dcn_algorithm = _check_dcn(algorithm, shape, dcn_alpha, dcn_beta, dcn_algorithm)
  bits = 32.0 if fmt is None else float(fmt.bits)
  if block_size is not None:
    bits += _scale_bits(fmt) / block_size
  m = float(nbytes) * bits / 32
  per_message = layers * _scale_bits(fmt) / 8 if measured_shift else 0.0
  if algorithm == "torus" and len(shape) != 2:
    raise ValueError(
        f"the torus algorithm needs mesh_shape=(X, Y), got mesh_shape={mesh_shape!r}."
    )
  if algorithm == "hierarchical":
    (steps, per_link), (dcn_steps, dcn_link) = _hierarchical(
        *shape, float(nbytes), m, per_message, dcn_algorithm)
    if aps:
      (a, b), (c, d) = _hierarchical(*shape, 8.0 * layers, 8.0 * layers, 0.0, dcn_algorithm)
      steps, per_link, dcn_steps, dcn_link = steps + a, per_link + b, dcn_steps + c, dcn_link + d
    seconds = alpha * steps + beta * per_link + dcn_alpha * dcn_steps + dcn_beta * dcn_link
    return AllReduceCost(steps + dcn_steps, per_link, seconds, dcn_steps, dcn_link)
  cost = {"ring": lambda *a: _ring(math.prod(shape), *a), "torus": lambda *a: _torus(
      *shape, *a), "two_shot": lambda *a: _two_shot(math.prod(shape), *a)}[algorithm]
  steps, per_link = cost(m, per_message)
  if aps:
    extra = cost(8.0 * layers)
    steps, per_link = steps + extra[0], per_link + extra[1]
  return AllReduceCost(steps, per_link, alpha * steps + beta * per_link)
