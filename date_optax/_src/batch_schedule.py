"""Batch-size schedules: a global batch that grows during training.

A :class:`BatchSchedule` says how large the global batch of every step is:
fixed, a Megatron-LM/NeMo ramp in examples, a doubling ramp in examples,
or adaptive (grown when the measured critical batch exceeds the current
batch). Its progress is a small
pytree of int32 arrays, :class:`BatchScheduleState`, kept in the train
state (``TrainState.batch_schedule``) and checkpointed with it. The examples
consumed are counted exactly in two int32 words (``E = high·2**31 + low``),
so the count and the learning rate's clock in examples never wrap, without
``jax_enable_x64``.

The train step (``make_train_step(..., batch_schedule=...)``) compiles one
program per batch size and gives each device its share of the rows, in as
few microbatches as ``max_rows_per_device`` allows (rows first). The host
must know a step's batch before it dispatches the step (to fetch that many
examples and pick the program), so:

* ``fixed``, ``ramp`` and ``doubling`` are pure functions of the examples consumed, which
  the host counts itself;
* ``adaptive`` decides on the device, inside step ``t``, from the smoothed
  noise statistics, and schedules the change for step ``t + 1 + lag``. The
  host reads the decision of step ``s − 1 − lag`` when it dispatches step
  ``s`` — a step that has long finished, so the read does not stall the
  pipeline — and a restored state carries any decision not yet applied, so
  a resumed run grows at the same steps as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from date_optax._src import validation
from date_optax._src.batch_schedule_state import (  # noqa: F401 - re-exported
    DEFAULT_GUARD_MARGIN,
    DEFAULT_HOLD_STARTS,
    KINDS,
    LEGACY_GENERATIONS,
    SPEC_LEN,
    BatchScheduleState,
    bits_f32,
    f32_bits,
    has_state,
    legacy_layout,
    upgrade_spec,
    upgraded_layout,
)
from date_optax._src.examples_clock import (  # noqa: F401 - used here and re-exported
    _WORD_BITS,
    MAX_BATCH,
    MAX_EXAMPLES,
    add_examples,
    as_examples_words,
    divmod_examples,
    examples_int,
    examples_words,
)
from date_optax._src.examples_clock import host_value as _host


class BatchProgress(NamedTuple):
  """What a growing-batch step tells the optimizer (``update(..., batch_progress=)``).

  Attributes:
    batch_size: the global batch of this step (int32).
    examples: the examples consumed before this step: int32 words
      ``[high, low]``, ``E = high·2**31 + low``, as the train step passes
      them (exact past 2**31), or a scalar below 2**31.

  Examples:
    >>> import date_optax
    >>> date_optax.BatchProgress(batch_size=64, examples=1024).batch_size
    64
  """

  batch_size: jax.Array
  examples: jax.Array


def _margin_code(margin: float) -> int:
  return -1 if margin == math.inf else round(margin * 1e6)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSchedule:
  r"""How the global batch grows during training: fixed, ramps or adaptive.

  Build it with :meth:`fixed`, :meth:`ramp`, :meth:`doubling` or
  :meth:`adaptive` and give it
  to ``date_optax.parallel.make_train_step(..., batch_schedule=...)``. At
  batch ``B`` the step gives each device ``B / replicas`` rows and runs them
  in as few accumulated microbatches as ``max_rows_per_device`` allows (at
  least the step's ``microbatches``: rows first, so a larger batch makes
  each device's microbatch larger before it adds microbatches): one
  compiled program per distinct batch size.

  **Ramp** (Megatron-LM's ``rampup_batch_size = [start, increment,
  ramp_examples]``): with ``m = (max_batch − start)/increment`` increments
  and ``E`` the examples consumed before a step, its batch is

  .. math::

    B(E) = \mathrm{start} + \mathrm{increment}\cdot
      \min\left(m, \left\lfloor \frac{E\,m}{\mathrm{ramp\_examples}}
      \right\rfloor\right).

  **Doubling** (the hand-made batch-size warmup: the batch doubles, or grows
  by ``factor``, at equal shares of the examples): with
  ``max_batch = start · factor**m``,

  .. math::

    B(E) = \mathrm{start}\cdot\mathrm{factor}^{\min\left(m, \left\lfloor
      \frac{E\,m}{\mathrm{ramp\_examples}}\right\rfloor\right)}.

  **Adaptive** (Merrill et al. 2025's batch-size warmup; Pollux's
  re-decided batch): at step ``t`` with batch ``B``, the measured critical
  batch is ``B_crit = calibration · B_simple`` (the step's smoothed simple
  noise scale, McCandlish et al. 2018, smoothed per example seen, so the
  same whatever the number of devices). The *trigger* holds on a step when
  ``B_crit`` is finite, ``B_crit >= threshold · B``, the step was not
  skipped, and the *runaway guard* passes: the loss's recent average (a
  half-life of ``hold_examples``) is at most ``(1 + guard_margin)`` times
  its long average (the statistics' smoothing). The batch grows when the
  trigger has held without a break over at least ``hold_examples``
  examples, ``B < max_batch``, no growth is pending and the change would
  come at least ``min_steps`` steps after the last one (skipped steps not
  counted): it becomes ``min(factor · B, max_batch)`` from step
  ``t + 1 + lag``, and the stretch starts again at that step: the ``lag``
  steps still run at ``B`` after the decision never count towards the next
  growth. It never shrinks. An
  infinite ``B_simple`` (the smoothed ``|G|²`` estimate not yet positive:
  the statistics have not separated the gradient from its noise, as in the
  first steps) grows nothing: measured, growing on it doubled the batch
  every ``min_steps`` steps from the start and cost up to 2.8 points. The
  decision is made on the device from replicated statistics, so every
  process takes it identically.

  Args:
    kind: one of :data:`KINDS`; use the constructors instead.
    start: the first global batch (every batch is a multiple of
      ``replicas × r`` rows, ``r`` the rows of one microbatch of the first
      batch on one device, checked when the step is built: each device's
      rows then split into whole microbatches within
      ``max_rows_per_device``).
    max_batch: the largest global batch.
    increment: the ramp's increment (``ramp`` only).
    ramp_examples: examples over which the ramp reaches `max_batch`
      (``ramp`` and ``doubling``).
    factor: the growth factor of ``adaptive`` and ``doubling``, an integer
      >= 2.
    threshold: grow when ``B_crit >= threshold · B``, > 0 (default 3).
    min_steps: the fewest steps between two changes, >= ``lag + 1``.
    lag: steps between a decision and the step it applies to, >= 1 (the
      host reads decisions this many steps late, so they never stall it).
    calibration: the multiple of ``B_simple`` taken as the critical batch,
      > 0 (Merrill et al. found B_simple underestimates it under Adam).
    hold_examples: ``adaptive`` only: the examples over which the trigger
      must hold before the batch grows, in ``[0, 2**31 − 1]``; None:
      ``32 · start`` (0 for the other kinds).
    guard_margin: ``adaptive`` only: the runaway guard's margin, in
      ``[0, 1000]`` (kept to 1e-6), or ``math.inf`` to turn the guard off;
      None: 0.1 (0 for the other kinds).

  Returns:
    The schedule (a frozen dataclass, validated when built).

  Raises:
    ValueError: a size, count or factor out of range; the message names the
      argument and its allowed range.
    TypeError: an argument of the wrong kind.

  Examples:
    >>> import date_optax
    >>> ramp = date_optax.BatchSchedule.ramp(32, 32, 1000, max_batch=128)
    >>> [ramp.batch_size_at(e) for e in (0, 333, 334, 667, 1000, 10**6)]
    [32, 32, 64, 96, 128, 128]
    >>> date_optax.BatchSchedule.adaptive(16, max_batch=1024).batch_sizes
    (16, 32, 64, 128, 256, 512, 1024)

  References:
    McCandlish, Kaplan, Amodei et al., `An Empirical Model of Large-Batch
    Training <https://arxiv.org/abs/1812.06162>`_, 2018; Merrill et al.,
    `Critical Batch Size Revisited <https://arxiv.org/abs/2505.23971>`_,
    2025; Qiao et al., `Pollux: Co-adaptive Cluster Scheduling for
    Goodput-Optimized Deep Learning <https://arxiv.org/abs/2008.12260>`_,
    OSDI 2021; Shoeybi et al., `Megatron-LM
    <https://arxiv.org/abs/1909.08053>`_, 2019 (``rampup_batch_size``,
    ``num_microbatches_calculator.py``).
  """

  kind: str
  start: int
  max_batch: int
  increment: int = 0
  ramp_examples: int = 0
  factor: int = 2
  threshold: float = 3.0
  min_steps: int = 1
  lag: int = 1
  calibration: float = 1.0
  hold_examples: int | None = None
  guard_margin: float | None = None

  def __post_init__(self) -> None:
    validation.check_choice("kind", self.kind, KINDS)
    start = validation.check_int("start", self.start, low=1, high=MAX_BATCH)
    top = validation.check_int("max_batch", self.max_batch, low=start, high=MAX_BATCH)
    set_ = lambda name, value: object.__setattr__(self, name, value)
    set_("start", start)
    set_("max_batch", top)
    if self.kind == "fixed" and top != start:
      raise ValueError(f"a fixed schedule has max_batch == start, got {top} != {start}.")
    if self.kind == "ramp":
      inc = validation.check_int("increment", self.increment, low=1, high=MAX_BATCH)
      if (top - start) % inc:
        raise ValueError(
            f"max_batch - start = {top - start} must be a multiple of "
            f"increment={inc} (Megatron-LM's ramp reaches max_batch exactly)."
        )
      set_("increment", inc)
      set_("ramp_examples", validation.check_int(
          "ramp_examples", self.ramp_examples, low=1, high=MAX_EXAMPLES))
    if self.kind in ("adaptive", "doubling"):
      f = validation.check_int("factor", self.factor, low=2)
      j = 0
      while start * f**j < top:
        j += 1
      if top % start or start * f**j != top:
        raise ValueError(
            f"max_batch={top} must be start={start} times a power of "
            f"factor={f} (e.g. {start * f ** max(j - 1, 0)} or {start * f**j}), "
            "so that the batch reaches it; got a ratio of "
            f"{top / start:g}."
        )
      set_("factor", f)
    if self.kind == "doubling":
      set_("ramp_examples", validation.check_int(
          "ramp_examples", self.ramp_examples, low=1, high=MAX_EXAMPLES))
    if self.kind == "adaptive":
      set_("lag", validation.check_int("lag", self.lag, low=1, high=1000))
      set_("min_steps", validation.check_int(
          "min_steps", self.min_steps, low=self.lag + 1, high=2**30))
      set_("threshold", float(validation.check_real(
          "threshold", self.threshold, low=0.0, low_inclusive=False)))
      set_("calibration", float(validation.check_real(
          "calibration", self.calibration, low=0.0, low_inclusive=False)))
      hold = (min(DEFAULT_HOLD_STARTS * start, MAX_BATCH) if self.hold_examples is None
              else self.hold_examples)
      set_("hold_examples", validation.check_int("hold_examples", hold, low=0,
                                                 high=MAX_BATCH))
      margin = DEFAULT_GUARD_MARGIN if self.guard_margin is None else self.guard_margin
      if not (isinstance(margin, (int, float)) and margin == math.inf):
        margin = validation.check_real("guard_margin", margin, low=0.0, high=1000.0)
        margin = round(float(margin) * 1e6) / 1e6  # kept to 1e-6 in the state
      set_("guard_margin", float(margin))
    else:
      for name in ("hold_examples", "guard_margin"):
        if getattr(self, name) not in (None, 0):
          raise ValueError(f"{name} belongs to an adaptive schedule; a {self.kind} "
                           f"schedule does not take it (got {getattr(self, name)!r}).")
      set_("hold_examples", 0)
      set_("guard_margin", 0.0)

  # -- constructors ---------------------------------------------------------

  @classmethod
  def fixed(cls, batch_size: int) -> BatchSchedule:
    """The same global batch at every step.

    Args:
      batch_size: the global batch, >= 1.

    Returns:
      A :class:`BatchSchedule`.

    Examples:
      >>> import date_optax
      >>> date_optax.BatchSchedule.fixed(256).batch_sizes
      (256,)
    """
    return cls(kind="fixed", start=batch_size, max_batch=batch_size)

  @classmethod
  def ramp(
      cls, start: int, increment: int, ramp_examples: int, *, max_batch: int
  ) -> BatchSchedule:
    """Megatron-LM/NeMo's ramp: `increment` more every equal share of examples.

    Args:
      start: the first global batch, >= 1.
      increment: how much the batch grows at each change, >= 1;
        ``max_batch − start`` must be a multiple of it.
      ramp_examples: examples consumed when the batch reaches `max_batch`,
        in ``[1, MAX_EXAMPLES]`` (``2**62 − 1``).
      max_batch: the final global batch, >= `start`.

    Returns:
      A :class:`BatchSchedule` of kind ``"ramp"``.

    Examples:
      >>> import date_optax
      >>> s = date_optax.BatchSchedule.ramp(16, 16, 480, max_batch=64)
      >>> s.batch_sizes, s.batch_size_at(160), s.batch_size_at(480)
      ((16, 32, 48, 64), 32, 64)

    References:
      Shoeybi et al., `Megatron-LM <https://arxiv.org/abs/1909.08053>`_,
      2019 (``--rampup-batch-size``).
    """
    return cls(kind="ramp", start=start, max_batch=max_batch, increment=increment,
               ramp_examples=ramp_examples)

  @classmethod
  def doubling(
      cls, start: int, ramp_examples: int, *, max_batch: int, factor: int = 2
  ) -> BatchSchedule:
    """A geometric ramp: the batch grows `factor`-fold at equal shares of examples.

    With ``max_batch = start · factor**m``, the batch is ``start`` for the
    first ``ramp_examples / m`` examples, then ``start · factor`` for the
    next share, and so on: it reaches `max_batch` after `ramp_examples`.
    This is the hand-made batch-size warmup (one doubling every equal
    interval), for comparison with :meth:`adaptive`, which times the same
    doublings from the measured critical batch instead.

    Args:
      start: the first global batch, >= 1.
      ramp_examples: examples consumed when the batch reaches `max_batch`,
        in ``[1, MAX_EXAMPLES]`` (``2**62 − 1``).
      max_batch: the final global batch, ``start · factor**m``.
      factor: the growth factor, an integer >= 2.

    Returns:
      A :class:`BatchSchedule` of kind ``"doubling"``.

    Examples:
      >>> import date_optax
      >>> s = date_optax.BatchSchedule.doubling(16, 300, max_batch=128)
      >>> s.batch_sizes, [s.batch_size_at(e) for e in (0, 99, 100, 200, 300)]
      ((16, 32, 64, 128), [16, 16, 32, 64, 128])

    References:
      Merrill et al., `Critical Batch Size Revisited
      <https://arxiv.org/abs/2505.23971>`_, 2025 (batch-size warmup by
      doublings); Smith et al., `Don't Decay the Learning Rate, Increase the
      Batch Size <https://arxiv.org/abs/1711.00489>`_, 2018.
    """
    return cls(kind="doubling", start=start, max_batch=max_batch,
               ramp_examples=ramp_examples, factor=factor)

  @classmethod
  def adaptive(
      cls,
      start: int,
      *,
      max_batch: int,
      factor: int = 2,
      threshold: float = 3.0,
      min_steps: int = 10,
      lag: int = 2,
      calibration: float = 1.0,
      hold_examples: int | None = None,
      guard_margin: float | None = None,
  ) -> BatchSchedule:
    """Grows the batch by `factor` when the measured critical batch passes it.

    Needs a step built with ``grad_stats=True`` (the critical batch is the
    step's smoothed simple noise scale times `calibration`).

    Args:
      start: the first global batch, >= 1.
      max_batch: the largest batch, ``start · factor**j``.
      factor: the growth factor, an integer >= 2 (Merrill et al.: 2).
      threshold: grow when ``calibration · B_simple >= threshold · B``,
        > 0. Merrill et al. grow at 2; the default 3 kept B0's quality
        on four of the five tasks of this library's growth study (2: on
        three), at most a tenth of B0's steps on each (docs/RESULTS.md,
        "A higher threshold").
      min_steps: the fewest steps between two changes, >= ``lag + 1``.
      lag: how many steps after its decision a change applies, >= 1.
      calibration: the multiple of ``B_simple`` taken as the critical
        batch, > 0.
      hold_examples: the examples over which the trigger must hold without
        a break (a skipped step or the guard breaks it) before the batch
        grows, in ``[0, 2**31 − 1]``; None: ``32 · start``. Counted from
        the step the batch last changed (the ``lag`` steps after a decision,
        still at the old batch, do not count). In examples, so the stretch
        does not depend on the number of devices.
      guard_margin: the runaway guard: growth holds while the loss's recent
        average exceeds ``(1 + guard_margin)`` times its long average; >= 0,
        ``math.inf`` turns it off; None: 0.1.

    Returns:
      A :class:`BatchSchedule` of kind ``"adaptive"``.

    Examples:
      >>> import date_optax
      >>> s = date_optax.BatchSchedule.adaptive(8, max_batch=64, threshold=1.5)
      >>> s.batch_sizes, s.threshold
      ((8, 16, 32, 64), 1.5)

    References:
      Merrill et al., `Critical Batch Size Revisited
      <https://arxiv.org/abs/2505.23971>`_, 2025 (batch-size warmup);
      McCandlish et al., `An Empirical Model of Large-Batch Training
      <https://arxiv.org/abs/1812.06162>`_, 2018 (the noise scale).
    """
    return cls(kind="adaptive", start=start, max_batch=max_batch, factor=factor,
               threshold=threshold, min_steps=min_steps, lag=lag,
               calibration=calibration, hold_examples=hold_examples,
               guard_margin=guard_margin)

  # -- what it allows -------------------------------------------------------

  @property
  def batch_sizes(self) -> tuple[int, ...]:
    """Every batch the schedule can reach, ascending (one program each)."""
    if self.kind == "fixed":
      return (self.start,)
    if self.kind == "ramp":
      return tuple(range(self.start, self.max_batch + 1, self.increment))
    sizes, b = [], self.start
    while b < self.max_batch:
      sizes.append(b)
      b *= self.factor
    return (*sizes, self.max_batch)

  @property
  def chunk_size(self) -> int:
    """The largest batch that divides every batch of the schedule (their gcd).

    A data loader of this global batch feeds every step whole chunks
    (`date_optax.parallel.GrowingBatches`).
    """
    return math.gcd(*self.batch_sizes)

  def batch_size_at(self, examples: int) -> int:
    """The batch of a step taken after `examples` examples (fixed or ramp).

    An adaptive schedule's batch depends on measurements; its state says
    (see `date_optax.parallel.TrainStep.next_batch_size`).
    """
    examples = validation.check_int("examples", examples, low=0)
    if self.kind == "adaptive":
      raise ValueError(
          "an adaptive schedule's batch depends on the measured noise scale, "
          "not only on the examples; ask the train step (step.next_batch_size)."
      )
    if self.kind == "fixed":
      return self.start
    if self.kind == "doubling":
      m = len(self.batch_sizes) - 1
      return self.start * self.factor ** min(m, examples * m // self.ramp_examples)
    m = (self.max_batch - self.start) // self.increment
    return self.start + self.increment * min(m, examples * m // self.ramp_examples)

  def check_unit(self, unit: int, replicas: int, microbatch: int) -> None:
    """Every batch must be a multiple of `unit` = replicas × `microbatch`,
    the rows of one microbatch of the first batch on one device."""
    for name, value in (("start", self.start), ("max_batch", self.max_batch),
                        ("increment", self.increment)):
      if value % unit:
        raise ValueError(
            f"batch_schedule's {name}={value} must be a multiple of the "
            f"{replicas} data replicas x {microbatch} microbatch rows (= {unit}), "
            "the first batch's rows per device and microbatch: then each device's rows "
            "of every batch split into whole microbatches within max_rows_per_device "
            f"(microbatches of {microbatch} rows always do; the step takes the fewest "
            "that fit, rows first)."
        )

  def check_run(self, total_examples: int) -> None:
    """A ramp must end within a run of `total_examples` examples.

    Args:
      total_examples: the examples of the whole run, in
        ``[1, MAX_EXAMPLES]`` (the count is exact up to there).

    Raises:
      ValueError: a ramp longer than the run, or a run longer than
        :data:`MAX_EXAMPLES`.
    """
    total_examples = validation.check_int("total_examples", total_examples, low=1,
                                          high=MAX_EXAMPLES)
    if self.kind in ("ramp", "doubling") and self.ramp_examples > total_examples:
      raise ValueError(
          f"the ramp's ramp_examples={self.ramp_examples} is longer than the run "
          f"({total_examples} examples): the batch would never reach "
          f"max_batch={self.max_batch}. Use ramp_examples <= {total_examples}."
      )

  # -- state ----------------------------------------------------------------

  def spec(self) -> np.ndarray:
    """The settings as an int32 vector (stored in the state).

    ``ramp_examples`` takes two words: entry 4 its low 31 bits, entry 10
    the rest (a record of 10 entries, from before, reads as high word 0);
    entries 11 and 12 are `hold_examples` and `guard_margin` in millionths
    (−1 for off; a record without them reads as the defaults).
    """
    high, low = (int(w) for w in examples_words(self.ramp_examples))
    out = [KINDS.index(self.kind), self.start, self.max_batch, self.increment,
           low, self.factor, f32_bits(self.threshold),
           self.min_steps, self.lag, f32_bits(self.calibration), high,
           self.hold_examples, _margin_code(self.guard_margin)]
    assert len(out) == SPEC_LEN
    return np.asarray(out, np.int32)

  @classmethod
  def from_spec(cls, spec: Any) -> BatchSchedule:
    """The schedule an int32 `spec` vector records (see :meth:`spec`)."""
    s = [int(x) for x in upgrade_spec(np.asarray(spec))]
    if len(s) != SPEC_LEN or not 0 <= s[0] < len(KINDS):
      raise ValueError(f"not a batch-schedule spec: {s!r}.")
    return cls(kind=KINDS[s[0]], start=s[1], max_batch=s[2], increment=s[3],
               ramp_examples=(s[10] << _WORD_BITS) + s[4], factor=s[5],
               threshold=bits_f32(s[6]), min_steps=s[7], lag=s[8],
               calibration=bits_f32(s[9]), hold_examples=s[11],
               guard_margin=math.inf if s[12] < 0 else s[12] / 1e6)

  def init(self) -> BatchScheduleState:
    """The state before the first step."""
    i = lambda v: jnp.asarray(v, jnp.int32)
    return BatchScheduleState(
        batch_size=i(self.start), examples=jnp.zeros((2,), jnp.int32),
        last_change=i(0), next_batch=i(self.start), next_step=i(0),
        spec=jnp.asarray(self.spec()), held=i(0),
        loss_avg=jnp.full((2,), jnp.nan, jnp.float32),
        skipped=jnp.zeros((2,), jnp.int32),
    )

  def check_state(self, state: Any) -> None:
    """Refuses a state (a checkpoint) made under different settings."""
    if not isinstance(state, BatchScheduleState):
      raise ValueError(
          f"the train state has no batch-schedule state (got {state!r}); build "
          "it with this step's init, or restore a checkpoint saved by a step "
          "with batch_schedule."
      )
    saved = upgrade_spec(_host(state.spec))
    if not np.array_equal(saved, self.spec()):
      try:
        theirs = repr(BatchSchedule.from_spec(saved))
      except (TypeError, ValueError):
        theirs = f"an unreadable spec {saved.tolist()}"
      raise ValueError(
          f"the state's (checkpoint's) batch schedule is {theirs}, but this step "
          f"was built with {self!r}; resume with the schedule the run started "
          "with, or start a fresh run."
      )

  def update(
      self, state: BatchScheduleState, step: jax.Array, batch_size: int,
      noise_scale: jax.Array | None = None, *, loss: Any = None,
      skipped: Any = None, decay: float | None = None,
  ) -> BatchScheduleState:
    """The state after step `step` ran with `batch_size` (inside the step).

    Straight-line arithmetic (the examples counts with their carry into the
    high word). A skipped step (`skipped`, a bool array) reads its examples
    but adds them to `skipped` too (the learning rate's clock stays), does
    not count towards ``min_steps`` and breaks an adaptive schedule's
    stretch. An adaptive schedule also folds the `loss` into its averages
    (the long one with `decay`, the step's statistics' decay at this batch)
    and decides from `noise_scale` (B_simple, replicated) whether to grow.
    """
    b = jnp.int32(batch_size)
    step = jnp.asarray(step, jnp.int32)
    skip = jnp.zeros((), bool) if skipped is None else jnp.asarray(skipped, bool)
    fresh = self.init()
    held, loss_avg, skipped_ex = (fresh.held, fresh.loss_avg, fresh.skipped) \
        if state.held is None else (state.held, state.loss_avg, state.skipped)
    changed = b != state.batch_size
    last_change = jnp.where(changed, step, state.last_change) + skip.astype(jnp.int32)
    new = state.replace(batch_size=jnp.broadcast_to(b, ()),
                        examples=add_examples(state.examples, b),
                        last_change=last_change, spec=jnp.asarray(self.spec()),
                        held=held, loss_avg=loss_avg,
                        skipped=jnp.where(skip, add_examples(skipped_ex, b), skipped_ex))
    if self.kind != "adaptive":
      return new
    if noise_scale is None or loss is None or decay is None:
      raise ValueError("an adaptive batch schedule needs the step's noise scale, "
                       "loss and statistics' decay (grad_stats=True).")
    loss = jnp.asarray(loss, jnp.float32)
    recent_decay = 0.5 ** (batch_size / self.hold_examples) if self.hold_examples else 0.0
    d = jnp.asarray([recent_decay, decay], jnp.float32)
    folded = jnp.where(jnp.isnan(loss_avg), loss, d * loss_avg + (1 - d) * loss)
    loss_avg = jnp.where(jnp.isfinite(loss) & ~skip, folded, loss_avg)
    calm = (loss_avg[0] - loss_avg[1] <= jnp.float32(self.guard_margin)
            * jnp.abs(loss_avg[1])) | (self.guard_margin == math.inf)
    critical = jnp.float32(self.calibration) * jnp.asarray(noise_scale, jnp.float32)
    trigger = (jnp.isfinite(critical)  # an unmeasured noise scale never grows it
               & (critical >= jnp.float32(self.threshold) * jnp.float32(batch_size))
               & ~skip & calm)
    # The `lag` steps between a decision and its change still run at the old
    # batch and test the noise against it: the next stretch starts at the
    # change, at the new batch.
    pending = step < state.next_step
    held = jnp.where(trigger & ~pending,
                     jnp.where(held > MAX_BATCH - b, MAX_BATCH, held + b), 0)
    effect = step + 1 + self.lag
    grow = (~pending
            & (effect - last_change >= self.min_steps)
            & trigger & (held >= self.hold_examples)
            & (batch_size < self.max_batch))
    target = jnp.int32(min(self.factor * batch_size, self.max_batch))
    return new.replace(next_batch=jnp.where(grow, target, state.next_batch),
                       next_step=jnp.where(grow, effect, state.next_step),
                       held=jnp.where(grow, 0, held), loss_avg=loss_avg)


def check_schedule(value: Any) -> BatchSchedule | None:
  """None or a :class:`BatchSchedule`; anything else is a TypeError."""
  if value is not None and not isinstance(value, BatchSchedule):
    raise TypeError(
        "batch_schedule must be a date_optax.BatchSchedule (BatchSchedule.fixed, "
        f".ramp, .doubling or .adaptive) or None, got {value!r}."
    )
  return value



def check_for_step(
    schedule: Any, grad_stats: bool, replicas: int, microbatches: int,
    max_rows_per_device: Any = None,
) -> BatchSchedule | None:
  """Validates a step's `batch_schedule` (and `max_rows_per_device`) against
  its replicas and statistics."""
  schedule = check_schedule(schedule)
  if schedule is None:
    if max_rows_per_device is not None:
      raise ValueError(
          "max_rows_per_device caps the rows of a growing batch's microbatches: "
          f"it needs a batch_schedule (got max_rows_per_device={max_rows_per_device!r} "
          "and no schedule; a fixed batch sets microbatches itself).")
    return None
  if max_rows_per_device is not None:
    first = schedule.start // max(1, replicas * microbatches)
    validation.check_int("max_rows_per_device", max_rows_per_device, low=max(1, first))
  if schedule.start % (replicas * microbatches):
    raise ValueError(
        f"batch_schedule's start={schedule.start} must split over the {replicas} "
        f"data replicas x {microbatches} microbatches (= {replicas * microbatches}): "
        "the first batch runs in the step's microbatches, the fewest any batch uses."
    )
  rows = schedule.start // (replicas * microbatches)
  schedule.check_unit(replicas * rows, replicas, rows)
  if schedule.kind == "adaptive" and not grad_stats:
    raise ValueError(
        "an adaptive batch_schedule decides from the measured noise scale: build "
        "the step with grad_stats=True (got grad_stats=False)."
    )
  return schedule
