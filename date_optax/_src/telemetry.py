"""Trust-ratio telemetry: summaries for step metrics, a CSV/TensorBoard writer
and a per-layer heatmap.

The ratios come from `date_optax.trust_ratios(opt_state)`: a pytree shaped like
the parameters whose leaves are float32 arrays of shape `()` (one layer) or
`(L,)` (a stacked leaf holding L layers).
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src import validation

_F32 = jnp.float32
# A ratio counts as "at a bound" within a few float32 ulps of it: a bound that
# is a schedule value may be rounded differently from the clip that produced
# the ratio.
_BOUND_RTOL = 4 * float(np.finfo(np.float32).eps)


def _check_ratios(ratios: Any) -> list[jax.Array]:
  if ratios is None:
    raise ValueError(
        "ratios is None: the optimizer keeps no trust ratios "
        "(date_optax.trust_ratios(opt_state) returned None)."
    )
  leaves = jax.tree.leaves(ratios)
  if not leaves:
    raise ValueError("ratios has no leaves: there is no layer to summarise.")
  return leaves


def _check_bound(name: str, value: Any) -> None:
  # Traced bounds (e.g. a schedule evaluated inside a jitted step) are accepted
  # as is; concrete ones are validated.
  if value is None or isinstance(value, jax.core.Tracer):
    return
  validation.check_nonnegative(name, value)


def trust_ratio_summary(
    ratios: Any,
    lower: float | jax.Array | None = None,
    upper: float | jax.Array | None = None,
    *,
    prefix: str = "",
) -> dict[str, jax.Array]:
  """Summarises per-layer trust ratios over all layers, for step metrics.

  Every layer counts once: a leaf of shape `()` is one layer, a stacked leaf
  of shape `(L,)` is L layers. Layers that a trust-ratio mask excludes carry a
  ratio of 1 in the optimizer state and are counted like the others. A ratio
  is *at* a bound when it is within 4 float32 ulps of it (a bound given as a
  schedule value may round differently from the clip that produced the
  ratio). Without a bound, the fraction at it is 0.

  The function is jit-able (`prefix` must be static) and returns float32
  scalars, so it can run inside a train step.

  Args:
    ratios: the per-layer ratios, e.g. `date_optax.trust_ratios(opt_state)`.
    lower: the lower bound in force at this step (a float or a scalar array),
      or None.
    upper: the upper bound in force at this step, or None.
    prefix: prepended to every key, e.g. `"trust_ratio/"`.

  Returns:
    A dict with keys `min`, `median`, `max`, `frac_at_lower`, `frac_at_upper`
    (each preceded by `prefix`) mapping to float32 scalars.

  Raises:
    ValueError: if `ratios` is None or has no leaves, or a bound is negative.

  Examples:
    >>> import jax.numpy as jnp
    >>> from date_optax.diagnostics import trust_ratio_summary
    >>> ratios = {'a': jnp.float32(0.01), 'b': jnp.float32(2.0),
    ...           'c': jnp.array([10.0, 10.0], jnp.float32)}
    >>> s = trust_ratio_summary(ratios, lower=0.01, upper=10.0)
    >>> [round(float(s[k]), 3) for k in ('min', 'median', 'max')]
    [0.01, 6.0, 10.0]
    >>> float(s['frac_at_lower']), float(s['frac_at_upper'])
    (0.25, 0.5)

  References:
    You, Li, Reddi, Hseu, Kumar, Bhojanapalli, Song, Demmel, Keutzer, Hsieh,
    "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
    ICLR 2020 (the LAMB trust ratio).
  """
  leaves = _check_ratios(ratios)
  _check_bound("lower", lower)
  _check_bound("upper", upper)
  if not isinstance(prefix, str):
    raise TypeError(f"prefix must be a str, got {prefix!r}.")
  r = jnp.concatenate([jnp.ravel(jnp.asarray(x, _F32)) for x in leaves])

  def frac_at(bound, below):
    if bound is None:
      return jnp.zeros((), _F32)
    b = jnp.asarray(bound, _F32)
    tol = _BOUND_RTOL * jnp.abs(b)
    hit = r <= b + tol if below else r >= b - tol
    return jnp.mean(hit.astype(_F32))

  out = {
      "min": jnp.min(r),
      "median": jnp.median(r),
      "max": jnp.max(r),
      "frac_at_lower": frac_at(lower, True),
      "frac_at_upper": frac_at(upper, False),
  }
  return {prefix + k: v.astype(_F32) for k, v in out.items()}


def _path_name(path: tuple[Any, ...]) -> str:
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(k.name)
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    elif isinstance(k, jax.tree_util.FlattenedIndexKey):
      parts.append(str(k.key))
    else:
      parts.append(str(k))
  return "/".join(parts) if parts else "ratio"


def per_layer_ratios(ratios: Any) -> dict[str, jax.Array]:
  """Names every layer's trust ratio: `{"Dense_0/kernel": r, ...}`.

  A leaf of shape `()` gives one entry named by its path in the tree (keys
  joined by `/`); a stacked leaf of shape `(L,)` gives `L` entries suffixed
  `[0]` ... `[L-1]` (several layer axes give `[i,j]`). Useful to log every
  layer with `MetricWriter` or to build the history for
  `plot_trust_ratio_heatmap`. Jit-able.

  Args:
    ratios: the per-layer ratios, e.g. `date_optax.trust_ratios(opt_state)`,
      or a dict that this function returned (names are kept).

  Returns:
    An insertion-ordered dict from layer name to a float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from date_optax.diagnostics import per_layer_ratios
    >>> r = per_layer_ratios({'dense': {'kernel': jnp.float32(0.5)},
    ...                       'blocks': jnp.array([1.0, 2.0])})
    >>> {k: float(v) for k, v in r.items()}
    {'blocks[0]': 1.0, 'blocks[1]': 2.0, 'dense/kernel': 0.5}

  References:
    You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks",
    2017 (LARS: one ratio per layer).
  """
  _check_ratios(ratios)
  out: dict[str, jax.Array] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(ratios)[0]:
    name = _path_name(path)
    x = jnp.asarray(leaf, _F32)
    if x.ndim == 0:
      out[name] = x
    else:
      for idx in np.ndindex(*x.shape):
        out[f"{name}[{','.join(map(str, idx))}]"] = x[idx]
  return out


def _scalar(name: str, value: Any) -> float:
  arr = np.asarray(jax.device_get(value))
  if arr.size != 1:
    raise ValueError(f"metric {name!r} must be a scalar, got shape {arr.shape}.")
  return float(arr.reshape(()))


class MetricWriter:
  """Writes scalar metrics to a CSV file and TensorBoard event files.

  The CSV file (`<logdir>/metrics.csv`) is in long form, one row per scalar:
  `step,name,value,wall_time`, appended and flushed at every write, so a
  process killed mid-run loses at most the row being written and a resumed
  run keeps appending to the same file (steps logged after the last
  checkpoint appear twice; keep the last row of each `(step, name)`, as
  `read_metrics_csv` does). TensorBoard event files are written with
  `tensorboardX` into `logdir` when it is installed (`pip install
  date-optax[examples]`).

  Args:
    logdir: directory for the CSV and event files; created if missing.
    tensorboard: True to require TensorBoard output, False to skip it, None
      (default) to write it when `tensorboardX` can be imported.
    csv_name: the CSV file name inside `logdir`.

  Examples:
    >>> import tempfile
    >>> from date_optax.diagnostics import MetricWriter, read_metrics_csv
    >>> logdir = tempfile.mkdtemp()
    >>> with MetricWriter(logdir, tensorboard=False) as writer:
    ...   writer.write_scalars(1, {'loss': 2.5, 'trust_ratio/max': 3.0})
    ...   writer.write_scalars(2, {'loss': 1.5})
    >>> steps, values = read_metrics_csv(logdir + '/metrics.csv')['loss']
    >>> steps.tolist(), values.tolist()
    ([1, 2], [2.5, 1.5])

  References:
    The `write_scalars`/`flush`/`close` interface follows
    `clu.metric_writers.MetricWriter` (Google, CLU).
  """

  def __init__(
      self,
      logdir: str | os.PathLike,
      *,
      tensorboard: bool | None = None,
      csv_name: str = "metrics.csv",
  ):
    if tensorboard is not None:
      validation.check_bool("tensorboard", tensorboard)
    if not isinstance(csv_name, str) or not csv_name or os.sep in csv_name:
      raise ValueError(f"csv_name must be a plain file name, got {csv_name!r}.")
    self._logdir = os.fspath(logdir)
    os.makedirs(self._logdir, exist_ok=True)
    self._csv_path = os.path.join(self._logdir, csv_name)
    new_file = not os.path.exists(self._csv_path) or (
        os.path.getsize(self._csv_path) == 0
    )
    self._csv_file = open(self._csv_path, "a", newline="")  # noqa: SIM115
    self._csv = csv.writer(self._csv_file)
    if new_file:
      self._csv.writerow(["step", "name", "value", "wall_time"])
      self._csv_file.flush()
    self._tb = None
    if tensorboard or tensorboard is None:
      try:
        import tensorboardX  # noqa: PLC0415 - optional dependency
      except ImportError as e:
        if tensorboard:
          raise ImportError(
              "MetricWriter(tensorboard=True) needs tensorboardX: "
              "pip install 'date-optax[examples]'."
          ) from e
      else:
        self._tb = tensorboardX.SummaryWriter(logdir=self._logdir)

  @property
  def csv_path(self) -> str:
    """Path of the CSV file."""
    return self._csv_path

  @property
  def tensorboard(self) -> bool:
    """Whether TensorBoard event files are written."""
    return self._tb is not None

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one value per name at `step` (values are fetched to the host).

    Args:
      step: the training step, an integer >= 0.
      scalars: a mapping from metric name to a scalar (Python number, NumPy or
        JAX array of size 1).
    """
    if self._csv_file is None:
      raise ValueError("MetricWriter is closed.")
    if isinstance(step, jax.Array) and step.ndim == 0:
      step = np.asarray(step)[()]  # a device step counter
    step = validation.check_int("step", step, low=0)
    if not isinstance(scalars, Mapping):
      raise TypeError(
          f"scalars must be a mapping name -> value, got {scalars!r}."
      )
    now = time.time()
    values = {str(k): _scalar(str(k), v) for k, v in scalars.items()}
    for name, value in values.items():
      self._csv.writerow([step, name, repr(value), f"{now:.3f}"])
      if self._tb is not None:
        self._tb.add_scalar(name, value, global_step=step, walltime=now)
    self._csv_file.flush()

  def flush(self) -> None:
    """Flushes the CSV and event files."""
    if self._csv_file is not None:
      self._csv_file.flush()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes the files; further writes raise."""
    if self._csv_file is not None:
      self._csv_file.close()
      self._csv_file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def read_metrics_csv(
    path: str | os.PathLike,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Reads a `MetricWriter` CSV into `{name: (steps, values)}`.

  Steps are sorted; when a step was written more than once (a run resumed
  from a checkpoint repeats the steps after it), the last row wins.

  Args:
    path: the CSV file written by `MetricWriter`.

  Returns:
    A dict from metric name to `(steps, values)`: an int64 and a float64
    NumPy array of equal length.

  Examples:
    >>> import tempfile
    >>> from date_optax.diagnostics import MetricWriter, read_metrics_csv
    >>> logdir = tempfile.mkdtemp()
    >>> with MetricWriter(logdir, tensorboard=False) as w:
    ...   w.write_scalars(3, {'loss': 1.0})
    ...   w.write_scalars(3, {'loss': 0.5})
    >>> read_metrics_csv(w.csv_path)['loss'][1].tolist()
    [0.5]

  References:
    None: a file-format helper for `MetricWriter`.
  """
  table: dict[str, dict[int, float]] = {}
  with open(os.fspath(path), newline="") as f:
    for row in csv.DictReader(f):
      table.setdefault(row["name"], {})[int(row["step"])] = float(row["value"])
  out = {}
  for name, by_step in table.items():
    steps = np.array(sorted(by_step), dtype=np.int64)
    out[name] = (steps, np.array([by_step[s] for s in steps], dtype=np.float64))
  return out


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
  tol = 1 + _BOUND_RTOL
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
