"""The examples' figure of the global batch and the learning rate per step.

`write_batch_and_lr` reads a run's `metrics.csv` (written by
`examples/_loop.py`) and draws `batch_and_lr.png` beside it: the global
batch on a log2 axis above the learning rate, both against the optimizer
step. A growing batch (`config.batch_schedule`) logs "batch_size" at every
logged step and at every step where it changes, so its line is exact; a
fixed batch is drawn flat. matplotlib (an `examples` extra) is imported
when a figure is drawn, on the Agg backend.
"""

from __future__ import annotations

import os
import warnings

import jax
import numpy as np
from etils import epath

from date_optax.diagnostics import read_metrics_csv

#: The figure's file name inside the workdir.
FILENAME = "batch_and_lr.png"


def plot_batch_and_lr(
    steps_batch: tuple[np.ndarray, np.ndarray],
    steps_lr: tuple[np.ndarray, np.ndarray],
    path: str | os.PathLike,
    *,
    title: str | None = None,
) -> str:
  """Saves two panels against the step: the global batch (log2) and the learning rate.

  Args:
    steps_batch: ``(steps, batch sizes)``; the batch holds from each step
      to the next (drawn as a staircase).
    steps_lr: ``(steps, learning rates)``.
    path: the PNG to write (local or an `etils.epath` URI).
    title: the figure's title.

  Returns:
    The path written, as a string.

  Examples:
    >>> import os, tempfile
    >>> from examples import _plots
    >>> out = _plots.plot_batch_and_lr(
    ...     ([1, 10, 20], [16, 32, 32]), ([1, 10, 20], [0.1, 0.2, 0.15]),
    ...     os.path.join(tempfile.mkdtemp(), "b.png"))
    >>> os.path.getsize(out) > 0
    True
  """
  import matplotlib  # noqa: PLC0415  (an `examples` extra)

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415
  import matplotlib.ticker  # noqa: PLC0415

  fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 4.8), sharex=True)
  try:
    top.plot(*steps_batch, drawstyle="steps-post", color="C0")
    top.set_yscale("log", base=2)
    # Every power of two in range, written as a number.
    sizes = np.asarray(steps_batch[1], float)
    powers = np.arange(np.floor(np.log2(sizes.min())), np.ceil(np.log2(sizes.max())) + 1)
    top.set_yticks(2.0**powers[:: max(1, len(powers) // 8)])
    top.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    top.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    top.set_ylabel("global batch")
    bottom.plot(*steps_lr, color="C1")
    bottom.set_ylabel("learning rate")
    bottom.set_xlabel("optimizer step")
    for ax in (top, bottom):
      ax.grid(alpha=0.3)
    if title:
      top.set_title(title, fontsize=9)
    fig.tight_layout()
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
      fig.savefig(f, format="png", dpi=80)
  finally:
    plt.close(fig)
  return os.fspath(path)


def write_batch_and_lr(
    workdir: str, *, batch_size: int, title: str | None = None
) -> str | None:
  """Draws `workdir/batch_and_lr.png` from `workdir/metrics.csv` (host 0).

  The logged "batch_size" is drawn when the run logged it (a growing
  batch), else a flat line at `batch_size`; the batch line runs to the last
  logged step. A failure (no matplotlib, no learning rate logged, an
  unwritable path) is a warning, never an error: the run's `results.json`
  is already written.

  Args:
    workdir: the run's directory.
    batch_size: the batch of a fixed-batch run (used when none is logged).
    title: the figure's title.

  Returns:
    The path written, or None when no figure was drawn.
  """
  if jax.process_index() != 0:
    return None
  try:
    rows = read_metrics_csv(os.path.join(workdir, "metrics.csv"))
    lr = rows["learning_rate"]
    last = int(max(steps[-1] for steps, _ in rows.values() if len(steps)))
    if "batch_size" in rows:
      steps, sizes = rows["batch_size"]
    else:
      steps, sizes = np.asarray([1]), np.asarray([batch_size])
    if steps[-1] < last:  # the staircase holds its last batch to the end
      steps, sizes = np.append(steps, last), np.append(sizes, sizes[-1])
    return plot_batch_and_lr((steps, sizes), lr, os.path.join(workdir, FILENAME),
                             title=title)
  except Exception as e:  # noqa: BLE001 - a figure must never cost the results
    warnings.warn(f"{FILENAME} not drawn in {workdir}: {e!r}", stacklevel=2)
    return None
