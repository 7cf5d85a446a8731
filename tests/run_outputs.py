"""What the tests read back from example and benchmark runs."""

from __future__ import annotations

import csv
import importlib.util
import os
from collections.abc import Iterable
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str) -> ModuleType:
  """`benchmarks/<name>.py` as a module (its `main` not run)."""
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def read_metrics(path) -> dict[str, list[tuple[int, float]]]:
  """An example's `metrics.csv`: each metric's (step, value) rows in the file's order."""
  out = {}
  with open(path) as f:
    for row in csv.DictReader(f):
      out.setdefault(row["name"], []).append((int(row["step"]), float(row["value"])))
  return out


def metrics_by_step(path) -> dict[str, dict[int, float]]:
  """An example's `metrics.csv` as {metric: {step: value}}."""
  return {name: dict(rows) for name, rows in read_metrics(path).items()}


def study_outputs(out: str, labels: Iterable[str]) -> tuple[str, list[str]]:
  """A study's table `out.md` and its log `out.jsonl`'s lines.

  Asserts that the table names every label and that the figure `out.png` was
  drawn (over 10 kB).
  """
  md = open(out + ".md").read()
  for label in labels:
    assert label in md
  assert os.path.getsize(out + ".png") > 10_000
  return md, open(out + ".jsonl").read().splitlines()
