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
import importlib.util
import math
import re
from typing import Any

import jax

from date_optax._src.parallel.layout.mesh import data_mesh, torus_mesh

GiB = 1 << 30

#: The environment of a process that only compiles for TPUs (no TPU used):
#: libtpu's one-process lock file shared, and no probing for TPU VM metadata.
#: Set by `date-optax compile` and the TPU-compile study before libtpu
#: loads; never on a TPU VM that trains.
COMPILE_ONLY_ENV = {
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "TPU_SKIP_MDS_QUERY": "1",
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_ACCELERATOR_TYPE": "v3-8",
}


@dataclasses.dataclass(frozen=True)
class _Generation:
  """Public facts of one TPU generation (per chip) and how it names slices."""

  topology_prefix: str  # libtpu's name: "v3" in "v3:16x16"
  size_counts: str  # what "v3-512"'s number counts: "cores" or "chips"
  cores_per_chip: int
  hbm_per_chip: int  # bytes
  peak_flops_per_chip: float  # dense bf16 FLOP/s
  sizes: tuple[int, ...]  # the accelerator-type numbers offered
  dims: int  # 2-D or 3-D torus


_POW2 = lambda lo, hi: tuple(2**i for i in range(lo, hi + 1))  # noqa: E731

#: Per-chip HBM and dense bf16 peak from Google's public Cloud TPU pages.
GENERATIONS: dict[str, _Generation] = {
    "v2": _Generation("v2", "cores", 2, 16 * GiB, 45e12, (8, 32, 128, 256, 512), 2),
    "v3": _Generation("v3", "cores", 2, 32 * GiB, 123e12, (8,) + _POW2(5, 11), 2),
    "v4": _Generation("v4", "cores", 2, 32 * GiB, 275e12, _POW2(3, 10) + (1536, 2048, 4096), 3),
    "v5p": _Generation("v5p", "cores", 2, 95 * GiB, 459e12, _POW2(3, 13), 3),
    "v5litepod": _Generation("v5e", "chips", 1, 16 * GiB, 197e12, (1, 4, 8) + _POW2(4, 8), 2),
    "v6e": _Generation("v6e", "chips", 1, 32 * GiB, 918e12, (1, 4, 8) + _POW2(4, 8), 2),
}


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
  """Every accelerator type `tpu_slice` knows.

  Returns:
    The names, e.g. ``["v2-8", ..., "v3-2048", ..., "v6e-256"]``, by
    generation and size.

  Examples:
    >>> import date_optax.parallel as dp
    >>> [t for t in dp.accelerator_types() if t.startswith("v2-")]
    ['v2-8', 'v2-32', 'v2-128', 'v2-256', 'v2-512']

  References:
    Google Cloud, "TPU versions" (the slice sizes of each generation).
  """
  return [f"{name}-{size}" for name, gen in GENERATIONS.items() for size in gen.sizes]


def check_libtpu() -> None:
  """Raises `ImportError` with the install command when `libtpu` is missing."""
  if importlib.util.find_spec("libtpu") is None:
    raise ImportError(
        "compiling for a TPU slice needs libtpu, the TPU compiler (no TPU is "
        "needed): pip install 'jax[tpu]' (it pins the libtpu of your jax), "
        "or pip install 'date-optax[tpu]'."
    )


@functools.cache
def _topology_devices(topology: str) -> tuple[Any, ...]:
  check_libtpu()
  from jax.experimental import topologies  # noqa: PLC0415 - loads libtpu

  return tuple(topologies.get_topology_desc(platform="tpu", topology_name=topology).devices)


@dataclasses.dataclass(frozen=True)
class TpuSlice:
  """A Cloud TPU slice (``v3-512``) as a compile target: devices, meshes, limits.

  Build it with `tpu_slice`. The devices are libtpu's description of the
  slice (no TPU is needed; any process, ``JAX_PLATFORMS=cpu`` included):
  arrays cannot live on them, but `jax.jit(...).lower(...).compile()` over a
  mesh of them runs the real TPU compiler.

  Args:
    accelerator_type: the Cloud TPU name, e.g. ``"v3-512"``.
    generation: ``"v2"``, ``"v3"``, ``"v4"``, ``"v5p"``, ``"v5litepod"`` or
      ``"v6e"``.
    topology: libtpu's topology name, e.g. ``"v3:16x16"`` (chips per axis).
    chips: chips in the slice.
    cores: TensorCores in the slice.
    hbm_per_chip: HBM bytes per chip (public specification).
    peak_flops_per_chip: dense bfloat16 FLOP/s per chip (public specification).

  Examples:
    >>> import date_optax.parallel as dp
    >>> s = dp.tpu_slice("v3-32")
    >>> s.topology, s.chips, s.num_devices, s.hbm_per_device / 2**30
    ('v3:4x4', 16, 32, 16.0)
    >>> dict(s.mesh(model=2).shape)
    {'data': 16, 'model': 2}

  References:
    Google Cloud, "TPU versions" (system architecture pages for v2, v3, v4,
    v5e, v5p and v6e); Ying et al., "Image Classification at Supercomputer
    Scale", 2018 (the v2/v3 pod's 2-D torus).
  """

  accelerator_type: str
  generation: str
  topology: str
  chips: int
  cores: int
  hbm_per_chip: int
  peak_flops_per_chip: float

  @property
  def devices(self) -> list[Any]:
    """The slice's JAX devices (libtpu's topology description), in id order."""
    return list(_topology_devices(self.topology))

  @property
  def num_devices(self) -> int:
    """JAX devices: one per TensorCore on v2, v3 and v4 (libtpu's topologies
    list v4's two cores apart; a v4 VM's runtime joins them into one megacore
    device), one per chip on v5p, v5e and v6e."""
    return len(self.devices)

  @property
  def devices_per_chip(self) -> int:
    return self.num_devices // self.chips

  @property
  def hbm_per_device(self) -> int:
    """HBM bytes one device (the unit a program's memory is reported in) has."""
    return self.hbm_per_chip // self.devices_per_chip

  @property
  def peak_flops_per_device(self) -> float:
    """Dense bf16 FLOP/s of one device."""
    return self.peak_flops_per_chip / self.devices_per_chip

  def data_mesh(self, axis_name: str = "data") -> jax.sharding.Mesh:
    """A 1-D mesh over every device of the slice (`date_optax.parallel.data_mesh`)."""
    return data_mesh(axis_name=axis_name, devices=self.devices)

  def mesh(self, model: int = 1, axis_names: tuple[str, str] = ("data", "model")
           ) -> jax.sharding.Mesh:
    """A (data, model) mesh: `model` devices per model-parallel group.

    Args:
      model: devices along the model axis; must divide the device count.
      axis_names: the two axes' names.

    Returns:
      A 2-D `jax.sharding.Mesh` (Auto axes) over the slice's devices,
      placed in the torus order `jax.make_mesh` chooses.
    """
    n = self.num_devices
    if not isinstance(model, int) or isinstance(model, bool) or model < 1 or n % model:
      divisors = [d for d in range(1, n + 1) if n % d == 0]
      raise ValueError(
          f"model must be a divisor of the {n} devices of {self.accelerator_type}, "
          f"one of {divisors}; got {model!r}."
      )
    return torus_mesh(n // model, model, axis_names=axis_names, devices=self.devices)

  def torus_mesh(self, axis_names: tuple[str, str] = ("x", "y")) -> jax.sharding.Mesh:
    """An X × Y mesh shaped as the slice's chip torus, for `GradSync("torus")`.

    The first axis is the torus's first axis of chips; the second holds the
    other axes (and, on v2/v3/v4, each chip's two cores), so neighbours along
    either axis share a link.
    """
    x = int(self.topology.split(":")[1].split("x")[0])
    return torus_mesh(x, self.num_devices // x, axis_names=axis_names, devices=self.devices)

  @staticmethod
  def compile_only_env() -> dict[str, str]:
    """Environment variables for a process that only compiles for TPUs.

    libtpu lets one process per host load it (``/tmp/libtpu_lockfile``) and
    probes for TPU VM metadata when it loads; a process that compiles and
    never runs on a TPU sets these first (`date-optax compile` does). Never
    on a TPU VM that trains.
    """
    return dict(COMPILE_ONLY_ENV)

  def as_dict(self) -> dict[str, Any]:
    """The slice's facts as JSON-ready values (devices counted, not listed)."""
    return {**dataclasses.asdict(self), "num_devices": self.num_devices,
            "hbm_per_device": self.hbm_per_device,
            "peak_flops_per_device": self.peak_flops_per_device}


def tpu_slice(accelerator_type: str) -> TpuSlice:
  """The Cloud TPU slice `accelerator_type` (``"v3-512"``) as a compile target.

  Args:
    accelerator_type: ``<generation>-<size>`` as Cloud TPU names slices
      (``gcloud ... --accelerator-type``): ``v2-8`` .. ``v2-512``,
      ``v3-8`` .. ``v3-2048``, ``v4-8`` .. ``v4-4096`` and ``v5p-8`` ..
      ``v5p-8192`` count TensorCores; ``v5litepod-1`` .. ``v5litepod-256``
      and ``v6e-1`` .. ``v6e-256`` count chips.

  Returns:
    A `TpuSlice`. Its devices load libtpu on first use.

  Raises:
    ValueError: an unknown name, listing the valid ones.
    ImportError: (on first use of the devices) libtpu is not installed; the
      message gives the install command.

  Examples:
    >>> import date_optax.parallel as dp
    >>> s = dp.tpu_slice("v3-2048")  # a full v3 pod: 1,024 chips
    >>> s.topology, s.num_devices
    ('v3:32x32', 2048)
    >>> dp.tpu_slice("v5litepod-256").topology
    'v5e:16x16'

  References:
    Google Cloud, "TPU versions" and "TPU regions and zones" (accelerator
    type names); MaxText's ``train_compile.py`` (compiling for a topology
    before renting it).
  """
  if not isinstance(accelerator_type, str):
    raise TypeError(f"accelerator_type must be a str such as 'v3-512', got "
                    f"{accelerator_type!r}.")
  match = re.fullmatch(r"(v[0-9a-z]+)-([0-9]+)", accelerator_type)
  gen = GENERATIONS.get(match.group(1)) if match else None
  size = int(match.group(2)) if match else 0
  if gen is None or size not in gen.sizes:
    raise ValueError(
        f"unknown accelerator_type {accelerator_type!r}; valid: "
        f"{', '.join(accelerator_types())}."
    )
  if gen.size_counts == "cores":
    cores, chips = size, max(1, size // gen.cores_per_chip)
  else:
    chips, cores = size, size * gen.cores_per_chip
  grid = _grid(chips, gen.dims)
  return TpuSlice(
      accelerator_type=accelerator_type,
      generation=match.group(1),
      topology=f"{gen.topology_prefix}:{'x'.join(map(str, grid))}",
      chips=chips,
      cores=cores,
      hbm_per_chip=gen.hbm_per_chip,
      peak_flops_per_chip=gen.peak_flops_per_chip,
  )
