"""The two-shot compressed reduction: one all-to-all, a float32 sum, one all-gather.

DeepSpeed's 1-bit Adam/LAMB (Tang et al. 2021, Li et al. 2021) reduce a
compressed gradient in two collectives instead of a ring's `2(N-1)` rounds:
each replica cuts its contribution into N chunks and compresses it once
(its *worker* residual keeps what the rounding dropped), one
`lax.all_to_all` hands chunk k of every replica to replica k, the owner
decodes the N chunks and sums them in float32, compresses its sum once (its
*server* residual, 1/N of the gradient) and one `lax.all_gather` returns
every owner's chunk. Two roundings per element, whatever N.

Layout: every leaf becomes `(N, c)` rows, row k the part replica k owns.
A leaf that weight-update sharding splits (`scatter=True`) is laid out by
`update_sharding.to_blocks` along its split axis, so row k is exactly
replica k's shard and the owner's rounded sum *is* the shard: no all-gather
for it. Every other leaf is flattened row-major and zero-padded to a
multiple of N, `c = ceil(size / N)`. With block scales each leaf's row is
then zero-padded to whole blocks (a block never mixes two leaves) and every
message carries one 8-bit exponent per block; with the measured shift one
exponent per leaf piece of the message. Block scales rounded to nearest
encode each row on its own, never the flattened buffer: the bytes are those
of the flat encoding cut into rows, and on a TPU, whose arrays lie in tiles
of 8 rows by 128 lanes, flattening an `(N, c)` buffer is a copy of all of it
in another layout (stochastic rounding draws its bits over the flat buffer,
and the measured shift its segment ids, so those stay flat). The worker
residual has the leaf's shape, and the block padding is never stored. The
server residual of a leaf is `(ceil(size / N),)` on every device, with or
without `scatter`, so where N does not divide a whole leaf the last
owners' chunks hold its `N·c - size` pad positions (fewer than N elements
per leaf in all). Those stay zero: zeros are sent there and a zero sum
rounds to zero in every format, so they carry nothing into the next step.

Column blocks. With block scales rounded to nearest, a leaf of two or more
dimensions is viewed as rows of its last dimension C (its split axis moved
first when weight-update sharding splits it). Where those rows divide
evenly among the N replicas, `R = N·r`, and the r rows of a replica are a
whole number of blocks (or at least 8 blocks, the last padded with zero
rows), the leaf is laid out as `(N, r, C)` and each `block_size`
consecutive rows of one column share a scale. Replica k's rows are the
same elements as the flat layout's chunk k (or its shard), so the
residuals are the same arrays. On a TPU those values lie in one column of
the 8 × 128 tiles: the max-abs, scale, round and residual of a block run as
a few fusions over the leaf where it lies, where blocks of 32 consecutive
elements on 128 lanes made the compiler relayout the whole gradient
(ResNet-50 on a v3-8: 1.55 GB accessed and 75 MB of temporaries, down from
7.06 GB and 1,145 MB, by the compiler's estimates). Payloads under 4 MiB
with the same last dimension and wire dtype travel in one collective,
concatenated along their rows; larger ones in their own. Where rows per
replica are fewer than a block (many replicas, small leaves) the flat
layout stays. Blocks change which values share a scale, not how a block
rounds; `tests/test_two_shot.py` checks both layouts against NumPy.

`grad_sync` calls `two_shot_sum` for the low-precision leaves of
`GradSync("two_shot", ...)`; its exact leaves go through
`collectives`' "two_shot" entry (an all-to-all and a float32 sum).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm import update_sharding as us
from date_optax._src.parallel.comm.collectives import pad_to, send_with_feedback


def chunk_size(size: int, n: int) -> int:
  """Elements of a leaf of `size` elements that one of `n` replicas owns."""
  return -(-int(size) // int(n))


def _rows(x: jax.Array, d: int | None, n: int) -> jax.Array:
  """A leaf as `(n, c)` rows, row k the part replica k owns."""
  if d is not None:
    return us.to_blocks(x, d, n)
  return pad_to(x.reshape(-1), n).reshape(n, -1)


def _from_rows(rows: jax.Array, shape: tuple[int, ...], d: int | None) -> jax.Array:
  if d is not None:
    return us.from_blocks(rows, shape, d)
  return rows.reshape(-1)[: math.prod(shape)].reshape(shape)


class _Codec:
  """Encodes `(r, w)` rows as `r` messages (payload, then the scales) at once.

  Plain formats round every element (clipped to the format's range first, as
  `send_with_feedback` does); with `block_size` one scale per block of a
  row, with `ids` (the leaf of each column) one scale per leaf piece of a
  row. One `encode` call per place that rounds, so a stochastic rounding
  draws one key per place, fresh for every element.
  """

  def __init__(self, fmt: Any, block_size: int | None, ids: np.ndarray | None):
    self.fmt, self.block_size, self.ids = fmt, block_size, ids
    self.groups = None if ids is None else int(ids.max(initial=-1)) + 1

  def _scaled(self, rows: int) -> Any:
    if self.block_size is not None:
      return lp.ScaledFormat(self.fmt, block_size=self.block_size), None
    gid = (np.arange(rows)[:, None] * self.groups + self.ids[None]).reshape(-1)
    return lp.ScaledFormat(self.fmt, groups=rows * self.groups), jnp.asarray(gid, jnp.int32)

  def encode(self, t: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(wire, sent)`: `(r, m)` messages and the `(r, w)` values they decode to."""
    r, w = t.shape
    if self.block_size is None and self.ids is None:
      wire, rest = send_with_feedback(self.fmt, t)
      return wire, t - rest
    if self.block_size is not None and lp.rounding_counter(self.fmt) is None:
      # Rounding to nearest: each row alone, never flattened (on a TPU a
      # flat copy of an (r, w) buffer is a relayout of all of it).
      codec, _ = self._scaled(1)
      wire, rest = jax.vmap(lambda row: send_with_feedback(codec, row))(t)
      return wire, t - rest
    codec, gid = self._scaled(r)
    flat = t.reshape(-1)
    wire, rest = send_with_feedback(codec, flat, gid)
    sent = (flat - rest).reshape(r, w)
    # The message of the whole buffer is the payload of every row, then the
    # scales of every row: regrouped, row j is what encoding row j alone gives.
    msgs = jnp.concatenate([wire[: r * w].reshape(r, w), wire[r * w :].reshape(r, -1)], axis=1)
    return msgs, sent

  def decode(self, msgs: jax.Array) -> jax.Array:
    """`(r, m)` messages -> `(r, w)` float32 values (exact)."""
    if self.block_size is None and self.ids is None:
      return self.fmt.decode(msgs)
    if self.block_size is not None:
      return jax.vmap(lp.ScaledFormat(self.fmt, block_size=self.block_size).decode)(msgs)
    codec, ids = lp.ScaledFormat(self.fmt, groups=self.groups), jnp.asarray(self.ids, jnp.int32)
    return jax.vmap(lambda m: codec.decode(m, ids))(msgs)


# -- column blocks ------------------------------------------------------------

#: A replica's rows of a leaf that is not a whole number of blocks are padded
#: with zero rows to the next block when they span at least this many blocks
#: (at most 1/8 more on the wire); fewer, and the leaf keeps the flat layout.
_MIN_PADDED_BLOCKS = 8


def _moved(shape: tuple[int, ...], d: int | None) -> tuple[int, ...]:
  """The shape of a leaf with its split axis `d` (if any) first."""
  if d is None:
    return tuple(shape)
  return (shape[d],) + tuple(v for i, v in enumerate(shape) if i != d)


def column_rows(shape: tuple[int, ...], n: int, block_size: int,
                d: int | None = None) -> int | None:
  """Rows per replica, padded to whole blocks, of a column-blocked leaf.

  The leaf is viewed as rows of its last dimension, after moving its split
  axis `d` (weight-update sharding; None: whole) first, so that replica k's
  rows are its chunk (or its shard). None where the leaf keeps the flat
  layout: fewer than two dimensions, rows that do not divide by `n`, or rows
  per replica that are neither a whole number of blocks nor at least
  `_MIN_PADDED_BLOCKS` blocks.
  """
  moved = _moved(shape, d)
  if len(moved) < 2 or moved[-1] == 0:
    return None
  rows = math.prod(moved[:-1])
  if rows % n:
    return None
  r = rows // n
  padded = -(-r // block_size) * block_size
  if r == 0 or (padded != r and r < _MIN_PADDED_BLOCKS * block_size):
    return None
  return padded


def _pow2(e: jax.Array) -> jax.Array:
  """2^e as float32, exactly, for integer e in [-126, 127] (its bits)."""
  return lax.bitcast_convert_type((e.astype(jnp.int32) + 127) << 23, jnp.float32)


class _ColumnCodec:
  """One scale per `block_size` consecutive rows of one column.

  `encode` takes `(..., p, C)` float32 with p a multiple of `block_size` and
  returns the payload `(..., p, C)` in the format's container, the exponents
  `(..., p / block_size, C)` int8 (`lp.ScaledFormat`'s rule: -128 for a block
  holding a NaN or Inf) and the values they decode to.
  """

  def __init__(self, fmt: Any, block_size: int):
    self.fmt, self.b = fmt, block_size
    self.container = lp.ScaledFormat(fmt, block_size=block_size).container

  def _blocks(self, t: jax.Array) -> jax.Array:
    *lead, p, c = t.shape
    return t.reshape(*lead, p // self.b, self.b, c)

  def encode(self, t: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    v = self._blocks(t)
    # max(max, -min) reads the block once; a NaN or Inf makes it non-finite.
    m = jnp.maximum(jnp.max(v, axis=-2), -jnp.min(v, axis=-2))
    bad = ~jnp.isfinite(m)
    e = jnp.where(bad, lp.NONFINITE_EXP, lp.group_exponents(jnp.where(bad, 0.0, m),
                                                             self.fmt.max))
    scale = _pow2(-jnp.where(bad, 0, e))[..., None, :]
    payload = self.fmt.encode(v * scale)
    if payload.dtype != self.container:
      payload = lax.bitcast_convert_type(payload, self.container)
    payload, exps = payload.reshape(t.shape), e.astype(jnp.int8)
    # The barrier keeps XLA from folding a float format's convert pair.
    sent = self.decode(*lax.optimization_barrier((payload, exps)))
    return payload, exps, sent

  def decode(self, payload: jax.Array, exps: jax.Array) -> jax.Array:
    if self.fmt.wire_dtype != self.container:
      payload = lax.bitcast_convert_type(payload, self.fmt.wire_dtype)
    e = exps.astype(jnp.int32)[..., None, :]
    bad = e == lp.NONFINITE_EXP
    out = self._blocks(self.fmt.decode(payload)) * _pow2(jnp.where(bad, 0, e))
    return jnp.where(bad, jnp.nan, out).reshape(payload.shape)


#: Arrays of at least this many bytes travel in a collective of their own;
#: smaller ones with the same last dimension and dtype share one (each
#: concatenation is a copy, each collective a latency).
_ALONE_BYTES = 4 << 20


def _by_lanes(arrays: list[jax.Array]) -> list[list[int]]:
  """Indices of the arrays that share one collective: the small ones with
  the same last dimension and dtype (concatenated along their rows)."""
  groups: dict[Any, list[int]] = {}
  for i, a in enumerate(arrays):
    key = i if a.size * a.dtype.itemsize >= _ALONE_BYTES else (a.shape[-1], a.dtype)
    groups.setdefault(key, []).append(i)
  return list(groups.values())


def _all_to_all(arrays: list[jax.Array], axes: tuple) -> list[jax.Array]:
  """Row block k of every `(n, p_i, C)` array to replica k, one collective
  per group of `_by_lanes`."""
  out: list[Any] = [None] * len(arrays)
  for idx in _by_lanes(arrays):
    cuts = np.cumsum([0] + [arrays[i].shape[1] for i in idx])
    got = lax.all_to_all(jnp.concatenate([arrays[i] for i in idx], axis=1), axes, 0, 0,
                         tiled=True)
    for j, i in enumerate(idx):
      out[i] = got[:, int(cuts[j]) : int(cuts[j + 1])]
  return out


def _all_gather(arrays: list[jax.Array], axes: tuple) -> list[jax.Array]:
  """Every replica's `(p_i, C)` arrays as `(n, p_i, C)`, one collective per
  group of `_by_lanes`."""
  out: list[Any] = [None] * len(arrays)
  for idx in _by_lanes(arrays):
    cuts = np.cumsum([0] + [arrays[i].shape[0] for i in idx])
    got = lax.all_gather(jnp.concatenate([arrays[i] for i in idx], axis=0), axes, axis=0)
    for j, i in enumerate(idx):
      out[i] = got[:, int(cuts[j]) : int(cuts[j + 1])]
  return out


def _column_sum(
    xs: list[jax.Array], dims: list[int | None], pads: list[int], axes: tuple, n: int,
    codec: _ColumnCodec, hop: list[jax.Array] | None,
) -> tuple[list[jax.Array], list[jax.Array] | None, list[jax.Array]]:
  """`two_shot_sum` for column-blocked leaves (`pads`: their padded rows per
  replica, `column_rows`)."""
  views, shapes = [], []
  for x, d, p in zip(xs, dims, pads, strict=True):
    moved = x if d is None else jnp.moveaxis(x, d, 0)
    shapes.append(moved.shape)
    v = moved.reshape(n, -1, moved.shape[-1])
    views.append(jnp.pad(v, ((0, 0), (0, p - v.shape[1]), (0, 0))) if p != v.shape[1] else v)
  rows = [math.prod(m[:-1]) // n for m in shapes]
  # Stage 1: every replica's rows k, rounded once, to replica k and summed there.
  enc = [codec.encode(v) for v in views]
  k = len(xs)
  got = _all_to_all([q for q, _, _ in enc] + [e for _, e, _ in enc], axes)
  chunks = [jnp.sum(codec.decode(q, e), axis=0) for q, e in zip(got[:k], got[k:], strict=True)]
  if hop is not None:
    chunks = [c + jnp.pad(h.reshape(r, -1), ((0, c.shape[0] - r), (0, 0)))
              for c, h, r in zip(chunks, hop, rows, strict=True)]
  # Stage 2: the owner's sum rounded once; a whole leaf's rows go to
  # everyone, a split leaf's are this replica's shard.
  enc2 = [codec.encode(c) for c in chunks]
  whole = [j for j, d in enumerate(dims) if d is None]
  got = _all_gather([enc2[j][0] for j in whole] + [enc2[j][1] for j in whole], axes)
  sums, sent, new_hop = [], [], None if hop is None else []
  for j, (x, d, r) in enumerate(zip(xs, dims, rows, strict=True)):
    if d is None:
      w = whole.index(j)
      sums.append(codec.decode(got[w], got[len(whole) + w])[:, :r].reshape(x.shape))
    else:
      sums.append(us.shard_from_chunk(enc2[j][2][:r], x.shape, d, n))
    sent_rows = enc[j][2][:, :r]
    sent.append(sent_rows.reshape(x.shape) if d is None else
                us.from_blocks(sent_rows.reshape(n, -1), x.shape, d))
    if new_hop is not None:
      new_hop.append((chunks[j] - enc2[j][2])[:r].reshape(-1))
  return sums, new_hop, sent


def _codec(fmt: Any, sync: Any, widths: list[int]) -> _Codec:
  ids = None
  if sync.measured_shift:
    ids = np.concatenate([np.full(w, i, np.int32) for i, w in enumerate(widths)])
  return _Codec(fmt, sync.block_size, ids)


def two_shot_sum(
    xs: list[jax.Array],
    dims: list[int | None],
    axes: Any,
    sync: Any,
    n: int,
    fmt: Any,
    hop: list[jax.Array] | None = None,
) -> tuple[list[jax.Array], list[jax.Array] | None, list[jax.Array]]:
  """Sums float32 leaves over the replicas in two compressed collectives.

  `xs` are this replica's contributions (float32, APS-shifted where APS is
  on, its worker residual already added), `dims` each leaf's split axis
  (`scatter`) or None, `fmt` the format with the device's rounding key,
  `hop` this device's server residuals, one `(ceil(size / n),)` array per
  leaf in the same units, or None. Every contribution is compressed once in
  its chunk layout, so `C(x)` below is what travels.

  Returns:
    `(sums, new_hop, sent)`: each leaf's sum (this replica's shard of it for
    a split leaf), the new server residuals (None without), and `C(x)`, the
    contributions as they were sent, shaped like `xs` (the caller keeps
    `x - C(x)` as the worker residual).

  Raises:
    ValueError: a server residual that is not `(ceil(size / n),)`.
  """
  axes_t = compat.as_tuple(axes)
  for x, h in zip(xs, hop or [], strict=False):
    if h.shape != (chunk_size(x.size, n),):
      raise ValueError(
          f"two_shot's server residual of a leaf of shape {x.shape} over {n} replicas "
          f"is ({chunk_size(x.size, n)},) (1/N of it), got {h.shape}: build it with "
          "ErrorFeedbackState.zeros(grads, grad_sync, chunks=N)."
      )
  pads: dict[int, int] = {}
  if sync.block_size is not None and lp.rounding_counter(fmt) is None:
    for i, (x, d) in enumerate(zip(xs, dims, strict=True)):
      p = column_rows(x.shape, n, sync.block_size, d)
      if p is not None:
        pads[i] = p
  sums: list[Any] = [None] * len(xs)
  sent: list[Any] = [None] * len(xs)
  new_hop: list[Any] | None = None if hop is None else [None] * len(xs)
  if pads:
    cols = list(pads)
    got = _column_sum([xs[i] for i in cols], [dims[i] for i in cols], [pads[i] for i in cols],
                      axes_t, n,
                      _ColumnCodec(fmt, sync.block_size),
                      None if hop is None else [hop[i] for i in cols])
    for j, i in enumerate(cols):
      sums[i], sent[i] = got[0][j], got[2][j]
      if new_hop is not None:
        new_hop[i] = got[1][j]
    if len(cols) == len(xs):
      return sums, new_hop, sent
  # The flat layout. Whole leaves first, then the split ones: each stage-2
  # part is one slice.
  whole = [i for i, d in enumerate(dims) if d is None and i not in pads]
  order = whole + [i for i, d in enumerate(dims) if d is not None and i not in pads]
  rows = [_rows(xs[i], dims[i], n) for i in order]
  widths = [r.shape[1] for r in rows]
  unit = sync.block_size or 1
  padded = [pad_to(r, unit) for r in rows]
  pwidths = [p.shape[1] for p in padded]
  starts = np.cumsum([0] + pwidths)
  # Stage 1: every chunk compressed once, chunk k to replica k, summed there.
  codec = _codec(fmt, sync, pwidths)
  wire, sent_rows = codec.encode(jnp.concatenate(padded, axis=1))
  chunk = jnp.sum(codec.decode(lax.all_to_all(wire, axes_t, 0, 0, tiled=True)), axis=0)
  if hop is not None:
    chunk = chunk + jnp.concatenate([pad_to(hop[i], unit) for i in order])
  # Stage 2: the owner's sum compressed once; the whole leaves' part
  # gathered, the split ones' kept (the owner's chunk is its shard).
  cut = len(whole)
  own, gathered = [], None
  for gather, lo, hi, pw in ((True, 0, starts[cut], pwidths[:cut]),
                             (False, starts[cut], starts[-1], pwidths[cut:])):
    if pw:
      part = _codec(fmt, sync, pw)
      msg, rounded = part.encode(chunk[int(lo) : int(hi)][None])
      own.append(rounded[0])
      if gather:
        gathered = part.decode(lax.all_gather(msg[0], axes_t, axis=0))
  own = jnp.concatenate(own) if own else chunk
  for j, i in enumerate(order):
    a, w = int(starts[j]), widths[j]
    if dims[i] is None:
      sums[i] = _from_rows(gathered[:, a : a + w], xs[i].shape, None)
    else:
      sums[i] = us.shard_from_chunk(own[a : a + w], xs[i].shape, dims[i], n)
    sent[i] = _from_rows(sent_rows[:, a : a + w], xs[i].shape, dims[i])
    if new_hop is not None:
      new_hop[i] = chunk[a : a + w] - own[a : a + w]
  return sums, new_hop, sent
