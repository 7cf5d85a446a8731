"""Where the benchmarks write their results (standard library only).

A study's log, table and plot go to ``docs/studies/<study>/``; a figure that
stands alone (a cost plot, a heat map) goes to ``docs/images/``. Every script
takes its default output path from here, so moving the results is one edit.
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The folder of the studies' outputs, one subfolder per study.
STUDIES = os.path.join(ROOT, "docs", "studies")
#: The folder of the figures the documentation shows.
IMAGES = os.path.join(ROOT, "docs", "images")


def study(name: str, prefix: str | None = None) -> str:
  """The output prefix ``docs/studies/<name>/<prefix>`` (prefix defaults to name)."""
  return os.path.join(STUDIES, name, prefix or name)


def image(filename: str) -> str:
  """The path ``docs/images/<filename>``."""
  return os.path.join(IMAGES, filename)
