"""Reading the communication rounds of a compiled XLA program (HLO text)."""

from __future__ import annotations

import re

_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%(\S+)\s*=\s*\S+\s+([\w\-]+)\((.*)$")
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
