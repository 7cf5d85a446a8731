"""Device meshes (`jax.make_mesh`, Auto axes): a 1-D data mesh, a 2-D torus.

The train steps compile with GSPMD (Auto axes): `auto_axes_mesh` gives any
mesh, e.g. one from `jax.make_mesh` with its default Explicit axes, that form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from date_optax._src import validation

DATA_AXIS = "data"
TORUS_AXES = ("x", "y")


def _pick_devices(n: int, devices: Sequence[Any] | None, name: str) -> list[Any]:
  all_devices = list(jax.devices() if devices is None else devices)
  if n > len(all_devices):
    raise ValueError(
        f"{name} asks for {n} devices but only {len(all_devices)} are available."
    )
  return all_devices[:n]


def _auto_types(n: int) -> Any:
  axis_type = getattr(jax.sharding, "AxisType", None)
  return None if axis_type is None else (axis_type.Auto,) * n


def _make_mesh(
    shape: tuple[int, ...], names: tuple[str, ...], devices: list[Any]
) -> jax.sharding.Mesh:
  """`jax.make_mesh` (physical ICI order on TPU/GPU) with Auto axes."""
  try:
    return jax.make_mesh(shape, names, axis_types=_auto_types(len(shape)),
                         devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    # A subset of a TPU slice (tests, debugging) has no physical layout.
    grid = np.asarray(devices, dtype=object).reshape(shape)
    types = _auto_types(len(shape))
    if types is None:  # pragma: no cover - older JAX
      return jax.sharding.Mesh(grid, names)
    return jax.sharding.Mesh(grid, names, axis_types=types)


def data_mesh(
    num_devices: int | None = None,
    *,
    axis_name: str = DATA_AXIS,
    devices: Sequence[Any] | None = None,
) -> jax.sharding.Mesh:
  """Builds a 1-D mesh whose only axis carries the data-parallel replicas.

  Args:
    num_devices: how many devices to use; `None` uses all of `devices`.
    axis_name: name of the mesh axis.
    devices: the devices to choose from (default `jax.devices()`, i.e. every
      device of every process).

  Returns:
    A `jax.sharding.Mesh` with one axis `axis_name`.

  Examples:
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh(4)
    >>> dict(mesh.shape)
    {'data': 4}

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1
    Hour", 2017 (synchronous data parallelism).
  """
  if not isinstance(axis_name, str):
    raise TypeError(f"axis_name must be a str, got {axis_name!r}.")
  if num_devices is None:
    num_devices = len(jax.devices() if devices is None else devices)
  num_devices = validation.check_int("num_devices", num_devices, low=1)
  devs = _pick_devices(num_devices, devices, "data_mesh")
  return _make_mesh((num_devices,), (axis_name,), devs)


def torus_mesh(
    x: int,
    y: int,
    *,
    axis_names: tuple[str, str] = TORUS_AXES,
    devices: Sequence[Any] | None = None,
) -> jax.sharding.Mesh:
  """Builds an `x` × `y` mesh with axes ("x", "y"), the shape of a TPU slice.

  On TPU the devices are placed in physical torus order by
  `jax.make_mesh`, so that neighbours along
  "x" and "y" share an interconnect link; on CPU (emulated devices) the order
  is `jax.devices()` row by row. Both axes carry data-parallel replicas: the
  global batch is split over `x * y` devices.

  Args:
    x: number of devices along the first ("vertical") axis.
    y: number of devices along the second ("horizontal") axis.
    axis_names: names of the two axes.
    devices: the devices to choose from (default `jax.devices()`); the first
      `x * y` are used.

  Returns:
    A 2-D `jax.sharding.Mesh`.

  Examples:
    >>> import date_optax.parallel as dp
    >>> mesh = dp.torus_mesh(2, 4)
    >>> dict(mesh.shape)
    {'x': 2, 'y': 4}

  References:
    Ying et al., "Image Classification at Supercomputer Scale", 2018.
  """
  x = validation.check_int("x", x, low=1)
  y = validation.check_int("y", y, low=1)
  if (
      not isinstance(axis_names, (tuple, list))
      or len(axis_names) != 2
      or not all(isinstance(a, str) for a in axis_names)
      or axis_names[0] == axis_names[1]
  ):
    raise ValueError(f"axis_names must be two distinct strings, got {axis_names!r}.")
  devs = _pick_devices(x * y, devices, "torus_mesh")
  return _make_mesh((x, y), tuple(axis_names), devs)


def auto_axes_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """`mesh` with every axis of type Auto (GSPMD), the way the steps compile.

  `jax.make_mesh` makes Explicit axes by default in recent JAX; the train
  steps place arrays themselves, so they use the same devices as Auto axes.
  """
  axis_type = getattr(jax.sharding, "AxisType", None)
  if axis_type is None or all(
      t == axis_type.Auto for t in getattr(mesh, "axis_types", ())
  ):
    return mesh
  return jax.sharding.Mesh(
      mesh.devices, mesh.axis_names, axis_types=(axis_type.Auto,) * len(mesh.axis_names)
  )
