"""What a compiled train step costs on its target: memory, collectives, time.

`compile_report(step, state, batch)` compiles a `TrainStep` for the devices
of its mesh (a TPU slice's from `tpu_slice`, on any machine) and reads the
compiler's own accounts: bytes per device (`memory_analysis`), flops and the
cost model's time (`cost_analysis`), and the collectives of the optimized
HLO. On a TPU slice it adds a roofline (`date_optax.parallel.roofline`)
from those counts and the generation's public facts, which gives a time on
every generation and prices the data-center network between slices. Every
time and rate derived here is an estimate, not a measurement.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time
from typing import Any

import jax

from date_optax._src.parallel.comm import hlo
from date_optax._src.parallel.step import roofline as rl
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
    flops: floating-point operations per device as XLA's cost analysis
      counts them: each loop body once.
    bytes_accessed: memory traffic per device, counted the same way.
    estimated_seconds: the best step time there is: `cost_model_seconds`
      where the compiler's cost model gives one and the program's loops do
      not add more than 5 % to its flops or bytes, else `roofline_seconds`
      (which counts every iteration); None with neither (a CPU target
      without a `TpuSlice`).
    collectives: every collective (`date_optax.parallel.collectives`).
    fusions: the program's fusion count.
    loops: ``while`` loops in the program (microbatch accumulation,
      scanned layers, the ring's rounds).
    executed_flops: the flops of the program as it runs, every loop body
      once per iteration (`hlo.executed_cost`: XLA's cost analysis of each
      body times its trip count); `flops` in a program without loops.
    executed_bytes_accessed: the bytes accessed counted the same way.
    loops_counted: False where a loop body's cost could not be read (this
      jaxlib lacks the analysis): the executed counts are then lower bounds.
    hbm_bytes: one device's memory (a `TpuSlice`'s), or None.
    peak_flops: one device's dense bf16 FLOP/s, or None.
    cost_model_seconds: the TPU cost model's step time (``optimal_seconds``),
      None where it gives none (some programs on v4, v5e, v6e; the
      Multislice programs tried here; CPU). It does not price DCN, and it
      counts a loop's body once.
    estimate_source: where `estimated_seconds` comes from: ``"cost_model"``,
      ``"roofline"`` or ``"none"``.
    estimate_note: why an estimate is missing or partial (empty when the
      cost model and the roofline both answer and no DCN is left out).
    roofline_seconds: the roofline with no overlap: the slower of compute
      and memory, then every collective (`Roofline.seconds`); None without
      a `TpuSlice`, as are the roofline fields below.
    roofline_overlap_seconds: the roofline with full overlap: the largest of
      compute, memory and the collectives (`Roofline.overlap_seconds`).
    roofline_compute_seconds: `executed_flops` over the device's peak bf16
      FLOP/s.
    roofline_memory_seconds: `executed_bytes_accessed` over the device's HBM
      bandwidth.
    roofline_ici_seconds: the collectives inside a slice (ICI).
    roofline_dcn_seconds: the collectives across slices (DCN); 0 on one slice.
    ici_bytes: bytes one device sends on ICI (ring algorithm bytes).
    dcn_bytes: bytes one device sends on DCN; 0 on one slice.
    roofline_collectives: each collective as the roofline priced it, the DCN
      transfers of a Multislice program included (`Roofline.collectives`).
    warnings: what the compiled program does that its step did not ask for
      (`compile_report` fills it): a step built with ``shard_update=True``
      whose program has no reduce-scatter, because the compiler wrote it as
      an all-reduce (the TPU compiler does so in every train step tried
      here, on every generation), sends more than psum's bytes.

  Examples:
    On CPU devices there is no cost-model time and, without a `TpuSlice`,
    no roofline; the report says so:

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
    >>> report.estimated_seconds, report.estimate_source
    (None, 'none')
    >>> report.estimate_note
    'no roofline: no TpuSlice given (pass tpu=); no cost-model time from this backend'

  References:
    OpenXLA, "Compiled module memory and cost analysis"
    (``Compiled.memory_analysis``, ``Compiled.cost_analysis``); MaxText,
    ``train_compile.py`` (compiling for a TPU topology without one);
    Williams, Waterman and Patterson, "Roofline", CACM 2009; Austin et al.,
    "How to Scale Your Model", 2025, https://jax-ml.github.io/scaling-book/.
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
  cost_model_seconds: float | None = None
  estimate_source: str = "none"
  estimate_note: str = ""
  roofline_seconds: float | None = None
  roofline_overlap_seconds: float | None = None
  roofline_compute_seconds: float | None = None
  roofline_memory_seconds: float | None = None
  roofline_ici_seconds: float | None = None
  roofline_dcn_seconds: float | None = None
  ici_bytes: float | None = None
  dcn_bytes: float | None = None
  roofline_collectives: tuple[dict, ...] = ()
  executed_flops: float | None = None
  executed_bytes_accessed: float | None = None
  loops_counted: bool = True
  warnings: tuple[str, ...] = ()

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
    """Estimated FLOP utilisation: the program's executed flops over the step
    time at the device's peak (all flops the program does, the optimizer's
    and rematerialisation's included: a hardware utilisation; a model's
    useful flops give its MFU)."""
    t = self.estimated_seconds
    flops = self.flops if self.executed_flops is None else self.executed_flops
    return None if not t or not self.peak_flops else flops / (t * self.peak_flops)

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
                    device_kind: str = "", devices: Any = None) -> CompileReport:
    """The report of any compiled program (`jax.jit(f).lower(...).compile()`).

    `compile_report` makes it for a train step; this takes programs of your
    own (an optimizer update alone, a collective alone).

    Args:
      compiled: a `jax.stages.Compiled`.
      num_devices: devices of its mesh.
      global_batch: the rows it takes (1 where that means nothing).
      compile_seconds: how long its compile took.
      tpu: the `TpuSlice` it was compiled for (HBM, peak and the roofline's
        facts per device), or None.
      device_kind: the target's name, e.g. ``"TPU v3"``.
      devices: its devices by partition id (``mesh.devices.flat``); default
        the mesh of its first input sharding, else the slice's devices.

    Returns:
      A `CompileReport`.
    """
    return report_compiled(
        compiled, num_devices=num_devices, global_batch=global_batch,
        compile_seconds=compile_seconds, device_kind=device_kind, tpu=tpu, devices=devices)

  def as_dict(self) -> dict[str, Any]:
    """JSON-ready values, the derived ones (fits, throughput, MFU) and every
    estimate (cost model, roofline and its pieces) included."""
    out = dataclasses.asdict(self)
    out["collectives"] = list(self.collectives)
    out["roofline_collectives"] = list(self.roofline_collectives)
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
    ms = lambda t: f"{t * 1e3:.4g} ms"  # noqa: E731
    if self.estimated_seconds:
      mfu = "" if self.mfu is None else f", estimated FLOP utilisation {self.mfu:.1%}"
      source = {"cost_model": "the compiler's cost model",
                "roofline": "the roofline, no overlap"}[self.estimate_source]
      lines.append(f"  estimated step time {ms(self.estimated_seconds)} (from {source}), "
                   f"{self.examples_per_second:,.0f} examples/s{mfu}")
    lines.append("  compiler's cost model: " + (
        "no time for this program" if self.cost_model_seconds is None
        else ms(self.cost_model_seconds)))
    if self.roofline_seconds is not None:
      lines.append(
          f"  roofline estimate (public chip facts): {ms(self.roofline_seconds)} no overlap, "
          f"{ms(self.roofline_overlap_seconds)} full overlap; compute "
          f"{ms(self.roofline_compute_seconds)}, memory {ms(self.roofline_memory_seconds)}, "
          f"ICI {ms(self.roofline_ici_seconds)} ({self.ici_bytes:,.0f} bytes), DCN "
          f"{ms(self.roofline_dcn_seconds)} ({self.dcn_bytes:,.0f} bytes)")
    if self.estimate_note:
      lines.append(f"  note: {self.estimate_note}")
    lines += [f"  warning: {w}" for w in self.warnings]
    if self.loops and self.executed_flops is not None:
      lines.append(
          f"  {self.loops} loop(s): executed flops {self.executed_flops:.3e}, bytes accessed "
          f"{self.executed_bytes_accessed:.3e}, every iteration counted (the cost analysis "
          f"counts each body once"
          f"{'' if self.loops_counted else '; some bodies unread: lower bounds'})")
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


def _mesh_devices(compiled: Any) -> list[Any] | None:
  """The devices by partition id: the mesh of the first input sharding that has one."""
  for sharding in jax.tree.leaves(compiled.input_shardings):
    devices = getattr(getattr(sharding, "mesh", None), "devices", None)
    if devices is not None:
      return list(devices.flat)
  return None


def _estimates(cost_model: float | None, roof: rl.Roofline | None,
               loops_add: float = 1.0) -> dict[str, Any]:
  """The report's estimate fields: the best time, its source, and what is
  missing; `loops_add`: executed over counted work (flops or bytes, the larger)."""
  notes = []
  looped = cost_model is not None and loops_add > 1.05
  if looped:
    notes.append(f"the cost model counts each loop body once ({cost_model * 1e3:.4g} ms; the "
                 f"loops run {loops_add:.3g}x the counted work)"
                 + ("" if roof is None else ": the estimate is the roofline's"))
  if roof is None:
    notes.append("no roofline: no TpuSlice given (pass tpu=)")
  if cost_model is None:
    notes.append("the TPU cost model gives no time for this program" if roof is not None
                 else "no cost-model time from this backend")
  elif roof is not None and roof.dcn_bytes:
    notes.append(f"the cost model leaves out DCN ({roof.dcn_seconds * 1e3:.3f} ms by the "
                 "roofline)")
  if cost_model is not None and not (looped and roof is not None):
    best, source = cost_model, "cost_model"
  elif roof is not None:
    best, source = roof.seconds, "roofline"
  else:
    best, source = None, "none"
  fields: dict[str, Any] = dict(estimated_seconds=best, cost_model_seconds=cost_model,
                                estimate_source=source, estimate_note="; ".join(notes))
  if roof is not None:
    fields.update(
        roofline_seconds=roof.seconds, roofline_overlap_seconds=roof.overlap_seconds,
        roofline_compute_seconds=roof.compute_seconds,
        roofline_memory_seconds=roof.memory_seconds, roofline_ici_seconds=roof.ici_seconds,
        roofline_dcn_seconds=roof.dcn_seconds, ici_bytes=roof.ici_bytes,
        dcn_bytes=roof.dcn_bytes, roofline_collectives=roof.collectives)
  return fields


def report_compiled(compiled: Any, *, num_devices: int, global_batch: int,
                    compile_seconds: float, hbm_bytes: int | None = None,
                    peak_flops: float | None = None, device_kind: str = "",
                    tpu: Any = None, devices: Any = None) -> CompileReport:
  """A `CompileReport` of an already compiled program (`jax.stages.Compiled`);
  with `tpu` (a `TpuSlice`) its HBM, peak and roofline fill the report."""
  mem = compiled.memory_analysis()
  cost = _cost(compiled)
  text = compiled.as_text()
  seconds = cost.get("optimal_seconds")
  flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  run_flops, run_bytes, counted = hlo.executed_cost(text, flops, accessed)
  loops_add = max(run_flops / flops if flops else 1.0, run_bytes / accessed if accessed else 1.0)
  roof = None
  if tpu is not None:
    hbm_bytes = tpu.hbm_per_device if hbm_bytes is None else hbm_bytes
    peak_flops = tpu.peak_flops_per_device if peak_flops is None else peak_flops
    if devices is None:
      devices = _mesh_devices(compiled)
    roof = rl.roofline(text, flops=run_flops, bytes_accessed=run_bytes, tpu=tpu,
                       devices=devices)
  return CompileReport(
      device_kind=device_kind,
      num_devices=num_devices,
      global_batch=global_batch,
      compile_seconds=compile_seconds,
      argument_bytes=int(mem.argument_size_in_bytes),
      output_bytes=int(mem.output_size_in_bytes),
      alias_bytes=int(mem.alias_size_in_bytes),
      temp_bytes=int(mem.temp_size_in_bytes),
      flops=flops,
      bytes_accessed=accessed,
      collectives=tuple(hlo.collectives(text)),
      fusions=hlo.fusion_count(text),
      loops=len(re.findall(r"\swhile\(", text)),
      hbm_bytes=hbm_bytes,
      peak_flops=peak_flops,
      executed_flops=run_flops,
      executed_bytes_accessed=run_bytes,
      loops_counted=counted,
      **_estimates(float(seconds) if seconds and seconds > 0 else None, roof, loops_add),
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
    tpu: the `TpuSlice` the mesh was built from, for its per-device HBM,
      peak rate and the roofline (`fits`, `mfu`, the ``roofline_*`` fields);
      None leaves them out.

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
    >>> r.estimate_source, r.roofline_seconds >= r.roofline_overlap_seconds > 0, r.dcn_bytes
    ('cost_model', True, 0.0)

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
  report = CompileReport.from_compiled(
      compiled, num_devices=step.mesh.devices.size, global_batch=rows,
      compile_seconds=seconds, tpu=tpu,
      device_kind=str(getattr(first, "device_kind", first.platform)),
      devices=list(step.mesh.devices.flat))
  return dataclasses.replace(report, warnings=_step_warnings(step, report))


def _step_warnings(step: Any, report: CompileReport) -> tuple[str, ...]:
  """What the program does that `step`'s options did not ask for."""
  kinds = report.collective_counts()
  if (getattr(step, "shard_update", False) and report.num_devices > 1
      and not kinds.get("reduce-scatter")):
    moved = report.collective_bytes().get("all-reduce", 0)
    return (
        "shard_update=True, but the compiled program has no reduce-scatter: the "
        "compiler wrote the gradient's as an all-reduce (as the TPU compiler does "
        "on every generation), so the step all-reduces "
        f"{moved:,.0f} bytes per device and sends more than psum would; "
        "shard_update=False moves less on this target, at the cost of the "
        "optimizer state held whole on every replica",)
  return ()
