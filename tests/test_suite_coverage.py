"""`benchmarks/suite_coverage.py`: the covering tests of the tests `make test` leaves out."""

from __future__ import annotations

from run_outputs import load_benchmark

_suite_coverage = load_benchmark("suite_coverage")
covering_tests = _suite_coverage.covering_tests
movable_tests = _suite_coverage.movable_tests


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


def test_movable_tests_keep_a_family_member_and_every_line_covered_slowest_first():
  lines = {
      "t::f[a]": frozenset({1, 2}), "t::f[b]": frozenset({1}), "t::f[c]": frozenset({1, 2}),
      "t::g[a]": frozenset({3}), "t::g[b]": frozenset({3, 4}),
      "t::h": frozenset({1}),
      "t::moved": frozenset({2}),  # already moved: line 2 must keep a default test
  }
  default = [n for n in lines if n != "t::moved"]
  seconds = {"t::f[a]": 3.0, "t::f[c]": 2.0, "t::f[b]": 1.0, "t::g[b]": 9.0, "t::g[a]": 0.5,
             "t::h": 8.0}
  # g[b] alone executes line 4; h has no family; f[a] goes first, then f[c]
  # would take line 2's last default test (the moved test's too), so f[c]
  # stays as the family's last and f[b] goes.
  assert movable_tests(lines, default, seconds) == ["t::f[a]", "t::f[b]", "t::g[a]"]
  assert movable_tests(lines, default, seconds, keep=lambda n: n == "t::f[a]") == [
      "t::f[c]", "t::f[b]", "t::g[a]"]
  assert movable_tests(lines, default, {}) == []
