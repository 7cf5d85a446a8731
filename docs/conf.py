"""Sphinx configuration: the guide pages (MyST Markdown) and the API reference
generated from the docstrings (autodoc + napoleon, Google style).

Build with `make docs` (output in docs/_build/html; warnings fail the build).
Importing this file has no side effects beyond putting the repository root on
sys.path, so pytest collection and doctest runs that touch docs/ are safe.
"""

import os
import re
import sys

_DOCS = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_DOCS)
sys.path.insert(0, _ROOT)

project = "date_optax"
author = "date_optax developers"
copyright = "2026, date_optax developers"  # noqa: A001

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"

# The pages written by the benchmark scripts (one study's tables each) and
# the studies' history pages are built too: RESULTS.md and studies/index.md
# link to them.
exclude_patterns = ["_build"]

# MyST: `$...$` maths is not used; headings get anchors for `page.md#section` links.
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3

# autodoc / napoleon: Google-style Args/Returns/Examples/References sections.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Types go in the signatures (the docstrings' Args say what each one means).
# Keep the package's type aliases (date_optax/_src/types.py) by name instead
# of expanding them into long unions.
autodoc_type_aliases = {
    name: name
    for name in ("PyTree", "ScalarOrSchedule", "Schedule", "MaskOrFn", "LayerAxes", "DType",
                 "LossFn")
}
autodoc_default_options = {"members": True, "show-inheritance": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# NamedTuple states list their fields under "Attributes:"; as :ivar: fields
# they do not collide with the fields autodoc documents.
napoleon_use_ivar = True

html_theme = "sphinx_book_theme"
html_title = "date_optax"
html_theme_options = {"show_toc_level": 2}


# The repository the pages link into: a Markdown link from a page in docs/ to
# a file outside docs/ (an example's README, a test) works on GitHub as a
# relative path; in the HTML build it points at that file in the repository.
REPO_URL = "https://github.com/date-optax/date-optax/blob/main"
_MD_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")


def _link_outside_docs(app, docname, source):
  page_dir = os.path.dirname(os.path.join(_DOCS, docname))

  def repl(m):
    target, _, anchor = m.group(1).partition("#")
    path = os.path.normpath(os.path.join(page_dir, target))
    if path.startswith(_DOCS + os.sep) or not path.startswith(_ROOT + os.sep):
      return m.group(0)
    url = f"{REPO_URL}/{os.path.relpath(path, _ROOT)}" + (f"#{anchor}" if anchor else "")
    return f"]({url})"

  source[0] = _MD_LINK.sub(repl, source[0])


# Docstrings write absolute values and norms as |G|, which reStructuredText
# would read as a substitution: escape bars outside ``literals`` and roles.
# A module constant documented with autodata (api/*.rst) keeps only the text
# written there, not the docstring of its type.
_CODE_SPAN = re.compile(r"(:[a-z:]+:)?(``.*?``|`[^`]*`)")


def _escape_bars(app, what, name, obj, options, lines):
  if what == "data" and getattr(obj, "__doc__", None) == type(obj).__doc__:
    lines.clear()  # a constant (tuple, dict, float): not its type's docstring
    return
  for i, line in enumerate(lines):
    if "|" not in line:
      continue
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(line):
      out.append(line[pos:m.start()].replace("|", "\\|"))
      out.append(m.group(0))
      pos = m.end()
    out.append(line[pos:].replace("|", "\\|"))
    lines[i] = "".join(out)


# The pages the benchmark scripts write (benchmarks/*.py, into
# docs/studies/<study>/<name>.md) are table fragments, most of them written
# to be pasted under a section: their headings start at level 3, or they have
# none. Built as pages, they get a level-1 title.
_STUDY_PAGES = {
    "batch_growth": "Growing batch study",
    "batch_scaling": "Batch scaling study",
    "bench_device_h200": "Accelerator benchmark on one H200",
    "bench_device_h200_27755f6": "Accelerator benchmark on one H200, after the rewrite",
    "bench_device_h200_599f3b3": "Accelerator benchmark on one H200, after the ordered LAMB",
    "bench_device_h200_dd09121": "Accelerator benchmark on one H200, with the host fast path",
    "bench_device_cpu_41ab8fc": "Accelerator benchmark on 8 emulated CPU devices",
    "demo_seeds": "The demo over three seeds",
    "batch_scaling_quick": "Batch scaling study (quick mode)",
    "bert_scaling": "BERT batch scaling study",
    "bert_scaling_short": "BERT batch scaling study (short)",
    "gain_study": "Gain study",
    "low_precision": "Low-precision communication study",
    "low_precision_long": "Low-precision communication study, longer runs",
    "low_precision_step_time": "Low-precision communication: bytes and step time per payload",
    "oracle": "Oracle study",
    "solver_ladder": "Solver ladder study",
}
_HEADING = re.compile(r"^(#+) ", re.M)


def _title_study_page(app, docname, source):
  folder, _, name = docname.rpartition("/")
  if not folder.startswith("studies/") or name not in _STUDY_PAGES:
    return
  levels = [len(h) for h in _HEADING.findall(source[0])]
  if not levels:
    source[0] = f"# {_STUDY_PAGES[name]}\n\n" + source[0]
  elif min(levels) > 1:
    shift = min(levels) - 1
    source[0] = _HEADING.sub(lambda m: "#" * (len(m.group(1)) - shift) + " ", source[0])


# A study page named after the commit it measured (`bench_device_h200_27755f6`)
# is a snapshot that RESULTS.md links to: built, but left out of the navigation
# (no toctree lists it, and the user pages never name it).
_COMMIT_PAGE = re.compile(r"_[0-9a-f]{7,40}$")


def _orphan_commit_page(app, docname, source):
  if docname.startswith("studies/") and _COMMIT_PAGE.search(docname):
    source[0] = "---\norphan: true\n---\n" + source[0]


# Sphinx writes an aliased type inside a union as TypeAliasForwardRef('Name').
_ALIAS_REF = re.compile(r"TypeAliasForwardRef\('([A-Za-z_.]+)'\)")


def _alias_names(app, what, name, obj, options, signature, return_annotation):
  clean = lambda s: _ALIAS_REF.sub(r"\1", s) if s else s
  return clean(signature), clean(return_annotation)


def setup(app):
  app.connect("autodoc-process-signature", _alias_names)
  app.connect("source-read", _link_outside_docs)
  app.connect("source-read", _title_study_page)
  app.connect("source-read", _orphan_commit_page)  # after the title: front matter first
  app.connect("autodoc-process-docstring", _escape_bars)
