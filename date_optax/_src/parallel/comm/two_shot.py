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
  # Whole leaves first, then the split ones: each stage-2 part is one slice.
  whole = [i for i, d in enumerate(dims) if d is None]
  order = whole + [i for i, d in enumerate(dims) if d is not None]
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
  sums: list[Any] = [None] * len(xs)
  sent: list[Any] = [None] * len(xs)
  new_hop: list[Any] | None = None if hop is None else [None] * len(xs)
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
