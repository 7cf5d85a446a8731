"""The README's Python snippets run as written (each in a fresh interpreter)."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_quick_start():
  text = README.read_text()
  assert text.index("make demo") < text.index("make test") < 400
  assert BLOCKS, "README has no python snippet"


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_snippet_runs(i, tmp_path):
  proc = subprocess.run(
      [sys.executable, "-c", BLOCKS[i]], cwd=tmp_path, capture_output=True,
      text=True, timeout=300,
  )
  assert proc.returncode == 0, f"README block {i} failed:\n{proc.stderr[-3000:]}"
