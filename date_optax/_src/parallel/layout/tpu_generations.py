"""Public facts of each Cloud TPU generation, in one table with its sources.

Every estimate the library makes for a TPU slice (does a program fit, how
long a step takes by the roofline, what a run costs) reads its numbers from
`GENERATIONS` below. Each number is a public specification; where a source
gives a range or a typical value, the value used and the reason are stated
beside it. None of these were measured here: no TPU has run this code.

Sources, cited by key in each row's ``sources``:

* ``cloud``: Google Cloud, "TPU versions" and the system-architecture page
  of each generation (https://cloud.google.com/tpu/docs/system-architecture-tpu-vm,
  .../v4, .../v5e, .../v5p, .../v6e): HBM per chip, dense bf16 peak, chips
  per host, slice sizes, which generations join slices over the data-center
  network (Multislice: v4, v5e, v5p, v6e).
* ``book``: Austin et al., "How to Scale Your Model", Google DeepMind, 2025,
  https://jax-ml.github.io/scaling-book/tpus/ (the TPU chapter's tables):
  HBM bandwidth, ICI bandwidth per link one way, DCN bandwidth about 2.5e10
  bytes/s per host.
* ``jouppi``: Jouppi et al., "A Domain-Specific Supercomputer for Training
  Deep Neural Networks", CACM 63(7), 2020: TPU v2's HBM bandwidth (700
  GB/s) and ICI links (4 per chip, 496 Gbit/s each).
* ``pricing``: Google Cloud, "Cloud TPU pricing", on-demand price per chip
  hour in us-central regions, as read on `PRICES_READ` (prices change and
  differ by region and commitment: pass your own to the planner).

Where no source states a number the library assumes one and says so:
``ici_hop_latency`` (1 us per ICI hop, the order of the book's worked
examples) and ``dcn_latency`` (10 us per message across hosts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

GiB = 1 << 30

#: When the per-chip-hour prices in `GENERATIONS` were read.
PRICES_READ = "2025-06"


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
  """One TPU generation's public facts, per chip, and how Cloud TPU names it.

  Args:
    name: the generation as people say it (``"v5e"``).
    accelerator_prefix: the prefix of Cloud TPU's accelerator types
      (``"v5litepod"`` in ``v5litepod-256``).
    topology_prefix: libtpu's topology prefix (``"v5e"`` in ``v5e:16x16``).
    size_counts: what the number of an accelerator type counts, ``"cores"``
      (``v3-512`` = 256 chips) or ``"chips"``.
    cores_per_chip: TensorCores per chip.
    devices_per_chip: JAX devices per chip on a VM of this generation
      (``len(jax.devices()) / chips``): 2 on v2/v3, 1 where the runtime
      joins the cores into one megacore device (v4, v5p) or the chip has one.
    chip_config: libtpu's ``chip_config_name`` that lists devices as a VM
      does (``"megacore"`` on v4), or None for libtpu's default.
    hbm_per_chip: HBM bytes per chip.
    hbm_bandwidth_per_chip: HBM bytes/s per chip.
    peak_flops_per_chip: dense bfloat16 FLOP/s per chip.
    ici_links_per_chip: ICI links per chip (4 on a 2-D torus, 6 on a 3-D one).
    ici_bandwidth_per_link: bytes/s of one ICI link in one direction.
    ici_hop_latency: seconds per ICI hop (assumed, see the module's notes).
    dcn_bandwidth_per_host: bytes/s a host sends over the data-center network.
    dcn_latency: seconds per DCN message (assumed).
    chips_per_host: chips one TPU VM host drives.
    multislice: whether Cloud TPU joins slices of it over the DCN.
    price_per_chip_hour: on-demand USD per chip hour (``pricing``).
    sizes: the accelerator-type numbers offered (``v3-8`` .. ``v3-2048``).
    dims: 2 or 3, the chip torus's dimensions.
    sources: the keys of the module's sources each number comes from.

  Examples:
    >>> import date_optax.parallel as dp
    >>> v6e = dp.tpu_generation("v6e")
    >>> v6e.peak_flops_per_chip / 1e12, v6e.hbm_bandwidth_per_chip / 1e12, v6e.ici_links_per_chip
    (918.0, 1.6, 4)

  References:
    See the module docstring: Google Cloud's TPU pages; Austin et al., "How
    to Scale Your Model", 2025; Jouppi et al., CACM 2020.
  """

  name: str
  accelerator_prefix: str
  topology_prefix: str
  size_counts: str
  cores_per_chip: int
  devices_per_chip: int
  chip_config: str | None
  hbm_per_chip: int
  hbm_bandwidth_per_chip: float
  peak_flops_per_chip: float
  ici_links_per_chip: int
  ici_bandwidth_per_link: float
  ici_hop_latency: float
  dcn_bandwidth_per_host: float
  dcn_latency: float
  chips_per_host: int
  multislice: bool
  price_per_chip_hour: float
  sizes: tuple[int, ...]
  dims: int
  sources: str

  @property
  def dcn_bandwidth_per_chip(self) -> float:
    """DCN bytes/s per chip: the host's share when all its chips send at once."""
    return self.dcn_bandwidth_per_host / self.chips_per_host

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready facts, the DCN share per chip included."""
    return {**dataclasses.asdict(self), "dcn_bandwidth_per_chip": self.dcn_bandwidth_per_chip}


def _pow2(lo: int, hi: int) -> tuple[int, ...]:
  return tuple(2**i for i in range(lo, hi + 1))


_DCN_PER_HOST = 2.5e10  # book: "typically around 2.5e10 bytes/s per host"
_ICI_HOP = 1e-6
_DCN_LATENCY = 1e-5

#: The generations by accelerator-type prefix (``"v5litepod"``, not ``"v5e"``).
GENERATIONS: dict[str, TpuGeneration] = {
    g.accelerator_prefix: g for g in (
        TpuGeneration(
            "v2", "v2", "v2", "cores", 2, 2, None, 16 * GiB, 7.0e11, 45e12,
            4, 6.2e10, _ICI_HOP, _DCN_PER_HOST, _DCN_LATENCY, 4, False, 1.125,
            (8, 32, 128, 256, 512), 2, "cloud; jouppi (HBM and ICI bandwidth); pricing"),
        TpuGeneration(
            "v3", "v3", "v3", "cores", 2, 2, None, 32 * GiB, 9.0e11, 123e12,
            4, 1.0e11, _ICI_HOP, _DCN_PER_HOST, _DCN_LATENCY, 4, False, 2.00,
            (8,) + _pow2(5, 11), 2, "cloud; book (bandwidths); pricing"),
        TpuGeneration(
            "v4", "v4", "v4", "cores", 2, 1, "megacore", 32 * GiB, 1.2e12, 275e12,
            6, 4.5e10, _ICI_HOP, _DCN_PER_HOST, _DCN_LATENCY, 4, True, 3.22,
            _pow2(3, 10) + (1536, 2048, 4096), 3, "cloud; book (bandwidths); pricing"),
        TpuGeneration(
            "v5p", "v5p", "v5p", "cores", 2, 1, None, 95 * GiB, 2.8e12, 459e12,
            6, 1.0e11, _ICI_HOP, _DCN_PER_HOST, _DCN_LATENCY, 4, True, 4.20,
            _pow2(3, 13), 3, "cloud; book (bandwidths); pricing"),
        TpuGeneration(
            "v5e", "v5litepod", "v5e", "chips", 1, 1, None, 16 * GiB, 8.1e11, 197e12,
            4, 5.0e10, _ICI_HOP, _DCN_PER_HOST, _DCN_LATENCY, 8, True, 1.20,
            (1, 4, 8) + _pow2(4, 8), 2, "cloud; book (bandwidths); pricing"),
        TpuGeneration(
            "v6e", "v6e", "v6e", "chips", 1, 1, None, 32 * GiB, 1.6e12, 918e12,
            4, 1.0e11, _ICI_HOP, _DCN_PER_HOST, _DCN_LATENCY, 8, True, 2.70,
            (1, 4, 8) + _pow2(4, 8), 2, "cloud; book (bandwidths); pricing"),
    )
}

#: Names people type for a generation's accelerator types: ``v5e-8`` is
#: Cloud TPU's ``v5litepod-8``.
ALIASES: dict[str, str] = {"v5e": "v5litepod"}


def generation(name: str) -> TpuGeneration:
  """The `TpuGeneration` of an accelerator-type prefix or generation name.

  Args:
    name: ``"v3"``, ``"v5litepod"``, ``"v5e"``, ``"v6e"``, ...

  Returns:
    Its `TpuGeneration`.

  Raises:
    ValueError: an unknown name, listing the known ones.

  Examples:
    >>> import date_optax.parallel as dp
    >>> g = dp.tpu_generation("v5e")
    >>> g.accelerator_prefix, g.hbm_per_chip / 2**30, g.dcn_bandwidth_per_chip / 1e9
    ('v5litepod', 16.0, 3.125)

  References:
    Google Cloud, "TPU versions"; Austin et al., "How to Scale Your Model",
    2025, https://jax-ml.github.io/scaling-book/tpus/.
  """
  if not isinstance(name, str):
    raise TypeError(f"name must be a str such as 'v5e', got {name!r}.")
  key = ALIASES.get(name, name)
  if key not in GENERATIONS:
    known = sorted(set(GENERATIONS) | set(ALIASES))
    raise ValueError(f"unknown TPU generation {name!r}; known: {', '.join(known)}.")
  return GENERATIONS[key]
