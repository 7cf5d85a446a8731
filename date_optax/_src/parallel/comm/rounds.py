"""Rounds of neighbour exchanges: the ring and 2-D torus phases, run as loops.

A *phase* is one ring's part of an algorithm: the `n - 1` exchanges of a
ring reduce-scatter or all-gather over a ring of `n` devices. A *program*
(a ring all-reduce's half, a torus half) is a Python generator that yields
its phases one after another and receives each phase's result.
`run_in_rounds` drives several programs side by side: round k makes the
k-th exchange of every program still running, so programs that do not
depend on each other (the two halves of the torus, Ying et al. 2018) share
rounds instead of running one after the other.

The rounds run as `lax.fori_loop`s over `lax.ppermute`: between two moments
where some program changes phase, every round does the same work, so those
rounds are one loop whose body holds one `ppermute` per ring in use. A ring
over P devices is one loop of `P - 1` rounds per phase, an X×Y torus at
most three loops per direction, so the compiled program does not grow with
the number of devices (nor does its compile time with it). A stretch of a
single round is not looped. The values are those of the rounds traced one
after the other, bit for bit (`tests/test_collective_rounds.py`).
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


def pad_to(buf: jax.Array, multiple: int) -> jax.Array:
  """Zero-pads the last axis of `buf` to a multiple of `multiple`."""
  pad = (-buf.shape[-1]) % multiple
  if pad:
    widths = [(0, 0)] * (buf.ndim - 1) + [(0, pad)]
    buf = jnp.pad(buf, widths)
  return buf


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


class Ring(NamedTuple):
  axes: tuple[Hashable, ...]  # the named axes that ppermute runs over
  size: int  # devices on one ring
  position: jax.Array  # this device's position on its ring
  perm: tuple[tuple[int, int], ...]  # linear index over `axes` -> right neighbour


def ring_over(axes: Any) -> Ring:
  """One ring over all devices of `axes` (row-major linear order)."""
  axes = compat.as_tuple(axes)
  n = compat.axis_size(axes)
  perm = tuple((j, (j + 1) % n) for j in range(n))
  return Ring(axes, n, lax.axis_index(axes), perm)


def sub_ring(axes: Any, grid: tuple[int, ...], dim: int) -> Ring:
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
  return Ring(axes, grid[dim], position, tuple(perm))


class Phase(NamedTuple):
  """`hops` exchanges over `ring`, each sending a message to the right.

  Hop `s` (a Python int, or the loop's traced index) is `send(s, carry,
  fmt)` -> `(message, carry)`, the `ppermute`, then `receive(s, carry,
  arrived)` -> `carry`; after the last hop the program gets
  `finish(carry)`. `fmt` is the phase's format; `send` gets it positioned
  so that its stochastic rounding (if any) draws the rank the call would
  have with every round traced one after the other (`run_in_rounds`).
  """

  ring: Ring
  hops: int
  carry: Any
  send: Callable[..., tuple[jax.Array, Any]] | None
  receive: Callable[..., Any] | None
  finish: Callable[[Any], Any]
  fmt: Any = None


def _row(rows: jax.Array, s: Any) -> jax.Array:
  return lax.dynamic_index_in_dim(rows, s, 0, keepdims=False)


def _set_row(rows: jax.Array, row: jax.Array, s: Any) -> jax.Array:
  return lax.dynamic_update_index_in_dim(rows, row, s, 0)


def _exchange(messages: dict[int, tuple[jax.Array, Ring]]) -> dict[int, jax.Array]:
  """One round: messages over the same ring travel in one `ppermute`."""
  groups: dict[tuple[Any, ...], list[int]] = {}
  for i, (_, ring) in messages.items():
    groups.setdefault((ring.axes, ring.perm), []).append(i)
  arrived: dict[int, jax.Array] = {}
  for (axes, perm), idxs in groups.items():
    sends = [messages[i][0] for i in idxs]
    if len(sends) == 1:
      arrived[idxs[0]] = lax.ppermute(sends[0], axes, perm)
      continue
    got = lax.ppermute(jnp.concatenate([s.reshape(-1) for s in sends]), axes, perm)
    offset = 0
    for i, s in zip(idxs, sends, strict=True):
      arrived[i] = got[offset : offset + s.size].reshape(s.shape)
      offset += s.size
  return arrived


def run_in_rounds(*programs: Generator) -> list[Any]:
  """Runs programs of phases side by side, one exchange of each per round.

  Exchanges of one round over the same ring (same axes and permutation)
  travel in a single `ppermute`; exchanges over different rings are
  separate `ppermute` calls with no data dependence between them, which XLA is
  free to run at the same time. The rounds between two phase changes are
  one `lax.fori_loop` (a single round is traced as it is).

  Stochastic roundings draw `fold_in(key, i)` for their i-th call
  (`lp.StochasticRounding`): each phase's work outside the loop (its first
  rounding) is traced where the program reaches it, in program order, and
  the loop's sends are given the ranks the same calls would have if every
  round were traced one after the other, program by program.
  """
  results: list[Any] = [None] * len(programs)
  running: dict[int, list[Any]] = {}  # program -> [phase, carry, hops done]
  first: dict[int, int | None] = {}  # the rank of each program's next send

  def advance(i: int, value: Any) -> None:
    while True:
      try:
        phase = programs[i].send(value)
      except StopIteration as stop:
        results[i] = stop.value
        return
      if phase.hops:
        running[i] = [phase, phase.carry, 0]
        return
      value = phase.finish(phase.carry)

  def reserve(i: int) -> None:  # program i's next send, in program order
    counter = lp.rounding_counter(running[i][0].fmt)
    first[i] = None if counter is None else counter.reserve(1)

  for i in range(len(programs)):
    advance(i, None)
    if i in running:
      reserve(i)
  while running:
    order = sorted(running)
    length = min(running[i][0].hops - running[i][2] for i in order)
    # Ranks of the sends of rounds 2, 3, ...: in each round every program
    # using a counter takes the next rank, in program order.
    counters: dict[int, Any] = {}
    rank: dict[int, tuple[int, int] | None] = {}
    for i in order:
      counter = lp.rounding_counter(running[i][0].fmt)
      if counter is None:
        rank[i] = None
        continue
      users = counters.setdefault(id(counter), [counter, 0])
      rank[i] = (id(counter), users[1])
      users[1] += 1
    base = {k: c.reserve(n * (length - 1)) for k, (c, n) in counters.items()}

    def body(t, carries, order=order, rank=rank, base=base, counters=counters):
      messages, carries = {}, dict(carries)
      for i in order:
        phase, _, done = running[i]
        fmt = phase.fmt
        if rank[i] is not None:
          key, pos = rank[i]
          later = base[key] + counters[key][1] * (t - 1) + pos
          call = first[i] if isinstance(t, int) and t == 0 else jnp.where(
              t == 0, first[i], later)
          fmt = lp.at_call(fmt, call)
        msg, carries[i] = phase.send(done + t, carries[i], fmt)
        messages[i] = (msg, phase.ring)
      arrived = _exchange(messages)
      for i in order:
        phase, _, done = running[i]
        carries[i] = phase.receive(done + t, carries[i], arrived[i])
      return carries

    carries = {i: running[i][1] for i in order}
    if length == 1:
      carries = body(0, carries)
    else:
      rings = [running[i][0].ring for i in order]
      carries = lax.fori_loop(0, length, body, _varying(carries, rings))
    for i in order:
      running[i][1] = carries[i]
      running[i][2] += length
    for i in order:  # phase changes and the next sends' ranks, in program order
      phase, carry, done = running[i]
      if done == phase.hops:
        del running[i]
        advance(i, phase.finish(carry))
      if i in running:
        reserve(i)
  return results


def _varying(carries: Any, rings: list[Ring]) -> Any:
  """Types a loop's carry as varying over every axis it may vary over.

  Under `shard_map(check_vma=True)` (where a ring position, an
  `axis_index`, is typed varying) a `ppermute`'s result varies over its
  axes, and messages that share a `ppermute` mix the axes their programs
  vary over, so the carry enters the loop typed over all of them;
  elsewhere (pmap, an unchecked shard_map) values carry no such type.
  """
  if not any(compat.varying_axes(r.position) for r in rings):
    return carries
  axes = {a for r in rings for a in r.axes}
  for x in jax.tree.leaves(carries):
    axes |= compat.varying_axes(x) or set()

  def cast(x):
    missing = tuple(a for a in axes if a not in compat.varying_axes(x))
    return compat.to_varying(x, missing) if missing else x

  return jax.tree.map(cast, carries)


def rotate(rows: jax.Array, start: Any) -> jax.Array:
  """`rows[(start + j) % n]` for j < n: a copy and a slice, not a gather."""
  n = rows.shape[0]
  return lax.dynamic_slice_in_dim(jnp.concatenate([rows, rows]), start % n, n, 0)


def ring_reduce_scatter(
    blocks: jax.Array, ring: Ring, fmt: CommFormat | None = None, gids: Any = None,
    feedback: Any = None,
) -> Phase:
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
    return Phase(ring, 0, (blocks[0], feedback), None, None, lambda carry: carry)
  # Hop s passes the partial sum of row (i - s - 1) to the right neighbour and
  # adds the one arriving from the left, which is row (i - s - 2); after n - 1
  # hops row i has visited every device and lands, complete, on position i.
  # Rotating the rows once so that row (i - 1 - s) comes s-th makes every
  # hop read row s (and s + 1) of the rotated buffer.
  rows = rotate(blocks[::-1], n - idx)  # rows[j] = blocks[(i - 1 - j) % n]
  grows = None if gids is None else rotate(gids[::-1], n - idx)
  frows = None if feedback is None or fmt is None else rotate(feedback[::-1], n - idx)

  def send(s, carry, fmt):
    acc, fr = carry
    g_out = None if grows is None else _row(grows, s)
    if fmt is None:
      return acc, carry
    if fr is not None:  # the residual of row s is replaced by this hop's
      wire, f = send_with_feedback(fmt, acc + _row(fr, s), g_out)
      return wire, (acc, _set_row(fr, f, s))
    return (fmt.encode(acc, g_out) if scaled else fmt.encode(acc)), carry

  def receive(s, carry, got):
    acc, fr = carry
    if scaled:
      got = fmt.decode(got, None if grows is None else _row(grows, s + 1))
    elif fmt is not None:
      got = fmt.decode(got)
    return _row(rows, s + 1) + got, fr

  def finish(carry):
    acc, fr = carry
    # j -> (i - 1 - j) % n is its own inverse: the same rotation puts rows back.
    return acc, None if fr is None else rotate(fr[::-1], n - idx)

  return Phase(ring, n - 1, (rows[0], frows), send, receive, finish, fmt)


def ring_all_gather(chunk: jax.Array, ring: Ring) -> Phase:
  """(c,) per device -> (n, c) with row j holding position j's chunk."""
  n, idx = ring.size, ring.position
  if n == 1:
    return Phase(ring, 0, chunk[None], None, None, lambda carry: carry)
  # Hop s forwards what arrived in hop s - 1: the chunk of position i - s,
  # kept as row s.
  pieces = _set_row(jnp.zeros((n,) + chunk.shape, chunk.dtype), chunk, 0)

  def send(s, pieces, fmt):
    return _row(pieces, s), pieces

  def receive(s, pieces, got):
    return _set_row(pieces, got, s + 1)

  # Row r is the piece that came (i - r) % n hops.
  return Phase(ring, n - 1, pieces, send, receive,
               lambda pieces: rotate(pieces[::-1], n - 1 - idx))


def single(phase: Phase) -> Generator:
  """A program of one phase."""
  return (yield phase)


# ---------------------------------------------------------------------------
# 2-D torus phases (Ying et al. 2018). Rows of `blocks` are in the row-major
# order of the (x, y) grid; each row is split into halves A and B. Half A is
# reduce-scattered along x then y, half B along y then x, and the two halves
# advance in the same rounds: in round k half A makes its k-th exchange and
# half B its k-th, so while A is on the x-rings B is on the y-rings and the two
# use disjoint links. The gather runs the phases in reverse, again together.
# ---------------------------------------------------------------------------


def torus_rings(axes: Any, grid: tuple[int, int] | None) -> tuple[Ring, Ring]:
  axes = compat.as_tuple(axes)
  if grid is not None:
    if len(grid) != 2:
      raise ValueError(f"grid must be (X, Y), got {grid!r}.")
    return sub_ring(axes, tuple(grid), 0), sub_ring(axes, tuple(grid), 1)
  if len(axes) != 2:
    raise ValueError(
        "the torus algorithm needs two axis names, or one axis and grid=(X, Y); "
        f"got axes={axes!r}."
    )
  return ring_over(axes[0]), ring_over(axes[1])


def torus_reduce_scatter(
    blocks: jax.Array, rx: Ring, ry: Ring, fmt: CommFormat | None = None,
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

  def two_rings(x, g, f, first, second, n_second):
    """Reduce-scatter (n_first, n_second·h) over `first`, then own row over `second`."""
    x, f = yield ring_reduce_scatter(x, first, fmt, g, f)
    own = first.position
    g = None if g is None else _row(g, own).reshape(n_second, h)
    row = None if f is None else _row(f, own).reshape(n_second, h)
    x, row = yield ring_reduce_scatter(x.reshape(n_second, h), second, fmt, g, row)
    if f is not None:
      f = lax.dynamic_update_slice_in_dim(f, row.reshape(1, -1), own, 0)
    return x, f

  def to_yx(z):  # rows (x, y) -> (y, x), each of h columns
    return z.reshape(nx, ny, h).transpose(1, 0, 2).reshape(ny, nx * h)

  def half_a(a, g, f):  # rows ordered (x, y): x-rings first, then y-rings
    shape = lambda z: None if z is None else z.reshape(nx, ny * h)
    a, f = yield from two_rings(shape(a), shape(g), shape(f), rx, ry, ny)
    return a, None if f is None else f.reshape(nx * ny, h)

  def half_b(b, g, f):  # rows reordered to (y, x) so that the y-phase comes first
    shape = lambda z: None if z is None else to_yx(z)
    b, f = yield from two_rings(shape(b), shape(g), shape(f), ry, rx, nx)
    if f is not None:  # back to rows (x, y)
      f = f.reshape(ny, nx, h).transpose(1, 0, 2).reshape(nx * ny, h)
    return b, f

  halves = lambda z: (None, None) if z is None else (z[:, :h], z[:, h:])
  (ga, gb), (fa, fb) = halves(gids), halves(feedback)
  (a, fa), (b, fb) = run_in_rounds(half_a(blocks[:, :h], ga, fa),
                                   half_b(blocks[:, h:], gb, fb))
  feedback = None if fa is None else jnp.concatenate([fa, fb], axis=1)[:, :c]
  return jnp.concatenate([a, b])[:c], feedback


def torus_all_gather(chunk: jax.Array, rx: Ring, ry: Ring) -> jax.Array:
  nx, ny = rx.size, ry.size
  c = chunk.shape[0]
  chunk = pad_to(chunk, 2)
  h = chunk.shape[0] // 2

  def half_a(a):
    a = yield ring_all_gather(a, ry)
    a = yield ring_all_gather(a.reshape(ny * h), rx)
    return a.reshape(nx * ny, h)

  def half_b(b):
    b = yield ring_all_gather(b, rx)
    b = yield ring_all_gather(b.reshape(nx * h), ry)
    return b.reshape(ny, nx, h).transpose(1, 0, 2).reshape(nx * ny, h)

  a, b = run_in_rounds(half_a(chunk[:h]), half_b(chunk[h:]))
  return jnp.concatenate([a, b], axis=1)[:, :c]
