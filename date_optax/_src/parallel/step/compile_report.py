"""What a compiled train step costs on its target: memory, collectives, time.

`compile_report(step, state, batch)` compiles a `TrainStep` for the devices
of its mesh (a TPU slice's from `tpu_slice`, on any machine) and reads the
compiler's own accounts: bytes per device (`memory_analysis`), flops and the
cost model's time (`cost_analysis`), and the collectives of the optimized
HLO. Every time and rate derived here is the compiler's estimate, not a
measurement.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time
from typing import Any

import jax

from date_optax._src.parallel.comm import hlo
from date_optax._src.types import PyTree


@dataclasses.dataclass(frozen=True)
class CompileReport:
  """The compiler's account of one compiled train-step program, per device.

  Made by `compile_report` (or `report_compiled` for any compiled program).

  Args:
    device_kind: the target device (``"TPU v3"``; ``"cpu"``).
    num_devices: devices of the program's mesh.
    global_batch: the global batch rows of the program.
    compile_seconds: wall time of `lower` + `compile` on this machine.
    argument_bytes: parameters, optimizer state and the batch share, per device.
    output_bytes: the outputs per device (the new state and metrics).
    alias_bytes: outputs written over donated arguments (counted once).
    temp_bytes: the program's temporaries (activations, gradients) per device.
    flops: floating-point operations per device (cost analysis).
    bytes_accessed: memory traffic per device (cost analysis).
    estimated_seconds: the cost model's step time (TPU: ``optimal_seconds``),
      or None where the backend gives none (CPU).
    collectives: every collective (`date_optax.parallel.collectives`).
    fusions: the program's fusion count.
    loops: ``while`` loops in the program (microbatch accumulation,
      scanned layers). XLA's cost analysis counts a loop's body once, so
      with loops `flops`, `bytes_accessed` and `estimated_seconds` are
      lower bounds.
    hbm_bytes: one device's memory (a `TpuSlice`'s), or None.
    peak_flops: one device's dense bf16 FLOP/s, or None.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> import date_optax.parallel as dp
    >>> step = dp.make_train_step(lambda p, b: ((b @ p) ** 2).mean(), optax.sgd(0.1),
    ...                           dp.data_mesh(4))
    >>> state = step.abstract_state(jax.ShapeDtypeStruct((16, 4), jnp.float32))
    >>> batch = jax.ShapeDtypeStruct((32, 16), jnp.float32)
    >>> report = dp.compile_report(step, state, batch)
    >>> report.num_devices, report.global_batch  # params and 8 rows of 16 per device:
    (4, 32)
    >>> report.argument_bytes >= 16 * 4 * 4 + 8 * 16 * 4
    True
    >>> report.collective_bytes()["all-reduce"] >= 16 * 4 * 4
    True

  References:
    OpenXLA, "Compiled module memory and cost analysis"
    (``Compiled.memory_analysis``, ``Compiled.cost_analysis``); MaxText,
    ``train_compile.py`` (compiling for a TPU topology without one).
  """

  device_kind: str
  num_devices: int
  global_batch: int
  compile_seconds: float
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  flops: float
  bytes_accessed: float
  estimated_seconds: float | None
  collectives: tuple[dict, ...]
  fusions: int
  loops: int = 0
  hbm_bytes: int | None = None
  peak_flops: float | None = None

  @property
  def total_bytes(self) -> int:
    """Bytes one device holds while the step runs: arguments, temporaries and
    the outputs not written over donated arguments."""
    return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes

  @property
  def fits(self) -> bool | None:
    """Whether `total_bytes` fits `hbm_bytes` (None without a capacity)."""
    return None if self.hbm_bytes is None else self.total_bytes <= self.hbm_bytes

  @property
  def examples_per_second(self) -> float | None:
    """Global examples per second at the estimated step time."""
    t = self.estimated_seconds
    return None if not t else self.global_batch / t

  @property
  def mfu(self) -> float | None:
    """Estimated FLOP utilisation: the program's flops over the step time at
    the device's peak (all flops the program does, the optimizer's included)."""
    t = self.estimated_seconds
    return None if not t or not self.peak_flops else self.flops / (t * self.peak_flops)

  def collective_bytes(self) -> dict[str, int]:
    """Bytes per device by collective kind (payloads as stored, summed)."""
    out: dict[str, int] = collections.Counter()
    for c in self.collectives:
      out[c["kind"]] += c["bytes"]
    return dict(out)

  def collective_counts(self) -> dict[str, int]:
    """The number of collectives of each kind."""
    return dict(collections.Counter(c["kind"] for c in self.collectives))

  @classmethod
  def from_compiled(cls, compiled: Any, *, num_devices: int, global_batch: int,
                    compile_seconds: float, tpu: Any = None,
                    device_kind: str = "") -> CompileReport:
    """The report of any compiled program (`jax.jit(f).lower(...).compile()`).

    `compile_report` makes it for a train step; this takes programs of your
    own (an optimizer update alone, a collective alone).

    Args:
      compiled: a `jax.stages.Compiled`.
      num_devices: devices of its mesh.
      global_batch: the rows it takes (1 where that means nothing).
      compile_seconds: how long its compile took.
      tpu: the `TpuSlice` it was compiled for (HBM and peak per device), or None.
      device_kind: the target's name, e.g. ``"TPU v3"``.

    Returns:
      A `CompileReport`.
    """
    return report_compiled(
        compiled, num_devices=num_devices, global_batch=global_batch,
        compile_seconds=compile_seconds, device_kind=device_kind,
        hbm_bytes=None if tpu is None else tpu.hbm_per_device,
        peak_flops=None if tpu is None else tpu.peak_flops_per_device)

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready values, the derived ones (fits, throughput, MFU) included."""
    out = dataclasses.asdict(self)
    out["collectives"] = list(self.collectives)
    out.update(total_bytes=self.total_bytes, fits=self.fits,
               examples_per_second=self.examples_per_second, mfu=self.mfu,
               collective_bytes=self.collective_bytes(),
               collective_counts=self.collective_counts())
    return out

  def summary(self) -> str:
    """A few human-readable lines (estimates marked as such)."""
    gb = lambda b: f"{b / 2**30:.3f} GiB"  # noqa: E731
    cap = "" if self.hbm_bytes is None else (
        f" of {gb(self.hbm_bytes)} ({'fits' if self.fits else 'DOES NOT FIT'}"
        f"{'' if self.fits else f', over by {gb(self.total_bytes - self.hbm_bytes)}'})")
    lines = [
        f"batch {self.global_batch} on {self.num_devices} x {self.device_kind}: "
        f"compiled in {self.compile_seconds:.1f} s, {self.fusions} fusions",
        f"  memory per device: {gb(self.total_bytes)}{cap} = arguments "
        f"{gb(self.argument_bytes)} + temporaries {gb(self.temp_bytes)} + outputs "
        f"{gb(self.output_bytes)} - aliased {gb(self.alias_bytes)}",
        f"  flops per device {self.flops:.3e}, bytes accessed {self.bytes_accessed:.3e}",
    ]
    if self.estimated_seconds:
      mfu = "" if self.mfu is None else f", estimated FLOP utilisation {self.mfu:.1%}"
      lines.append(f"  estimated step time {self.estimated_seconds * 1e3:.2f} ms (compiler's "
                   f"cost model), {self.examples_per_second:,.0f} examples/s{mfu}")
    if self.loops:
      lines.append(f"  {self.loops} loop(s): the cost analysis counts each loop body once, so "
                   "flops and time are lower bounds")
    counts, sizes = self.collective_counts(), self.collective_bytes()
    for kind in hlo.COLLECTIVE_KINDS:
      if kind in counts:
        groups = sorted({c["group_size"] for c in self.collectives
                         if c["kind"] == kind and c["group_size"]})
        lines.append(f"  {kind}: {counts[kind]} ops, {sizes[kind]:,} bytes, "
                     f"group sizes {groups}")
    return "\n".join(lines)


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class DoesNotFit(ValueError):
  """The compiler refused a program that needs more memory than a device has.

  Attributes:
    required_bytes: what the compiler said the program needs (its
      temporaries, as the message names them), or None if unreadable.
    available_bytes: the device memory it had, or None.
  """

  def __init__(self, message: str, required_bytes: int | None = None,
               available_bytes: int | None = None):
    super().__init__(message)
    self.required_bytes = required_bytes
    self.available_bytes = available_bytes

  @classmethod
  def from_error(cls, error: Exception) -> Exception:
    """The `DoesNotFit` of a compiler out-of-memory error, else `error` itself."""
    text = str(error)
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
      return error
    amount = r"\(([\d.]+)([KMGT]?)i?B?\)"
    need = re.search(r"required for ([^(]*?) " + amount, text)
    have = re.search(r"available HBM " + amount, text)
    to_bytes = lambda m, i: int(float(m.group(i)) * _UNITS[m.group(i + 1)])  # noqa: E731
    required = to_bytes(need, 2) if need else None
    available = to_bytes(have, 1) if have else None
    what = need.group(1) if need else "the program"
    first = text.split("HLO module:")[0].strip().splitlines()[0]
    message = (f"does not fit: the compiler needs {required / 2**30:.2f} GiB for {what} per "
               f"device, {available / 2**30:.2f} GiB of HBM available (over by "
               f"{(required - available) / 2**30:.2f} GiB)" if need and have else
               f"does not fit: {first}")
    return cls(message, required, available)


def _cost(compiled: Any) -> dict[str, float]:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0] if cost else {}
  return dict(cost or {})


def report_compiled(compiled: Any, *, num_devices: int, global_batch: int,
                    compile_seconds: float, hbm_bytes: int | None = None,
                    peak_flops: float | None = None, device_kind: str = "") -> CompileReport:
  """A `CompileReport` of an already compiled program (`jax.stages.Compiled`)."""
  mem = compiled.memory_analysis()
  cost = _cost(compiled)
  text = compiled.as_text()
  seconds = cost.get("optimal_seconds")
  return CompileReport(
      device_kind=device_kind,
      num_devices=num_devices,
      global_batch=global_batch,
      compile_seconds=compile_seconds,
      argument_bytes=int(mem.argument_size_in_bytes),
      output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes),
      temp_bytes=int(mem.temp_size_in_bytes),
      flops=float(cost.get("flops", 0.0)),
      bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      estimated_seconds=float(seconds) if seconds and seconds > 0 else None,
      collectives=tuple(hlo.collectives(text)),
      fusions=hlo.fusion_count(text),
      loops=len(re.findall(r"\swhile\(", text)),
      hbm_bytes=hbm_bytes,
      peak_flops=peak_flops,
  )


def compile_report(step: Any, state: Any, batch: PyTree, *, tpu: Any = None) -> CompileReport:
  """Compiles `step` for its mesh and reports memory, collectives and time.

  Nothing runs: the state and batch may be abstract (`step.abstract_state`,
  ``jax.ShapeDtypeStruct`` batches) and the mesh may be a TPU slice's
  (`tpu_slice(...).data_mesh()`) on a machine without that slice.

  Args:
    step: a train step (`make_train_step`, `make_sharded_train_step`).
    state: its `TrainState`, concrete or abstract.
    batch: one global batch, concrete or abstract; a batch-scheduled step
      compiles the program of this batch's rows.
    tpu: the `TpuSlice` the mesh was built from, for its per-device HBM and
      peak rate (`fits`, `mfu`); None leaves them out.

  Returns:
    A `CompileReport`.

  Raises:
    ValueError: the program does not fit its device's memory (the TPU
      compiler refuses such a program): the message says by how much, and
      the error's ``required_bytes`` and ``available_bytes`` hold the
      compiler's numbers; or the batch does not split over the replicas.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> import date_optax.parallel as dp
    >>> v3 = dp.tpu_slice("v3-8")  # no TPU needed: libtpu compiles for it
    >>> step = dp.make_train_step(lambda p, b: ((b @ p) ** 2).mean(), optax.sgd(0.1),
    ...                           v3.data_mesh())
    >>> state = step.abstract_state(jax.ShapeDtypeStruct((128, 128), jnp.float32))
    >>> r = dp.compile_report(step, state, jax.ShapeDtypeStruct((1024, 128), jnp.float32),
    ...                       tpu=v3)
    >>> r.device_kind, r.num_devices, r.fits, r.estimated_seconds > 0
    ('TPU v3', 8, True, True)

  References:
    MaxText, ``train_compile.py``: compile for a target topology before
    renting it.
  """
  start = time.perf_counter()
  try:
    compiled = step.compile(state, batch)
  except jax.errors.JaxRuntimeError as e:
    raise DoesNotFit.from_error(e) from e
  seconds = time.perf_counter() - start
  devices = step.mesh.devices.flat
  first = next(iter(devices))
  rows = int(jax.tree.leaves(batch)[0].shape[0])
  return CompileReport.from_compiled(
      compiled, num_devices=step.mesh.devices.size, global_batch=rows,
      compile_seconds=seconds, tpu=tpu,
      device_kind=str(getattr(first, "device_kind", first.platform)))
