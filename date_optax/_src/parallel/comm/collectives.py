"""All-reduce algorithms over named mesh axes: psum, an explicit ring, 2-D torus.

All three work inside `jax.shard_map` and `jax.pmap` (any context that binds
the axis names) on pytrees of any shapes and dtypes. Leaves are grouped by
accumulation dtype (float16/bfloat16/float32 accumulate in float32, small
integers in int32), each group is packed into one flat buffer so that the
whole tree costs one collective per group, padded where the number of devices
does not divide it, reduced, and cast back to each leaf's dtype.

The ring and torus algorithms are written with `lax.ppermute` only, so they
show (and let one test) the communication pattern of Ying et al. (2018); on
real hardware `lax.psum` lets XLA pick an equivalent schedule. They take
`2(P-1)` rounds for a ring over P devices, `2(X-1) + 2(Y-1)` for an X×Y
torus, run as loops (`rounds.run_in_rounds`): the compiled program holds a
fixed number of collective-permutes inside `while` loops whose trip counts
are the ring lengths, so neither it nor its compile time grows with the
number of devices (`hlo.collective_permute_rounds` counts the rounds of
such a program).

The hops take an optional payload format; choosing it (APS, rounding keys)
and the public `all_reduce` live in `grad_sync`, the one place that wires a
reduction together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from date_optax._src.parallel import compat
from date_optax._src.parallel.comm import low_precision as lp
from date_optax._src.parallel.comm import rounds
from date_optax._src.parallel.comm.low_precision import CommFormat
from date_optax._src.parallel.comm.rounds import pad_to, send_with_feedback
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


def most_square_grid(n: int) -> tuple[int, int]:
  """The X×Y grid of n devices closest to square, X <= Y."""
  rows = int(np.floor(np.sqrt(n)))
  while n % rows:
    rows -= 1
  return rows, n // rows


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


def _on_ring(phase: Callable[..., rounds.Phase]) -> Callable[..., jax.Array]:
  return lambda x, axes, grid, *fmt: rounds.run_in_rounds(
      rounds.single(phase(x, rounds.ring_over(axes), *fmt)))[0]


def _on_torus(phase: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  return lambda x, axes, grid, *fmt: phase(x, *rounds.torus_rings(axes, grid), *fmt)


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
    "ring": _Algorithm(_on_ring(rounds.ring_reduce_scatter), _on_ring(rounds.ring_all_gather)),
    "torus": _Algorithm(_on_torus(rounds.torus_reduce_scatter),
                        _on_torus(rounds.torus_all_gather)),
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
  `2(n-1)/n · M` bytes per link for `M` bytes. The reduce-scatter and the
  all-gather are each one loop of `n - 1` exchanges, so the compiled program
  runs a chain of `2(n-1)` collective-permutes while its size does not
  depend on `n`.

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
  `ppermute` calls with no data dependence between them when the halves are on
  different axes (XLA may run them at the same time, on disjoint links), or
  as one `ppermute` carrying both when they are on the same axis (in `|X-Y|`
  rounds of the scatter and of the gather when X ≠ Y). On an X×Y torus the
  compiled program therefore runs `2(X-1) + 2(Y-1)` rounds of neighbour
  exchanges instead of `2(XY-1)` for one ring over all devices, in at most
  three loops for the reduce-scatter and three for the all-gather (one per
  stretch of rounds in which neither half changes axis), so its size does
  not depend on X and Y.

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
