"""All-reduce algorithms over named mesh axes: psum, an explicit ring, 2-D torus.

All three work inside `jax.shard_map` and `jax.pmap` (any context that binds
the axis names) on pytrees of any shapes and dtypes. Leaves are grouped by
accumulation dtype (float16/bfloat16/float32 accumulate in float32, small
integers in int32), each group is packed into one flat buffer so that the
whole tree costs one collective per group, padded where the number of devices
does not divide it, reduced, and cast back to each leaf's dtype.

The ring and torus algorithms are written with `lax.ppermute` only, so they
show (and let one test) the communication pattern of Ying et al. (2018); on
real hardware `lax.psum` lets XLA pick an equivalent schedule. Their rounds are
unrolled: the compiled program holds one collective-permute per ring and
round, so its length grows with the ring lengths (`2(P-1)` rounds for a ring
over P devices, `2(X-1) + 2(Y-1)` for an X×Y torus).

The hops take an optional payload format; choosing it (APS, rounding keys)
and the public `all_reduce` live in `grad_sync`, the one place that wires a
reduction together.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm.low_precision import CommFormat
from date_optax._src.types import PyTree


def acc_dtype(dtype: Any) -> np.dtype:
  """The dtype a sum or mean of `dtype` accumulates in, the package's one rule.

  Floats in float32 or wider, booleans and integers narrower than 32 bits in
  int32, other integers as they are.
  """
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.inexact):
    return jnp.promote_types(dtype, jnp.float32)
  if dtype == jnp.bool_ or dtype.itemsize < 4:
    return jnp.dtype(jnp.int32)
  return dtype


def _cast_back(x: jax.Array, dtype: Any) -> jax.Array:
  if jnp.dtype(dtype) == jnp.bool_:
    return x != 0  # a sum of booleans is their logical or
  return x.astype(dtype)


def _reduce_tree(tree: PyTree, flat_reduce: Callable[[jax.Array], jax.Array]) -> PyTree:
  """Applies a reduction of 1-D buffers to every leaf, one buffer per dtype."""
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [jnp.asarray(x) for x in leaves]
  groups: dict[np.dtype, list[int]] = {}
  for i, x in enumerate(leaves):
    groups.setdefault(acc_dtype(x.dtype), []).append(i)
  out: list[Any] = list(leaves)
  for acc, idxs in groups.items():
    sizes = [leaves[i].size for i in idxs]
    if sum(sizes) == 0:
      continue
    buf = jnp.concatenate([leaves[i].astype(acc).reshape(-1) for i in idxs])
    red = flat_reduce(buf)
    offset = 0
    for i, size in zip(idxs, sizes, strict=True):
      piece = red[offset : offset + size].reshape(leaves[i].shape)
      out[i] = _cast_back(piece, leaves[i].dtype)
      offset += size
  return jax.tree.unflatten(treedef, out)


def pad_to(buf: jax.Array, multiple: int) -> jax.Array:
  pad = (-buf.shape[-1]) % multiple
  if pad:
    widths = [(0, 0)] * (buf.ndim - 1) + [(0, pad)]
    buf = jnp.pad(buf, widths)
  return buf


# ---------------------------------------------------------------------------
# Rounds of neighbour exchanges. A ring phase is written as a generator that
# yields `(payload, ring)` for each exchange and receives what arrived from the
# left neighbour. `_run_in_rounds` drives several such programs side by side:
# round k issues the k-th exchange of every program still running, so programs
# that do not depend on each other (the two halves of the torus) share rounds
# instead of running one after the other. The rounds are unrolled in Python, so
# the compiled program holds one collective-permute per exchange and its
# dependency chain of collective-permutes is the number of rounds.
# ---------------------------------------------------------------------------


class _Ring(NamedTuple):
  axes: tuple[Hashable, ...]  # the named axes that ppermute runs over
  size: int  # devices on one ring
  position: jax.Array  # this device's position on its ring
  perm: tuple[tuple[int, int], ...]  # linear index over `axes` -> right neighbour


def _ring_over(axes: Any) -> _Ring:
  """One ring over all devices of `axes` (row-major linear order)."""
  axes = compat.as_tuple(axes)
  n = compat.axis_size(axes)
  perm = tuple((j, (j + 1) % n) for j in range(n))
  return _Ring(axes, n, lax.axis_index(axes), perm)


def _sub_ring(axes: Any, grid: tuple[int, ...], dim: int) -> _Ring:
  """Rings along dimension `dim` of a logical grid laid over one named axis.

  With `pmap` there is a single axis of X·Y devices; the torus algorithm views
  it as an X×Y grid in row-major order, and each ring links the devices that
  differ only in coordinate `dim`.
  """
  axes = compat.as_tuple(axes)
  total = compat.axis_size(axes)
  if int(np.prod(grid)) != total:
    raise ValueError(
        f"grid {grid} has {int(np.prod(grid))} devices but the axes {axes} have "
        f"{total}."
    )
  perm = []
  for j in range(total):
    coords = list(np.unravel_index(j, grid))
    coords[dim] = (coords[dim] + 1) % grid[dim]
    perm.append((j, int(np.ravel_multi_index(coords, grid))))
  stride = int(np.prod(grid[dim + 1 :]))
  position = (lax.axis_index(axes) // stride) % grid[dim]
  return _Ring(axes, grid[dim], position, tuple(perm))


def _run_in_rounds(*programs: Generator) -> list[jax.Array]:
  """Runs exchange programs side by side, one exchange of each per round.

  Exchanges of one round that travel over the same ring (same axes and
  permutation) are concatenated into a single `ppermute`; exchanges over
  different rings are separate `ppermute`s with no data dependence between
  them, which XLA is free to run at the same time.
  """
  results: list[Any] = [None] * len(programs)
  pending: dict[int, tuple[jax.Array, _Ring]] = {}

  def advance(i: int, arrived: jax.Array | None) -> None:
    try:
      pending[i] = programs[i].send(arrived)
    except StopIteration as stop:
      results[i] = stop.value

  for i in range(len(programs)):
    advance(i, None)
  while pending:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (_, ring) in pending.items():
      groups.setdefault((ring.axes, ring.perm), []).append(i)
    arrived: dict[int, jax.Array] = {}
    for (axes, perm), idxs in groups.items():
      sends = [pending[i][0] for i in idxs]
      if len(sends) == 1:
        arrived[idxs[0]] = lax.ppermute(sends[0], axes, perm)
        continue
      got = lax.ppermute(jnp.concatenate([s.reshape(-1) for s in sends]), axes, perm)
      offset = 0
      for i, s in zip(idxs, sends, strict=True):
        arrived[i] = got[offset : offset + s.size].reshape(s.shape)
        offset += s.size
    pending.clear()
    for i in sorted(arrived):
      advance(i, arrived[i])
  return results


def _rotate(rows: jax.Array, start: jax.Array) -> jax.Array:
  """`rows[(start + j) % n]` for j < n: a copy and a slice, not a gather."""
  n = rows.shape[0]
  return lax.dynamic_slice_in_dim(jnp.concatenate([rows, rows]), start % n, n, 0)


def send_with_feedback(fmt: Any, t: jax.Array, gid: Any = None) -> tuple[jax.Array, jax.Array]:
  """`(wire, residual)`: `t` sent as `C(t)` in `fmt`, keeping `t - C(t)`.

  The error feedback of one rounding place (a hop of a reduce-scatter, or
  the payload of a compressed all-gather): the caller has already added the
  place's old residual to `t`. A plain format is clipped to `±fmt.max`
  before it is encoded (a float format may lack an infinity); the clipped
  part stays in the residual. The barrier keeps XLA from eliding the
  encode/decode pair the residual is measured on.
  """
  if isinstance(fmt, lp.ScaledFormat):
    wire = lax.optimization_barrier(fmt.encode(t, gid))
    return wire, t - fmt.decode(wire, gid)
  wire = lax.optimization_barrier(fmt.encode(jnp.clip(t, -fmt.max, fmt.max)))
  return wire, t - fmt.decode(wire)


def _ring_reduce_scatter(
    blocks: jax.Array, ring: _Ring, fmt: CommFormat | None = None, gids: Any = None,
    feedback: Any = None,
) -> Generator:
  """(n, c) per device -> `((c,), feedback)`: the sum over the ring of row `position`.

  `blocks` has one row per device on the ring; the device at ring position i
  ends up owning row i (for a ring over mesh axes, the order that
  `PartitionSpec(axes)` uses for the same axes). With a communication format
  `fmt` the rows are rounded to it, every partial sum is rounded to it before
  it is sent (it travels in the format's wire dtype), and the sums are taken
  in float32 from two values of the format; the returned sum is not rounded.
  With a `lp.ScaledFormat` the rows are not rounded (the device adds its
  float32 row to the decoded partial sum) and each partial sum is sent with
  scales measured on it; `gids` (n, c) are the rows' segment ids for the
  measured per-layer shift.

  With `feedback` (n, c), this device's hop residuals (row j the residual of
  the partial sum of row j it forwards; each row j != i is forwarded by this
  device at exactly one hop), the rows are not rounded first, every partial
  sum `p` of row j is sent as `C(p + f_j)` and `f_j' = p + f_j - C(p + f_j)`
  is returned in its place; row i, which this device does not forward,
  comes back unchanged. Without it the second result is None.
  """
  n, idx = ring.size, ring.position
  scaled = isinstance(fmt, lp.ScaledFormat)
  if fmt is not None and not scaled and feedback is None:
    # With feedback the rows are not rounded here, where no residual could be
    # kept (the second torus phase starts from float32 partial sums): every
    # message is rounded as it is sent, with its residual.
    blocks = fmt.round(blocks)
  if n == 1:
    return blocks[0], feedback
  # Step s passes the partial sum of row (i - s - 1) to the right neighbour and
  # adds the one arriving from the left, which is row (i - s - 2); after n - 1
  # steps row i has visited every device and lands, complete, on position i.
  # Rotating the rows once so that row (i - 1 - s) comes s-th makes every
  # step a static slice (no copy of the whole buffer per step).
  rows = _rotate(blocks[::-1], n - idx)  # rows[j] = blocks[(i - 1 - j) % n]
  grows = None if gids is None else _rotate(gids[::-1], n - idx)
  frows = None if feedback is None or fmt is None else _rotate(feedback[::-1], n - idx)
  sent_residuals = []
  acc = rows[0]
  for s in range(n - 1):
    g_out = None if grows is None else grows[s]
    g_in = None if grows is None else grows[s + 1]
    if fmt is None:
      got = yield acc, ring
    elif frows is not None:
      wire, f = send_with_feedback(fmt, acc + frows[s], g_out)
      sent_residuals.append(f)
      got = yield wire, ring
      got = fmt.decode(got, g_in) if scaled else fmt.decode(got)
    elif scaled:
      got = fmt.decode((yield fmt.encode(acc, g_out), ring), g_in)
    else:
      got = fmt.decode((yield fmt.encode(acc), ring))
    acc = rows[s + 1] + got
  if frows is None:
    return acc, None
  # j -> (i - 1 - j) % n is its own inverse: the same rotation puts rows back.
  frows = jnp.concatenate([jnp.stack(sent_residuals), frows[n - 1 :]])
  return acc, _rotate(frows[::-1], n - idx)


def _ring_all_gather(chunk: jax.Array, ring: _Ring) -> Generator:
  """(c,) per device -> (n, c) with row j holding position j's chunk."""
  n, idx = ring.size, ring.position
  if n == 1:
    return chunk[None]
  # Step s forwards what arrived in step s - 1: the chunk of position i - s.
  pieces = [chunk]
  for _ in range(n - 1):
    got = yield pieces[-1], ring
    pieces.append(got)
  # Row r is the piece that came (i - r) % n hops.
  return _rotate(jnp.stack(pieces[::-1]), n - 1 - idx)


# ---------------------------------------------------------------------------
# 2-D torus phases (Ying et al. 2018). Rows of `blocks` are in the row-major
# order of the (x, y) grid; each row is split into halves A and B. Half A is
# reduce-scattered along x then y, half B along y then x, and the two halves
# advance in the same rounds: in round k half A makes its k-th exchange and
# half B its k-th, so while A is on the x-rings B is on the y-rings and the two
# use disjoint links. The gather runs the phases in reverse, again together.
# ---------------------------------------------------------------------------


def most_square_grid(n: int) -> tuple[int, int]:
  """The X×Y grid of n devices closest to square, X <= Y."""
  rows = int(np.floor(np.sqrt(n)))
  while n % rows:
    rows -= 1
  return rows, n // rows


def _torus_rings(axes: Any, grid: tuple[int, int] | None) -> tuple[_Ring, _Ring]:
  axes = compat.as_tuple(axes)
  if grid is not None:
    if len(grid) != 2:
      raise ValueError(f"grid must be (X, Y), got {grid!r}.")
    return _sub_ring(axes, tuple(grid), 0), _sub_ring(axes, tuple(grid), 1)
  if len(axes) != 2:
    raise ValueError(
        "the torus algorithm needs two axis names, or one axis and grid=(X, Y); "
        f"got axes={axes!r}."
    )
  return _ring_over(axes[0]), _ring_over(axes[1])


def _torus_reduce_scatter(
    blocks: jax.Array, rx: _Ring, ry: _Ring, fmt: CommFormat | None = None,
    gids: Any = None, feedback: Any = None,
) -> tuple[jax.Array, Any]:
  """The two-phase reduce-scatter; `feedback` (n, c) as for one ring.

  In half A a device at (x, y) forwards, on the x-ring, the rows of other x
  and then, on the y-ring, the pieces of its own x-row with other y; half B
  the other way round. So every element of `feedback` outside row
  `x·Y + y` is written by exactly one hop, and that row (the device's own
  chunk, which the gather sends) comes back unchanged.
  """
  nx, ny = rx.size, ry.size
  c = blocks.shape[1]
  blocks = pad_to(blocks, 2)
  h = blocks.shape[1] // 2
  if gids is not None:  # padding repeats the last id, so ids stay sorted
    gids = jnp.pad(gids, ((0, 0), (0, blocks.shape[1] - c)), mode="edge")
  if feedback is not None:
    feedback = pad_to(feedback, 2)

  def two_rings(x, g, f, first, second, n_first, n_second):
    """Reduce-scatter (n_first, n_second·h) over `first`, then own row over `second`."""
    x, f = yield from _ring_reduce_scatter(x, first, fmt, g, f)
    own = first.position
    g = None if g is None else g[own].reshape(n_second, h)
    row = None if f is None else f[own].reshape(n_second, h)
    x, row = yield from _ring_reduce_scatter(x.reshape(n_second, h), second, fmt, g, row)
    if f is not None:
      f = lax.dynamic_update_slice_in_dim(f, row.reshape(1, -1), own, 0)
    return x, f

  def to_yx(z):  # rows (x, y) -> (y, x), each of h columns
    return z.reshape(nx, ny, h).transpose(1, 0, 2).reshape(ny, nx * h)

  def half_a(a, g, f):  # rows ordered (x, y): x-rings first, then y-rings
    shape = lambda z: None if z is None else z.reshape(nx, ny * h)
    a, f = yield from two_rings(shape(a), shape(g), shape(f), rx, ry, nx, ny)
    return a, None if f is None else f.reshape(nx * ny, h)

  def half_b(b, g, f):  # rows reordered to (y, x) so that the y-phase comes first
    shape = lambda z: None if z is None else to_yx(z)
    b, f = yield from two_rings(shape(b), shape(g), shape(f), ry, rx, ny, nx)
    if f is not None:  # back to rows (x, y)
      f = f.reshape(ny, nx, h).transpose(1, 0, 2).reshape(nx * ny, h)
    return b, f

  halves = lambda z: (None, None) if z is None else (z[:, :h], z[:, h:])
  (ga, gb), (fa, fb) = halves(gids), halves(feedback)
  (a, fa), (b, fb) = _run_in_rounds(half_a(blocks[:, :h], ga, fa),
                                    half_b(blocks[:, h:], gb, fb))
  feedback = None if fa is None else jnp.concatenate([fa, fb], axis=1)[:, :c]
  return jnp.concatenate([a, b])[:c], feedback


def _torus_all_gather(chunk: jax.Array, rx: _Ring, ry: _Ring) -> jax.Array:
  nx, ny = rx.size, ry.size
  c = chunk.shape[0]
  chunk = pad_to(chunk, 2)
  h = chunk.shape[0] // 2

  def half_a(a):
    a = yield from _ring_all_gather(a, ry)
    a = yield from _ring_all_gather(a.reshape(ny * h), rx)
    return a.reshape(nx * ny, h)

  def half_b(b):
    b = yield from _ring_all_gather(b, rx)
    b = yield from _ring_all_gather(b.reshape(nx * h), ry)
    return b.reshape(ny, nx, h).transpose(1, 0, 2).reshape(nx * ny, h)

  a, b = _run_in_rounds(half_a(chunk[:h]), half_b(chunk[h:]))
  return jnp.concatenate([a, b], axis=1)[:, :c]


# ---------------------------------------------------------------------------
# The algorithms, one table: how each reduce-scatters blocks and gathers them.
# Every phase is called as `phase(x, axes, grid)`.
# ---------------------------------------------------------------------------


class _Algorithm(NamedTuple):
  # reduce_scatter(blocks, axes, grid, fmt, gids, feedback): (float32 sums,
  # not yet rounded; the new feedback or None).
  reduce_scatter: Callable[..., jax.Array]
  # all_gather(chunk, axes, grid): any dtype, moved exactly.
  all_gather: Callable[..., jax.Array]


def _on_ring(phase: Callable[..., Generator]) -> Callable[..., jax.Array]:
  return lambda x, axes, grid, *fmt: _run_in_rounds(phase(x, _ring_over(axes), *fmt))[0]


def _on_torus(phase: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  return lambda x, axes, grid, *fmt: phase(x, *_torus_rings(axes, grid), *fmt)


def _psum_scatter(
    x: jax.Array, axes: Any, grid: Any, fmt: CommFormat | None = None, gids: Any = None,
    feedback: Any = None,
) -> tuple[jax.Array, None]:
  axes = compat.as_tuple(axes)
  if feedback is not None:
    raise ValueError("lax.psum_scatter has no hops whose rounding could be fed back.")
  if fmt is None:
    return lax.psum_scatter(x, axes, scatter_dimension=0), None
  return fmt.decode(lax.psum_scatter(fmt.encode(x), axes, scatter_dimension=0)), None


def _all_to_all_scatter(
    x: jax.Array, axes: Any, grid: Any, fmt: Any = None, gids: Any = None, feedback: Any = None,
) -> tuple[jax.Array, None]:
  """Exact reduce-scatter of "two_shot": row k of every device reaches device k
  in one `all_to_all` and is summed there (its payload formats: `two_shot`)."""
  if fmt is not None or feedback is not None:
    raise ValueError("two_shot's low-precision payload is two_shot.two_shot_sum's.")
  axes = compat.as_tuple(axes)
  return jnp.sum(lax.all_to_all(x, axes, 0, 0, tiled=True), axis=0), None


_ALGORITHMS: dict[str, _Algorithm] = {
    "psum": _Algorithm(
        reduce_scatter=_psum_scatter,
        all_gather=lambda x, axes, grid: lax.all_gather(x, compat.as_tuple(axes), axis=0),
    ),
    "ring": _Algorithm(_on_ring(_ring_reduce_scatter), _on_ring(_ring_all_gather)),
    "torus": _Algorithm(_on_torus(_torus_reduce_scatter), _on_torus(_torus_all_gather)),
    "two_shot": _Algorithm(
        reduce_scatter=_all_to_all_scatter,
        all_gather=lambda x, axes, grid: lax.all_gather(x, compat.as_tuple(axes), axis=0),
    ),
}

#: The all-reduce algorithms by name.
ALGORITHMS = tuple(_ALGORITHMS)


def _algorithm(name: str) -> _Algorithm:
  if name not in _ALGORITHMS:
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {name!r}.")
  return _ALGORITHMS[name]


def reduce_scatter_blocks(
    blocks: jax.Array,
    axes: Any,
    algorithm: str,
    *,
    grid: tuple[int, int] | None = None,
    fmt: CommFormat | None = None,
    gids: Any = None,
    feedback: Any = None,
) -> Any:
  """Sums `blocks` (n, c) over the devices; device k keeps row k, shape (c,).

  `k` is the linear index over `axes` in row-major order, the order that
  `PartitionSpec(axes)` uses to place shards. With a communication format
  `fmt` the payload travels in it (partial sums rounded at every hop for
  "ring"/"torus"); the result is float32 and not yet rounded to `fmt`.
  With a `lp.ScaledFormat` of `block_size` B, `c` must be a multiple of B
  ("ring") or 2B ("torus") so that every message holds whole blocks; with
  one of segment ids, `gids` (n, c) gives each element's sorted id.

  With `feedback` (n, c) float32, this device's hop residuals laid out like
  `blocks` ("ring"/"torus" with a format only), every partial sum this
  device forwards is sent as `C(p + f)` and the result is `(row k, new
  feedback)`: each element outside row k is forwarded by this device at
  exactly one hop and gets `p + f - C(p + f)`; row k comes back unchanged
  (it is the payload of the gather, `all_gather_blocks(..., feedback=)`).
  """
  if feedback is not None and (fmt is None or algorithm == "psum"):
    raise ValueError("feedback needs a format and algorithm 'ring' or 'torus'.")
  if fmt is None:
    return _algorithm(algorithm).reduce_scatter(blocks, axes, grid)[0]
  if isinstance(fmt, lp.ScaledFormat):
    if algorithm == "psum":
      raise ValueError("scales measured at every hop need algorithm 'ring' or 'torus'.")
    gids = None if gids is None else jnp.asarray(gids, jnp.int32)
  chunk, feedback_out = _algorithm(algorithm).reduce_scatter(
      blocks.astype(jnp.float32), axes, grid, fmt, gids, feedback
  )
  return chunk if feedback is None else (chunk, feedback_out)


def all_gather_blocks(
    chunk: jax.Array,
    axes: Any,
    algorithm: str,
    *,
    grid: tuple[int, int] | None = None,
    fmt: CommFormat | None = None,
    gids: Any = None,
    feedback: Any = None,
) -> Any:
  """Inverse layout of `reduce_scatter_blocks`: (c,) per device -> (n, c).

  With `fmt` the chunk is rounded to the format once and travels in it, so
  every device ends with the same (rounded) values, float32. With a
  `lp.ScaledFormat` the chunk travels as one packed message (payload and
  scales) and `gids` (n, c) are the segment ids of all rows. With
  `feedback` (c,), this device's residual of its gathered payload, the
  chunk travels as `C(chunk + feedback)` and the result is `(rows,
  chunk + feedback - C(chunk + feedback))`.
  """
  if fmt is None:
    if feedback is not None:
      raise ValueError("feedback needs a format: an exact gather rounds nothing.")
    return _algorithm(algorithm).all_gather(chunk, axes, grid)
  scaled = isinstance(fmt, lp.ScaledFormat)
  own = None
  if scaled:
    axes_t = compat.as_tuple(axes)
    k = lax.axis_index(axes_t if len(axes_t) > 1 else axes_t[0])
    gids = None if gids is None else jnp.asarray(gids, jnp.int32)
    own = None if gids is None else gids[k]
  if feedback is None:
    wire = fmt.encode(chunk, own) if scaled else fmt.encode(chunk)
  else:
    wire, feedback = send_with_feedback(fmt, chunk + feedback, own)
  rows = _algorithm(algorithm).all_gather(wire, axes, grid)
  if not scaled:
    rows = fmt.decode(rows)
  elif gids is None:
    rows = jax.vmap(fmt.decode)(rows)
  else:
    rows = jax.vmap(fmt.decode)(rows, gids)
  return rows if feedback is None else (rows, feedback)


def blockwise_all_reduce(
    algorithm: str,
    axes: Any,
    grid: tuple[int, int] | None = None,
    fmt: CommFormat | None = None,
) -> Callable[[jax.Array], jax.Array]:
  def flat_reduce(buf: jax.Array) -> jax.Array:
    n = compat.axis_size(axes)
    size = buf.shape[0]
    blocks = pad_to(buf, n).reshape(n, -1)
    chunk = reduce_scatter_blocks(blocks, axes, algorithm, grid=grid, fmt=fmt)
    return all_gather_blocks(chunk, axes, algorithm, grid=grid, fmt=fmt).reshape(-1)[:size]

  return flat_reduce


def psum_all_reduce(tree: PyTree, axis_name: Any) -> PyTree:
  """Sums a pytree over named axes with `lax.psum`, accumulating in float32.

  Args:
    tree: a pytree of arrays (any shapes and dtypes).
    axis_name: a mesh/pmap axis name or a tuple of names.

  Returns:
    The sum over all devices of the named axes, each leaf in its own dtype
    (bfloat16 and float16 leaves are summed in float32, then cast back).
    Over a single device the tree is returned as it is, with no all-reduce
    compiled, unless a leaf is typed as varying along the axes
    (`shard_map(check_vma=True)`), whose type only a collective changes.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> n = mesh.size
    >>> f = jax.jit(jax.shard_map(lambda t: dp.psum_all_reduce(t, "data"), mesh=mesh,
    ...                   in_specs=P("data"), out_specs=P()))
    >>> float(f(jnp.ones(n, jnp.bfloat16))[0]) == n
    True

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018.
  """
  axes = compat.as_tuple(axis_name)
  if compat.axis_size(axes) == 1 and compat.untyped_replication(tree, axes):
    # A sum over one device is its operand; XLA would still run (and on the
    # CPU copy through) an all-reduce over the single device.
    return tree

  def reduce_leaf(x):
    x = jnp.asarray(x)
    return _cast_back(lax.psum(x.astype(acc_dtype(x.dtype)), axes), x.dtype)

  return jax.tree.map(reduce_leaf, tree)


def ring_all_reduce(tree: PyTree, axis_name: Any) -> PyTree:
  """Sums a pytree over a ring of devices, written with `lax.ppermute`.

  The classic bandwidth-optimal ring: the packed buffer is cut into one chunk
  per device; a reduce-scatter of `n - 1` neighbour exchanges leaves each
  device with one fully summed chunk, and an all-gather of `n - 1` more
  exchanges hands every chunk to every device. Cost `2(n-1)` latency steps and
  `2(n-1)/n · M` bytes per link for `M` bytes; the exchanges are unrolled, so
  the compiled program has a chain of `2(n-1)` collective-permutes.

  Args:
    tree: a pytree of arrays (any shapes and dtypes); buffers are zero-padded
      when the number of devices does not divide them.
    axis_name: the ring's axis name, or a tuple of names for one ring over
      all their devices in row-major order.

  Returns:
    The sum over the ring, each leaf in its own dtype (low-precision floats are
    accumulated in float32).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh()
    >>> n = mesh.size
    >>> f = jax.jit(jax.shard_map(lambda t: dp.ring_all_reduce(t, "data"), mesh=mesh,
    ...                   in_specs=P("data"), out_specs=P("data"),
    ...                   check_vma=False))
    >>> bool((f(jnp.arange(3.0 * n)) == jnp.tile(jnp.arange(3.0 * n)
    ...       .reshape(n, 3).sum(0), n)).all())
    True

  References:
    Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters
    of workstations", 2009; Ying et al., "Image Classification at
    Supercomputer Scale", 2018.
  """
  return _reduce_tree(tree, blockwise_all_reduce("ring", compat.as_tuple(axis_name)))


def torus_all_reduce(
    tree: PyTree, axes: Any = ("x", "y"), *, grid: tuple[int, int] | None = None
) -> PyTree:
  """Sums a pytree over a 2-D torus with the two-phase algorithm of Ying et al.

  The packed buffer is split into halves A and B. Half A reduce-scatters along
  the first axis and then the second, half B along the second and then the
  first, leaving each device one fully summed piece of each half; the
  all-gather runs each half's phases in reverse. The two halves advance in the
  same rounds: round k sends half A's k-th and half B's k-th message, as two
  `ppermute`s with no data dependence between them when the halves are on
  different axes (XLA may run them at the same time, on disjoint links), or
  as one `ppermute` carrying both when they are on the same axis (in `|X-Y|`
  rounds of the scatter and of the gather when X ≠ Y). On an X×Y torus the
  compiled program therefore has `2(X-1) + 2(Y-1)` rounds of neighbour
  exchanges instead of `2(XY-1)` for one ring over all devices.

  Args:
    tree: a pytree of arrays (any shapes and dtypes); buffers are zero-padded
      when `2·X·Y` does not divide them.
    axes: the two axis names `(vertical, horizontal)` of a mesh; or, with
      `grid`, one axis name (e.g. a `pmap` axis) viewed as an X×Y grid.
    grid: `(X, Y)` when `axes` is a single axis of X·Y devices, which are then
      laid out row by row; `None` when `axes` names two axes.

  Returns:
    The sum over all X·Y devices, each leaf in its own dtype (low-precision
    floats are accumulated in float32).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.torus_mesh(1, jax.device_count())
    >>> f = jax.jit(jax.shard_map(lambda t: dp.torus_all_reduce(t, ("x", "y")),
    ...                   mesh=mesh, in_specs=P(("x", "y")),
    ...                   out_specs=P(("x", "y")), check_vma=False))
    >>> out = f(jnp.ones(5 * mesh.size))
    >>> bool((out == mesh.size).all())
    True

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018, §3
    (two-dimensional gradient summation), https://arxiv.org/abs/1811.06992.
  """
  grid = None if grid is None else tuple(grid)
  return _reduce_tree(tree, blockwise_all_reduce("torus", axes, grid))
