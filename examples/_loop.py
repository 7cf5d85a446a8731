"""The examples' training loop: restore, preemption guard, metrics, evaluation,
checkpoints and `results.json`, written once (the loop of flax's examples).

Each example's `train.py` builds its model, loss, optimizer, step
(`date_optax.parallel.make_train_step`) and data, then calls `train_loop`.
A step built with a growing batch (`batch_schedule=`) is run on a budget
of examples instead of steps, each step fed `step.next_batch_size(state)`
rows from a `date_optax.parallel.GrowingBatches`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from etils import epath

import date_optax.parallel as dp
from date_optax.checkpoint import CheckpointManager, PreemptionGuard, tree_checksum
from date_optax.diagnostics import MetricWriter


def make_grad_sync(config: ml_collections.ConfigDict) -> dp.GradSync:
  """The step's gradient reduction from `config.grad_sync`.

  Args:
    config: the run's config; `config.grad_sync` holds `algorithm`,
      `comm_dtype`, `aps` ("auto", "on" or "off"), `rounding`, `block_size`
      (0: off) and `error_feedback`.

  Returns:
    The `date_optax.parallel.GradSync` (it validates the combination).
  """
  gs = config.grad_sync
  aps_modes = {"auto": None, "on": True, "off": False}
  if gs.aps not in aps_modes:
    raise ValueError(f'config.grad_sync.aps must be "auto", "on" or "off", got {gs.aps!r}.')
  return dp.GradSync(
      gs.algorithm, comm_dtype=gs.comm_dtype, aps=aps_modes[gs.aps], rounding=gs.rounding,
      block_size=gs.block_size or None, error_feedback=gs.error_feedback)


def batch_schedule_kind(config: ml_collections.ConfigDict, kinds: tuple) -> str | None:
  """`config.batch_schedule` (None: a fixed batch), checked to be one of `kinds`.

  Raises:
    ValueError: naming the setting and the kinds the example knows.
  """
  kind = config.get("batch_schedule")
  if kind not in kinds:
    raise ValueError(f"config.batch_schedule must be one of {kinds}, got {kind!r} "
                     "(leave it unset for a fixed batch).")
  return kind


def scalars_of(metrics: dict[str, Any]) -> dict[str, float]:
  """The step's metrics as floats: `trust_ratios` (one per layer) left out, `aux` flattened."""
  out = {k: float(v) for k, v in metrics.items() if k not in ("trust_ratios", "aux")}
  return {**out, **{k: float(v) for k, v in metrics.get("aux", {}).items()}}


def train_loop(
    config: ml_collections.ConfigDict,
    workdir: str,
    train_step: Callable[[Any, Any], tuple[Any, dict[str, Any]]],
    state: Any,
    batches: Iterator[Any],
    *,
    total_steps: int | None = None,
    eval_every: int | None = None,
    evaluate: Callable[[Any], dict[str, float]],
    boundaries: Collection[int] = (),
    scalars: Callable[[int], dict[str, float]] = lambda step: {},
    summary: Callable[[Any], dict[str, Any]] = lambda state: {},
    total_examples: int | None = None,
    eval_every_examples: int | None = None,
) -> dict[str, Any]:
  """Trains `state` to `total_steps` or `total_examples`, resuming from its checkpoints.

  Every `config.log_every_steps` steps the step's metrics (the learning rate
  among them) and `scalars(step)` go to `workdir/metrics.csv`; every
  `eval_every` steps `evaluate(state)` does. The last step and the steps in
  `boundaries` are always logged, evaluated and checkpointed. Checkpoints
  (every `config.checkpoint_every_steps` steps, default `eval_every`; none
  when `config.save_checkpoints` is False) hold the state, the position of
  `batches` (a grain iterator) and the last metrics. On SIGTERM/SIGINT the
  step in flight is saved and the loop returns; rerunning resumes exactly.

  *Growing batch.* When `train_step` was built with a `batch_schedule`, the
  run is counted in examples: each step takes `train_step.next_batch_size(state)`
  rows from `batches` (a `date_optax.parallel.GrowingBatches`, whose
  position is checkpointed like a grain iterator's; the schedule's progress
  is in the state), and the loop stops before a step whose batch would pass
  `total_examples` (the step count is whatever the schedule gives). A step
  is evaluated when the examples cross a multiple of `eval_every_examples`;
  it is also logged when its batch differs from the previous step's, so
  `metrics.csv` records every change of "batch_size" at the step it
  happened. Checkpoints come every `config.checkpoint_every_steps` steps,
  or, when that is None, at every evaluation.

  Args:
    config: reads `log_every_steps`, `checkpoint_every_steps`,
      `save_checkpoints` and `progress_bar` (the last three optional).
    workdir: checkpoints, `metrics.csv` and `results.json` (local or gs://).
    train_step: `date_optax.parallel.make_train_step`'s step.
    state: the fresh train state (its structure for the restore).
    batches: a checkpointable iterator (`get_state`/`set_state`); for a
      growing batch, a `GrowingBatches`.
    total_steps: the step to stop at (a fixed batch).
    eval_every: the evaluation cadence in steps (a fixed batch).
    evaluate: `evaluate(state)`, a dict of floats.
    boundaries: steps always logged, evaluated and checkpointed.
    scalars: `scalars(step)`, extra floats for each metrics row.
    summary: `summary(state)`, extra entries of the result.
    total_examples: the examples to train on (a growing batch).
    eval_every_examples: the evaluation cadence in examples (a growing
      batch), e.g. the size of the training set.

  Returns:
    The last train and eval metrics, "steps", `summary(state)` and the
    "params_checksum", also written to `workdir/results.json`; with a
    growing batch also "examples" (trained on) and "batch_changes" (the
    ``[step, batch]`` pairs at which the batch took each size, first step
    1); or ``{"preempted_at_step": step}`` after a signal.

  Raises:
    ValueError: the budget does not match the step: `total_steps` and
      `eval_every` for a fixed batch, `total_examples` and
      `eval_every_examples` for a growing one.
    TypeError: a growing batch read from an iterator without `take`.
  """
  growing = getattr(train_step, "batch_schedule", None) is not None
  _check_budget(growing, batches, total_steps, eval_every, total_examples,
                eval_every_examples)
  ckpt_every = config.get("checkpoint_every_steps") or (None if growing else eval_every)
  log_every = config.log_every_steps
  boundaries = set(boundaries)
  metrics, evals, changes = {}, {}, []
  with contextlib.ExitStack() as stack:
    ckpt = None
    if config.get("save_checkpoints", True):
      ckpt = stack.enter_context(CheckpointManager(os.path.join(workdir, "checkpoints")))
      if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        dp.restore_iterator(batches, meta.get("data"))
        metrics, evals = meta.get("metrics", {}), meta.get("eval", {})
        changes = [list(c) for c in meta.get("batch_changes", [])]
    guard = stack.enter_context(PreemptionGuard())
    step = int(state.step)
    writer = stack.enter_context(MetricWriter(workdir, tensorboard=None, resume_step=step))
    if growing:
      examples = state.batch_schedule.num_examples()
      size = train_step.next_batch_size(state)
      show = stack.enter_context(_progress(config, total_examples, examples, step, "examples"))
    else:
      show = stack.enter_context(_progress(config, total_steps, step, step, "steps"))
    while (examples + size <= total_examples) if growing else step < total_steps:
      if growing:
        state, m = train_step(state, batches.take(size))
        changed = not changes or changes[-1][1] != size
        if changed:
          changes.append([step + 1, size])
        step, examples = step + 1, examples + size
        following = train_step.next_batch_size(state)
        last = examples + following > total_examples or step in boundaries
        do_eval = last or (examples // eval_every_examples
                           > (examples - size) // eval_every_examples)
        do_log = step % log_every == 0 or last or changed
        do_ckpt = last or (step % ckpt_every == 0 if ckpt_every else do_eval)
        size, position = following, examples
      else:
        state, m = train_step(state, next(batches))
        step += 1
        last = step == total_steps or step in boundaries
        do_eval = step % eval_every == 0 or last
        do_log = step % log_every == 0 or last
        do_ckpt = step % ckpt_every == 0 or last
        position = step
      row = {}
      if do_log:
        metrics = row = {**scalars_of(m), **scalars(step)}
      if do_eval:
        evals = evaluate(state)
        row = {**(row or scalars(step)), **evals}
      if row:
        writer.write_scalars(step, row)
      show(step, position, {k: row[k] for k in ("loss", "learning_rate", *evals) if k in row})
      preempted = guard.should_stop(step)  # the same answer on every host
      if ckpt is not None and (preempted or do_ckpt):
        meta = {"data": dp.iterator_state(batches), "metrics": metrics, "eval": evals}
        if growing:
          meta["batch_changes"] = changes
        ckpt.save(step, state, force=True, metadata=meta)
      if preempted:
        where = (f"step {step} ({examples} of {total_examples} examples)" if growing
                 else f"step {step} of {total_steps}")
        _print(f"{guard.received}: saved {where} in {workdir}; "
               "rerun the same command to resume.")
        return {"preempted_at_step": step}
  variables = state.params if state.model_state is None else {
      "params": state.params, "batch_stats": state.model_state}
  grown = {"examples": examples, "batch_changes": changes} if growing else {}
  result = {**metrics, **(evals or evaluate(state)), "steps": step, **grown,
            **summary(state), "params_checksum": tree_checksum(variables)}
  if jax.process_index() == 0:
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    epath.Path(workdir, "results.json").write_text(json.dumps(result, indent=1))
  return result


def _check_budget(growing: bool, batches: Any, total_steps: int | None,
                  eval_every: int | None, total_examples: int | None,
                  eval_every_examples: int | None) -> None:
  """A fixed batch counts steps, a growing one examples; refuses a mix."""
  if not growing:
    if total_steps is None or eval_every is None or total_examples is not None:
      raise ValueError(
          "a step with a fixed batch runs on total_steps and eval_every, got "
          f"total_steps={total_steps}, eval_every={eval_every}, "
          f"total_examples={total_examples}.")
    return
  if total_examples is None or eval_every_examples is None or total_steps is not None:
    raise ValueError(
        "a step with a growing batch (batch_schedule=) runs on total_examples "
        f"and eval_every_examples, got total_examples={total_examples}, "
        f"eval_every_examples={eval_every_examples}, total_steps={total_steps}.")
  if not callable(getattr(batches, "take", None)):
    raise TypeError(
        "a growing batch needs batches of any size: pass "
        "date_optax.parallel.GrowingBatches(iter(loader), schedule.chunk_size), "
        f"got {type(batches).__name__}.")


def host_int(x: Any) -> int:
  """A replicated scalar's value on this host (its first local copy), as an int."""
  return int(np.asarray(x.addressable_data(0) if isinstance(x, jax.Array) else x))


def _print(line: str) -> None:
  if jax.process_index() == 0:
    print(line, flush=True)


@contextlib.contextmanager
def _progress(config: ml_collections.ConfigDict, total: int, initial: int, step: int,
              unit: str):
  """`show(step, position, scalars)`: a tqdm bar (`config.progress_bar`) or a line.

  The position is the step (`unit` "steps") or the examples trained on
  ("examples", a growing batch); only host 0 prints.
  """
  if unit == "steps":
    _print(f"running steps {initial + 1}..{total} on {jax.device_count()} devices")
  else:
    _print(f"running from step {step + 1} until {total} examples (now {initial}), "
           f"the batch growing, on {jax.device_count()} devices")
  if not config.get("progress_bar") or jax.process_index() != 0:
    yield lambda step, position, row: row and _print(
        f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()))
    return
  from tqdm.auto import tqdm  # noqa: PLC0415  (an `examples` extra)

  with tqdm(total=total, initial=initial, unit=unit.rstrip("s"), mininterval=2.0) as bar:
    def show(step, position, row):
      bar.update(position - bar.n)
      if "loss" in row:
        bar.set_postfix({k: f"{v:.3g}" for k, v in row.items()})
    yield show
