"""Plots of trust-ratio telemetry (matplotlib, imported when a plot is drawn)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from date_optax._src import validation
from date_optax._src.telemetry import BOUND_RTOL, per_layer_ratios


def plot_trust_ratio_heatmap(
    history: Sequence[Any],
    path: str | os.PathLike,
    *,
    steps: Sequence[int] | None = None,
    lower: float | None = None,
    upper: float | None = None,
    title: str | None = None,
) -> str:
  """Saves a PNG heatmap of the trust ratio of every layer over steps.

  Rows are layers (named as in `per_layer_ratios`, in tree order), columns are
  the logged steps, and the colour is `log10(ratio)` over the data's range.
  Bounds, when given, are drawn in red on the colour bar (when inside that
  range), and its label gives the share of cells at each bound.

  Args:
    history: one entry per logged step; each entry is a ratios pytree
      (`date_optax.trust_ratios(opt_state)`) or the dict `per_layer_ratios`
      returned for it. All entries must name the same layers.
    path: the PNG file to write (its directory is created).
    steps: the step of each entry (defaults to 0, 1, ...).
    lower: the lower ratio bound to mark, or None.
    upper: the upper ratio bound to mark, or None.
    title: the figure title.

  Returns:
    The path written, as a string.

  Examples:
    >>> import os, tempfile
    >>> import jax.numpy as jnp
    >>> from date_optax.diagnostics import plot_trust_ratio_heatmap
    >>> history = [{'w': jnp.float32(0.1 * (t + 1)), 'b': jnp.float32(1.0)}
    ...            for t in range(5)]
    >>> out = plot_trust_ratio_heatmap(
    ...     history, os.path.join(tempfile.mkdtemp(), 'heat.png'))
    >>> os.path.getsize(out) > 0
    True

  References:
    You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks",
    2017 (LARS: per-layer ratios differ by orders of magnitude).
  """
  if isinstance(history, (str, bytes)) or not isinstance(history, Sequence):
    raise TypeError(
        f"history must be a sequence of ratios pytrees, got {type(history).__name__}."
    )
  if not history:
    raise ValueError("history is empty: nothing to plot.")
  rows = [jax.device_get(per_layer_ratios(h)) for h in history]
  names = list(rows[0])
  for i, r in enumerate(rows):
    if list(r) != names:
      raise ValueError(
          f"history[{i}] names layers {list(r)[:4]}..., expected the layers of "
          f"history[0] ({names[:4]}...)."
      )
  if steps is None:
    steps = list(range(len(rows)))
  steps = [int(s) for s in steps]
  if len(steps) != len(rows):
    raise ValueError(f"steps has {len(steps)} entries, history has {len(rows)}.")
  for name, bound in (("lower", lower), ("upper", upper)):
    if bound is not None:
      validation.check_positive(name, bound)

  data = np.array([[float(r[n]) for r in rows] for n in names], dtype=np.float64)
  with np.errstate(divide="ignore"):
    logd = np.log10(np.where(data > 0, data, np.nan))

  # The object-oriented Figure API renders off-screen without touching the
  # pyplot state or the user's backend.
  from matplotlib.figure import Figure  # noqa: PLC0415 - optional dependency

  height = min(2.0 + 0.28 * len(names), 16.0)
  fig = Figure(figsize=(9.0, height))
  ax = fig.subplots()
  # The colour range is the data's, for contrast; bounds inside it are drawn
  # on the colour bar and the share of cells at each bound is in its label.
  finite = logd[np.isfinite(logd)]
  vmin = float(finite.min()) if finite.size else -1.0
  vmax = float(finite.max()) if finite.size else 1.0
  if vmax - vmin < 1e-6:
    vmin, vmax = vmin - 0.5, vmax + 0.5
  im = ax.imshow(
      logd,
      aspect="auto",
      interpolation="nearest",
      cmap="viridis",
      vmin=vmin,
      vmax=vmax,
      extent=(steps[0] - 0.5, steps[-1] + 0.5, len(names) - 0.5, -0.5),
  )
  ax.set_yticks(range(len(names)))
  ax.set_yticklabels(names, fontsize=8)
  ax.set_xlabel("step")
  ax.set_title(title or "trust ratio per layer", fontsize=10)
  cbar = fig.colorbar(im, ax=ax)
  label = "log10(trust ratio)"
  tol = 1 + BOUND_RTOL
  for bound, name in ((lower, "lower"), (upper, "upper")):
    if bound is None:
      continue
    at = data <= bound * tol if name == "lower" else data >= bound / tol
    label += f"\n{name} {bound:g}: {100 * at.mean():.1f}% of cells"
    if vmin <= math.log10(bound) <= vmax:
      cbar.ax.axhline(math.log10(bound), color="red", linewidth=2.0)
  cbar.set_label(label, fontsize=8)
  fig.tight_layout()
  out = os.fspath(path)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=120)
  return out
