"""`benchmarks/suite_coverage.py`: the covering tests of the tests `make test` leaves out."""

from __future__ import annotations

from run_outputs import load_benchmark

covering_tests = load_benchmark("suite_coverage").covering_tests


def test_own_family_first_then_its_file_then_the_most_lines_and_uncovered_lines_named():
  lines = {
      "a.py::f[x]": frozenset({("m.py", 1), ("m.py", 2), ("m.py", 3), ("m.py", 9)}),
      "a.py::f[y]": frozenset({("m.py", 1)}),
      "b.py::big": frozenset({("m.py", 1), ("m.py", 2), ("m.py", 3)}),
      "a.py::g": frozenset({("m.py", 2)}),
  }
  got = covering_tests(lines, ["a.py::f[x]"])
  # b.py::big alone covers more, but the family and the file come first.
  assert got == {"a.py::f[x]": (["a.py::f[y]", "a.py::g", "b.py::big"], [("m.py", 9)])}


def test_a_moved_test_never_covers_another():
  lines = {"t::a": frozenset({1}), "t::b": frozenset({1}), "t::c": frozenset({2})}
  got = covering_tests(lines, ["t::a", "t::b"])
  assert got == {"t::a": ([], [1]), "t::b": ([], [1])}
  assert covering_tests(lines, ["t::a"]) == {"t::a": (["t::b"], [])}
