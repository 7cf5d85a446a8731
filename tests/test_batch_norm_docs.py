"""Doctests of the batch-norm API and the guide page example that uses it."""

from __future__ import annotations

import doctest
import importlib
import pathlib
import re
import runpy

import pytest

import date_optax.nn
import date_optax.nn.nnx

MODULES = [
    "date_optax._src.batch_norm",
    "date_optax._src.batch_norm_nnx",
    "date_optax.nn",
    "date_optax.nn.nnx",
]
PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "batch_norm.md"


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
  module = importlib.import_module(name)
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
  assert result.failed == 0
  if name.startswith("date_optax._src"):
    assert result.attempted > 0


@pytest.mark.parametrize("package", [date_optax.nn, date_optax.nn.nnx])
def test_public_names_have_docstrings_with_examples(package):
  assert package.__doc__
  for name in package.__all__:
    obj = getattr(package, name)
    doc = obj.__doc__ or ""
    assert doc.strip(), name
    if callable(obj):
      assert ">>>" in doc, f"{name} has no doctest example"
      assert "References:" in doc, f"{name} cites no paper"


def test_guide_example_runs(capsys, tmp_path):
  text = PAGE.read_text()
  code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
  script = tmp_path / "readme_example.py"
  script.write_text(code)
  # runpy registers the module while it runs (flax modules are dataclasses).
  runpy.run_path(str(script), run_name="readme_example")
  out = capsys.readouterr().out.splitlines()
  assert out == ["{'ghost_batch_size': 32, 'group_size': 2}", "True"]
