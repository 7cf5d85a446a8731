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
