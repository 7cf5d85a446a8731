"""The repository's layout: who imports whom, how large modules grow, what is tracked.

* Examples own their data and models; benchmarks may import them (the studies
  and `make demo` train the examples' MNIST-1D model on the examples' data),
  but an example never imports benchmarks: an example is what a user copies.
* `date_optax/_src/parallel/` is four rooms whose imports point one way:
  `comm/` (how gradients travel) imports none of the others, `layout/` (where
  arrays live) only `comm/`, `data/` only those two, and `step/` any of them.
* The library has no import circle, and no module over 700 lines.
* No tracked file is over 1 MB unless it is a documented data file.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "date_optax"
PARALLEL = "date_optax._src.parallel"
#: The rooms of `_src/parallel/`, each allowed to import those listed for it.
ROOMS = {"comm": set(), "layout": {"comm"}, "data": {"comm", "layout"},
         "step": {"comm", "layout", "data"}}
MAX_MODULE_LINES = 700
MAX_TRACKED_BYTES = 1_000_000
#: Tracked files allowed over MAX_TRACKED_BYTES, each with the reason.
DATA_FILES: dict[str, str] = {}


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
  out = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      out.append((node.lineno, node.module))
      # `from package import module` imports the module too.
      out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
  return out


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _library_modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_examples_never_import_benchmarks():
  offenders = [
      f"{path.relative_to(ROOT)}:{line} imports {name}"
      for path in sorted((ROOT / "examples").rglob("*.py"))
      for line, name in _imports(path)
      if name == "benchmarks" or name.startswith("benchmarks.")
  ]
  assert offenders == []
  assert list((ROOT / "examples").rglob("*.py"))  # the check read something


def test_benchmarks_read_the_examples_data_and_model():
  # One home for the MNIST-1D data, the digits loader and the LSTM: the
  # examples. The studies' modules re-export them rather than keep copies.
  from benchmarks.tasks import data, models  # noqa: PLC0415
  from examples.mnist1d_lstm import input_pipeline  # noqa: PLC0415
  from examples.mnist1d_lstm import models as example_models
  from examples.mnist_lstm import input_pipeline as digits  # noqa: PLC0415

  assert data.load_mnist1d is input_pipeline.load_mnist1d
  assert data.Dataset is input_pipeline.Dataset
  assert data.load_digits is digits.get_datasets
  assert models.LSTMClassifier is example_models.LSTMClassifier


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_parallel_rooms_import_one_way(room):
  folder = PACKAGE / "_src" / "parallel" / room
  offenders = []
  for path in sorted(folder.rglob("*.py")):
    for line, name in _imports(path):
      if not name.startswith(PARALLEL + "."):
        continue
      other = name[len(PARALLEL) + 1:].split(".")[0]
      if other in ROOMS and other != room and other not in ROOMS[room]:
        offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
  assert offenders == []
  assert list(folder.glob("*.py"))


def test_library_has_no_import_circle():
  modules = _library_modules()
  graph = {
      name: sorted({imp for _, imp in _imports(path) if imp in modules and imp != name})
      for name, path in modules.items()
  }
  # Importing a package runs its __init__, which may import its own
  # submodules: that is no circle, so edges from a module to the package it
  # lives in are dropped.
  for name, deps in graph.items():
    graph[name] = [d for d in deps if not name.startswith(d + ".")]
  state: dict[str, int] = {}
  cycles = []

  def visit(node, stack):
    state[node] = 1
    for dep in graph[node]:
      if state.get(dep) == 1:
        cycles.append(stack[stack.index(dep):] + [dep])
      elif dep not in state:
        visit(dep, stack + [dep])
    state[node] = 2

  for name in graph:
    if name not in state:
      visit(name, [name])
  assert cycles == []
  assert len(graph) > 40  # the check read the library


def test_no_library_module_over_700_lines():
  sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
           for p in PACKAGE.rglob("*.py")}
  assert {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES} == {}
  assert max(sizes.values()) > 100


def test_no_large_file_is_tracked_by_mistake():
  try:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True, timeout=60).stdout
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  files = [f for f in out.decode().split("\0") if f]
  large = {f: (ROOT / f).stat().st_size for f in files
           if (ROOT / f).is_file() and (ROOT / f).stat().st_size > MAX_TRACKED_BYTES}
  assert {f: n for f, n in large.items() if f not in DATA_FILES} == {}
  assert not [f for f in files if f.endswith(".whl")]
  assert len(files) > 100
