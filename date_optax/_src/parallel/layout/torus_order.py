"""Device orders that follow a TPU slice's links, from the devices' coordinates.

An explicit ring or 2-D torus all-reduce (`GradSync("ring")`,
`GradSync("torus")`) sends each round to the next device of its ring. The
round costs one link's time only when that next device is a neighbour: the
same chip (another TensorCore, v2/v3) or one ICI hop away. `jax.make_mesh`
orders devices for XLA's own collectives, not for our rings: on a
``v3:4x4`` slice its first axis visits chips (0,0), (2,0), (0,2), (2,2).
This module orders devices by their ``coords`` (and ``core_on_chip``)
instead:

* A ring over a grid of chips is a Hamiltonian cycle with unit steps
  wherever one exists (some dimension even, as on every TPU slice of more
  than one chip): rows visited as a snake over all but the first column,
  which the ring walks back along to close. Every hop is one link and the
  closing hop too, without wrap-around links.
* A ring along one line of chips (a mesh axis that is a single chip
  dimension) is that line in order; its closing hop is one link where the
  slice wraps around on that dimension, and otherwise a route back along
  the line, the opposite direction to every other hop of the ring, so no
  link carries two of its messages one way.

Which dimensions wrap around is not in the devices; `wraparound` assumes
the public rule: v4 and v5p slices made of whole 4×4×4 cubes are 3-D tori,
v5e and v6e wrap only along an edge of 16 chips (a full pod's), v2 and v3
only along a full pod's edge (16 and 32 chips). Sources: Austin et al.,
"How to Scale Your Model", 2025, https://jax-ml.github.io/scaling-book/tpus/
("TPU networking": wrap-around links on axes of a multiple of 4 on the v*p
chips and on full 16-chip axes on v5e/v6e); Google Cloud, "TPU v4" (slices
of whole cubes are tori); Ying et al., "Image Classification at
Supercomputer Scale", 2018 (the v2/v3 pod's 2-D torus).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Chips along the edge of a full pod (v2, v3, v5e, v6e): the only edge
#: length with wrap-around links on those generations.
_FULL_EDGE = {"v2": 16, "v3": 32, "v5litepod": 16, "v6e": 16}


def wraparound(generation: str, bounds: Sequence[int]) -> tuple[bool, ...]:
  """Which chip dimensions of a slice close into a ring by their own links.

  Args:
    generation: the accelerator-type prefix (``"v3"``, ``"v4"``,
      ``"v5p"``, ``"v5litepod"``, ``"v6e"``).
    bounds: chips along each dimension (``(4, 4, 1)`` for ``v3:4x4``).

  Returns:
    One bool per dimension (a dimension of 1 or 2 chips counts as closed:
    its two ends are neighbours).
  """
  bounds = tuple(int(b) for b in bounds)
  if generation in ("v4", "v5p"):
    cubes = all(b % 4 == 0 for b in bounds if b > 1) and len([b for b in bounds if b > 1]) == 3
    return tuple(b <= 2 or cubes for b in bounds)
  edge = _FULL_EDGE.get(generation)
  return tuple(b <= 2 or b == edge for b in bounds)


def _snake(shape: Sequence[int]) -> list[tuple[int, ...]]:
  """Every point of a grid once, consecutive points one unit apart."""
  if not shape:
    return [()]
  first, rest = shape[0], _snake(shape[1:])
  out = []
  for i in range(first):
    out += [(i, *r) for r in (rest if i % 2 == 0 else rest[::-1])]
  return out


def ring_order(shape: Sequence[int]) -> list[tuple[int, ...]]:
  """A cycle through every point of a grid, unit steps where one exists.

  With some dimension of even length and at least two dimensions longer
  than 1, every step, the closing one included, moves one unit along one
  dimension. Otherwise (a line, or all lengths odd) the order is a snake
  whose closing step is longer.

  Args:
    shape: the grid's lengths.

  Returns:
    The grid's points (index tuples), in ring order starting at the origin.

  Examples:
    >>> from date_optax._src.parallel.layout.torus_order import ring_order
    >>> ring_order((2, 3))
    [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
  """
  shape = tuple(int(s) for s in shape)
  live = [d for d, s in enumerate(shape) if s > 1]
  even = [d for d in live if shape[d] % 2 == 0]
  if len(live) < 2 or not even:
    return _snake(shape)
  # Rows along an even dimension m; the other live dimensions flattened into
  # "columns" by a snake, so consecutive columns are grid neighbours.
  m = even[0]
  others = [d for d in range(len(shape)) if d != m]
  columns = _snake([shape[d] for d in others])

  def point(row: int, col: int) -> tuple[int, ...]:
    p = [0] * len(shape)
    p[m] = row
    for d, v in zip(others, columns[col], strict=True):
      p[d] = v
    return tuple(p)

  n_rows, n_cols = shape[m], len(columns)
  out = [point(0, c) for c in range(n_cols)]
  for r in range(1, n_rows):  # snake over columns 1.., then back up column 0
    cols = range(n_cols - 1, 0, -1) if r % 2 else range(1, n_cols)
    out += [point(r, c) for c in cols]
  out += [point(r, 0) for r in range(n_rows - 1, 0, -1)]
  return out


def _chip_key(device: Any) -> tuple[int, ...]:
  return (*(int(c) for c in device.coords), int(getattr(device, "core_on_chip", 0)))


def _grid(devices: Sequence[Any]) -> tuple[dict[tuple[int, ...], Any], tuple[int, ...]]:
  """Devices by (x, y, z, core), and the grid's lengths (cores last)."""
  by_key = {_chip_key(d): d for d in devices}
  if len(by_key) != len(devices):
    raise ValueError("two devices share coordinates and core; not one slice's devices.")
  keys = np.array(list(by_key))
  lo = keys.min(axis=0)
  shape = tuple(int(s) for s in keys.max(axis=0) - lo + 1)
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"the devices do not fill a {shape} grid of chips and cores.")
  return {tuple(int(v) for v in np.array(k) - lo): d for k, d in by_key.items()}, shape


def ring_devices(devices: Sequence[Any]) -> list[Any]:
  """A TPU slice's devices in the order of one ring whose hops are links.

  Args:
    devices: one slice's devices (each with ``coords``; ``core_on_chip``
      where a chip has several).

  Returns:
    The devices as a cycle over the chip grid and the cores of each chip
    (`ring_order`): each next device is on the same chip or one ICI link
    away, the last and the first too.
  """
  by_key, shape = _grid(devices)
  return [by_key[p] for p in ring_order(shape)]


def torus_devices(devices: Sequence[Any]) -> np.ndarray:
  """A TPU slice's devices as the X × Y grid of a 2-D torus all-reduce.

  The first axis is the chips' first dimension, in order; the second is a
  ring (`ring_order`) over the other chip dimensions and the cores of each
  chip (the y and z of a v4/v5p cube fold into it). Along the second axis
  every hop is one link or on-chip; along the first it is one link, and
  the closing hop one link where that dimension wraps around (`wraparound`).

  Args:
    devices: one slice's devices.

  Returns:
    An object array of shape (X, Y).
  """
  by_key, shape = _grid(devices)
  cycle = ring_order(shape[1:])
  return np.array([[by_key[(x, *p)] for p in cycle] for x in range(shape[0])], dtype=object)


def ici_hops(a: Any, b: Any, bounds: Sequence[int], wraps: Sequence[bool]) -> int:
  """ICI links between two devices of a slice on the shortest route.

  Args:
    a: a device (``coords``).
    b: another device of the same slice.
    bounds: chips along each dimension.
    wraps: `wraparound` of the slice.

  Returns:
    0 for two cores of one chip, else the sum over dimensions of the
    distance along it (the shorter way round where it wraps).
  """
  hops = 0
  for ca, cb, n, w in zip(a.coords, b.coords, bounds, wraps, strict=True):
    d = abs(int(ca) - int(cb))
    hops += min(d, n - d) if w else d
  return hops
