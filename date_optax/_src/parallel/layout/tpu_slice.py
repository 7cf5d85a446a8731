"""Cloud TPU slices as compile targets: `tpu_slice("v3-512")` without a TPU.

`libtpu` (installed by ``pip install 'jax[tpu]'``) describes every TPU
topology to the compiler on any machine, a CPU-only one included
(`jax.experimental.topologies.get_topology_desc`). A `TpuSlice` names a
slice the way Cloud TPU does (``v3-512``: 512 TensorCores, 256 chips, the
``v3:16x16`` torus), gives its devices and meshes over them, and the per-core
HBM and peak bf16 rate of its generation, so that a train step can be
compiled for the slice and its memory and estimated time read before the
slice is rented (`date_optax.parallel.compile_report`).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib.util
import math
import os
import re
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.layout import torus_order
from date_optax._src.parallel.layout import tpu_generations as tg
from date_optax._src.parallel.layout.mesh import (
    _make_mesh,
    auto_axes_mesh,
    torus_mesh,
)

#: The environment of a process that only compiles for TPUs (no TPU used):
#: libtpu's one-process lock file shared, and no probing for TPU VM metadata.
#: `tpu_slice`'s devices set what is unset of it on a host without a TPU;
#: never on a TPU VM that trains.
COMPILE_ONLY_ENV = {
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v3-8",
}

#: The outer mesh axis of a Multislice target: it crosses slices (DCN).
SLICE_AXIS = "slice"


def _grid(chips: int, dims: int) -> tuple[int, ...]:
  """The chip torus of a slice: powers of two, as square as they go
  (``64 -> 8x8``, ``128 -> 8x16``; 3-D ``64 -> 4x4x4``, ``128 -> 4x4x8``)."""
  if chips & (chips - 1):  # not a power of two: v4-1536 is 8x8x12
    return (8, 8, chips // 64)
  e = int(math.log2(chips))
  base, extra = divmod(e, dims)
  # The last `extra` axes are one power of two longer; a 3-D slice of one
  # layer of chips lists that layer first (libtpu's "v4:2x2x1").
  grid = tuple(2 ** (base + (i >= dims - extra)) for i in range(dims))
  return grid[::-1] if grid[0] == 1 else grid


def accelerator_types() -> list[str]:
  """Every accelerator type `tpu_slice` knows, by Cloud TPU's names.

  Returns:
    The names, e.g. ``["v2-8", ..., "v3-2048", ..., "v6e-256"]``, by
    generation and size (v5e's as ``v5litepod-N``; `tpu_slice` also takes
    ``v5e-N``).

  Examples:
    >>> import date_optax.parallel as dp
    >>> [t for t in dp.accelerator_types() if t.startswith("v2-")]
    ['v2-8', 'v2-32', 'v2-128', 'v2-256', 'v2-512']

  References:
    Google Cloud, "TPU versions" (the slice sizes of each generation).
  """
  return [f"{name}-{size}" for name, gen in tg.GENERATIONS.items() for size in gen.sizes]


def check_libtpu() -> None:
  """Raises `ImportError` with the install command when `libtpu` is missing."""
  if importlib.util.find_spec("libtpu") is None:
    raise ImportError(
        "compiling for a TPU slice needs libtpu, the TPU compiler (no TPU is "
        "needed): pip install 'jax[tpu]' (it pins the libtpu of your jax), "
        "or pip install 'date-optax[tpu]'."
    )


def has_tpu_attached() -> bool:
  """Whether this host has TPU chips (a TPU VM's ``/dev/accel*`` or ``/dev/vfio``)."""
  return bool(glob.glob("/dev/accel*")) or os.path.isdir("/dev/vfio")


def quiet_compile_only() -> None:
  """Sets the unset keys of `COMPILE_ONLY_ENV` on a host without a TPU.

  libtpu probes for a TPU VM's metadata when it loads and, finding none,
  prints start-up errors that mean nothing to a process that only compiles.
  On a host with TPU chips nothing is set: a training process there needs
  the real metadata. Values the user set are kept.
  """
  if has_tpu_attached():
    return
  for key, value in COMPILE_ONLY_ENV.items():
    os.environ.setdefault(key, value)


@functools.cache
def _topology_devices(topology: str, num_slices: int = 1,
                      chip_config: str | None = None) -> tuple[Any, ...]:
  check_libtpu()
  quiet_compile_only()
  from jax.experimental import topologies  # noqa: PLC0415 - loads libtpu

  kwargs: dict[str, Any] = {}
  if num_slices > 1:
    kwargs["num_slices"] = num_slices
  if chip_config is not None:
    # A VM's runtime joins the chip's cores into one device; libtpu needs the
    # host's chip block with that config ((2, 2, 1) on every 3-D generation).
    kwargs.update(chip_config_name=chip_config, chips_per_host_bounds=(2, 2, 1))
  desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs)
  return tuple(desc.devices)


def _by_slice(devices: list[Any], num_slices: int) -> list[list[Any]]:
  """The devices grouped by slice: by ``slice_index`` where devices carry one
  (a Multislice topology, a Multislice VM), else by process (each process a
  slice, as `create_hybrid_device_mesh(process_is_granule=True)` does)."""
  key = ((lambda d: d.slice_index)
         if all(getattr(d, "slice_index", None) is not None for d in devices)
         else (lambda d: d.process_index))
  groups: dict[int, list[Any]] = {}
  for d in devices:
    groups.setdefault(key(d), []).append(d)
  if len(groups) != num_slices or len({len(g) for g in groups.values()}) != 1:
    raise ValueError(
        f"expected {num_slices} slices of equal size, found groups of sizes "
        f"{[len(g) for _, g in sorted(groups.items())]}."
    )
  return [sorted(g, key=lambda d: d.id) for _, g in sorted(groups.items())]


def multislice_mesh(
    shape: tuple[int, ...],
    axis_names: tuple[str, ...],
    *,
    num_slices: int,
    devices: list[Any] | None = None,
    slice_axis: str = SLICE_AXIS,
) -> jax.sharding.Mesh:
  """A mesh over several slices: the slice axis outermost, each slice's own
  axes laid out inside it (`jax.make_mesh`'s physical order per slice).

  Collectives over `slice_axis` cross the data-center network (DCN); those
  over the other axes stay on one slice's ICI links. This is the hybrid mesh
  of `jax.experimental.mesh_utils.create_hybrid_device_mesh`.

  Args:
    shape: the per-slice mesh shape (its product is each slice's devices).
    axis_names: the per-slice axis names.
    num_slices: the number of slices (1 gives a mesh with a slice axis of 1).
    devices: every device of every slice (default `jax.devices()`).
    slice_axis: the name of the outer axis.

  Returns:
    A `jax.sharding.Mesh` of shape ``(num_slices, *shape)`` and axes
    ``(slice_axis, *axis_names)``, Auto axes.

  Raises:
    ValueError: the devices do not form `num_slices` equal slices of
      ``prod(shape)`` devices, or `slice_axis` is one of `axis_names`.

  Examples:
    >>> import jax
    >>> import date_optax.parallel as dp
    >>> mesh = dp.multislice_mesh((4,), ("data",), num_slices=2)  # 2 x 4 CPU devices
    >>> dict(mesh.shape)
    {'slice': 2, 'data': 4}

  References:
    Google Cloud, "Cloud TPU Multislice overview"; JAX,
    ``jax.experimental.mesh_utils.create_hybrid_device_mesh``; MaxText's
    ``dcn_data_parallelism``.
  """
  num_slices = validation.check_int("num_slices", num_slices, low=1)
  if slice_axis in axis_names:
    raise ValueError(f"slice_axis {slice_axis!r} must differ from axis_names {axis_names}.")
  devices = list(jax.devices() if devices is None else devices)
  per_slice = int(np.prod(shape))
  if per_slice * num_slices != len(devices):
    raise ValueError(
        f"a mesh of {num_slices} slices of shape {tuple(shape)} needs "
        f"{per_slice * num_slices} devices, got {len(devices)}."
    )
  if num_slices == 1:
    groups = [devices]
  elif all(getattr(d, "slice_index", None) is not None for d in devices) or len(
      {d.process_index for d in devices}) == num_slices:
    groups = _by_slice(devices, num_slices)
  else:  # one process, no slice indices (CPU tests): consecutive blocks
    groups = [devices[i * per_slice:(i + 1) * per_slice] for i in range(num_slices)]
  # Each slice in its own physical order (`jax.make_mesh`, as one slice's mesh is).
  grids = [_make_mesh(tuple(shape), tuple(axis_names), group).devices for group in groups]
  mesh = jax.sharding.Mesh(np.stack(grids), (slice_axis, *axis_names))
  return auto_axes_mesh(mesh)


def _ordered_mesh(grid: np.ndarray, names: tuple[str, ...]) -> jax.sharding.Mesh:
  """A mesh over devices in the order given (not `jax.make_mesh`'s), Auto axes."""
  return auto_axes_mesh(jax.sharding.Mesh(grid, names))


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """A Cloud TPU slice (``v3-512``), or S of them, as a compile target.

  Build it with `tpu_slice`. The devices are libtpu's description of the
  slice (no TPU is needed; any process, ``JAX_PLATFORMS=cpu`` included):
  arrays cannot live on them, but `jax.jit(...).lower(...).compile()` over a
  mesh of them runs the real TPU compiler. They are the devices a VM of
  that type lists (`jax.devices()`): one per TensorCore on v2 and v3, one
  megacore device per chip on v4 and v5p, one per chip on v5e and v6e.

  With ``num_slices`` S > 1 the target is a Multislice job: S slices of
  this type joined by the data-center network (DCN). Its meshes put a
  ``"slice"`` axis outermost, so only collectives over that axis cross DCN.

  Args:
    accelerator_type: Cloud TPU's name of one slice, e.g. ``"v3-512"``,
      ``"v5litepod-256"`` (``"v5e-256"`` is accepted and stored so).
    generation: the accelerator-type prefix: ``"v2"``, ``"v3"``, ``"v4"``,
      ``"v5p"``, ``"v5litepod"`` or ``"v6e"``.
    topology: libtpu's topology name of one slice, e.g. ``"v3:16x16"``.
    chips: chips in one slice.
    cores: TensorCores in one slice.
    hbm_per_chip: HBM bytes per chip (public specification).
    peak_flops_per_chip: dense bfloat16 FLOP/s per chip (public specification).
    num_slices: slices joined over DCN (1: a single slice).

  Examples:
    >>> import date_optax.parallel as dp
    >>> s = dp.tpu_slice("v3-32")
    >>> s.topology, s.chips, s.num_devices, s.hbm_per_device / 2**30
    ('v3:4x4', 16, 32, 16.0)
    >>> dict(s.mesh(model=2).shape)
    {'data': 16, 'model': 2}
    >>> v4 = dp.tpu_slice("v4-8")  # 4 chips, one 32 GiB megacore device each
    >>> v4.num_devices, v4.hbm_per_device / 2**30
    (4, 32.0)
    >>> two = dp.tpu_slice("v5e-16", num_slices=2)
    >>> two.accelerator_type, two.num_devices, dict(two.data_mesh().shape)
    ('v5litepod-16', 32, {'slice': 2, 'data': 16})

  References:
    Google Cloud, "TPU versions" (system architecture pages for v2, v3, v4,
    v5e, v5p and v6e) and "Cloud TPU Multislice overview"; Ying et al.,
    "Image Classification at Supercomputer Scale", 2018 (the v2/v3 pod's
    2-D torus).
  """

  accelerator_type: str
  generation: str
  topology: str
  chips: int
  cores: int
  hbm_per_chip: int
  peak_flops_per_chip: float
  num_slices: int = 1

  @property
  def facts(self) -> tg.TpuGeneration:
    """The generation's public facts (bandwidths, links, hosts, price)."""
    return tg.GENERATIONS[self.generation]

  @property
  def name(self) -> str:
    """The target as people write it: ``"v5litepod-256"`` or ``"4 x v5litepod-256"``."""
    return (self.accelerator_type if self.num_slices == 1
            else f"{self.num_slices} x {self.accelerator_type}")

  @property
  def devices(self) -> list[Any]:
    """Every slice's JAX devices (libtpu's topology description), in id order."""
    return list(_topology_devices(self.topology, self.num_slices, self.facts.chip_config))

  @property
  def num_devices(self) -> int:
    """JAX devices over all slices, as VMs of this type list them."""
    return len(self.devices)

  @property
  def total_chips(self) -> int:
    """Chips over all slices (what a run is billed for)."""
    return self.chips * self.num_slices

  @property
  def hosts(self) -> int:
    """TPU VM hosts over all slices (one process each on a real job)."""
    return self.num_slices * max(1, self.chips // self.facts.chips_per_host)

  @property
  def devices_per_chip(self) -> int:
    return self.num_devices // self.total_chips

  @property
  def hbm_per_device(self) -> int:
    """HBM bytes one device (the unit a program's memory is reported in) has."""
    return self.hbm_per_chip // self.devices_per_chip

  @property
  def peak_flops_per_device(self) -> float:
    """Dense bf16 FLOP/s of one device."""
    return self.peak_flops_per_chip / self.devices_per_chip

  @property
  def hbm_bandwidth_per_device(self) -> float:
    """HBM bytes/s of one device."""
    return self.facts.hbm_bandwidth_per_chip / self.devices_per_chip

  def _check_model(self, model: Any, n: int) -> int:
    if not isinstance(model, int) or isinstance(model, bool) or model < 1 or n % model:
      divisors = [d for d in range(1, n + 1) if n % d == 0]
      per = "of one slice " if self.num_slices > 1 else ""
      raise ValueError(
          f"model must be a divisor of the {n} devices {per}of {self.accelerator_type}, "
          f"one of {divisors}; got {model!r}."
      )
    return model

  def data_mesh(self, axis_name: str = "data") -> jax.sharding.Mesh:
    """A mesh whose every axis carries replicas.

    Over one slice a 1-D mesh whose order is a ring of the slice's links
    (each device's next is on its chip or one ICI hop away, the last's
    next is the first: `GradSync("ring")` over it sends every round over
    one link); over several, ``("slice", axis_name)`` with the slice axis
    outermost."""
    if self.num_slices == 1:
      return _ordered_mesh(np.array(torus_order.ring_devices(self.devices), dtype=object),
                           (axis_name,))
    per = self.num_devices // self.num_slices
    return multislice_mesh((per,), (axis_name,), num_slices=self.num_slices,
                           devices=self.devices)

  def mesh(self, model: int = 1, axis_names: tuple[str, str] = ("data", "model")
           ) -> jax.sharding.Mesh:
    """A (data, model) mesh: `model` devices per model-parallel group.

    Args:
      model: devices along the model axis; must divide one slice's devices
        (a model group never crosses slices).
      axis_names: the two axes' names.

    Returns:
      A 2-D `jax.sharding.Mesh` (Auto axes) over the slice's devices,
      placed in the torus order `jax.make_mesh` chooses; over several slices
      a 3-D one with the ``"slice"`` axis outermost.
    """
    per = self.num_devices // self.num_slices
    model = self._check_model(model, per)
    if self.num_slices == 1:
      return torus_mesh(per // model, model, axis_names=axis_names, devices=self.devices)
    return multislice_mesh((per // model, model), tuple(axis_names),
                           num_slices=self.num_slices, devices=self.devices)

  def torus_mesh(self, axis_names: tuple[str, str] = ("x", "y")) -> jax.sharding.Mesh:
    """An X × Y mesh shaped as the slice's chip torus, for `GradSync("torus")`.

    Ordered by the devices' coordinates: the first axis is the chips' first
    dimension in order; the second is a ring over the other dimensions and,
    on v2/v3, each chip's two cores (a v4/v5p cube's y and z fold into it).
    Each hop along the second axis is one ICI link or stays on the chip;
    along the first axis it is one link, the ring's closing hop too where
    the slice wraps around on that dimension (`wraparound`), and otherwise
    a route back along the line that no other hop of the ring uses in that
    direction. One slice only: a torus does not cross the data-center
    network.

    Raises:
      ValueError: a Multislice target.
    """
    if self.num_slices > 1:
      raise ValueError(
          f"torus_mesh is one slice's torus; {self.name} has {self.num_slices} slices "
          "joined by DCN: use data_mesh() (a 'slice' axis outermost) with "
          "GradSync('hierarchical') or psum."
      )
    if (not isinstance(axis_names, (tuple, list)) or len(axis_names) != 2
        or not all(isinstance(a, str) for a in axis_names) or axis_names[0] == axis_names[1]):
      raise ValueError(f"axis_names must be two distinct strings, got {axis_names!r}.")
    return _ordered_mesh(torus_order.torus_devices(self.devices), tuple(axis_names))

  @property
  def bounds(self) -> tuple[int, ...]:
    """Chips along each dimension of one slice (``(4, 4, 1)`` for ``v3:4x4``)."""
    dims = [int(b) for b in self.topology.split(":")[1].split("x")]
    return tuple(dims + [1] * (3 - len(dims)))

  @property
  def wraparound(self) -> tuple[bool, ...]:
    """Which chip dimensions close into rings by their own links (assumed
    from public pages; see `date_optax._src.parallel.layout.torus_order`)."""
    return torus_order.wraparound(self.generation, self.bounds)

  def ici_hops(self, a: Any, b: Any) -> int:
    """ICI links between devices `a` and `b` of one slice (0: the same chip).

    Args:
      a: a device of this slice.
      b: another.

    Returns:
      The links on the shortest route, wrap-around links included where
      the slice has them.
    """
    return torus_order.ici_hops(a, b, self.bounds, self.wraparound)

  @staticmethod
  def compile_only_env() -> dict[str, str]:
    """Environment variables for a process that only compiles for TPUs.

    libtpu lets one process per host load it (``/tmp/libtpu_lockfile``) and
    probes for TPU VM metadata when it loads. `tpu_slice`'s devices set the
    unset ones on a host without a TPU; a process that loads libtpu another
    way first (``jax.devices()`` with ``jax[tpu]`` installed) sets them
    itself. Never on a TPU VM that trains.
    """
    return dict(COMPILE_ONLY_ENV)

  def as_dict(self) -> dict[str, Any]:
    """The slice's facts as JSON-ready values (devices counted, not listed)."""
    return {**dataclasses.asdict(self), "name": self.name,
            "num_devices": self.num_devices, "total_chips": self.total_chips,
            "hosts": self.hosts, "hbm_per_device": self.hbm_per_device,
            "peak_flops_per_device": self.peak_flops_per_device,
            "hbm_bandwidth_per_device": self.hbm_bandwidth_per_device,
            "generation_facts": self.facts.as_dict()}


def tpu_slice(accelerator_type: str, num_slices: int = 1) -> TpuSlice:
  """The Cloud TPU slice `accelerator_type` (``"v3-512"``) as a compile target.

  Args:
    accelerator_type: ``<generation>-<size>`` as Cloud TPU names slices
      (``gcloud ... --accelerator-type``): ``v2-8`` .. ``v2-512``,
      ``v3-8`` .. ``v3-2048``, ``v4-8`` .. ``v4-4096`` and ``v5p-8`` ..
      ``v5p-8192`` count TensorCores; ``v5litepod-1`` .. ``v5litepod-256``
      (also written ``v5e-N``) and ``v6e-1`` .. ``v6e-256`` count chips.
    num_slices: how many such slices a Multislice job joins over the
      data-center network, 1 to 64 (v4, v5e, v5p and v6e; 1 on v2 and v3).

  Returns:
    A `TpuSlice`. Its devices load libtpu on first use.

  Raises:
    ValueError: an unknown name, listing the valid ones; a slice count out
      of range or on a generation that cannot join slices.
    ImportError: (on first use of the devices) libtpu is not installed; the
      message gives the install command.

  Examples:
    >>> import date_optax.parallel as dp
    >>> s = dp.tpu_slice("v3-2048")  # a full v3 pod: 1,024 chips
    >>> s.topology, s.num_devices
    ('v3:32x32', 2048)
    >>> dp.tpu_slice("v5e-256").topology
    'v5e:16x16'
    >>> dp.tpu_slice("v5litepod-256", num_slices=4).total_chips
    1024

  References:
    Google Cloud, "TPU versions", "TPU regions and zones" (accelerator
    type names) and "Cloud TPU Multislice overview"; MaxText's
    ``train_compile.py`` (compiling for a topology before renting it).
  """
  if not isinstance(accelerator_type, str):
    raise TypeError(f"accelerator_type must be a str such as 'v3-512', got "
                    f"{accelerator_type!r}.")
  match = re.fullmatch(r"(v[0-9a-z]+)-([0-9]+)", accelerator_type)
  prefix = tg.ALIASES.get(match.group(1), match.group(1)) if match else ""
  gen = tg.GENERATIONS.get(prefix)
  size = int(match.group(2)) if match else 0
  if gen is None or size not in gen.sizes:
    raise ValueError(
        f"unknown accelerator_type {accelerator_type!r}; valid: "
        f"{', '.join(accelerator_types())} (v5e-N is v5litepod-N)."
    )
  num_slices = validation.check_int("num_slices", num_slices, low=1, high=64)
  if num_slices > 1 and not gen.multislice:
    multi = ", ".join(g.name for g in tg.GENERATIONS.values() if g.multislice)
    raise ValueError(
        f"num_slices={num_slices}: TPU {gen.name} slices cannot be joined over the "
        f"data-center network (Multislice runs on {multi}); pass num_slices=1."
    )
  if gen.size_counts == "cores":
    cores, chips = size, max(1, size // gen.cores_per_chip)
  else:
    chips, cores = size, size * gen.cores_per_chip
  grid = _grid(chips, gen.dims)
  return TpuSlice(
      accelerator_type=f"{prefix}-{size}",
      generation=prefix,
      topology=f"{gen.topology_prefix}:{'x'.join(map(str, grid))}",
      chips=chips,
      cores=cores,
      hbm_per_chip=gen.hbm_per_chip,
      peak_flops_per_chip=gen.peak_flops_per_chip,
      num_slices=num_slices,
  )
