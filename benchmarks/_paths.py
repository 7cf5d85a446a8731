"""Where the benchmarks write their results, and how a figure is saved.

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
#: Where the MNIST-1D studies cache the generated data set.
MNIST1D_CACHE = os.path.join(ROOT, "tmp", "mnist1d_cache")


def study(name: str, prefix: str | None = None) -> str:
  """The output prefix ``docs/studies/<name>/<prefix>`` (prefix defaults to name)."""
  return os.path.join(STUDIES, name, prefix or name)


def study_out(name: str, quick: bool, out: str | None = None) -> str:
  """`out` (a --out flag), else the study's prefix (``<name>_quick`` with --quick).

  Its folder is made.
  """
  out = out or study(name, f"{name}_quick" if quick else name)
  os.makedirs(os.path.dirname(out), exist_ok=True)
  return out


def image(filename: str) -> str:
  """The path ``docs/images/<filename>``."""
  return os.path.join(IMAGES, filename)


def save_figure(fig, path: str, dpi: float | None = None) -> None:
  """Lays `fig` out tightly, writes it to `path` and closes it.

  `dpi` None keeps matplotlib's own (``savefig.dpi``). Closing frees the
  figure, which pyplot otherwise keeps until the process ends.
  """
  import matplotlib.pyplot as plt  # noqa: PLC0415  (only where a plot is drawn)

  fig.tight_layout()
  fig.savefig(path, dpi=dpi)
  plt.close(fig)
