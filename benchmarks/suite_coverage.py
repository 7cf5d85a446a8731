"""Which tests `make test` may leave to `make test-all`: line coverage per test.

    python -m benchmarks.suite_coverage run [--data FILE]    # ~20 min on 2 cores
    python -m benchmarks.suite_coverage check [--data FILE]  # tests/moved_to_test_all.py against it

`run` runs the default suite, then the tests `tests/moved_to_test_all.py`
lists, under coverage.py with one context per test (pytest-cov's
`--cov-context=test`) over `date_optax/`, `examples/` and `benchmarks/`, and
writes the data file (default `.suite_coverage`). `check`
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
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("date_optax", "examples", "benchmarks")
# Test files whose checks run in processes they start (not measured: judged by
# reading). Left out of the run: under coverage, the pytest-xdist workers were
# lost during test_parallel_multihost.py (2026-11-29), and the lines their
# own process runs would only make the default suite look more complete.
STARTS_PROCESSES = ("test_parallel_multihost.py", "test_preemption.py", "test_first_screen.py")
# Never proposed: the doctests and the docs' snippets (what a reader runs),
# the bad-input checks, LARS's and LAMB's compiled-update structure, and the
# files above.
KEEP = "|".join([r"test_api_docs|test_readme|_docs\.py|bad_input|bad_value",
                 r"no_control_flow_and_no_dot\[(lars|lamb)\]|per_leaf_is_the_base_optimizers\[lars\]",
                 *(f.replace(".", r"\.") for f in STARTS_PROCESSES)])


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


def movable_tests(lines: Mapping[str, frozenset], default: Iterable[str],
                  seconds: Mapping[str, float], keep=lambda name: False) -> list[str]:
  """Default tests that may join the moved ones, the slowest first.

  Greedy over the tests by their time: a test is taken where another default
  test of its family (its name before ``[``) stays, and every line it
  executes stays executed by a default test not taken. Lines of the tests
  already moved stay covered too: a line a taken test executes keeps at least
  one default test.

  Args:
    lines: test name -> the set of (file, line) it executes.
    default: the tests the default suite runs now.
    seconds: test name -> its time (a test without one is not taken).
    keep: names to leave in the default suite whatever their cover.

  Returns:
    The names taken, in the order taken.

  Example:
    >>> lines = {"t.py::f[a]": frozenset({1}), "t.py::f[b]": frozenset({1}),
    ...          "t.py::g[a]": frozenset({2}), "t.py::g[b]": frozenset({3})}
    >>> movable_tests(lines, lines, {"t.py::f[a]": 2.0, "t.py::f[b]": 1.0, "t.py::g[a]": 5.0})
    ['t.py::f[a]']
  """
  default = [n for n in default if n in lines]
  count = collections.Counter(x for n in default for x in lines[n])
  family = collections.Counter(n.split("[")[0] for n in default)
  taken = []
  for name in sorted((n for n in default if seconds.get(n) and lines[n] and not keep(n)),
                     key=lambda n: -seconds[n]):
    if family[name.split("[")[0]] >= 2 and all(count[x] >= 2 for x in lines[name]):
      count.subtract(lines[name])
      family[name.split("[")[0]] -= 1
      taken.append(name)
  return taken


def _propose(lines: dict, moved: Mapping, args) -> int:
  """Prints `tests/moved_to_test_all.py`'s entries with the tests `movable_tests` adds."""
  if not args.durations:
    raise SystemExit("propose needs --durations LOG (pytest -n 2 --durations=0 of make test)")
  seconds = collections.Counter()
  with open(args.durations) as log:
    for row in log:
      match = re.match(r"\s*([\d.]+)s call\s+tests/(\S+)", row)
      if match:
        seconds[match.group(2)] += float(match.group(1))
  seconds = {n: t for n, t in seconds.items() if t >= args.min_seconds}
  keep = re.compile(args.keep)
  default = [n for n in lines if n not in moved]
  taken = movable_tests(lines, default, seconds, keep=lambda n: bool(keep.search(n)))
  print(f"# {len(taken)} more tests, {sum(seconds[n] for n in taken):.1f} s of calls")
  entries = covering_tests(lines, [*moved, *taken])
  file = None
  for name, (chosen, uncovered) in entries.items():
    if name.split("::")[0] != file:
      file = name.split("::")[0]
      print(f"    # {file}")
    print(f"    {name!r}: (" + "".join(f"\n        {c!r}," for c in chosen) + "\n    ),")
    if uncovered:
      print(f"    # NOT covered by default tests: {uncovered[:5]}")
  return 0


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
  p.add_argument("command", choices=("run", "check", "propose"))
  p.add_argument("--data", default=os.path.join(ROOT, ".suite_coverage"),
                 help="the coverage data file (default .suite_coverage)")
  p.add_argument("--durations", help="propose: a pytest log with --durations=0 of the "
                 "default suite (the tests' call times rank them)")
  p.add_argument("--min-seconds", type=float, default=1.0,
                 help="propose: consider tests whose call takes at least this long")
  p.add_argument("--keep", default=KEEP,
                 help="propose: a regular expression of test names never proposed")
  args = p.parse_args(argv)
  sys.path.insert(0, os.path.join(ROOT, "tests"))
  from moved_to_test_all import MOVED  # noqa: PLC0415

  if args.command == "run":
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as rc:
      rc.write("[run]\nsource =\n" + "".join(f"  {s}\n" for s in SOURCES)
               + f"parallel = true\ndata_file = {args.data}\n")
    cov = ["--cov", f"--cov-config={rc.name}", "--cov-context=test", "--cov-report="]
    runs = [  # the default suite, then the listed tests (marked slow) into the same file
        ["-p", "no:cacheprovider", *cov, *(f"--ignore=tests/{f}" for f in STARTS_PROCESSES)],
        ["-p", "no:cacheprovider", "-m", "", *cov, "--cov-append", *(f"tests/{n}" for n in MOVED)],
    ]
    for extra in runs:
      cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", *extra]
      print(" ".join(cmd[:14]), "..." if len(cmd) > 14 else "", flush=True)
      if status := subprocess.call(cmd, cwd=ROOT):
        return status
    return 0
  lines = _read(args.data)
  if args.command == "propose":
    return _propose(lines, MOVED, args)
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
