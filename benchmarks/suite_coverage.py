"""Which tests `make test` may leave to `make test-all`: line coverage per test.

    python -m benchmarks.suite_coverage run [--data FILE]    # the whole suite, ~30 min on 2 cores
    python -m benchmarks.suite_coverage check [--data FILE]  # tests/moved_to_test_all.py against it

`run` runs every test (`-m ''`) under coverage.py with one context per test
(pytest-cov's `--cov-context=test`) over `date_optax/`, `examples/` and
`benchmarks/`, and writes the data file (default `.suite_coverage`). `check`
reads it and, for each test `tests/moved_to_test_all.py` lists, finds default
tests whose lines together contain the listed test's lines (its own family
first); it prints them and exits 1 where the default suite misses a line the
listed test executes. Lines run in processes a test starts are not measured:
tests that start processes are judged by reading them, not by this check.

Needs `pip install coverage pytest-cov` (not a dependency of the library).
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("date_optax", "examples", "benchmarks")


def covering_tests(lines: Mapping[str, frozenset], moved: Iterable[str]) -> dict:
  """For each moved test, default tests whose lines contain its lines.

  Args:
    lines: test name -> the set of (file, line) it executes.
    moved: the tests left to `make test-all`; every other test in `lines` runs
      by default.

  Returns:
    test name -> (covering tests, uncovered lines): tests of the moved test's
    own family (its name before ``[``) first, then of its file, then whichever
    adds the most lines; uncovered lines are those no default test executes.

  Example:
    >>> lines = {"t.py::f[a]": frozenset({1, 2}), "t.py::f[b]": frozenset({1}),
    ...          "t.py::g": frozenset({2, 3})}
    >>> covering_tests(lines, ["t.py::f[a]"])
    {'t.py::f[a]': (['t.py::f[b]', 't.py::g'], [])}
  """
  moved = list(moved)
  left_out = set(moved)
  default = {n: s for n, s in lines.items() if n not in left_out}
  by_line = collections.defaultdict(set)
  for name, executed in default.items():
    for line in executed:
      by_line[line].add(name)
  result = {}
  for name in moved:
    need = {x for x in lines.get(name, ()) if by_line[x]}
    uncovered = sorted(x for x in lines.get(name, ()) if not by_line[x])
    family, file = name.split("[")[0], name.split("::")[0]
    chosen = []
    while need:
      candidates = set().union(*(by_line[x] for x in need))
      best = max(sorted(candidates), key=lambda n: (n.split("[")[0] == family,
                                                   n.startswith(file + "::"),
                                                   len(need & default[n])))
      chosen.append(best)
      need -= default[best]
    result[name] = (chosen, uncovered)
  return result


def _read(path: str) -> dict:
  import coverage  # noqa: PLC0415

  data = coverage.CoverageData(path)
  data.read()
  lines = collections.defaultdict(set)
  for file in data.measured_files():
    short = os.path.relpath(file, ROOT)
    for number, contexts in data.contexts_by_lineno(file).items():
      for context in contexts:
        if context:  # "tests/x.py::test[p]|run" (or |setup, |teardown)
          lines[context.rsplit("|", 1)[0].removeprefix("tests/")].add((short, number))
  return {n: frozenset(s) for n, s in lines.items()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("command", choices=("run", "check"))
  p.add_argument("--data", default=os.path.join(ROOT, ".suite_coverage"),
                 help="the coverage data file (default .suite_coverage)")
  args = p.parse_args(argv)
  if args.command == "run":
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as rc:
      rc.write("[run]\nsource =\n" + "".join(f"  {s}\n" for s in SOURCES)
               + f"parallel = true\ndata_file = {args.data}\n")
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-m", "", "--cov",
           f"--cov-config={rc.name}", "--cov-context=test", "--cov-report="]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT)
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  from moved_to_test_all import MOVED  # noqa: PLC0415

  lines = _read(args.data)
  missing = [n for n in MOVED if n not in lines]
  status = 0
  for name, (chosen, uncovered) in covering_tests(lines, MOVED).items():
    print(f"{name}\n  covered by: {', '.join(chosen) or '(executes no measured line)'}")
    if uncovered:
      status = 1
      print(f"  NOT covered by default tests: {uncovered[:5]}"
            f"{' ...' if len(uncovered) > 5 else ''}")
  if missing:
    print(f"\nnot in the data (it executes no measured line, or was not run): {missing}")
  verdict = ("every line they execute is executed by default" if not status
             else "some lines they execute are not")
  print(f"\n{len(MOVED)} tests left to make test-all; {verdict}")
  return status


if __name__ == "__main__":
  sys.exit(main())
