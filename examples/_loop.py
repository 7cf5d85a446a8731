"""The examples' training loop: restore, preemption guard, metrics, evaluation,
checkpoints and `results.json`, written once (the loop of flax's examples).

Each example's `train.py` builds its model, loss, optimizer, step
(`date_optax.parallel.make_train_step`) and data, then calls `train_loop`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from typing import Any

import jax
import ml_collections
from etils import epath

import date_optax.parallel as dp
from date_optax.checkpoint import CheckpointManager, PreemptionGuard, tree_checksum
from date_optax.diagnostics import MetricWriter


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
    total_steps: int,
    eval_every: int,
    evaluate: Callable[[Any], dict[str, float]],
    boundaries: Collection[int] = (),
    scalars: Callable[[int], dict[str, float]] = lambda step: {},
    summary: Callable[[Any], dict[str, Any]] = lambda state: {},
) -> dict[str, Any]:
  """Trains `state` to `total_steps`, resuming from `workdir/checkpoints`.

  Every `config.log_every_steps` steps the step's metrics (the learning rate
  among them) and `scalars(step)` go to `workdir/metrics.csv`; every
  `eval_every` steps `evaluate(state)` does. The last step and the steps in
  `boundaries` are always logged, evaluated and checkpointed. Checkpoints
  (every `config.checkpoint_every_steps` steps, default `eval_every`; none
  when `config.save_checkpoints` is False) hold the state, the position of
  `batches` (a grain iterator) and the last metrics. On SIGTERM/SIGINT the
  step in flight is saved and the loop returns; rerunning resumes exactly.

  Args:
    config: reads `log_every_steps`, `checkpoint_every_steps`,
      `save_checkpoints` and `progress_bar` (the last three optional).
    workdir: checkpoints, `metrics.csv` and `results.json` (local or gs://).
    train_step: `date_optax.parallel.make_train_step`'s step.
    state: the fresh train state (its structure for the restore).
    batches: a checkpointable iterator (`get_state`/`set_state`).
    total_steps: the step to stop at.
    eval_every: the evaluation cadence in steps.
    evaluate: `evaluate(state)`, a dict of floats.
    boundaries: steps always logged, evaluated and checkpointed.
    scalars: `scalars(step)`, extra floats for each metrics row.
    summary: `summary(state)`, extra entries of the result.

  Returns:
    The last train and eval metrics, "steps", `summary(state)` and the
    "params_checksum", also written to `workdir/results.json`; or
    ``{"preempted_at_step": step}`` after a signal.
  """
  ckpt_every = config.get("checkpoint_every_steps") or eval_every
  boundaries = set(boundaries)
  metrics, evals = {}, {}
  with contextlib.ExitStack() as stack:
    ckpt = None
    if config.get("save_checkpoints", True):
      ckpt = stack.enter_context(CheckpointManager(os.path.join(workdir, "checkpoints")))
      if ckpt.latest_step() is not None:
        state, meta = ckpt.restore(state)
        dp.restore_iterator(batches, meta.get("data"))
        metrics, evals = meta.get("metrics", {}), meta.get("eval", {})
    guard = stack.enter_context(PreemptionGuard())
    step = int(state.step)
    writer = stack.enter_context(MetricWriter(workdir, tensorboard=None, resume_step=step))
    show = stack.enter_context(_progress(config, total_steps, step))
    while step < total_steps:
      state, m = train_step(state, next(batches))
      step += 1
      last = step == total_steps or step in boundaries
      row = {}
      if step % config.log_every_steps == 0 or last:
        metrics = row = {**scalars_of(m), **scalars(step)}
      if step % eval_every == 0 or last:
        evals = evaluate(state)
        row = {**(row or scalars(step)), **evals}
      if row:
        writer.write_scalars(step, row)
      show(step, {k: row[k] for k in ("loss", "learning_rate", *evals) if k in row})
      preempted = guard.should_stop(step)  # the same answer on every host
      if ckpt is not None and (preempted or step % ckpt_every == 0 or last):
        ckpt.save(step, state, force=True, metadata={
            "data": dp.iterator_state(batches), "metrics": metrics, "eval": evals})
      if preempted:
        _print(f"{guard.received}: saved step {step} of {total_steps} in {workdir}; "
               "rerun the same command to resume.")
        return {"preempted_at_step": step}
  variables = state.params if state.model_state is None else {
      "params": state.params, "batch_stats": state.model_state}
  result = {**metrics, **(evals or evaluate(state)), "steps": step, **summary(state),
            "params_checksum": tree_checksum(variables)}
  if jax.process_index() == 0:
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    epath.Path(workdir, "results.json").write_text(json.dumps(result, indent=1))
  return result


def _print(line: str) -> None:
  if jax.process_index() == 0:
    print(line, flush=True)


@contextlib.contextmanager
def _progress(config: ml_collections.ConfigDict, total: int, initial: int):
  """`show(step, scalars)`: a tqdm bar (`config.progress_bar`), else a line (host 0)."""
  _print(f"running steps {initial + 1}..{total} on {jax.device_count()} devices")
  if not config.get("progress_bar") or jax.process_index() != 0:
    yield lambda step, row: row and _print(
        f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()))
    return
  from tqdm.auto import tqdm  # noqa: PLC0415  (an `examples` extra)

  with tqdm(total=total, initial=initial, unit="step", mininterval=2.0) as bar:
    def show(step, row):
      bar.update(step - bar.n)
      if "loss" in row:
        bar.set_postfix({k: f"{v:.3g}" for k, v in row.items()})
    yield show
