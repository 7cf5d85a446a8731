"""TPU slice facts: generations, sizes and how a slice maps to JAX devices.

Standard library only (Python >= 3.8), shared by every script in this folder.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Generation(NamedTuple):
  """Hardware facts of one TPU generation, as the accelerator type names it.

  Attributes:
    runtime: default `--version`/`--runtime-version` for JAX on this
      generation (Google's "TPU software versions" page).
    sizes: the numbers accepted after the dash (`v3-32` -> 32).
    size_counts: what that number counts: "cores" (TensorCores; v2-v5p) or
      "chips" (v5e, v6e).
    cores_per_chip: TensorCores per chip.
    devices_per_chip: JAX devices per chip (1 where two TensorCores form one
      "megacore" device: v4, v5p).
    chips_per_host: chips attached to one TPU VM host in a multi-host slice.
    max_single_host_chips: the largest slice that is a single host.
    multislice: whether Cloud TPU Multislice can join several slices of
      this generation over the data-center network (not v2, v3).
  """

  runtime: str
  sizes: tuple
  size_counts: str
  cores_per_chip: int
  devices_per_chip: int
  chips_per_host: int
  max_single_host_chips: int
  multislice: bool = True


_POW2 = lambda lo, hi: tuple(2**i for i in range(lo, hi + 1))  # noqa: E731

GENERATIONS: dict[str, Generation] = {
  "v2": Generation(
    "tpu-ubuntu2204-base", (8, 32, 128, 256, 512), "cores", 2, 2, 4, 4, False
  ),
  "v3": Generation(
    "tpu-ubuntu2204-base", (8,) + _POW2(5, 11), "cores", 2, 2, 4, 4, False
  ),
  "v4": Generation(
    "tpu-ubuntu2204-base", _POW2(3, 10) + (1536, 2048, 4096), "cores", 2, 1, 4, 4
  ),
  "v5p": Generation("v2-alpha-tpuv5", _POW2(3, 13), "cores", 2, 1, 4, 4),
  "v5litepod": Generation(
    "v2-alpha-tpuv5-lite", (1, 4, 8) + _POW2(4, 8), "chips", 1, 1, 4, 8
  ),
  "v6e": Generation(
    "v2-alpha-tpuv6e", (1, 4, 8) + _POW2(4, 8), "chips", 1, 1, 4, 8
  ),
}

#: Other names of a generation: Cloud TPU calls v5e "v5litepod" in accelerator
#: types (gcloud takes only that), people call it v5e.
ALIASES: dict[str, str] = {"v5e": "v5litepod"}


def display_name(generation: str) -> str:
  """"v5e (v5litepod)" for v5litepod, the name itself otherwise."""
  for alias, name in ALIASES.items():
    if name == generation:
      return f"{alias} ({name})"
  return generation


#: The generations whose slices Multislice can join, for messages.
MULTISLICE_GENERATIONS = ", ".join(
  display_name(name) for name, gen in GENERATIONS.items() if gen.multislice
)


class SliceLayout(NamedTuple):
  accelerator_type: str
  generation: str
  cores: int  # TensorCores
  chips: int
  devices: int  # JAX devices (jax.device_count())
  hosts: int  # TPU VM workers (gcloud --worker=0..hosts-1)


def parse_accelerator_type(value: str) -> SliceLayout:
  """Validates an accelerator type such as "v3-32" and returns its layout.

  `v5e-N` is taken as `v5litepod-N`, the name gcloud knows; the layout
  carries that name.

  Raises:
    ValueError: naming the allowed generations and sizes.
  """
  match = re.fullmatch(r"(v[0-9a-z]+)-([0-9]+)", value)
  name = ALIASES.get(match.group(1), match.group(1)) if match else ""
  if name not in GENERATIONS:
    generations = ", ".join(display_name(g) for g in GENERATIONS)
    raise ValueError(
      f"unknown accelerator type {value!r}; expected <generation>-<size> with "
      f"generation one of {generations} (e.g. v2-32, v3-32, v4-32)"
    )
  size = int(match.group(2))
  gen = GENERATIONS[name]
  if size not in gen.sizes:
    sizes = ", ".join(f"{name}-{s}" for s in gen.sizes)
    raise ValueError(f"unknown accelerator type {value!r}; {name} slices are {sizes}")
  if gen.size_counts == "cores":
    cores, chips = size, size // gen.cores_per_chip
  else:
    chips, cores = size, size * gen.cores_per_chip
  if chips <= gen.max_single_host_chips:
    hosts = 1
  else:
    hosts = chips // gen.chips_per_host
  accel = value if name == match.group(1) else f"{name}-{size}"  # v5e-N: v5litepod-N
  return SliceLayout(accel, name, cores, chips, chips * gen.devices_per_chip, hosts)


# --------------------------------------------------------------------------
