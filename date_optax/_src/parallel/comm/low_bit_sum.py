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


def _scaled_reduce_scatter(
    rows: jax.Array,
    ids: np.ndarray | None,
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    codec: Any,
    block_size: int | None,
) -> tuple[jax.Array, np.ndarray | None]:
  """Reduce-scatters `rows` `(n, m)` with scales measured at every hop.

  The columns are zero-padded to whole blocks (`_block_unit`), and the
  group ids `ids` `(n, m)` (measured per-layer shift; `None` with blocks)
  edge-padded alike. Returns this device's chunk and the padded ids.
  """
  rows = pad_to(rows, _block_unit(algorithm, block_size))
  if ids is not None:
    ids = np.pad(ids, ((0, 0), (0, rows.shape[1] - ids.shape[1])), mode="edge")
  chunk = reduce_scatter_blocks(rows, axes, algorithm, grid=grid, fmt=codec, gids=ids)
  return chunk, ids


def _scaled_sum(
    xs: list[jax.Array],
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    fmt: Any,
    block_size: int | None,
) -> list[jax.Array]:
  """Ring/torus sum of float32 arrays with scales measured at every hop.

  With `block_size` B each array is zero-padded to whole blocks (a block
  never mixes two layers) and the buffer to `n` rows of a multiple of B
  elements (2B for the torus, which halves the rows); without, every element
  carries the index of its array as segment id (the measured per-layer
  shift: one scale per layer piece in each message).
  """
  n = compat.axis_size(axes)
  flat, codec, ids = _scaled_layout([x.reshape(-1) for x in xs], fmt, block_size, algorithm)
  buf = pad_to(jnp.concatenate(flat), n * _block_unit(algorithm, block_size))
  if ids is not None:
    ids = np.pad(ids, (0, buf.size - ids.size), mode="edge").reshape(n, -1)
  chunk, ids = _scaled_reduce_scatter(buf.reshape(n, -1), ids, axes, algorithm, grid,
                                      codec, block_size)
  out_flat = all_gather_blocks(chunk, axes, algorithm, grid=grid, fmt=codec, gids=ids)
  out_flat = out_flat.reshape(-1)
  out, offset = [], 0
  for x, f in zip(xs, flat, strict=True):
    out.append(out_flat[offset : offset + x.size].reshape(x.shape))
    offset += f.size
  return out


def low_precision_reduce_scatter(
    blocks: list[jax.Array],
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    fmt: Any,
    *,
    block_size: int | None = None,
    measured_shift: bool = False,
) -> list[jax.Array]:
  """Reduce-scatters float32 `(n, c_i)` arrays with the payload in `fmt`.

  Device k (row-major over `axes`) gets row k of the sum of each array,
  `(c_i,)`, rounded as the final sum would travel (the shard of a sharded
  update). With `block_size` each array's columns are zero-padded to whole
  blocks (2 blocks' worth of alignment for the torus) so that no block
  mixes two arrays; with `measured_shift` each array's piece is one group.
  """
  widths = [b.shape[1] for b in blocks]
  if block_size is None and not measured_shift:
    chunk = fmt.round(reduce_scatter_blocks(
        jnp.concatenate(blocks, axis=1), axes, algorithm, grid=grid, fmt=fmt))
    padded_widths = widths
  else:
    blocks, codec, ids = _scaled_layout(blocks, fmt, block_size, algorithm)
    padded_widths = [b.shape[1] for b in blocks]
    if ids is not None:
      ids = np.tile(ids, (blocks[0].shape[0], 1))
    chunk, ids = _scaled_reduce_scatter(jnp.concatenate(blocks, axis=1), ids, axes,
                                        algorithm, grid, codec, block_size)
    chunk = codec.round(chunk, None if ids is None else jnp.asarray(ids[0]))
  out, offset = [], 0
  for w, pw in zip(widths, padded_widths, strict=True):
    out.append(chunk[offset : offset + w])
    offset += pw
  return out


def low_precision_sum(
    xs: list[jax.Array],
    axes: Any,
    algorithm: str,
    grid: tuple[int, int] | None,
    fmt: CommFormat,
    *,
    block_size: int | None = None,
    measured_shift: bool = False,
) -> list[jax.Array]:
  """Sums float32 arrays (already shifted) with the payload in `fmt`.

  One packed buffer for "ring"/"torus" (rounded at every hop), one
  `lax.psum` per array on the wire dtype for "psum". With `block_size` or
  `measured_shift` ("ring"/"torus" only) each message carries scales
  measured on it (`lp.ScaledFormat`): one per block of `block_size`
  elements, or one per layer piece.
  """
  if block_size is not None or measured_shift:
    return _scaled_sum(xs, axes, algorithm, grid, fmt, block_size)
  if algorithm == "psum":
    return [fmt.decode(lax.psum(fmt.encode(x), compat.as_tuple(axes))) for x in xs]
  flat = blockwise_all_reduce(algorithm, axes, grid, fmt)(
      jnp.concatenate([x.reshape(-1) for x in xs])
  )
  out, offset = [], 0
  for x in xs:
    out.append(flat[offset : offset + x.size].reshape(x.shape))
    offset += x.size
  return out
