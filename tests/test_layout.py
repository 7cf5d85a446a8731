"""examples/ and benchmarks/ stay apart: neither imports the other.

An example is what a user copies; a study must not break when an example
changes. What both need is written in each (the MNIST-1D data and model), and
benchmarks/tasks/ holds what the studies and `make demo` share.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# benchmarks/bert_scaling.py runs examples/bert_lamb through its command line
# (a subprocess), which is no import.
ALLOWED: set[str] = set()


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
  out = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.append((node.lineno, node.module))
  return out


@pytest.mark.parametrize("folder,other", [("examples", "benchmarks"),
                                          ("benchmarks", "examples")])
def test_examples_and_benchmarks_do_not_import_each_other(folder, other):
  offenders = [
      f"{path.relative_to(ROOT)}:{line} imports {name}"
      for path in sorted((ROOT / folder).rglob("*.py"))
      if str(path.relative_to(ROOT)) not in ALLOWED
      for line, name in _imports(path)
      if name == other or name.startswith(other + ".")
  ]
  assert offenders == []
  assert list((ROOT / folder).rglob("*.py"))  # the check read something
