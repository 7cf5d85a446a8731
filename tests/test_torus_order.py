"""Rings and tori on a TPU slice follow its links, read from device coordinates.

The grid orders are checked as pure functions; then the TPU compiler's own
program (libtpu, no TPU needed) is read: every collective-permute's
source-target pair is mapped back to the devices and their ICI distance.
"""

from __future__ import annotations

import importlib.util
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import date_optax.parallel as dp
from date_optax._src.parallel.layout import torus_order


def _unit_steps(points, closed=True):
  """How far apart consecutive points are (L1), the last and first too."""
  pts = np.array(points)
  nxt = np.roll(pts, -1, axis=0) if closed else pts[1:]
  return np.abs(pts[: len(nxt)] - nxt).sum(axis=1)


@pytest.mark.parametrize("shape", [(2, 2), (2, 3), (3, 4), (4, 4, 1, 2), (2, 2, 4),
                                   (4, 4, 4), (32, 32, 1, 2), (1, 2, 3), (5, 2)])
def test_a_ring_over_a_grid_with_an_even_side_moves_one_unit_every_step(shape):
  order = torus_order.ring_order(shape)
  assert sorted(order) == sorted(itertools.product(*map(range, shape)))  # every point once
  assert order[0] == (0,) * len(shape)
  np.testing.assert_array_equal(_unit_steps(order), 1)


@pytest.mark.parametrize("shape", [(5,), (3, 3), (1, 7, 1), (1, 6)])
def test_without_a_unit_cycle_the_order_is_a_snake(shape):
  # A line, or a grid of odd sides (a bipartite grid with an odd number of
  # points), has no cycle of unit steps: every step but the closing one is.
  order = torus_order.ring_order(shape)
  assert sorted(order) == sorted(itertools.product(*map(range, shape)))
  np.testing.assert_array_equal(_unit_steps(order, closed=False), 1)
  assert _unit_steps(order)[-1] > 1


@pytest.mark.parametrize("generation,bounds,expected", [
    ("v3", (4, 4, 1), (False, False, True)),
    ("v3", (32, 32, 1), (True, True, True)),
    ("v2", (16, 16, 1), (True, True, True)),
    ("v4", (2, 2, 4), (True, True, False)),  # not whole cubes: no wrap-around on z
    ("v4", (4, 4, 4), (True, True, True)),
    ("v5p", (4, 4, 8), (True, True, True)),
    ("v5litepod", (4, 4, 1), (False, False, True)),
    ("v5litepod", (16, 16, 1), (True, True, True)),
    ("v6e", (8, 16, 1), (False, True, True)),
])
def test_wraparound_follows_the_public_rule(generation, bounds, expected):
  assert torus_order.wraparound(generation, bounds) == expected


# -- the TPU compiler's programs ----------------------------------------------

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu (pip install 'jax[tpu]') is not installed")

#: One slice per generation; which ones wrap around decides the closing hops.
SLICES = ["v2-8", "v3-32", "v4-32", "v5p-16", "v5litepod-16", "v6e-16", "v3-2048"]


def _rings(grid, axis):
  """The rings of a mesh axis, each a list of devices."""
  return [list(r) for r in np.moveaxis(grid, axis, -1).reshape(-1, grid.shape[axis])]


def _allowed(tpu, ring):
  """Hops allowed between consecutive devices of a ring: one link or the same
  chip; for a ring that is one line of chips that does not wrap around, the
  closing hop routes back along it."""
  differ = {i for a, b in zip(ring, ring[1:]) for i in range(3) if a.coords[i] != b.coords[i]}
  line = len(differ) == 1 and len({d.core_on_chip for d in ring}) == 1
  closing = len(ring) - 1 if line and not tpu.wraparound[differ.pop()] else 1
  return [1] * (len(ring) - 1) + [closing]


@needs_libtpu
@pytest.mark.parametrize("accelerator_type", SLICES)
def test_meshes_for_rings_step_over_one_link(accelerator_type):
  tpu = dp.tpu_slice(accelerator_type)
  ring = list(tpu.data_mesh().devices.flat)
  hops = [tpu.ici_hops(a, b) for a, b in zip(ring, ring[1:] + ring[:1])]
  assert max(hops) <= 1, accelerator_type
  grid = tpu.torus_mesh().devices
  for axis in (0, 1):
    for r in _rings(grid, axis):
      hops = [tpu.ici_hops(a, b) for a, b in zip(r, r[1:] + r[:1])]
      assert all(h <= ok for h, ok in zip(hops, _allowed(tpu, r), strict=True)), (axis, hops)
  if all(tpu.wraparound):
    assert {tpu.ici_hops(a, b) for r in _rings(grid, 0) for a, b in zip(r, r[1:] + r[:1])} == {1}


def _permute_pairs(mesh, sync):
  """The (source, target) devices of every collective-permute `sync` compiles to."""
  axes = mesh.axis_names
  f = jax.jit(jax.shard_map(lambda x: sync(x, axes if len(axes) > 1 else axes[0]),
                            mesh=mesh, in_specs=P(axes), out_specs=P(axes),
                            check_vma=False))
  x = jax.ShapeDtypeStruct((mesh.size * 256,), jnp.float32,
                           sharding=NamedSharding(mesh, P(axes)))
  rounds = dp.collective_permute_rounds(f.lower(x).compile().as_text())
  flat = list(mesh.devices.flat)  # SPMD partition ids index the mesh's devices
  pairs = {(flat[s], flat[t]) for _, ps in rounds for s, t in ps}
  assert pairs, "no collective-permute read from the program"
  return pairs


@needs_libtpu
@pytest.mark.xdist_group("libtpu")
@pytest.mark.parametrize("accelerator_type", ["v3-32", "v4-32"])
def test_the_compiled_ring_and_torus_send_only_over_links(accelerator_type):
  # The TPU compiler's own program: every collective-permute's pairs are the
  # meshes' neighbours, so each hop is one link, on-chip, or the closing hop
  # of a line that does not wrap around.
  tpu = dp.tpu_slice(accelerator_type)
  pairs = _permute_pairs(tpu.data_mesh(), dp.ring_all_reduce)
  assert len(pairs) == tpu.num_devices  # one ring through every device
  assert {tpu.ici_hops(a, b) for a, b in pairs} <= {0, 1}
  mesh = tpu.torus_mesh()
  allowed = {}
  for axis in (0, 1):
    for r in _rings(mesh.devices, axis):
      for a, b, ok in zip(r, r[1:] + r[:1], _allowed(tpu, r), strict=True):
        allowed[(a, b)] = allowed[(b, a)] = max(ok, allowed.get((a, b), 0))
  pairs = _permute_pairs(mesh, lambda x, axes: dp.torus_all_reduce(x, axes))
  assert pairs <= set(allowed)  # only neighbours on the mesh's rings
  assert all(tpu.ici_hops(a, b) <= allowed[(a, b)] for a, b in pairs)
  assert {tpu.ici_hops(a, b) for a, b in pairs} >= {1}
