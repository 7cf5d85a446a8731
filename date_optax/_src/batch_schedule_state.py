"""The growing batch's progress in the train state, and its saved layouts.

:class:`BatchScheduleState` is what ``TrainState.batch_schedule`` holds and
checkpoints carry. Its layout grew twice, and checkpoints of every layout
restore into today's:

* generation 1: ``examples`` an int32 scalar, a 10-entry ``spec``;
* generation 2: ``examples`` two int32 words, an 11-entry ``spec``;
* generation 3 (today): the adaptive rule's stretch, loss averages and the
  skipped steps' examples, and a 13-entry ``spec`` (the stretch and the
  guard's margin).

A restored state of an older generation gets the new fields' start values
(nothing held, no loss seen, nothing skipped) and its settings record the
defaults of the settings it did not have.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from date_optax._src.examples_clock import examples_int, examples_words

#: The kinds of :class:`date_optax.BatchSchedule` (their index is ``spec[0]``).
KINDS = ("fixed", "ramp", "adaptive", "doubling")

#: An adaptive schedule's default stretch: the trigger must hold over this
#: many times the start batch of examples.
DEFAULT_HOLD_STARTS = 32
#: An adaptive schedule's default runaway-guard margin.
DEFAULT_GUARD_MARGIN = 0.1

# Entries of the settings record, per generation.
SPEC_LEN = 13
_GEN2_SPEC_LEN = 11
_GEN1_SPEC_LEN = 10
# The fields generation 3 added, and their values before a first step.
_NEW_FIELDS = ("held", "loss_avg", "skipped")


def f32_bits(x: float) -> int:
  return int(np.asarray(x, np.float32).view(np.int32))


def bits_f32(x: int) -> float:
  return float(np.asarray(x, np.int32).view(np.float32))


def upgrade_spec(spec: Any) -> np.ndarray:
  """A settings record of any generation, in today's layout.

  A record without the stretch and the margin (generations 1 and 2) gets an
  adaptive schedule's defaults for them (0 for the other kinds, which do
  not use them), so a run saved before resumes under today's defaults.
  """
  spec = np.asarray(spec).reshape(-1).astype(np.int32)
  if spec.size == _GEN1_SPEC_LEN:  # ramp_examples' high word
    spec = np.concatenate([spec, np.zeros((1,), np.int32)])
  if spec.size == _GEN2_SPEC_LEN:
    adaptive = int(spec[0]) == KINDS.index("adaptive")
    hold = min(DEFAULT_HOLD_STARTS * int(spec[1]), 2**31 - 1) if adaptive else 0
    margin = round(DEFAULT_GUARD_MARGIN * 1e6) if adaptive else 0
    spec = np.concatenate([spec, np.asarray([hold, margin], np.int32)])
  return spec


def _fresh(name: str) -> jax.Array:
  if name == "held":
    return jnp.zeros((), jnp.int32)
  if name == "loss_avg":
    return jnp.full((2,), jnp.nan, jnp.float32)
  return jnp.zeros((2,), jnp.int32)


class BatchScheduleState(flax.struct.PyTreeNode):
  """The progress of a :class:`BatchSchedule`: small arrays in the train state.

  Attributes:
    batch_size: the global batch of the last step taken (the schedule's
      start before the first step).
    examples: examples consumed so far (skipped steps included: their data
      was read), exact as two int32 words ``[high, low]``,
      ``E = high·2**31 + low`` (up to :data:`MAX_EXAMPLES`); read it with
      :meth:`num_examples`. A checkpoint written before the two-word count
      (an int32 scalar) restores into this layout.
    last_change: the step at which the batch last changed (0 at the start;
      moved one step later by each skipped step, so a skipped step does not
      count towards ``min_steps``).
    next_batch: the batch an adaptive schedule decided to grow to (or the
      current one when no growth is pending).
    next_step: the step from which `next_batch` applies.
    spec: the schedule's settings (int32 vector), so that a checkpoint
      restored under a different schedule is refused.
    held: the examples over which an adaptive schedule's trigger has held
      without a break (int32, saturating at 2**31 − 1).
    loss_avg: float32 ``[recent, long]`` moving averages of the loss (NaN
      before the first finite step), for the runaway guard.
    skipped: the examples of skipped steps, two int32 words like
      `examples`: the learning rate's clock is ``examples − skipped``.

  Examples:
    >>> import date_optax
    >>> state = date_optax.BatchSchedule.fixed(64).init()
    >>> int(state.batch_size), state.num_examples(), state.examples.tolist()
    (64, 0, [0, 0])
  """

  batch_size: jax.Array
  examples: jax.Array
  last_change: jax.Array
  next_batch: jax.Array
  next_step: jax.Array
  spec: jax.Array
  held: Any = None
  loss_avg: Any = None
  skipped: Any = None

  def num_examples(self) -> int:
    """The examples consumed, as an exact Python int (reads the device).

    Returns:
      ``high·2**31 + low`` of :attr:`examples` (this host's copy).
    """
    return examples_int(self.examples)


def _state_to_dict(state: BatchScheduleState) -> dict:
  return {f.name: serialization.to_state_dict(getattr(state, f.name))
          for f in dataclasses.fields(state)}


def _state_from_dict(target: BatchScheduleState, saved: dict) -> BatchScheduleState:
  """flax's state dict -> the state; one of an older generation is upgraded."""
  names = [f.name for f in dataclasses.fields(target)]
  old = [n for n in names if n not in _NEW_FIELDS]
  if set(saved) != set(names) and set(saved) != set(old):
    raise ValueError(
        f"a BatchScheduleState has the fields {names}; the saved state has "
        f"{sorted(saved)} (at {serialization.current_path()})."
    )
  values = {n: serialization.from_state_dict(getattr(target, n), saved[n], name=n)
            for n in names if n in saved}
  if np.shape(values["examples"]) == ():
    values["examples"] = examples_words(int(np.asarray(values["examples"])))
  values["spec"] = upgrade_spec(values["spec"])
  for n in _NEW_FIELDS:
    if values.get(n) is None:
      values[n] = _fresh(n)
  return target.replace(**values)


# flax.serialization (msgpack) reads a state of any generation.
serialization.register_serialization_state(
    BatchScheduleState, _state_to_dict, _state_from_dict, override=True)


def _is_state(x: Any) -> bool:
  return isinstance(x, BatchScheduleState)


#: The older layouts a checkpoint may hold, newest first.
LEGACY_GENERATIONS = (2, 1)


def legacy_layout(abstract: Any, generation: int = 1) -> Any:
  """`abstract` with each :class:`BatchScheduleState` in an older layout.

  Generation 2 lacks the fields generation 3 added (and has an 11-entry
  `spec`); generation 1 also counts `examples` in one int32 scalar (and has
  a 10-entry `spec`). The target that reads such a checkpoint.
  """

  def old(x):
    if not _is_state(x):
      return x
    like = lambda leaf, shape: jax.ShapeDtypeStruct(
        shape, jnp.int32, sharding=getattr(leaf, "sharding", None))
    spec_len = _GEN2_SPEC_LEN if generation == 2 else _GEN1_SPEC_LEN
    examples = x.examples if generation == 2 else like(x.examples, ())
    return x.replace(examples=examples, spec=like(x.spec, (spec_len,)),
                     **dict.fromkeys(_NEW_FIELDS))

  return jax.tree.map(old, abstract, is_leaf=_is_state)


def has_state(tree: Any) -> bool:
  """Whether `tree` holds a :class:`BatchScheduleState`."""
  return any(_is_state(x) for x in jax.tree.leaves(tree, is_leaf=_is_state))


def upgraded_layout(restored: Any, abstract: Any) -> Any:
  """`restored` (read with a :func:`legacy_layout` target) in today's layout,
  placed as `abstract` says."""

  def convert(examples, spec):
    if examples.shape == ():
      examples = jnp.stack([jnp.zeros((), jnp.int32), examples.astype(jnp.int32)])
    if spec.shape[0] == _GEN1_SPEC_LEN:
      spec = jnp.concatenate([spec, jnp.zeros((1,), spec.dtype)])
    adaptive = spec[0] == KINDS.index("adaptive")
    cap = (2**31 - 1) // DEFAULT_HOLD_STARTS
    hold = jnp.where(spec[1] > cap, jnp.int32(2**31 - 1), spec[1] * DEFAULT_HOLD_STARTS)
    tail = jnp.where(adaptive, jnp.stack([hold, jnp.int32(round(DEFAULT_GUARD_MARGIN * 1e6))]),
                     jnp.zeros((2,), jnp.int32))
    return (examples, jnp.concatenate([spec.astype(jnp.int32), tail]),
            *(_fresh(n) for n in _NEW_FIELDS))

  def new(a, r):
    if not _is_state(a):
      return r
    names = ("examples", "spec", *_NEW_FIELDS)
    shardings = tuple(getattr(getattr(a, n), "sharding", None) for n in names)
    if None in shardings:
      shardings = None
    out = jax.jit(convert, out_shardings=shardings)(r.examples, r.spec)
    return r.replace(**dict(zip(names, out, strict=True)))

  return jax.tree.map(new, abstract, restored, is_leaf=_is_state)
