"""A growing batch inside the step, and the host's view of it.

Inside the step: the optimizer's progress (`schedule_progress`), the
statistics' decay at the step's batch (`decay_at`: smoothing per example
seen) and the schedule's update after the optimizer (`schedule_step`). On
the host, `BatchTracker` counts what the train step dispatched and reads an
adaptive schedule's device decisions `lag` steps late, so that
`step.next_batch_size` never waits for the steps in flight.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from date_optax._src.batch_schedule import BatchProgress, BatchSchedule
from date_optax._src.examples_clock import examples_int, sub_examples
from date_optax._src.examples_clock import host_value as _host
from date_optax._src.gain import noise_scale
from date_optax._src.parallel.step import grad_stats as gs_lib


def schedule_progress(state: Any, rows: int) -> BatchProgress:
  """What the optimizer is told: the batch, and the examples of the steps
  it applied (a skipped step's examples do not move its clock)."""
  examples = state.examples
  if state.skipped is not None:
    examples = sub_examples(examples, state.skipped)
  return BatchProgress(batch_size=jnp.int32(rows), examples=examples)


def decay_at(decay: float | None, rows: int, schedule: BatchSchedule) -> float | None:
  """The statistics' decay for a step of `rows` examples: `decay` per
  `schedule.start` examples, so the smoothing is per example seen."""
  return None if decay is None else float(decay) ** (rows / schedule.start)


def schedule_step(
    schedule: BatchSchedule, state: Any, new_state: Any, metrics: dict, rows: int,
    decay: float | None,
) -> Any:
  """`new_state` with the schedule's state after the step (`metrics` gains
  the batch, and an adaptive schedule's decision)."""
  measured = None
  if new_state.grad_stats is not None:
    measured = noise_scale(gs_lib.smoothed(new_state.grad_stats, rows))
  new_state = new_state.replace(batch_schedule=schedule.update(
      state.batch_schedule, state.step, rows, measured, loss=metrics["loss"],
      skipped=metrics["skipped"], decay=decay))
  metrics["batch_size"] = jnp.int32(rows)
  if schedule.kind == "adaptive":
    metrics["next_batch_size"] = new_state.batch_schedule.next_batch
    metrics["next_batch_step"] = new_state.batch_schedule.next_step
  return new_state


class BatchTracker:
  """The host's view of a schedule's progress: the batch of the next step.

  It counts the steps and examples it dispatched and, for an adaptive
  schedule, reads each device decision `lag` steps late (by then the step
  that made it has finished, so the read does not wait). A state it did
  not produce (fresh, or restored from a checkpoint) is read once.
  """

  def __init__(self, schedule: BatchSchedule):
    self.schedule = schedule
    self._token: Any = None  # the examples array of the last state we returned
    self._pending: list[tuple[int, Any]] = []

  def _sync(self, state: Any) -> None:
    bs = state.batch_schedule
    self.schedule.check_state(bs)
    host = (state.step, bs.batch_size, bs.next_batch, bs.next_step)
    self.step, self.batch, nb, ns = (int(_host(x)) for x in host)
    self.examples = examples_int(bs.examples)
    self._decision = (nb, ns)
    self._pending = []
    self._token = bs.examples

  def next_batch_size(self, state: Any) -> int:
    """The global batch of the next step on `state`."""
    if state.batch_schedule is None or state.batch_schedule.examples is not self._token:
      self._sync(state)
    if self.schedule.kind != "adaptive":
      return self.schedule.batch_size_at(self.examples)
    s = self.schedule.lag
    while self._pending and self._pending[0][0] <= self.step - 1 - s:
      _, arrays = self._pending.pop(0)
      self._decision = tuple(int(_host(x)) for x in arrays)
    nb, ns = self._decision
    return nb if self.step >= ns else self.batch

  def record(self, batch_size: int, new_state: Any, metrics: Any) -> None:
    """Notes that a step ran with `batch_size` and returned `new_state`.

    An adaptive decision is read from the metrics (the state's buffers are
    donated to the next step).
    """
    bs = new_state.batch_schedule
    if self.schedule.kind == "adaptive":
      self._pending.append(
          (self.step, (metrics["next_batch_size"], metrics["next_batch_step"])))
    self.step += 1
    self.batch = batch_size
    self.examples += batch_size
    self._token = bs.examples
