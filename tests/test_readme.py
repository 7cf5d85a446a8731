"""The Python snippets of the README and of every guide page run as written,
and print what their `# prints` comments say.

Each snippet runs in this test process, in a namespace of its own, in a fresh
working directory, with the process's environment restored afterwards. Its
set-up lines (the CPU platform, 8 emulated devices) are already in effect here
(tests/conftest.py): a `jax.config.update` of those two options to the values
the process has is a no-op, and any other value fails the test; the
distributed runtime finds no cluster, as in a fresh single-host interpreter.
Running in process shares the test run's imports and compiled programs,
where a fresh interpreter for each of 20-odd snippets cost about a minute of
`make test`.

A snippet states its output in comments `# prints <line>`, one per line of
stdout, in order (at the end of the `print` call's line, or on lines of their
own after a loop). Every README snippet has them. The check compares the
lines with their numbers taken apart: the text between numbers must be equal,
an integer must be equal, and a number written with a decimal point or an
exponent may differ by one unit in the last digit the comment shows (`0.039`
matches 0.038 to 0.040), so that a value on the edge of its rounding on
another CPU still matches.
"""

import contextlib
import io
import os
import pathlib
import re
import warnings

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The hand-written pages; the study pages in docs/ are tables written by
# benchmarks/*.py and hold no code.
PAGES = [README, ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def _blocks(page):
  return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


SNIPPETS = [(page, i, code) for page in PAGES for i, code in enumerate(_blocks(page))]


_PRINTS = re.compile(r"#\s*prints\s(.*)$", re.M)
# A number on its own: not the digits inside a word such as "v6e-8" or "int8".
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.(\d+))?(?:[eE]([-+]?\d+))?(?![\w.])")
# A page named after a commit (`bench_device_h200_27755f6`): hex with a digit and a letter.
_COMMIT_NAMED = re.compile(r"\w+_(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def expected_output(code):
  """The stdout lines a snippet's `# prints` comments give, in order."""
  return [m.group(1).rstrip() for m in _PRINTS.finditer(code)]


def _split(line):
  return _NUMBER.split(line)[::3], list(_NUMBER.finditer(line))


def output_matches(expected, got):
  """Whether printed `got` is the `expected` line, numbers within their last digit."""
  (text_e, nums_e), (text_g, nums_g) = _split(expected), _split(got)
  if text_e != text_g or len(nums_e) != len(nums_g):
    return False
  for e, g in zip(nums_e, nums_g):
    decimals, exponent = e.group(1), e.group(2)
    if decimals is None and exponent is None:
      if int(e.group(0)) != int(g.group(0)) or g.group(1) or g.group(2):
        return False
      continue
    unit = 10.0 ** (-len(decimals or "") + int(exponent or 0))
    if abs(float(e.group(0)) - float(g.group(0))) > unit * (1 + 1e-6):
      return False
  return True


@pytest.mark.parametrize("expected,got,same", [
    ("loss 0.039", "loss 0.039", True),
    ("loss 0.039", "loss 0.040", True),
    ("loss 0.039", "loss 0.041", False),
    ("16.0 117 220", "16.0 118 220", False),
    ("3.536e-03", "3.537e-03", True),
    ("3.536e-03", "3.546e-03", False),
    ("LARS: loss 0.0000", "LAMB: loss 0.0000", False),
    ("True 32 True", "True 32 False", False),
    ("v6e-8: 2 steps", "v6e-8: 2 steps", True),
])
def test_output_matches(expected, got, same):
  assert output_matches(expected, got) is same


def test_readme_has_quick_start():
  text = README.read_text()
  assert text.index("make demo") < text.index("make test") < 400
  assert _blocks(README), "README has no python snippet"


def test_every_readme_snippet_states_its_output():
  for i, code in enumerate(_blocks(README)):
    assert expected_output(code), f"README block {i} has no `# prints` comment"


def test_user_pages_name_no_page_after_a_commit():
  # Measurements keep their commit inside the page; a user page never links a
  # page whose name is a commit hash.
  for page in PAGES:
    assert _COMMIT_NAMED.findall(page.read_text()) == [], page.name


def test_guide_pages_exist_and_are_linked():
  text = README.read_text()
  guide = sorted((ROOT / "docs" / "guide").glob("*.md"))
  assert guide, "docs/guide has no page"
  for page in guide:
    assert f"docs/guide/{page.name}" in text, f"README does not link {page.name}"


def _set_up_already(update):
  """`jax.config.update` that lets a snippet's set-up lines pass if already in effect."""

  def checked(name, value):
    if name == "jax_num_cpu_devices":
      assert value == jax.device_count(), (
          f"the snippet wants {value} CPU devices; the tests have {jax.device_count()}")
      return None
    if name == "jax_platforms":
      assert value == jax.default_backend(), (
          f"the snippet wants {value!r}; the tests run on {jax.default_backend()!r}")
      return None
    return update(name, value)

  return checked


def _no_cluster(coordinator_address=None, num_processes=None, process_id=None, **kwargs):
  """`jax.distributed.initialize` on one host with no cluster: what JAX raises."""
  del kwargs
  assert coordinator_address is num_processes is process_id is None, "a snippet starts a cluster"
  raise ValueError("no cluster detected (a single-process run)")


@pytest.mark.parametrize(
    "page,i,code", SNIPPETS, ids=[f"{p.relative_to(ROOT)}-{i}" for p, i, _ in SNIPPETS]
)
def test_snippet_runs(page, i, code, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for key in ("JAX_PLATFORMS", "XLA_FLAGS"):  # restored when the test ends
    if key in os.environ:
      monkeypatch.setenv(key, os.environ[key])
    else:
      monkeypatch.delenv(key, raising=False)
  monkeypatch.setattr(jax.config, "update", _set_up_already(jax.config.update))
  monkeypatch.setattr(jax.distributed, "initialize", _no_cluster)
  stdout = io.StringIO()
  with contextlib.redirect_stdout(stdout), warnings.catch_warnings():
    # A page teaches no keyword the library is about to remove.
    warnings.filterwarnings("error", r".*is deprecated and will be removed", DeprecationWarning)
    exec(compile(code, f"{page.relative_to(ROOT)} block {i}", "exec"), {"__name__": "__main__"})
  expected = expected_output(code)
  if expected:
    got = stdout.getvalue().splitlines()
    assert len(got) == len(expected) and all(map(output_matches, expected, got)), (
        f"{page.relative_to(ROOT)} block {i} printed\n{stdout.getvalue()}\ninstead of its "
        "`# prints` lines\n" + "\n".join(expected))
