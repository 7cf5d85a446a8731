"""A roofline step time for a program compiled for a TPU slice.

The TPU compiler's cost model (``cost_analysis()["optimal_seconds"]``) gives
no time for some programs and does not price the data-center network (DCN)
that joins the slices of a Multislice job. The roofline here needs only what
every compiled program reports and the generation's public facts
(`date_optax.parallel.tpu_generation`): the per-device flops over the peak
bf16 rate, the per-device bytes accessed over the HBM bandwidth, and every
collective of the optimized HLO priced by its bytes and replica groups on
the links it uses, ICI inside a slice and DCN across slices.

On a Multislice target the TPU compiler emits one slice's program: its
replica groups name that slice's devices only (``{{0,1,2,3}}`` on each of
2 x ``v5e:2x2``, ``num_partitions=4``), and what crosses slices is a host
transfer, a ``send`` with ``_xla_megascale_transfer_type`` (``ALL_REDUCE``,
``REDUCE_SCATTER``, ``ALL_GATHER``, ``ALL_TO_ALL``, ``ONE_TO_ONE``) and
``_xla_megascale_target="{1,2}x{0:3}"`` (the slices, then each slice's
devices). A psum over every axis becomes a reduce-scatter on ICI, an
all-reduce of one shard over DCN, and an all-gather on ICI. Those sends are
the DCN collectives priced here; a replica group whose devices lie on
different slices (a program that keeps global groups) is priced on DCN too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from date_optax._src import validation
from date_optax._src.parallel.comm import hlo
from date_optax._src.parallel.layout.tpu_slice import TpuSlice

#: The networks a collective can use.
ICI, DCN = "ici", "dcn"

# The megascale runtime's transfer types, by the collective they implement.
_DCN_KINDS = {"ALL_REDUCE": "all-reduce", "REDUCE_SCATTER": "reduce-scatter",
              "ALL_GATHER": "all-gather", "ALL_TO_ALL": "all-to-all",
              "ONE_TO_ONE": "collective-permute"}
_SEND = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+send\((.*)$")


def wire_bytes(kind: str, nbytes: float, group_size: int) -> float:
  """Bytes one device sends for a collective on a ring of `group_size`.

  `nbytes` is the payload as `date_optax.parallel.collectives` stores it:
  the full array each device holds before an all-reduce, reduce-scatter or
  all-to-all and after an all-gather; a collective-permute's one message.

  .. math::
    \\text{all-reduce: } 2\\tfrac{n-1}{n}B, \\quad
    \\text{reduce-scatter, all-gather, all-to-all: } \\tfrac{n-1}{n}B, \\quad
    \\text{collective-permute: } B.

  Args:
    kind: one of `date_optax.parallel.collectives`'s kinds.
    nbytes: the payload in bytes, as above.
    group_size: devices per replica group (n); 1 sends nothing.

  Returns:
    The bytes each device puts on the wire.

  References:
    Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
    clusters of workstations", J. Parallel Distrib. Comput., 2009.
  """
  n = validation.check_int("group_size", group_size, low=1)
  if kind == "collective-permute":
    return float(nbytes)
  if n == 1:
    return 0.0
  if kind not in hlo.COLLECTIVE_KINDS:
    raise ValueError(f"kind must be one of {hlo.COLLECTIVE_KINDS}, got {kind!r}.")
  return (2.0 if kind == "all-reduce" else 1.0) * (n - 1) / n * float(nbytes)


def ring_steps(kind: str, group_size: int) -> int:
  """Latency terms of a collective on a ring: ``n - 1`` per phase, two
  phases for an all-reduce (reduce-scatter, then all-gather), one message
  for a collective-permute, none for a group of one."""
  if kind == "collective-permute":
    return 1
  if group_size <= 1:
    return 0
  return (2 if kind == "all-reduce" else 1) * (group_size - 1)


def _ints(text: str) -> list[int]:
  return [int(i) for i in text.split(",") if i.strip()]


def replica_groups(text: str, num_partitions: int) -> list[list[int]] | None:
  """The device ids of each replica group (or source-target pair) in an
  HLO attribute: ``{{0,1},{2,3}}``, ``{}`` (every device), the iota form
  ``[2,4]<=[4,2]T(1,0)`` and the mesh form ``mesh['x'=2,'y'=4] {'y'}``.
  The ids are SPMD partition ids (positions in the mesh's flattened device
  order). None for a form not known here."""
  text = text.strip()
  if text in ("", "{}"):
    return [list(range(num_partitions))]
  if text.startswith("{{"):
    return [_ints(g) for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
  iota = re.fullmatch(r"\[([\d,]*)\]<=\[([\d,]*)\](?:T\(([\d,]*)\))?", text)
  if iota:
    ids = np.arange(math.prod(_ints(iota.group(2)))).reshape(_ints(iota.group(2)))
    if iota.group(3):
      ids = ids.transpose(_ints(iota.group(3)))
    shape = _ints(iota.group(1))
    return ids.reshape(-1, shape[-1]).tolist()
  mesh = re.fullmatch(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", text)
  if mesh:
    axes = [(a, int(s)) for a, s in re.findall(r"'([^']+)'=(\d+)", mesh.group(1))]
    names = [a for a, _ in axes]
    chosen = re.findall(r"'([^']+)'", mesh.group(2))
    if not set(chosen) <= set(names):
      return None
    ids = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes])
    order = [i for i, a in enumerate(names) if a not in chosen] + [names.index(a) for a in chosen]
    size = math.prod(dict(axes)[a] for a in chosen)
    return ids.transpose(order).reshape(-1, size).tolist()
  return None


def dcn_transfers(hlo_text: str, num_slices: int) -> list[dict]:
  """The cross-slice collectives of a Multislice program (its host transfers).

  Each ``send`` the megascale runtime carries becomes one collective, sized
  as `date_optax.parallel.collectives` sizes the same kind: an all-gather's
  send holds one slice's shard, so its full payload is that shard times the
  slices; the others send the full array. Receives are not counted again.

  Args:
    hlo_text: the optimized HLO of one slice's program.
    num_slices: the slices of the job (for a transfer naming no target).

  Returns:
    Dicts with ``kind``, ``name``, ``transfer_type``, ``bytes`` (the payload
    as above), ``group_size`` (slices taking part) and ``groups`` (the
    runtime's target).
  """
  out = []
  for line in hlo_text.splitlines():
    m = _SEND.match(line)
    ttype = re.search(r'_xla_megascale_transfer_type="(\w+)"', line) if m else None
    if not ttype:
      continue
    arrays = hlo._arrays(m.group(2))  # the payload, then the runtime's u32 scalar
    if len(arrays) > 1 and arrays[-1][:2] == ("u32", 1):
      arrays = arrays[:-1]
    payload = sum(b for _, _, b in arrays)
    target = re.search(r'_xla_megascale_target="\{([^}]*)\}x', line)
    slices = num_slices
    if target:
      slices = sum(int(b) - int(a) + 1 if a else 1 for a, b in
                   (p.split(":") if ":" in p else ("", p) for p in target.group(1).split(",")))
    kind = _DCN_KINDS.get(ttype.group(1), "collective-permute")
    out.append({"kind": kind, "name": m.group(1), "transfer_type": ttype.group(1),
                "bytes": payload * (slices if kind == "all-gather" else 1),
                "group_size": slices if kind != "collective-permute" else 2,
                "groups": target.group(0).split("=", 1)[1] if target else ""})
  return out


def _program_devices(devices: Sequence[Any], num_partitions: int) -> list[Any]:
  """The device of each partition id: one slice's devices (in the given
  order) when the program is one slice's of a Multislice job."""
  devices = list(devices)
  if len(devices) <= num_partitions:
    return devices
  first = getattr(devices[0], "slice_index", None)
  same = [d for d in devices if getattr(d, "slice_index", None) == first]
  return same if len(same) == num_partitions else devices[:num_partitions]


def _extents(group: Sequence[Any]) -> list[int] | None:
  """Distinct coordinates of the group's chips along each torus axis (None
  for devices without coordinates)."""
  coords = [tuple(getattr(d, "coords", None) or ()) for d in group]
  if not coords or not coords[0]:
    return None
  return [len({c[i] for c in coords}) for i in range(len(coords[0]))]


def torus_hops(group: Sequence[Any]) -> int | None:
  """Neighbour steps of one phase of a collective over `group` on a torus.

  XLA's TPU collectives run along one torus axis at a time (a phase per
  axis the group spans, the two cores of a v2/v3 chip one more), so a
  reduce-scatter or an all-gather takes ``Σ_d (e_d − 1)`` steps, ``e_d``
  the distinct coordinates of the group's chips along axis d: 62 for a
  32 × 32 grid of chips, where one ring through its 1,024 chips takes
  1,023.

  Args:
    group: the group's devices (with ``coords``, and ``core_on_chip`` where
      a chip has several).

  Returns:
    The steps, or None for devices without coordinates.
  """
  extents = _extents(group)
  if extents is None:
    return None
  cores = len({getattr(d, "core_on_chip", 0) for d in group})
  return sum(e - 1 for e in extents) + cores - 1


def _axes_spanned(group: Sequence[Any]) -> int:
  """Torus axes along which the group's chips differ (0: one chip)."""
  extents = _extents(group)
  return 1 if extents is None else sum(e > 1 for e in extents)


@dataclasses.dataclass(frozen=True)
class Roofline:
  """The roofline step time of one device's program on a TPU slice.

  Made by `roofline`. All times in seconds, bytes per device.

  Args:
    compute_seconds: flops over the device's peak bf16 FLOP/s.
    memory_seconds: bytes accessed over the device's HBM bandwidth.
    ici_seconds: the collectives inside a slice, summed.
    dcn_seconds: the collectives across slices, summed.
    ici_bytes: bytes one device sends on ICI (`wire_bytes`, summed).
    dcn_bytes: bytes one device sends on DCN.
    collectives: each collective as priced: the `collectives` dict plus
      ``network`` (``"ici"`` or ``"dcn"``), ``links`` (ICI links one way
      per chip; 0 on DCN), ``wire_bytes``, ``steps`` and ``seconds``.

  Examples:
    >>> import date_optax.parallel as dp
    >>> r = dp.Roofline(2e-3, 3e-3, 1e-3, 0.5e-3, 1e6, 2e5, ())
    >>> round(r.seconds * 1e3, 6), round(r.overlap_seconds * 1e3, 6), r.bound  # ms
    (4.5, 3.0, 'memory')

  References:
    Williams, Waterman and Patterson, "Roofline: an insightful visual
    performance model for multicore architectures", CACM 52(4), 2009.
  """

  compute_seconds: float
  memory_seconds: float
  ici_seconds: float
  dcn_seconds: float
  ici_bytes: float
  dcn_bytes: float
  collectives: tuple[dict, ...]

  @property
  def communication_seconds(self) -> float:
    """ICI and DCN time, one after the other (a hierarchical all-reduce's
    DCN phase waits for its ICI reduce-scatter)."""
    return self.ici_seconds + self.dcn_seconds

  @property
  def seconds(self) -> float:
    """No overlap: the slower of compute and memory, then every collective."""
    return max(self.compute_seconds, self.memory_seconds) + self.communication_seconds

  @property
  def overlap_seconds(self) -> float:
    """Full overlap: the largest of compute, memory and communication."""
    return max(self.compute_seconds, self.memory_seconds, self.communication_seconds)

  @property
  def bound(self) -> str:
    """Which term is largest: ``"compute"``, ``"memory"``, ``"ici"`` or ``"dcn"``."""
    terms = {"compute": self.compute_seconds, "memory": self.memory_seconds,
             "ici": self.ici_seconds, "dcn": self.dcn_seconds}
    return max(terms, key=terms.get)


def roofline(hlo_text: str, *, flops: float, bytes_accessed: float, tpu: TpuSlice,
             devices: Sequence[Any] | None = None) -> Roofline:
  """The roofline of a program compiled for `tpu`, from the compiler's own counts.

  .. math::
    t_\\text{compute} = \\frac{F}{P}, \\quad
    t_\\text{memory} = \\frac{M}{B_\\text{HBM}}, \\quad
    t_c = \\frac{w_c}{B_c} + s_c\\,\\alpha_c,

  with F the per-device flops and M the per-device bytes accessed
  (``cost_analysis``), P and B_HBM one device's peak bf16 FLOP/s and HBM
  bytes/s; for each collective c, w_c its `wire_bytes` on a ring of its
  replica group, s_c its latency steps (on ICI one phase of `torus_hops`
  per torus axis the group spans, two phases for an all-reduce; on DCN its
  `ring_steps`), and on ICI
  ``B_c = ici_bandwidth_per_link * links / devices_per_chip``,
  ``alpha_c = ici_hop_latency``; on DCN
  ``B_c = dcn_bandwidth_per_chip / devices_per_chip``,
  ``alpha_c = dcn_latency``. The step takes ``max(t_compute, t_memory) +
  sum(t_c)`` with no overlap (`Roofline.seconds`) and ``max(t_compute,
  t_memory, sum(t_c))`` with full overlap (`Roofline.overlap_seconds`).

  Assumptions. The links of a group on ICI: a bidirectional ring along each
  torus axis the group's chips span (two one-way links per axis, at least
  one axis, at most the chip's ``ici_links_per_chip``): 2 for a group along
  one axis, 4 over a whole 2-D torus, 6 over a 3-D one, read from the
  devices' ``coords``. The devices of a chip (the two cores of a v2/v3
  chip) share its links. A collective-permute sends its payload once over
  one link to a neighbour. A replica group whose devices lie on several
  slices is priced wholly on DCN. The DCN share of a chip is the host's
  bandwidth over its chips (`TpuGeneration.dcn_bandwidth_per_chip`), all
  chips sending at once. Flops are priced at the bf16 peak, so f32 matmuls
  (several bf16 passes on a TPU) make the compute time a lower bound. A
  loop's collectives count once per iteration where the trip count can be
  read (`date_optax.parallel.collectives`: the ring and torus rounds run as
  loops); its flops and bytes are what the caller passes: the cost
  analysis counts a loop's body once, `compile_report` passes every
  iteration's (`CompileReport.executed_flops`).

  Args:
    hlo_text: ``compiled.as_text()``: one device's optimized program.
    flops: its flops per device (``cost_analysis()["flops"]``, or with its
      loops' iterations, `CompileReport.executed_flops`).
    bytes_accessed: its bytes accessed per device
      (``cost_analysis()["bytes accessed"]``, or
      `CompileReport.executed_bytes_accessed`).
    tpu: the `TpuSlice` it was compiled for.
    devices: the program's devices by partition id, i.e. its mesh's
      ``mesh.devices.flat`` (default: the slice's devices in id order,
      which places groups on the torus less exactly).

  Returns:
    A `Roofline`.

  Raises:
    TypeError: `hlo_text` is not a str, or `tpu` not a `TpuSlice`.
    ValueError: negative or non-finite `flops` or `bytes_accessed`.

  Examples:
    A psum of 4 MiB per device over a v5e-4's 2 x 2 chips: 2 (3/4) 4 MiB
    on 4 links of 50 GB/s, plus 4 hops of 1 us (reduce-scatter along each
    axis, 1 + 1 steps, then all-gather the same):

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> v5e = dp.tpu_slice("v5e-4")
    >>> mesh = v5e.data_mesh()
    >>> f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "data"), mesh=mesh,
    ...                           in_specs=P("data"), out_specs=P()))
    >>> x = jax.ShapeDtypeStruct((4 * 2**20,), jnp.float32,
    ...                          sharding=NamedSharding(mesh, P("data")))
    >>> compiled = f.lower(x).compile()
    >>> cost = compiled.cost_analysis()
    >>> r = dp.roofline(compiled.as_text(), flops=cost["flops"],
    ...                 bytes_accessed=cost["bytes accessed"], tpu=v5e,
    ...                 devices=mesh.devices.flat)
    >>> [(c["kind"], c["network"], c["links"]) for c in r.collectives]
    [('all-reduce', 'ici', 4)]
    >>> round(r.ici_seconds * 1e6, 1), r.dcn_bytes
    (35.5, 0.0)

  References:
    Williams, Waterman and Patterson, "Roofline", CACM 52(4), 2009;
    Austin et al., "How to Scale Your Model", Google DeepMind, 2025,
    https://jax-ml.github.io/scaling-book/ (its TPU and collectives
    chapters: bandwidths, and the time of a collective over torus axes);
    Patarasuk and Yuan, J. Parallel Distrib. Comput., 2009 (ring bytes).
  """
  if not isinstance(hlo_text, str):
    raise TypeError(f"hlo_text must be the str of compiled.as_text(), got "
                    f"{type(hlo_text).__name__}.")
  if not isinstance(tpu, TpuSlice):
    raise TypeError(f"tpu must be a TpuSlice (date_optax.parallel.tpu_slice), got {tpu!r}.")
  flops = float(validation.check_nonnegative("flops", flops))
  bytes_accessed = float(validation.check_nonnegative("bytes_accessed", bytes_accessed))
  facts, per_chip = tpu.facts, tpu.devices_per_chip
  parts = re.search(r"\bnum_partitions=(\d+)", hlo_text)
  all_devices = list(tpu.devices if devices is None else devices)
  program = _program_devices(all_devices, int(parts.group(1)) if parts else len(all_devices))
  priced = []
  placed: dict[tuple[Any, ...], tuple[int, str, int]] = {}  # a loop's, placed once
  for c in hlo.collectives(hlo_text):
    key = (c["kind"], c["groups"], c["group_size"])
    if key not in placed:
      groups = replica_groups(c["groups"], len(program)) or []
      members = [[program[i] for i in g if i < len(program)] for g in groups]
      slices = [{getattr(d, "slice_index", None) for d in g} for g in members]
      network = DCN if any(len(s) > 1 for s in slices) else ICI
      n = (max(1, len(groups[0])) if groups and c["kind"] != "collective-permute"
           else c["group_size"] or 1)
      links = 0 if network == DCN else (1 if c["kind"] == "collective-permute" else min(
          facts.ici_links_per_chip, 2 * max(1, min((_axes_spanned(g) for g in members),
                                                   default=1))))
      known = [h for h in map(torus_hops, members) if h is not None] if (
          network == ICI and c["kind"] != "collective-permute") else []
      hops = max(known) if known else None
      placed[key] = (n, network, links, hops)
    n, network, links, hops = placed[key]
    priced.append({**c, "group_size": n, "network": network, "links": links, "hops": hops})
  for c in dcn_transfers(hlo_text, tpu.num_slices):
    priced.append({**c, "network": DCN, "links": 0})
  totals = {ICI: [0.0, 0.0], DCN: [0.0, 0.0]}  # seconds, wire bytes
  for c in priced:
    wire = wire_bytes(c["kind"], c["bytes"], c["group_size"])
    steps = ring_steps(c["kind"], c["group_size"])
    hops = c.pop("hops", None)
    if hops is not None and c["group_size"] > 1:  # phases along the torus axes
      steps = (2 if c["kind"] == "all-reduce" else 1) * min(hops, c["group_size"] - 1)
    if c["network"] == ICI:
      bandwidth = facts.ici_bandwidth_per_link * c["links"] / per_chip
      latency = facts.ici_hop_latency
    else:
      bandwidth, latency = facts.dcn_bandwidth_per_chip / per_chip, facts.dcn_latency
    c.update(wire_bytes=wire, steps=steps, seconds=wire / bandwidth + steps * latency)
    totals[c["network"]][0] += c["seconds"]
    totals[c["network"]][1] += wire
  return Roofline(
      compute_seconds=flops / tpu.peak_flops_per_device,
      memory_seconds=bytes_accessed / tpu.hbm_bandwidth_per_device,
      ici_seconds=totals[ICI][0], dcn_seconds=totals[DCN][0],
      ici_bytes=totals[ICI][1], dcn_bytes=totals[DCN][1],
      collectives=tuple(priced))
