"""Reading the communication rounds of a compiled XLA program (HLO text).

Both readers follow the program as it runs: a `while` loop whose trip count
XLA knows (the ring and torus rounds of `rounds.run_in_rounds`, a
microbatch loop) contributes its body once per iteration.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

# The result type may be a tuple with spaces inside, as a TPU program's
# `collective-permute-start` is: the op is the first word followed by "(".
_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%(\S+)\s*=\s*.*?\s([\w\-]+)\((.*)$")
_COMPUTATION_START = re.compile(r"\n(?=\S.*\{[ \t]*$)", re.MULTILINE)


_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


class _Instruction(NamedTuple):
  name: str
  op: str
  operands: tuple[str, ...]
  root: bool
  line: str
  callees: tuple[str, ...]  # a `while`'s body, a `call`'s computation
  trips: int  # how many times the callees run: a while's trip count (1 if unknown)


def _constant(ins: _Instruction | None) -> int | None:
  if ins is None or ins.op != "constant":
    return None
  m = re.search(r"\bconstant\((-?\d+)\)", ins.line)
  return int(m.group(1)) if m else None


def _source(instructions: dict[str, _Instruction], name: str | None) -> _Instruction | None:
  """The instruction `name` is a copy or bitcast of (itself if neither)."""
  ins = instructions.get(name) if name else None
  while ins is not None and ins.op in ("copy", "bitcast") and ins.operands:
    ins = instructions.get(ins.operands[0])
  return ins


def _trip_count(ins: _Instruction, caller: dict[str, _Instruction],
                comps: dict[str, list[_Instruction]]) -> int:
  """A `while`'s trip count: XLA's ``known_trip_count``, or read from a loop
  that counts a tuple element up by one from a constant while it is below a
  constant (`lax.fori_loop`, `lax.scan`: the TPU compiler writes no
  ``known_trip_count``); 1 when neither is found."""
  known = _TRIPS.search(ins.line)
  if known:
    return int(known.group(1))
  cond = re.search(r"\bcondition=%?([\w.\-]+)", ins.line)
  body = {i.name: i for i in comps.get(ins.callees[0], ())} if ins.callees else {}
  cond_ins = {i.name: i for i in comps.get(cond.group(1), ())} if cond else {}
  root = next((i for i in cond_ins.values() if i.root), None)
  init = caller.get(ins.operands[0]) if ins.operands else None
  if (root is None or root.op != "compare" or "direction=LT" not in root.line
      or init is None or init.op != "tuple"):
    return 1
  counter, limit = (cond_ins.get(o) for o in root.operands[:2])
  index = re.search(r"\bindex=(\d+)", counter.line) if counter is not None else None
  if counter is None or counter.op != "get-tuple-element" or index is None or (
      _constant(limit) is None):
    return 1
  k = int(index.group(1))
  start = _source(caller, init.operands[k] if k < len(init.operands) else None)
  body_root = next((i for i in body.values() if i.root), None)
  step = None
  if body_root is not None and body_root.op == "tuple" and k < len(body_root.operands):
    step = _source(body, body_root.operands[k])
  if _constant(start) is None or step is None or step.op != "add":
    return 1
  return max(0, _constant(limit) - _constant(start))


def _computations(hlo_text: str) -> tuple[dict[str, list[_Instruction]], str | None]:
  """The instructions of every computation, and the name of the entry."""
  comps: dict[str, list[_Instruction]] = {}
  entry = None
  for k, comp in enumerate(_COMPUTATION_START.split(hlo_text)):
    lines = comp.splitlines()
    header = _HEADER.match(lines[0]) if lines and lines[0].rstrip().endswith("{") else None
    if header is None:  # text before the first computation, or bare instructions
      comp_name = f"#{k}"
    else:
      comp_name, lines = header.group(2), lines[1:]
      if header.group(1):
        entry = comp_name
    out = []
    for line in lines:
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      name, op, rest = m.groups()
      callees = ()
      if op in ("while", "call", "fusion"):
        callee = re.search(r"\b(?:body|to_apply|calls)=%?([\w.\-]+)", rest)
        callees = (callee.group(1),) if callee else ()
      out.append(_Instruction(name, op, tuple(re.findall(r"%([\w.\-]+)", rest)),
                              line.lstrip().startswith("ROOT"), line, callees, 1))
    comps[comp_name] = out
  for comp_name, instructions in comps.items():
    caller = {i.name: i for i in instructions}
    comps[comp_name] = [i._replace(trips=_trip_count(i, caller, comps)) if i.op == "while"
                        else i for i in instructions]
  return comps, entry


def _executed(hlo_text: str, comps: dict[str, list[_Instruction]] | None = None,
              entry: str | None = None) -> Iterator[tuple[str, _Instruction]]:
  """`(computation, instruction)` as the program runs them: from the entry,
  a `while` body repeated its known trip count, a `call`'s or a `fusion`'s
  computation once where it is called (a collective the TPU compiler fuses,
  inside a loop, runs each iteration); computations not reached that way
  (or all, without an entry) once, after."""
  if comps is None:
    comps, entry = _computations(hlo_text)
  seen: set[str] = set()

  def walk(name: str) -> Iterator[tuple[str, _Instruction]]:
    seen.add(name)
    for ins in comps.get(name, ()):
      yield name, ins
      for _ in range(ins.trips):
        for callee in ins.callees:
          if callee in comps:
            yield from walk(callee)

  if entry is not None:
    yield from walk(entry)
  for name in list(comps):
    if name not in seen:
      yield from walk(name)


def collective_permute_rounds(hlo_text: str) -> list[tuple[int, frozenset]]:
  """The round and device pairs of every collective-permute run, in program order.

  The round of a collective-permute is the number of collective-permutes on
  the longest chain of data dependences that ends with it (itself included):
  exchanges that do not depend on each other share a round, and the largest
  round is the number of neighbour-exchange latencies on the critical path.

  A `while` loop with a known trip count T (XLA writes it in the loop's
  ``backend_config``) runs its body T times: its collective-permutes are
  listed once per iteration, and iteration t + 1 depends on what iteration
  t's body returns, so a body with one exchange per round that runs T times
  counts T rounds, as the unrolled program would (the ring and torus of
  `rounds.run_in_rounds`). A loop of unknown trip count counts once;
  computations not reached from the entry by `while`, `call` and `fusion`
  count once, each on its own.

  Args:
    hlo_text: `jax.jit(f).lower(...).compile().as_text()` (or any HLO text).

  Returns:
    `[(round, pairs)]` in the order the instructions run (the executed
    order for a scheduled module, loops unrolled), `pairs` the frozenset of
    `(source, target)` device ids.

  Examples:
    A ring all-reduce over 4 devices takes ``2(P - 1) = 6`` rounds, from
    two loops of three:

    >>> import jax, jax.numpy as jnp
    >>> from jax.sharding import PartitionSpec as P
    >>> import date_optax.parallel as dp
    >>> mesh = dp.data_mesh(4)  # one axis, "data"
    >>> f = jax.jit(jax.shard_map(
    ...     lambda x: dp.ring_all_reduce(x, "data"), mesh=mesh,
    ...     in_specs=P("data"), out_specs=P("data"), check_vma=False))
    >>> text = f.lower(jnp.ones(8)).compile().as_text()
    >>> [r for r, _ in dp.collective_permute_rounds(text)]
    [1, 2, 3, 4, 5, 6]
    >>> text.count(" collective-permute(")  # in the program: one per loop body
    2

  References:
    Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for
    clusters of workstations", 2009 (the ring's ``2(P - 1)`` steps); the
    alpha-beta model of `date_optax.parallel.allreduce_cost`.
  """
  comps, entry = _computations(hlo_text)
  out: list[tuple[int, frozenset]] = []
  seen: set[str] = set()
  pairs_of: dict[str, frozenset] = {}

  def walk(name: str, base: int) -> int:
    """Rounds in computation `name` whose parameters are at round `base`;
    returns the round of its result."""
    seen.add(name)
    depth: dict[str, int] = {}
    result = base
    for ins in comps.get(name, ()):
      d = base if ins.op == "parameter" else max(
          (depth.get(o, 0) for o in ins.operands), default=0)
      for _ in range(ins.trips):
        for callee in ins.callees:
          if callee in comps:
            d = walk(callee, d)
      if ins.op.startswith("collective-permute") and not ins.op.endswith("-done"):
        d += 1
        if ins.line not in pairs_of:  # a loop body's, read once
          pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", ins.line).group(1)
          pairs_of[ins.line] = frozenset(
              tuple(map(int, p.split(","))) for p in re.findall(r"\{(\d+,\d+)", pairs))
        out.append((d, pairs_of[ins.line]))
      depth[ins.name] = d
      if ins.root:
        result = d
    return result

  if entry is not None:
    walk(entry, 0)
  for name in list(comps):
    if name not in seen:
      walk(name, 0)
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


# A fusion the TPU compiler runs as a reduce-scatter (over 4 devices on v4,
# v5e, v5p and v6e: an all-reduce and a dynamic slice in one kernel,
# "all-reduce-scatter").
_SCATTER_FUSION = re.compile(r'"emitter":"[^"]*AllReduceScatter')


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
  by its ``-done`` result). A loop body of known trip count T counts T
  times, as the program runs it (`collective_permute_rounds`), and so does
  a collective inside a fusion called there. Over 4 devices of a v4, v5e,
  v5p or v6e slice the TPU compiler writes a reduce-scatter as a fusion of
  an all-reduce and a slice that its reduce-scatter emitter runs
  (``"emitter":"SingleInputAllReduceScatterFusion"``): that all-reduce is
  reported as the reduce-scatter it is, its payload the all-reduce's. Over
  more devices, and on v2/v3, a reduce-scatter compiles to a plain
  all-reduce and a slice, and is reported as the all-reduce that runs.

  Args:
    hlo_text: `jax.jit(f).lower(...).compile().as_text()`.

  Returns:
    A list, in program order, of dicts: ``kind`` (one of `COLLECTIVE_KINDS`),
    ``name``, ``dtypes`` (the payload's element types), ``elements`` and
    ``bytes`` (the payload as stored: the result of an
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
  matches: dict[str, Any] = {}
  entries: dict[tuple[str, ...], dict] = {}  # a loop body's collectives, parsed once
  comps, entry = _computations(hlo_text)
  scattering = {callee for instructions in comps.values() for i in instructions
                if i.op == "fusion" and _SCATTER_FUSION.search(i.line) for callee in i.callees}
  for comp, ins in _executed(hlo_text, comps, entry):
    if ins.line not in matches:
      matches[ins.line] = _OPERATION.match(ins.line)
    m = matches[ins.line]
    if not m:
      continue
    name, result, kind, phase, rest = m.groups()
    if kind == "all-reduce" and comp in scattering:
      # The TPU compiler's reduce-scatter: an all-reduce and a slice fused
      # for its reduce-scatter emitter; the payload is the all-reduce's.
      out.append(dict(_collective(name, result, kind, rest, sizes), kind="reduce-scatter"))
      continue
    if phase == "-start":
      starts[name] = (kind, rest)
      continue
    if phase == "-done":
      operand = re.match(r"\s*%([\w.\-]+)", rest)
      kind, rest = starts.pop(operand.group(1), (kind, rest)) if operand else (kind, rest)
    key = (name, result, kind, rest)
    if key not in entries:
      entries[key] = _collective(name, result, kind, rest, sizes)
    out.append(dict(entries[key]))
  return out


def _collective(name: str, result: str, kind: str, rest: str,
                sizes: tuple[int, int] | None) -> dict:
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
  return {
      "kind": kind, "name": name,
      "dtypes": sorted({d for d, _, _ in arrays}),
      "elements": elements,
      "bytes": nbytes, "group_size": size, "groups": groups,
  }


def fusion_count(hlo_text: str) -> int:
  """Fusion instructions in a compiled program (its kernels, roughly)."""
  return len(re.findall(r"=[^=\n]*?\sfusion\(", hlo_text))


def loop_bodies(hlo_text: str) -> list[tuple[str, int, str | None]]:
  """``(body, executions, enclosing body)`` of every ``while`` loop reached
  from the entry: how many times the body runs per call of the program (the
  product of its own and its enclosing loops' trip counts, 1 per unknown
  count) and the body of the loop it sits in (None at the top)."""
  comps, entry = _computations(hlo_text)
  out: list[tuple[str, int, str | None]] = []

  def walk(name: str, runs: int, enclosing: str | None, depth: int) -> None:
    for ins in comps.get(name, ()):
      for callee in ins.callees:
        if callee not in comps or depth > 64:
          continue
        if ins.op == "while":
          out.append((callee, runs * ins.trips, enclosing))
          walk(callee, runs * ins.trips, callee, depth + 1)
        else:
          walk(callee, runs, enclosing, depth + 1)

  if entry is not None:
    walk(entry, 1, None, 0)
  return out


def as_entry(hlo_text: str, computation: str) -> str:
  """The module text with `computation` as its entry (a plain header: the
  original entry's aliasing and layout do not apply to it)."""
  text = re.sub(r"^ENTRY\s+", "", hlo_text, flags=re.MULTILINE)
  text = re.sub(r"^HloModule[^\n]*", "HloModule loop_body", text, count=1, flags=re.MULTILINE)
  text, found = re.subn(rf"^(%?{re.escape(computation)}\s)", r"ENTRY \1", text, count=1,
                        flags=re.MULTILINE)
  if not found:
    raise ValueError(f"no computation named {computation!r} in the module.")
  return text


def executed_cost(hlo_text: str, flops: float, bytes_accessed: float,
                  analyse: Any = None) -> tuple[float, float, bool]:
  """The flops and bytes accessed of a program as it runs, loops included.

  XLA's cost analysis (``compiled.cost_analysis()``) and the TPU cost model
  count a ``while`` body once, however many times it runs, so a program
  with a microbatch loop or layers under `nn.scan` reads as a fraction of
  its work. Each loop body is analysed alone (`as_entry`, XLA's own cost
  analysis on the host) and what it does beyond its first run is added:

  .. math::
    F = F_\\text{counted} + \\sum_b (n_b - 1)\\,(F_b - \\textstyle\\sum_{c \\in b} F_c),

  with n_b the executions of body b (`loop_bodies`) and the inner sum over
  the loops directly inside b (whose own extra runs their own terms add).
  Loop conditions and loops of unknown trip count add nothing.

  Args:
    hlo_text: ``compiled.as_text()``.
    flops: its counted flops (``cost_analysis()["flops"]``).
    bytes_accessed: its counted bytes (``cost_analysis()["bytes accessed"]``).
    analyse: ``text -> {"flops", "bytes accessed"}`` or None (default: XLA's
      cost analysis through `compat.hlo_text_cost`).

  Returns:
    ``(flops, bytes_accessed, complete)``: `complete` is False where a body
    could not be analysed (its extra runs are then left out).
  """
  if analyse is None:
    from date_optax._src.parallel import compat  # noqa: PLC0415
    analyse = compat.hlo_text_cost
  bodies = loop_bodies(hlo_text)
  if not any(runs > 1 for _, runs, _ in bodies):
    return flops, bytes_accessed, True
  inclusive: dict[str, dict | None] = {}
  for body, _, _ in bodies:
    inclusive[body] = analyse(as_entry(hlo_text, body))
  complete = all(c is not None for c in inclusive.values())
  keys = ("flops", "bytes accessed")
  own = {b: dict(c) if c is not None else None for b, c in inclusive.items()}
  for body, _, enclosing in bodies:
    if enclosing is not None and own.get(enclosing) is not None and inclusive[body] is not None:
      for k in keys:
        own[enclosing][k] = own[enclosing].get(k, 0.0) - inclusive[body].get(k, 0.0)
  extra = dict.fromkeys(keys, 0.0)
  for body, runs, _ in bodies:
    if own[body] is not None:
      for k in keys:
        extra[k] += (runs - 1) * max(0.0, own[body].get(k, 0.0))
  return flops + extra["flops"], bytes_accessed + extra["bytes accessed"], complete
