"""Host-side metric output: a CSV/TensorBoard writer for local and cloud paths.

Paths go through `etils.epath`, so a `gs://` workdir (where pod runs write)
works like a local directory. Only process 0 writes: the metrics of a
data-parallel step are replicated, and N hosts appending to one object would
interleave or overwrite each other.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from etils import epath

from date_optax._src import validation

_HEADER = ("step", "name", "value", "wall_time")


def _scalar(name: str, value: Any) -> float:
  arr = np.asarray(jax.device_get(value))
  if arr.size != 1:
    raise ValueError(f"metric {name!r} must be a scalar, got shape {arr.shape}.")
  return float(arr.reshape(()))


def _is_local(path: str) -> bool:
  return "://" not in path


def _rows_to_text(rows: list[tuple[str, ...]]) -> str:
  buf = io.StringIO()
  writer = csv.writer(buf)
  writer.writerow(_HEADER)
  writer.writerows(rows)
  return buf.getvalue()


def _read_rows(path: epath.Path) -> list[tuple[str, ...]]:
  """The data rows of an existing CSV (a torn last line is dropped)."""
  if not path.exists():
    return []
  text = path.read_text()
  rows = []
  for row in csv.reader(io.StringIO(text)):
    if tuple(row) == _HEADER:
      continue
    if len(row) != len(_HEADER):
      continue  # a line cut short by a kill mid-write
    try:
      int(row[0])
      float(row[2])
    except ValueError:
      continue
    rows.append(tuple(row))
  return rows


_WARNED_NO_TENSORBOARD = False


def _warn_no_tensorboard(csv_path: str) -> None:
  """Once per process: tensorboard=None found no tensorboardX."""
  global _WARNED_NO_TENSORBOARD
  if _WARNED_NO_TENSORBOARD:
    return
  _WARNED_NO_TENSORBOARD = True
  validation.warn_at_caller(
      f"MetricWriter: tensorboardX is not installed, so only the CSV "
      f"({csv_path}) is written, no TensorBoard event files; pip install "
      "'date-optax[examples]' for them, or pass tensorboard=False to silence "
      "this (warned once per process).")


class MetricWriter:
  """Writes scalar metrics to a CSV file (and TensorBoard event files).

  The CSV file (`<logdir>/metrics.csv`) is in long form, one row per scalar:
  `step,name,value,wall_time`. `logdir` may be a local directory or any path
  `etils.epath` understands, such as `gs://bucket/run` (Cloud Storage needs
  `gcsfs` or TensorFlow installed, as for every epath user).

  * **Local paths** are appended to and flushed at every write, so a process
    killed mid-run loses at most the row being written.
  * **Object stores** (`gs://`, `s3://`) cannot append: the writer keeps the
    rows in memory and rewrites the object at most every `flush_secs`
    seconds, on `flush()` and on `close()`.
  * **Only process 0 writes** (`jax.process_index() == 0` unless
    `process_index` is given); on other processes every method is a no-op,
    so a multi-host loop can call it unconditionally.
  * **Resuming**: a run restored from the checkpoint of step `s` passes
    `resume_step=s`; rows of steps after `s` (logged by the interrupted run
    after its last checkpoint) are dropped when the writer opens, and the
    resumed run appends, so the file has every step exactly once. Without
    `resume_step` existing rows are kept (`read_metrics_csv` then keeps the
    last row of each `(step, name)`).

  TensorBoard event files are written with `tensorboardX` into a local
  `logdir` when it is installed (`pip install date-optax[examples]`);
  without it the default `tensorboard=None` writes the CSV only and warns
  once per process.

  Args:
    logdir: directory for the CSV and event files; created if missing. A
      local path or an `etils.epath` URI such as `gs://bucket/run`.
    tensorboard: True to require TensorBoard output, False to skip it, None
      (default) to write it when `tensorboardX` can be imported and `logdir`
      is local (a local `logdir` without `tensorboardX` warns once that only
      the CSV is written).
    csv_name: the CSV file name inside `logdir`.
    resume_step: the step of the checkpoint the run resumed from; rows of
      later steps are dropped. None keeps every existing row.
    process_index: which process this is (default `jax.process_index()`);
      only process 0 writes.
    flush_secs: for object-store paths, the longest time rows stay in memory
      before the object is rewritten (> 0). Local files flush every write.

  Examples:
    >>> import tempfile
    >>> from date_optax.diagnostics import MetricWriter, read_metrics_csv
    >>> logdir = tempfile.mkdtemp()
    >>> with MetricWriter(logdir, tensorboard=False) as writer:
    ...   for step in (1, 2, 3):
    ...     writer.write_scalars(step, {'loss': 3.0 - step})
    >>> # Resumed from the checkpoint of step 2: step 3 is logged again.
    >>> with MetricWriter(logdir, tensorboard=False, resume_step=2) as writer:
    ...   writer.write_scalars(3, {'loss': 0.5})
    >>> steps, values = read_metrics_csv(logdir + '/metrics.csv')['loss']
    >>> steps.tolist(), values.tolist()
    ([1, 2, 3], [2.0, 1.0, 0.5])

  References:
    The `write_scalars`/`flush`/`close` interface follows
    `clu.metric_writers.MetricWriter` (Google, CLU); paths follow
    `etils.epath` (Google).
  """

  def __init__(
      self,
      logdir: str | os.PathLike,
      *,
      tensorboard: bool | None = None,
      csv_name: str = "metrics.csv",
      resume_step: int | None = None,
      process_index: int | None = None,
      flush_secs: float = 30.0,
  ):
    if tensorboard is not None:
      validation.check_bool("tensorboard", tensorboard)
    if not isinstance(csv_name, str) or not csv_name or "/" in csv_name or os.sep in csv_name:
      raise ValueError(f"csv_name must be a plain file name, got {csv_name!r}.")
    if resume_step is not None:
      resume_step = validation.check_int("resume_step", resume_step, low=0)
    if process_index is None:
      process_index = jax.process_index()
    process_index = validation.check_int("process_index", process_index, low=0)
    validation.check_positive("flush_secs", flush_secs)
    if not isinstance(logdir, (str, os.PathLike)):
      raise TypeError(f"logdir must be a path or a URI string, got {logdir!r}.")
    self._active = process_index == 0
    self._logdir = epath.Path(logdir)
    self._local = _is_local(os.fspath(logdir))
    self._csv_path = self._logdir / csv_name
    self._flush_secs = float(flush_secs)
    self._closed = False
    self._tb = None
    self._file = None
    self._rows: list[tuple[str, ...]] = []
    self._dirty = False
    self._last_flush = time.monotonic()
    if not self._active:
      return
    self._logdir.mkdir(parents=True, exist_ok=True)
    rows = _read_rows(self._csv_path)
    kept = [r for r in rows if resume_step is None or int(r[0]) <= resume_step]
    if self._local:
      path = os.fspath(self._csv_path)
      # Rewrite once, atomically (drops rows after the checkpoint and a line
      # torn by a kill, writes the header of a new file), then append.
      tmp = path + ".tmp"
      with open(tmp, "w", newline="") as f:
        f.write(_rows_to_text(kept))
      os.replace(tmp, path)
      self._file = open(path, "a", newline="")  # noqa: SIM115
      self._csv = csv.writer(self._file)
    else:
      self._rows = kept
      self._dirty = True
      self._rewrite()
    if tensorboard or (tensorboard is None and self._local):
      try:
        import tensorboardX  # noqa: PLC0415 - optional dependency
      except ImportError as e:
        if tensorboard:
          raise ImportError(
              "MetricWriter(tensorboard=True) needs tensorboardX: "
              "pip install 'date-optax[examples]'."
          ) from e
        _warn_no_tensorboard(self.csv_path)
      else:
        self._tb = tensorboardX.SummaryWriter(logdir=os.fspath(self._logdir))

  @property
  def csv_path(self) -> str:
    """Path (or URI) of the CSV file."""
    return os.fspath(self._csv_path)

  @property
  def tensorboard(self) -> bool:
    """Whether TensorBoard event files are written."""
    return self._tb is not None

  @property
  def active(self) -> bool:
    """Whether this process writes (process 0) or ignores every call."""
    return self._active

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one value per name at `step` (values are fetched to the host).

    Args:
      step: the training step, an integer >= 0.
      scalars: a mapping from metric name to a scalar (Python number, NumPy or
        JAX array of size 1).
    """
    if self._closed:
      raise ValueError("MetricWriter is closed.")
    if isinstance(step, jax.Array) and step.ndim == 0:
      step = np.asarray(step)[()]  # a device step counter
    step = validation.check_int("step", step, low=0)
    if not isinstance(scalars, Mapping):
      raise TypeError(f"scalars must be a mapping name -> value, got {scalars!r}.")
    values = {str(k): _scalar(str(k), v) for k, v in scalars.items()}
    if not self._active:
      return
    now = time.time()
    rows = [(str(step), name, repr(value), f"{now:.3f}") for name, value in values.items()]
    for name, value in values.items():
      if self._tb is not None:
        self._tb.add_scalar(name, value, global_step=step, walltime=now)
    if self._local:
      self._csv.writerows(rows)
      self._file.flush()
    else:
      self._rows.extend(rows)
      self._dirty = True
      if time.monotonic() - self._last_flush >= self._flush_secs:
        self._rewrite()

  def _rewrite(self) -> None:
    if self._dirty:
      self._csv_path.write_text(_rows_to_text(self._rows))
      self._dirty = False
    self._last_flush = time.monotonic()

  def flush(self) -> None:
    """Makes every row written so far durable (and flushes event files)."""
    if not self._active or self._closed:
      return
    if self._local:
      self._file.flush()
    else:
      self._rewrite()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes the files; further writes raise."""
    if self._closed:
      return
    self.flush()
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
    self._closed = True

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def read_metrics_csv(
    path: str | os.PathLike,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Reads a `MetricWriter` CSV into `{name: (steps, values)}`.

  Steps are sorted; when a step was written more than once (a run resumed
  without `resume_step` repeats the steps after its checkpoint), the last
  row wins. Local paths and `etils.epath` URIs are both accepted.

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
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"no metrics file at {path}.")
  table: dict[str, dict[int, float]] = {}
  for step, name, value, _ in _read_rows(path):
    table.setdefault(name, {})[int(step)] = float(value)
  out = {}
  for name, by_step in table.items():
    steps = np.array(sorted(by_step), dtype=np.int64)
    out[name] = (steps, np.array([by_step[s] for s in steps], dtype=np.float64))
  return out
