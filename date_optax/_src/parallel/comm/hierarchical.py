"""The hierarchical gradient sync of Cloud TPU Multislice: exact in a slice, compressed across.

Multislice joins S TPU slices by the data-center network (DCN, about 3 GB/s
per chip) while the M chips of one slice talk over ICI (50-100 GB/s per
link). Over a mesh `Mesh(devices.reshape(S, M), ("dcn", "ici"))` with data
axes `(outer, inner) = ("dcn", "ici")`, `GradSync("hierarchical", ...)`
reduces in three stages, so that only 1/M of each gradient crosses the slow
network, and only there in the payload format:

1. inside each slice, XLA's float32 reduce-scatter (`lax.psum_scatter` over
   the in-slice axis, one per accumulation dtype over the whole flattened
   tree): device i of slice s gets row i of its slice's sum;
2. across the slices, each device's row (its shard, 1/M of the gradient)
   is summed with the devices at the same in-slice position, over the outer
   axis, in the payload format by `dcn_algorithm`: "two_shot"
   (`two_shot.two_shot_sum`, 1-bit Adam's compressed reduce-scatter) or
   "ring" (`low_bit_sum`, a rounding at every hop); exactly by `lax.psum`
   without a format;
3. inside each slice, XLA's all-gather of the shards.

A whole leaf whose shard is too small to fill its blocks (a batch-norm
scale of 64 split 256 ways: one element, padded to a block of 32 in each
of the S chunks) crosses in float32 instead, exactly, wherever that sends
no more bytes than the payload would (`exact_is_smaller`); its residuals,
if it holds any, are added to it once and come back zero.

Layout. Device (s, i) is replica `k = s·M + i`, the row-major order of
`PartitionSpec(("dcn", "ici"))`. A whole leaf is flattened and zero-padded
to a multiple of M and cut into M rows of `c = ceil(size / M)`. Weight-update
sharding (`scatter=True`) splits the update inside the slice only, as
Multislice training keeps the slices pure data parallel: a leaf that M
divides along an axis (`update_sharding.to_blocks` over M) has row i =
block i, device i's shard; the cross-slice sum leaves it on device (s, i) of
every slice, and stage 3 is skipped for it. The new parameters are then
all-gathered inside the slice; nothing but the gradient's shard crosses.

Error feedback (two-stage, as `error_feedback.ErrorFeedbackState`): the
rounding happens on the shard only, so the worker residual is the shard's,
`(ceil(size / M),)` per leaf, `p = row + e`, `e' = p - C(p)` (EF-SGD,
Karimireddy et al. 2019), and the hop residual the cross-slice
algorithm's, the two-shot server residual of 1/S of the shard (Tang et al.
2021) or the ring's of the whole shard: `(1 + 1/S) / M` or `2 / M` of a
gradient per device. Auto-Precision Scaling measures `max|p|` over every
device and scales for the S-term sum.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import error_feedback as ef
from date_optax._src.parallel.comm import low_bit_sum
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm import two_shot as ts
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.comm.collectives import acc_dtype, pad_to
from date_optax._src.types import PyTree

#: The cross-slice algorithms of "hierarchical" (`GradSync.dcn_algorithm`).
DCN_ALGORITHMS = ("two_shot", "ring")


def check_dcn_algorithm(algorithm: str, dcn_algorithm: Any) -> str | None:
  """`GradSync.dcn_algorithm` resolved: "two_shot" by default for "hierarchical".

  Raises:
    ValueError: one not in `DCN_ALGORITHMS`, or one given with another
      algorithm.
  """
  if dcn_algorithm is None:
    return "two_shot" if algorithm == "hierarchical" else None
  if not isinstance(dcn_algorithm, str) or dcn_algorithm not in DCN_ALGORITHMS:
    raise ValueError(
        f"dcn_algorithm must be None or one of {DCN_ALGORITHMS} (the cross-slice "
        f"algorithm of algorithm=\"hierarchical\"), got {dcn_algorithm!r}."
    )
  if algorithm != "hierarchical":
    raise ValueError(
        f"dcn_algorithm={dcn_algorithm!r} is the cross-slice algorithm of "
        f'algorithm="hierarchical" (grad_reduce="hierarchical"), got algorithm='
        f"{algorithm!r}; pass dcn_algorithm=None."
    )
  return dcn_algorithm


def check_axes(axes: Any) -> tuple[Hashable, Any]:
  """`(outer, inner)`: the slices' axis and the in-slice axis (or axes).

  The first data axis crosses the slices; the others stay inside one: one
  axis is returned as itself, several as a tuple (their devices in row-major
  order, as `PartitionSpec` lays them out).

  Raises:
    ValueError: fewer than two axes.
  """
  axes_t = compat.as_tuple(axes)
  if len(axes_t) < 2:
    raise ValueError(
        'grad_reduce="hierarchical" needs two data axes (slices, in-slice): the '
        "first crosses the slices (DCN), the others stay inside one (ICI), as "
        'in Mesh(devices.reshape(S, -1), ("dcn", "ici")) with data_axes=("dcn", '
        f'"ici"); got data axes {axes_t}.'
    )
  return axes_t[0], axes_t[1] if len(axes_t) == 2 else tuple(axes_t[1:])


def _rows(x: jax.Array, d: int | None, m: int) -> jax.Array:
  """A leaf as `(m, c)` rows, row i the part in-slice device i reduces."""
  if d is None:
    return pad_to(x.reshape(-1), m).reshape(m, -1)
  return us.to_blocks(x, d, m)  # row i: in-slice device i's shard


def _groups(xs: Sequence[jax.Array], idxs: Sequence[int]) -> list[list[int]]:
  """`idxs` grouped by dtype, so that each group is one buffer, one collective."""
  out: dict[Any, list[int]] = {}
  for i in idxs:
    out.setdefault(xs[i].dtype, []).append(i)
  return list(out.values())


def _cut(buf: jax.Array, widths: Sequence[int]) -> list[jax.Array]:
  """The consecutive pieces of the last axis of `buf`, `widths` wide."""
  starts = np.cumsum([0, *widths])
  return [buf[..., int(a) : int(b)] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def _scatter_in_slice(
    xs: list[jax.Array], dims: list[int | None], inner: Hashable, s: int, m: int
) -> list[jax.Array]:
  """Stage 1: each leaf's row of its slice's sum, flat; one reduce-scatter per dtype."""
  out: list[Any] = [None] * len(xs)
  for idxs in _groups(xs, range(len(xs))):
    rows = [_rows(xs[i], dims[i], m) for i in idxs]
    buf = jnp.concatenate(rows, axis=1)
    own = lax.psum_scatter(buf.reshape(-1), inner, scatter_dimension=0, tiled=True)
    for i, piece in zip(idxs, _cut(own, [r.shape[1] for r in rows]), strict=True):
      out[i] = piece
  return out


def _gather_in_slice(
    pieces: list[jax.Array], leaves: list[jax.Array], idxs: list[int], inner: Hashable,
) -> dict[int, jax.Array]:
  """Stage 3: the whole leaves `idxs` from every in-slice device's reduced row."""
  out = {}
  for group in _groups(pieces, idxs):
    got = lax.all_gather(jnp.concatenate([pieces[i] for i in group]), inner, axis=0)
    for i, rows in zip(group, _cut(got, [pieces[i].shape[0] for i in group]), strict=True):
      out[i] = rows.reshape(-1)[: leaves[i].size].reshape(leaves[i].shape)
  return out


def _exact_across(pieces: list[jax.Array], outer: Hashable) -> list[jax.Array]:
  """Stage 2 without a format: `lax.psum` of the shards, one per dtype."""
  out: list[Any] = [None] * len(pieces)
  for group in _groups(pieces, range(len(pieces))):
    summed = lax.psum(jnp.concatenate([pieces[i] for i in group]), outer)
    for i, p in zip(group, _cut(summed, [pieces[i].size for i in group]), strict=True):
      out[i] = p
  return out


def _ring_across(
    xs: list[jax.Array], outer: Hashable, sync: Any, fmt: Any, hop: list[jax.Array] | None,
) -> tuple[list[jax.Array], list[jax.Array] | None]:
  """Stage 2 over a ring of the slices, a rounding at every hop (`low_bit_sum`):
  every shard all-reduced whole."""
  options = {"block_size": sync.block_size, "measured_shift": sync.measured_shift}
  got = low_bit_sum.low_precision_sum(xs, outer, "ring", None, fmt, feedback=hop, **options)
  sums, fb = got if hop is not None else (got, None)
  return list(sums), None if fb is None else [f.reshape(-1) for f in fb]


def exact_is_smaller(size: int, s: int, block_size: int, bits: int) -> bool:
  """Whether a whole leaf's shard of `size` elements costs no more bytes
  across `s` slices in float32 than in a `bits`-wide payload with block
  scales: each of its `s` chunks is padded to whole blocks and carries an
  exponent byte per block (two for 16-bit formats), so a shard of a few
  elements (a batch-norm scale split 256 ways) sends dozens of padded ones."""
  width = -(-int(size) // s)
  padded = -(-width // block_size) * block_size
  exponent = 1 if bits <= 8 else 2
  return s * (padded * bits / 8 + padded // block_size * exponent) >= 4 * int(size)


def _check_residuals(pieces: list[jax.Array], worker: Any, hop: Any, s: int, m: int,
                     dcn_algorithm: str) -> None:
  """Residuals shaped as `ErrorFeedbackState.zeros(..., slices=S)` builds them."""
  for i, p in enumerate(pieces):
    want_hop = (-(-p.size // s),) if dcn_algorithm == "two_shot" else (p.size,)
    for name, got, want in (("worker", worker, (p.size,)), ("hop", hop, want_hop)):
      if got is not None and tuple(got[i].shape) != want:
        raise ValueError(
            f"hierarchical's {name} residual of a leaf over {s} slices of {m} devices "
            f"is {want} on each device, got {tuple(got[i].shape)}: build it with "
            "ErrorFeedbackState.zeros(grads, grad_sync, chunks=N, slices=S)."
        )


def hierarchical_reduce(
    tree: PyTree, axes: Any, sync: Any, key: Any, scatter: bool, worker: Any = None,
    hop: Any = None,
) -> tuple[PyTree, Any, Any]:
  """Sums a pytree over the slices and the devices of each slice, in three stages.

  The reduction of `GradSync("hierarchical")`, as `sync_gradients` calls it
  on the shares `g / N` of this device (call it inside `shard_map` over the
  two data axes). With S slices of M devices, a leaf of `size` elements:

  .. math::

    p_{s,i} = \\sum_{j<M} \\mathrm{row}_i(x_{s,j}) + e_{s,i}, \\qquad
    y_i = \\mathrm{D}_S\\big(C(p_{0,i}), \\dots, C(p_{S-1,i})\\big), \\qquad
    e_{s,i}' = p_{s,i} - C(p_{s,i}),

  `row_i` the i-th of the M rows of the leaf (stage 1 sums them exactly,
  float32), `C` the payload's rounding and `D_S` the cross-slice algorithm
  over the S slices with its own rounding and residual (stage 2), and the
  sum `[y_0, ..., y_{M-1}]` gathered in the slice (stage 3). Only
  `ceil(size / M)` elements per device cross the slices' network, in the
  payload format; the in-slice stages move float32 over the fast links.

  Args:
    tree: this device's pytree of arrays.
    axes: the two data axes `(slices, in-slice)`.
    sync: the `GradSync` (`algorithm="hierarchical"`; its format, scaling,
      rounding and `dcn_algorithm`).
    key: the stochastic-rounding key (this device's index is folded in), or
      None.
    scatter: return each leaf that M divides along an axis as this
      device's in-slice shard of the sum, block i of M on device (s, i) of
      every slice (weight-update sharding inside the slice; no stage 3).
    worker: None, or this device's worker residuals, one float32
      `(ceil(size / M),)` shard per leaf (`ErrorFeedbackState.zeros(...,
      slices=S)`), a pytree like `tree`.
    hop: None, or the cross-slice algorithm's residuals, like `worker` but
      `(ceil(ceil(size / M) / S),)` for "two_shot".

  Returns:
    `(sums, new_worker, new_hop)`: the sum over all S·M devices (or with
    `scatter` the shards) in each leaf's dtype, and the new residuals
    (those of leaves sent exactly unchanged; None where not given).

  Raises:
    ValueError: not two axes, or residuals of another shape.

  Examples:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> from jax.sharding import Mesh, PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> devices = np.array(jax.devices())  # 2 slices of 4 with 8 devices
    >>> slices = 2 if devices.size % 2 == 0 else 1
    >>> mesh = Mesh(devices.reshape(slices, -1), ("dcn", "ici"))
    >>> sync = dp.GradSync("hierarchical", comm_dtype="int8")
    >>> f = jax.jit(jax.shard_map(
    ...     lambda g: dp.sync_gradients(g, ("dcn", "ici"), sync), mesh=mesh,
    ...     in_specs=P(("dcn", "ici")), out_specs=P(("dcn", "ici")), check_vma=False))
    >>> g = jnp.repeat(jnp.arange(float(mesh.size)), 6)  # replica k's gradient: six k's
    >>> bool(jnp.allclose(f(g), (mesh.size - 1) / 2))
    True

  References:
    Google Cloud, "Cloud TPU Multislice overview",
    https://cloud.google.com/tpu/docs/multislice-introduction; Tang et al.,
    "1-bit Adam: Communication Efficient Large-Scale Training with Adam's
    Convergence Speed", ICML 2021, https://arxiv.org/abs/2102.02888;
    Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
    clusters of workstations", 2009 (rings); Karimireddy et al., "Error
    Feedback Fixes SignSGD and other Gradient Compression Schemes", ICML
    2019, https://arxiv.org/abs/1901.09847.
  """
  outer, inner = check_axes(axes)
  axes_t = (outer, *compat.as_tuple(inner))
  s, m = compat.axis_size(outer), compat.axis_size(inner)
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [jnp.asarray(x) for x in leaves]
  dims = [us.update_shard_axis(x.shape, m) if scatter else None for x in leaves]
  fmt = sync.format
  low, exact = lp.split_floats(leaves) if fmt is not None else ([], list(range(len(leaves))))
  lossy = set(low)
  cast = [jnp.float32 if i in lossy else acc_dtype(x.dtype) for i, x in enumerate(leaves)]
  pieces = _scatter_in_slice([x.astype(c) for x, c in zip(leaves, cast, strict=True)],
                             dims, inner, s, m)
  worker_l = None if worker is None else jax.tree.leaves(worker)
  hop_l = None if hop is None else jax.tree.leaves(hop)
  _check_residuals(pieces, worker_l, hop_l, s, m, sync.dcn_algorithm)
  new_worker = None if worker_l is None else list(worker_l)
  new_hop = None if hop_l is None else list(hop_l)
  if low and sync.block_size and not sync.uses_aps:
    # Shards too small to fill their blocks cross in float32, exactly, with
    # whatever their residuals hold (then zero): nothing is lost.
    small = [i for i in low if exact_is_smaller(pieces[i].size, s, sync.block_size, fmt.bits)]
    me = lax.axis_index(outer)
    for i in small:
      p = pieces[i]
      if worker_l is not None:
        p = p + worker_l[i].astype(jnp.float32)
        new_worker[i] = jnp.zeros_like(worker_l[i])
      if hop_l is not None:
        h = hop_l[i].astype(jnp.float32)
        if sync.dcn_algorithm == "two_shot":  # this slice owns chunk `me` of the shard
          h = lax.dynamic_update_slice(jnp.zeros((s * h.size,), jnp.float32), h,
                                       (me * h.size,))[: p.size]
        p = p + h
        new_hop[i] = jnp.zeros_like(hop_l[i])
      pieces[i] = p
    low = [i for i in low if i not in small]
    exact = sorted(exact + small)
  reduced: list[Any] = [None] * len(leaves)
  for i, r in zip(exact, _exact_across([pieces[i] for i in exact], outer), strict=True):
    reduced[i] = r
  if low:
    ps = [pieces[i] for i in low]
    if worker_l is not None:  # the residual rides with the shard it was left on
      ps = [p + worker_l[i].astype(jnp.float32) for p, i in zip(ps, low, strict=True)]
    scaling = None
    if sync.uses_aps or not sync.measures_scales:  # APS for the S-term sum, and NaN flags
      ps, scaling = lp.prepare(ps, axes_t, s, fmt, sync.uses_aps)
    shift = lambda v, j, sign: v if scaling is None else jnp.ldexp(v, sign * scaling.exponents[j])
    hops = None if hop_l is None else [
        shift(hop_l[i].astype(jnp.float32), j, 1) for j, i in enumerate(low)]
    dev_fmt = lp.device_format(fmt, axes_t, key)
    # Every shard is summed whole across the slices.
    if sync.dcn_algorithm == "two_shot":
      sums, hops, sent = ts.two_shot_sum(ps, [None] * len(ps), outer, sync, s, dev_fmt, hops)
    else:
      sent = ps if worker_l is None else [ef.compress(p, dev_fmt, sync) for p in ps]
      sums, hops = _ring_across(sent, outer, sync, dev_fmt, hops)
    for j, i in enumerate(low):
      r = sums[j].reshape(-1)
      reduced[i] = r if scaling is None else scaling.undo(j, r)
      if new_worker is not None:
        diff = ps[j] - sent[j].reshape(-1)
        new_worker[i] = shift(diff, j, -1).astype(worker_l[i].dtype)
      if hops is not None:
        new_hop[i] = shift(hops[j].reshape(-1), j, -1).astype(hop_l[i].dtype)
  whole = [i for i, d in enumerate(dims) if d is None]
  gathered = _gather_in_slice(reduced, leaves, whole, inner)
  out = []
  for i, x in enumerate(leaves):
    full = gathered[i] if dims[i] is None else us.shard_from_chunk(reduced[i], x.shape,
                                                                   dims[i], m)
    out.append(full != 0 if x.dtype == jnp.bool_ else full.astype(x.dtype))
  unflatten = lambda like, new: None if new is None else jax.tree.unflatten(
      jax.tree.structure(like), new)
  return jax.tree.unflatten(treedef, out), unflatten(worker, new_worker), unflatten(hop, new_hop)
