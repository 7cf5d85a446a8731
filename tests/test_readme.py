"""The Python snippets of the README and of every guide page run as written
(each in a fresh interpreter)."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# The hand-written pages; the study pages in docs/ are tables written by
# benchmarks/*.py and hold no code.
PAGES = [README, ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]


def _blocks(page):
  return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


SNIPPETS = [(page, i, code) for page in PAGES for i, code in enumerate(_blocks(page))]


def test_readme_has_quick_start():
  text = README.read_text()
  assert text.index("make demo") < text.index("make test") < 400
  assert _blocks(README), "README has no python snippet"


def test_guide_pages_exist_and_are_linked():
  text = README.read_text()
  guide = sorted((ROOT / "docs" / "guide").glob("*.md"))
  assert guide, "docs/guide has no page"
  for page in guide:
    assert f"docs/guide/{page.name}" in text, f"README does not link {page.name}"


@pytest.mark.parametrize(
    "page,i,code", SNIPPETS, ids=[f"{p.relative_to(ROOT)}-{i}" for p, i, _ in SNIPPETS]
)
def test_snippet_runs(page, i, code, tmp_path):
  proc = subprocess.run(
      [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
  )
  assert proc.returncode == 0, (
      f"{page.relative_to(ROOT)} block {i} failed:\n{proc.stderr[-3000:]}")
