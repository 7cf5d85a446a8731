"""Every public name imports, is documented (Args/Returns/Examples/References),
and its docstring examples run as doctests."""

import doctest
import importlib
import inspect
import pkgutil
import re

import pytest

import date_optax

PUBLIC_PACKAGES = ["date_optax"] + [
    f"date_optax.{m.name}"
    for m in pkgutil.iter_modules(date_optax.__path__)
    if not m.name.startswith("_")
]


def _public_objects():
  for pkg_name in PUBLIC_PACKAGES:
    pkg = importlib.import_module(pkg_name)
    for name in getattr(pkg, "__all__", []):
      yield pkg_name, name, getattr(pkg, name)


PUBLIC = list(_public_objects())


def _documented_callable(obj) -> bool:
  return inspect.isfunction(obj) or (
      inspect.isclass(obj) and not issubclass(obj, tuple)
  )


@pytest.mark.parametrize(
    "pkg,name,obj", PUBLIC, ids=[f"{p}.{n}" for p, n, _ in PUBLIC]
)
def test_public_name_documented(pkg, name, obj):
  doc = inspect.getdoc(obj)
  assert doc, f"{pkg}.{name} has no docstring"
  if _documented_callable(obj) and not name.endswith("State"):
    for section in ("Args:", "Returns:", "Examples:", "References:"):
      if section == "Args:" and not inspect.signature(obj).parameters:
        continue
      if section == "Returns:" and inspect.isclass(obj):
        continue
      assert section in doc, f"{pkg}.{name} docstring lacks {section}"


def _doctests():
  finder = doctest.DocTestFinder(exclude_empty=True)
  seen = set()
  for pkg, name, obj in PUBLIC:
    if id(obj) in seen:
      continue
    seen.add(id(obj))
    for t in finder.find(obj, f"{pkg}.{name}"):
      if t.examples:
        yield t


DOCTESTS = list(_doctests())


@pytest.mark.parametrize("test", DOCTESTS, ids=[t.name for t in DOCTESTS])
def test_doctest(test):
  runner = doctest.DocTestRunner(
      optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
  )
  runner.run(test)
  assert runner.failures == 0, f"doctest {test.name} failed (see output above)"


def test_every_public_callable_has_an_example():
  missing = [
      f"{p}.{n}" for p, n, o in PUBLIC
      if _documented_callable(o) and not n.endswith("State")
      and ">>>" not in (inspect.getdoc(o) or "")
  ]
  assert not missing, f"no doctest example: {missing}"


def test_code_outside_the_library_uses_public_names_only():
  # Examples, benchmarks, the TPU scripts and the demo build on the public
  # API, as code outside this repository must. Tests are white-box (they
  # check private helpers such as the HLO round reader against references),
  # so tests/ is the one place allowed to import date_optax._src.
  import ast
  import pathlib

  root = pathlib.Path(__file__).resolve().parent.parent
  offenders = []
  for folder in ("examples", "benchmarks", "tpu"):
    for path in sorted((root / folder).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
          names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
          names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        if any(n == "date_optax._src" or n.startswith("date_optax._src.") for n in names):
          offenders.append(f"{path.relative_to(root)}:{node.lineno}")
  assert offenders == [], offenders
  assert not (root / "date_optax" / "_src" / "lstm_demo.py").exists()


# An inline literal closed right before a letter or digit (`jax.Array`s) is
# not markup to docutils: `make docs` fails on it (a warning), and that build
# runs only in `make test-all`.
_LITERAL = re.compile(r"``.+?``|`[^`]+`")  # left to right, as docutils pairs them


def _docstrings():
  seen = set()
  for pkg, name, obj in PUBLIC:
    members = [(name, obj)]
    if inspect.isclass(obj):
      members += [(f"{name}.{m}", v) for m, v in vars(obj).items() if not m.startswith("_")]
    for label, member in members:
      target = member.fget if isinstance(member, property) else member
      doc = inspect.getdoc(target) if callable(target) else None
      if doc and id(target) not in seen:
        seen.add(id(target))
        yield f"{pkg}.{label}", doc


def test_docstrings_close_every_inline_literal_before_a_space_or_punctuation():
  bad = []
  for label, doc in _docstrings():
    prose = [line for line in doc.splitlines() if not line.lstrip().startswith((">>>", "..."))]
    for par in "\n".join(prose).split("\n\n"):  # docutils pairs marks within a paragraph
      text = " ".join(par.split())
      bad += [f"{label}: {text[m.start():m.end() + 1]}" for m in _LITERAL.finditer(text)
              if text[m.end():m.end() + 1].isalnum()]
  assert bad == [], bad
