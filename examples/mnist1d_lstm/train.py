"""Training and evaluation of the MNIST-1D LSTM with a date_optax recipe.

The baseline of the config (tuned at `base_batch_size`) is a
`date_optax.Baseline`; `config.method` scales it to `config.batch_size`:
`date_optax.date` (DATE), the baseline's plain solver on the DATE schedule,
or linear LR scaling with a 5-epoch warmup. The step is
`date_optax.parallel.make_train_step`: the global batch is split over a
`("data",)` mesh, the parameters are replicated, and one all-reduce per step
averages the gradients. The test set is evaluated with
`date_optax.parallel.evaluate` (split over the devices, the last batch padded
and masked).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import date_optax
import date_optax.parallel as dp
from date_optax import diagnostics
from date_optax.checkpoint import CheckpointManager, PreemptionGuard, tree_checksum
from examples.mnist1d_lstm import input_pipeline, models


def make_baseline(config: ml_collections.ConfigDict) -> date_optax.Baseline:
  """The run tuned at `config.base_batch_size`."""
  return date_optax.Baseline(
      batch_size=config.base_batch_size,
      learning_rate=config.learning_rate,
      warmup_epochs=config.warmup_epochs,
      epochs=config.num_epochs,
      num_examples=config.num_train,
      optimizer=config.solver,
      optimizer_options={"momentum": 0.9} if config.solver == "momentum" else {},
  )


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.Recipe]:
  """The optimizer for `config.method` at `config.batch_size`, and its recipe."""
  baseline = make_baseline(config)
  batch = config.batch_size
  if config.method == "date":
    lower, upper = config.ratio_bounds
    tx = date_optax.date(baseline, batch, lower=lower, upper=upper)
    return tx, date_optax.date_recipe(baseline, batch)
  if config.method == "baseline":
    recipe = date_optax.date_recipe(baseline, batch)
  elif config.method == "linear":
    recipe = date_optax.scale_recipe(
        dataclasses.replace(baseline, warmup_epochs=5.0), batch,
        lr_scaling="linear", warmup_scaling="none",
    )
  else:
    raise ValueError(
        f"config.method must be 'date', 'baseline' or 'linear', got {config.method!r}."
    )
  return baseline.solver(recipe.schedule), recipe


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains for `config.num_epochs` epochs, evaluating after each.

  Args:
    config: the hyperparameters (see configs/default.py).
    workdir: where `metrics.csv` (and TensorBoard files if tensorboardX is
      installed) and `results.json` are written.

  Returns:
    The final metrics: test accuracy (%), iterations, wall time.
  """
  start = time.perf_counter()
  data = input_pipeline.get_datasets(config.num_train, config.num_test, config.data_seed)
  model = models.LSTMClassifier(hidden_size=config.hidden_size, chunk=config.chunk)
  return fit(config, workdir, data, model, start=start)


def fit(
    config: ml_collections.ConfigDict,
    workdir: str,
    data: dict[str, np.ndarray],
    model: Any,
    *,
    start: float | None = None,
) -> dict[str, Any]:
  """The training loop shared with the MNIST example.

  Args:
    config: as for `train_and_evaluate`.
    workdir: output directory.
    data: `x_train`, `y_train`, `x_test`, `y_test` arrays (labels int32).
    model: a flax module mapping a batch of `x` to logits.
    start: `time.perf_counter()` at the start, to count data loading.

  Resumable: checkpoints (parameters, optimizer state, step and input
  position) go to `workdir/checkpoints` every `config.checkpoint_every_steps`
  steps (default: every epoch); on SIGTERM or SIGINT the loop saves the step
  it finished and returns. Running it again with the same `workdir` resumes
  and ends bit-identical to an uninterrupted run on the same device count
  (`params_checksum` in `results.json`); `metrics.csv` then has every step
  once.

  Returns:
    The final metrics, also written to `workdir/results.json`, or
    `{"preempted_at_step": s}` after a signal.
  """
  os.makedirs(workdir, exist_ok=True)
  start = time.perf_counter() if start is None else start
  mesh = dp.data_mesh(config.num_devices)
  n_dev = mesh.devices.size
  if config.batch_size % n_dev:
    raise ValueError(
        f"config.batch_size={config.batch_size} must divide over {n_dev} devices."
    )
  tx, recipe = make_optimizer(config)
  example = jnp.zeros((1, *data["x_train"].shape[1:]), jnp.float32)
  params = model.init(jax.random.key(config.seed), example)

  def loss_fn(p, batch):
    logits = model.apply(p, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

  # Each device computes the gradient of its slice of the global batch; one
  # all-reduce averages them; steps with a NaN/Inf gradient are skipped.
  # The ratio bounds and learning rate in the metrics come from tx's state.
  train_step = dp.make_train_step(loss_fn, tx, mesh)
  state = train_step.init(params)

  def metric_fn(params, batch):
    return {"accuracy": jnp.argmax(model.apply(params, batch["x"]), -1) == batch["y"]}

  test_set = {"x": data["x_test"], "y": data["y_test"]}
  eval_batch = n_dev * max(1, 4096 // n_dev)
  steps_per_epoch = len(data["x_train"]) // config.batch_size
  total_steps = steps_per_epoch * config.num_epochs
  ckpt_every = config.get("checkpoint_every_steps") or steps_per_epoch

  def batch_at(step: int) -> dict[str, np.ndarray]:
    # The input position is (epoch, index) = divmod(step, steps_per_epoch):
    # epoch e is shuffled by the e-th permutation of one seeded generator,
    # so any step's batch can be rebuilt after a restart.
    epoch, index = divmod(step, steps_per_epoch)
    if epoch != batch_at.epoch:
      rng = np.random.default_rng(config.seed)
      for _ in range(epoch):
        rng.permutation(len(data["x_train"]))
      batch_at.batches = list(input_pipeline.train_batches(
          data["x_train"], data["y_train"], config.batch_size, rng))
      batch_at.epoch = epoch
    return batch_at.batches[index]

  batch_at.epoch = -1
  step, accuracy = 0, float("nan")
  with contextlib.ExitStack() as stack:
    ckpt = stack.enter_context(CheckpointManager(
        os.path.join(workdir, "checkpoints"), max_to_keep=2, async_save=False))
    guard = stack.enter_context(PreemptionGuard())
    if ckpt.latest_step() is not None:
      # Resume: parameters, optimizer state, step and input position.
      state, meta = ckpt.restore(state)
      step, accuracy = meta["step"], meta["test_accuracy"]
    writer = stack.enter_context(
        diagnostics.MetricWriter(workdir, tensorboard=None, resume_step=step))
    while step < total_steps:
      state, metrics = train_step(state, batch_at(step))
      step += 1
      if step % config.log_every_steps == 0:
        scalars = {k: float(v) for k, v in metrics.items() if k != "trust_ratios"}
        scalars["learning_rate"] = float(recipe.schedule(step - 1))
        writer.write_scalars(step, scalars)
      if step % steps_per_epoch == 0:
        evals = dp.evaluate(metric_fn, state.params, test_set, mesh, batch_size=eval_batch)
        accuracy = 100.0 * evals["accuracy"]
        writer.write_scalars(step, {"test_accuracy": accuracy,
                                    "epoch": step // steps_per_epoch})
      preempted = guard.should_stop(step)
      if preempted or step % ckpt_every == 0 or step == total_steps:
        epoch, index = divmod(step, steps_per_epoch)
        ckpt.save(step, state, force=True, metadata={
            "step": step, "epoch": epoch, "index": index, "test_accuracy": accuracy})
      if preempted:
        print(f"{guard.received}: saved step {step} of {total_steps} in {workdir}; "
              "rerun the same command to resume.", flush=True)
        return {"preempted_at_step": step}
  result = dict(
      method=config.method, batch_size=config.batch_size, iterations=step,
      test_accuracy=accuracy, wall_time=time.perf_counter() - start,
      devices=n_dev, peak_learning_rate=recipe.peak_learning_rate,
      warmup_steps=recipe.warmup_steps, params_checksum=tree_checksum(state.params),
  )
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(result, f, indent=1)
  return result
