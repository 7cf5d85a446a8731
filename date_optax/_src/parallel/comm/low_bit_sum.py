"""Sums and reduce-scatters whose payload travels in a low-bit format.

The algorithms of `collectives.py` (psum, ring, 2-D torus) carry a
`low_precision.CommFormat` here: one packed buffer rounded at every hop of the
ring or torus, or one `lax.psum` on the wire dtype. With block scales
(`block_size`) or the measured per-layer shift, every message carries scales
measured on it (`low_precision.ScaledFormat`). `grad_sync.py` calls
`low_precision_sum` for an all-reduce and `low_precision_reduce_scatter` for
a sharded update.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm.collectives import (
  all_gather_blocks,
  blockwise_all_reduce,
  pad_to,
  reduce_scatter_blocks,
  send_with_feedback,
)
from date_optax._src.parallel.comm.low_precision import CommFormat


def _scaled_layout(
    pieces: list[jax.Array], fmt: Any, block_size: int | None, algorithm: str
) -> tuple[list[jax.Array], Any, np.ndarray | None]:
  """Lays out arrays for a sum whose scales are measured at every hop.

  With `block_size` B each piece's last axis is zero-padded to whole blocks
  (a block never mixes two arrays) and the codec carries one scale per
  block; without, the codec carries one scale per piece (the measured
  per-layer shift) and `ids` gives the piece of each element of the last
  axis. Returns `(pieces, codec, ids)`.
  """
  if algorithm == "psum":
    raise ValueError(
        "block_size/measured_shift need algorithm 'ring' or 'torus', got 'psum'."
    )
  if block_size is not None:
    pieces = [pad_to(p, block_size) for p in pieces]
    return pieces, lp.ScaledFormat(fmt, block_size=block_size), None
  ids = np.concatenate(
      [np.full(p.shape[-1], i, np.int32) for i, p in enumerate(pieces)]
  )
  return pieces, lp.ScaledFormat(fmt, groups=len(pieces)), ids


def _block_unit(algorithm: str, block_size: int | None) -> int:
  """The alignment of a scaled buffer's rows: a block (two for the torus)."""
  return (2 if algorithm == "torus" else 1) * (block_size or 1)


def _index(axes: Any) -> jax.Array:
  axes = compat.as_tuple(axes)
  return lax.axis_index(axes if len(axes) > 1 else axes[0])


def _own_row(rows: jax.Array, axes: Any) -> jax.Array:
  """Row k of `rows` (n, c), k this device's row-major index over `axes`."""
  return lax.dynamic_index_in_dim(rows, _index(axes), 0, keepdims=False)


def _set_own_row(rows: jax.Array, row: jax.Array, axes: Any) -> jax.Array:
  return lax.dynamic_update_slice_in_dim(rows, row[None], _index(axes), 0)


def _split(flat: jax.Array, shapes: list[tuple[int, ...]], widths: list[int]) -> list[jax.Array]:
  """Consecutive pieces of `flat`, `widths[i]` long, the first `prod(shapes[i])`
  of each reshaped to `shapes[i]`."""
  out, offset = [], 0
  for shape, w in zip(shapes, widths, strict=True):
    out.append(flat[offset : offset + int(np.prod(shape))].reshape(shape))
    offset += w
  return out


def _scaled_reduce_scatter(
    rows: jax.Array,
    ids: np.ndarray | None,
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    codec: Any,
    block_size: int | None,
    feedback: Any = None,
) -> tuple[jax.Array, np.ndarray | None, Any]:
  """Reduce-scatters `rows` `(n, m)` with scales measured at every hop.

  The columns are zero-padded to whole blocks (`_block_unit`), and the
  group ids `ids` `(n, m)` (measured per-layer shift; `None` with blocks)
  edge-padded alike, and `feedback` (the hop residuals, `(n, m)` or None)
  zero-padded. Returns this device's chunk, the padded ids and the new
  feedback (None without).
  """
  unit = _block_unit(algorithm, block_size)
  rows = pad_to(rows, unit)
  if ids is not None:
    ids = np.pad(ids, ((0, 0), (0, rows.shape[1] - ids.shape[1])), mode="edge")
  if feedback is None:
    chunk = reduce_scatter_blocks(rows, axes, algorithm, grid=grid, fmt=codec, gids=ids)
    return chunk, ids, None
  chunk, feedback = reduce_scatter_blocks(rows, axes, algorithm, grid=grid, fmt=codec,
                                          gids=ids, feedback=pad_to(feedback, unit))
  return chunk, ids, feedback


def _scaled_sum(
    xs: list[jax.Array],
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    fmt: Any,
    block_size: int | None,
    feedback: list[jax.Array] | None = None,
) -> tuple[list[jax.Array], list[jax.Array] | None]:
  """Ring/torus sum of float32 arrays with scales measured at every hop.

  With `block_size` B each array is zero-padded to whole blocks (a block
  never mixes two layers) and the buffer to `n` rows of a multiple of B
  elements (2B for the torus, which halves the rows); without, every element
  carries the index of its array as segment id (the measured per-layer
  shift: one scale per layer piece in each message). `feedback`, arrays
  shaped like `xs`, are the hop residuals, laid out the same way.
  """
  n = compat.axis_size(axes)
  unit = n * _block_unit(algorithm, block_size)
  flat, codec, ids = _scaled_layout([x.reshape(-1) for x in xs], fmt, block_size, algorithm)
  buf = pad_to(jnp.concatenate(flat), unit)
  if ids is not None:
    ids = np.pad(ids, (0, buf.size - ids.size), mode="edge").reshape(n, -1)
  fb = None
  if feedback is not None:
    fb = _scaled_layout([f.reshape(-1) for f in feedback], fmt, block_size, algorithm)[0]
    fb = pad_to(jnp.concatenate(fb), unit).reshape(n, -1)
  chunk, ids, fb = _scaled_reduce_scatter(buf.reshape(n, -1), ids, axes, algorithm, grid,
                                          codec, block_size, fb)
  if fb is None:
    out_flat = all_gather_blocks(chunk, axes, algorithm, grid=grid, fmt=codec, gids=ids)
  else:
    out_flat, row = all_gather_blocks(chunk, axes, algorithm, grid=grid, fmt=codec,
                                      gids=ids, feedback=_own_row(fb, axes))
    fb = _split(_set_own_row(fb, row, axes).reshape(-1), [x.shape for x in xs],
                [f.size for f in flat])
  out = _split(out_flat.reshape(-1), [x.shape for x in xs], [f.size for f in flat])
  return out, fb


def low_precision_reduce_scatter(
    blocks: list[jax.Array],
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    fmt: Any,
    *,
    block_size: int | None = None,
    measured_shift: bool = False,
    feedback: list[jax.Array] | None = None,
) -> Any:
  """Reduce-scatters float32 `(n, c_i)` arrays with the payload in `fmt`.

  Device k (row-major over `axes`) gets row k of the sum of each array,
  `(c_i,)`, rounded as the final sum would travel (the shard of a sharded
  update). With `block_size` each array's columns are zero-padded to whole
  blocks (2 blocks' worth of alignment for the torus) so that no block
  mixes two arrays; with `measured_shift` each array's piece is one group.

  `feedback`, `(n, c_i)` arrays like `blocks` ("ring"/"torus"), are this
  device's hop residuals: row j != k those of the partial sums it forwards,
  row k that of its final rounding; with them the result is `(rows, new
  feedback)`.
  """
  widths = [b.shape[1] for b in blocks]
  n = blocks[0].shape[0]
  fb = None
  if block_size is None and not measured_shift:
    rows, padded_widths, codec, gid = jnp.concatenate(blocks, axis=1), widths, fmt, None
    if feedback is not None:
      fb = jnp.concatenate(feedback, axis=1)
      chunk, fb = reduce_scatter_blocks(rows, axes, algorithm, grid=grid, fmt=fmt,
                                        feedback=fb)
    else:
      chunk = reduce_scatter_blocks(rows, axes, algorithm, grid=grid, fmt=fmt)
  else:
    blocks, codec, ids = _scaled_layout(blocks, fmt, block_size, algorithm)
    padded_widths = [b.shape[1] for b in blocks]
    if ids is not None:
      ids = np.tile(ids, (n, 1))
    if feedback is not None:
      fb = jnp.concatenate(_scaled_layout(feedback, fmt, block_size, algorithm)[0], axis=1)
    chunk, ids, fb = _scaled_reduce_scatter(jnp.concatenate(blocks, axis=1), ids, axes,
                                            algorithm, grid, codec, block_size, fb)
    gid = None if ids is None else jnp.asarray(ids[0])
  if fb is None:
    chunk = codec.round(chunk, gid) if gid is not None else codec.round(chunk)
  else:
    wire, row = send_with_feedback(codec, chunk + _own_row(fb, axes), gid)
    chunk = codec.decode(wire, gid) if gid is not None else codec.decode(wire)
    fb = _set_own_row(fb, row, axes)
  out, fb_out, offset = [], [], 0
  for w, pw in zip(widths, padded_widths, strict=True):
    out.append(chunk[offset : offset + w])
    if fb is not None:
      fb_out.append(fb[:, offset : offset + w])
    offset += pw
  return out if fb is None else (out, fb_out)


def low_precision_sum(
    xs: list[jax.Array],
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    fmt: CommFormat,
    *,
    block_size: int | None = None,
    measured_shift: bool = False,
    feedback: list[jax.Array] | None = None,
) -> Any:
  """Sums float32 arrays (already shifted) with the payload in `fmt`.

  One packed buffer for "ring"/"torus" (rounded at every hop), one
  `lax.psum` per array on the wire dtype for "psum". With `block_size` or
  `measured_shift` ("ring"/"torus" only) each message carries scales
  measured on it (`lp.ScaledFormat`): one per block of `block_size`
  elements, or one per layer piece.

  `feedback`, arrays shaped like `xs` ("ring"/"torus" only), are this
  device's residuals of every rounding it applies to a message: each hop's
  partial sum and the payload of the gather, laid out like the packed
  buffer (`reduce_scatter_blocks`); with them the result is `(sums, new
  feedback)`.
  """
  if block_size is not None or measured_shift:
    out, fb = _scaled_sum(xs, axes, algorithm, grid, fmt, block_size, feedback)
    return out if feedback is None else (out, fb)
  if algorithm == "psum":
    if feedback is not None:
      raise ValueError("lax.psum has no hops whose rounding could be fed back.")
    return [fmt.decode(lax.psum(fmt.encode(x), compat.as_tuple(axes))) for x in xs]
  shapes = [x.shape for x in xs]
  sizes = [x.size for x in xs]
  if feedback is None:
    flat = blockwise_all_reduce(algorithm, axes, grid, fmt)(
        jnp.concatenate([x.reshape(-1) for x in xs])
    )
    return _split(flat, shapes, sizes)
  n = compat.axis_size(axes)
  rows = lambda ys: pad_to(jnp.concatenate([y.reshape(-1) for y in ys]), n).reshape(n, -1)
  chunk, fb = reduce_scatter_blocks(rows(xs), axes, algorithm, grid=grid, fmt=fmt,
                                    feedback=rows(feedback))
  out, row = all_gather_blocks(chunk, axes, algorithm, grid=grid, fmt=fmt,
                               feedback=_own_row(fb, axes))
  fb = _set_own_row(fb, row, axes)
  return _split(out.reshape(-1), shapes, sizes), _split(fb.reshape(-1), shapes, sizes)
