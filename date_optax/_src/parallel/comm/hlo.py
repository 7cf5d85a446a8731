"""Reading the communication rounds of a compiled XLA program (HLO text)."""

from __future__ import annotations

import math
import re

# The result type may be a tuple with spaces inside, as a TPU program's
# `collective-permute-start` is: the op is the first word followed by "(".
_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%(\S+)\s*=\s*.*?\s([\w\-]+)\((.*)$")
_COMPUTATION_START = re.compile(r"\n(?=\S.*\{[ \t]*$)", re.MULTILINE)


def collective_permute_rounds(hlo_text: str) -> list[tuple[int, frozenset]]:
  """The round and device pairs of every collective-permute, in program order.

  The round of a collective-permute is the number of collective-permutes on
  the longest chain of data dependences that ends with it (itself included):
  exchanges that do not depend on each other share a round, and the largest
  round is the number of neighbour-exchange latencies on the critical path.
  Rounds are counted inside each computation (a `while` body counts once).

  Args:
    hlo_text: `jax.jit(f).lower(...).compile().as_text()` (or any HLO text).

  Returns:
    `[(round, pairs)]` in the order the instructions appear (the executed
    order for a scheduled module), `pairs` the frozenset of
    `(source, target)` device ids.

  Examples:
    A ring all-reduce over 4 devices takes ``2(P - 1) = 6`` rounds:

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh(4)  # one axis, "data"
    >>> f = jax.jit(jax.shard_map(
    ...     lambda x: dp.ring_all_reduce(x, "data"), mesh=mesh,
    ...     in_specs=P("data"), out_specs=P("data"), check_vma=False))
    >>> rounds = dp.collective_permute_rounds(f.lower(jnp.ones(8)).compile().as_text())
    >>> max(r for r, _ in rounds)
    6

  References:
    Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
    clusters of workstations", 2009 (the ring's ``2(P - 1)`` steps); the
    alpha-beta model of `date_optax.parallel.allreduce_cost`.
  """
  out = []
  for comp in _COMPUTATION_START.split(hlo_text):
    depth: dict[str, int] = {}
    for line in comp.splitlines():
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      name, op, rest = m.groups()
      d = max((depth.get(o, 0) for o in re.findall(r"%([\w.\-]+)", rest)), default=0)
      if op.startswith("collective-permute") and not op.endswith("-done"):
        d += 1
        pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line).group(1)
        out.append((d, frozenset(
            tuple(map(int, p.split(","))) for p in re.findall(r"\{(\d+,\d+)", pairs))))
      depth[name] = d
  return out


#: The collective operations of an HLO module, by the name `collectives` reports.
COLLECTIVE_KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all",
                    "collective-permute")

# Bits of an HLO element type (sub-byte types as declared; see `_stored_bits`).
_TYPE_BITS = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
    "s32": 32, "u32": 32, "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "f4e2m1fn": 4, "f8e4m3fn": 8, "f8e5m2": 8, "f8e4m3": 8, "f8e8m0fnu": 8, "f8e4m3fnuz": 8,
    "f8e5m2fnuz": 8, "f8e4m3b11fnuz": 8, "f8e3m4": 8, "c64": 64, "c128": 128,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\](\{[^}]*\})?")
_OPERATION = re.compile(
    r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*?)\s+"
    r"(all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)"
    r"(-start|-done)?\((.*)$")


def _stored_bits(dtype: str, layout: str | None) -> int:
  """Bits one element occupies in memory.

  A TPU layout ends its tiling with ``(k,1)`` when `k` narrow elements share
  a 32-bit word: ``s8`` and ``s4`` both show ``(4,1)`` on TPU v2-v4, i.e. a
  4-bit element takes a whole byte there. Without such a tile (other
  backends) the declared width counts.
  """
  bits = _TYPE_BITS.get(dtype, 32)
  if bits < 32 and layout:
    tile = re.findall(r"\((\d+),1\)", layout)
    if tile:
      return 32 // int(tile[-1])
  return bits


def _arrays(type_text: str) -> list[tuple[str, int, int]]:
  """``(dtype, elements, stored bytes)`` of each array in an HLO result type."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(type_text):
    if dtype not in _TYPE_BITS:
      continue
    n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
    out.append((dtype, n, -(-n * _stored_bits(dtype, layout) // 8)))
  return out


def _module_sizes(hlo_text: str) -> tuple[int, int] | None:
  """``(replica_count, num_partitions)`` from the ``HloModule`` header (each 1
  when not written), or None for text without the header."""
  header = re.search(r"^HloModule\b[^\n]*", hlo_text, re.MULTILINE)
  if not header:
    return None

  def count(key: str) -> int:
    found = re.search(rf"\b{key}=(\d+)", header.group(0))
    return int(found.group(1)) if found else 1

  return count("replica_count"), count("num_partitions")


def _group_size(attrs: str, sizes: tuple[int, int] | None = None) -> tuple[str, int | None]:
  """The replica-groups text of an instruction and the size of one group.

  ``replica_groups={}`` is one group of every participant: the replicas of a
  cross-replica collective (no ``channel_id``), else every device, replicas
  times partitions (`sizes`, from the module's header; None without it).
  """
  m = re.search(r"replica_groups=(\{\{.*?\}\}|\{\}|\[[\d,]*\]<=\[[\d,]*\](?:T\([\d,]*\))?|"
                r"mesh\[[^\]]*\]\s*\{[^}]*\})", attrs)
  if not m:
    return "", None
  text = m.group(1)
  if text == "{}":
    if sizes is None:
      return text, None
    return text, sizes[0] * (sizes[1] if "channel_id=" in attrs else 1)
  if text.startswith("{{"):
    return text, len(text[2:].split("}", 1)[0].split(","))
  if text.startswith("["):
    return text, int(text[1:].split("]", 1)[0].split(",")[-1])
  if text.startswith("mesh"):
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", text.split("]", 1)[0]))
    axes = re.findall(r"'([^']+)'", text.split("]", 1)[1])
    return text, math.prod(int(sizes[a]) for a in axes) if axes else 1
  return text, None


def collectives(hlo_text: str) -> list[dict]:
  """Every collective of a compiled program, with its payload and groups.

  Reads the optimized HLO text (``compiled.as_text()``): each all-reduce,
  reduce-scatter, all-gather, all-to-all and collective-permute, counted
  once (an asynchronous ``-start``/``-done`` pair is one collective, sized
  by its ``-done`` result). Operations inside a loop body count once.

  Args:
    hlo_text: `jax.jit(f).lower(...).compile().as_text()`.

  Returns:
    A list, in program order, of dicts: ``kind`` (one of `COLLECTIVE_KINDS`),
    ``name``, ``dtypes`` (the payload's element types), ``elements``,
    ``elements`` and ``bytes`` (the payload as stored: the result of an
    all-reduce, all-gather, all-to-all or collective-permute, the input of a
    reduce-scatter, i.e. its result, the scattered shard, times the group
    size), ``group_size`` (devices per replica group, every participant for
    ``replica_groups={}``, read from the module's ``HloModule`` header; for
    a collective-permute, the number of source-target pairs) and ``groups``
    (the replica groups or source-target pairs as written).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "data"),
    ...     mesh=dp.data_mesh(4), in_specs=P("data"), out_specs=P()))
    >>> [(c["kind"], c["bytes"], c["group_size"])
    ...  for c in dp.collectives(f.lower(jnp.ones(4 * 256)).compile().as_text())]
    [('all-reduce', 1024, 4)]

  References:
    OpenXLA, "Operation semantics" (AllReduce, ReduceScatter, AllGather,
    AllToAll, CollectivePermute).
  """
  starts: dict[str, tuple[str, str]] = {}
  out = []
  sizes = _module_sizes(hlo_text)
  for line in hlo_text.splitlines():
    m = _OPERATION.match(line)
    if not m:
      continue
    name, result, kind, phase, rest = m.groups()
    if phase == "-start":
      starts[name] = (kind, rest)
      continue
    if phase == "-done":
      operand = re.match(r"\s*%([\w.\-]+)", rest)
      kind, rest = starts.pop(operand.group(1), (kind, rest)) if operand else (kind, rest)
    arrays = _arrays(result)
    if kind == "collective-permute":
      pairs = re.search(r"source_target_pairs=(\{[^=]*?\}\})", rest)
      groups = pairs.group(1) if pairs else ""
      size = groups.count("{") - 1 if groups else None
    else:
      groups, size = _group_size(rest, sizes)
    nbytes, elements = sum(b for _, _, b in arrays), sum(n for _, n, _ in arrays)
    if kind == "reduce-scatter" and size:
      # The result is this device's shard: the payload is the group's.
      nbytes, elements = nbytes * size, elements * size
    out.append({
        "kind": kind, "name": name,
        "dtypes": sorted({d for d, _, _ in arrays}),
        "elements": elements,
        "bytes": nbytes, "group_size": size, "groups": groups,
    })
  return out


def fusion_count(hlo_text: str) -> int:
  """Fusion instructions in a compiled program (its kernels, roughly)."""
  return len(re.findall(r"=[^=\n]*?\sfusion\(", hlo_text))
