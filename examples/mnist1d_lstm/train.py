"""Training and evaluation of the MNIST-1D LSTM with a date_optax recipe.

The baseline of the config (tuned at `base_batch_size`) is a
`date_optax.Baseline`; `config.method` scales it to `config.batch_size`:
`date_optax.date` (DATE), the baseline's plain solver on the DATE schedule,
or linear LR scaling with a 5-epoch warmup. The step is
`date_optax.parallel.make_train_step`: the global batch is split over a
`("data",)` mesh, the parameters are replicated, and one all-reduce per step
averages the gradients. The batches come through grain
(`date_optax.parallel.data_loader`); the loop is the examples' own
(`examples/_loop.py`). The test set is evaluated with
`date_optax.parallel.evaluate` after every epoch.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

import date_optax
import date_optax.parallel as dp
from examples import _loop
from examples.mnist1d_lstm import input_pipeline, models


def make_baseline(config: ml_collections.ConfigDict) -> date_optax.Baseline:
  """The run tuned at `config.base_batch_size`: `config.solver` ("adam", or heavy ball 0.9)."""
  return date_optax.Baseline(
      batch_size=config.base_batch_size, learning_rate=config.learning_rate,
      warmup_epochs=config.warmup_epochs, epochs=config.num_epochs,
      num_examples=config.num_train, optimizer=config.solver,
      optimizer_options={"momentum": 0.9} if config.solver == "momentum" else {},
  )


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.Recipe]:
  """The optimizer for `config.method` at `config.batch_size`, and its recipe.

  "date" is `date_optax.date` (with `config.ratio_bounds`, a pair, or None
  for its default bounds rule); "baseline" the plain solver on DATE's
  schedule; "linear" the plain solver with the learning rate scaled by k and
  a 5-epoch warmup (Goyal et al. 2017). The plain solver records its
  learning rate (`optax.inject_hyperparams`) for the step's metrics.
  """
  if config.method not in ("date", "baseline", "linear"):
    raise ValueError(
        f"config.method must be 'date', 'baseline' or 'linear', got {config.method!r}."
    )
  baseline, batch = make_baseline(config), config.batch_size
  if config.method == "linear":
    recipe = date_optax.scale_recipe(
        dataclasses.replace(baseline, warmup_epochs=5.0), batch,
        lr_scaling="linear", warmup_scaling="none")
  else:
    recipe = date_optax.date_recipe(baseline, batch)
  if config.method == "date":
    bounds = config.get("ratio_bounds")
    options = {} if bounds is None else dict(zip(("lower", "upper"), bounds))
    return date_optax.date(baseline, batch, **options), recipe
  return optax.inject_hyperparams(baseline.solver)(learning_rate=recipe.schedule), recipe


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains for `config.num_epochs` epochs, evaluating after each.

  Args:
    config: the hyperparameters (see configs/default.py).
    workdir: checkpoints, `metrics.csv` and `results.json`.

  Returns:
    The final metrics: test accuracy (%), iterations, wall time.
  """
  start = time.perf_counter()
  data = input_pipeline.load_mnist1d(config.num_train, config.num_test,
                                    seed=config.data_seed)
  model = models.LSTMClassifier(hidden_size=config.hidden_size, chunk=config.chunk)
  return fit(config, workdir, data, model, start=start)


def fit(
    config: ml_collections.ConfigDict,
    workdir: str,
    data: input_pipeline.Dataset,
    model: Any,
    *,
    start: float | None = None,
) -> dict[str, Any]:
  """Trains `model` on `data` (the loop shared with the MNIST example).

  Args:
    config: as for `train_and_evaluate`.
    workdir: output directory.
    data: the train and test arrays (labels int32).
    model: a flax module mapping a batch of `x` to logits.
    start: `time.perf_counter()` at the start, to count data loading.

  Resumable (`examples/_loop.py`): checkpoints every
  `config.checkpoint_every_steps` steps (default: every epoch) and on
  SIGTERM; a rerun ends bit-identical to an uninterrupted run on the same
  device count (`params_checksum` in `results.json`).

  Returns:
    The final metrics, also written to `workdir/results.json`, or
    `{"preempted_at_step": s}` after a signal.
  """
  start = time.perf_counter() if start is None else start
  mesh = dp.data_mesh(config.num_devices)
  n_dev = mesh.devices.size
  if config.batch_size % n_dev:
    raise ValueError(
        f"config.batch_size={config.batch_size} must divide over {n_dev} devices."
    )
  tx, recipe = make_optimizer(config)
  params = model.init(jax.random.key(config.seed),
                      jnp.zeros((1, *data.x_train.shape[1:]), jnp.float32))

  def loss_fn(p, batch):
    logits = model.apply(p, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

  def metric_fn(params, batch):
    return {"accuracy": jnp.argmax(model.apply(params, batch["x"]), -1) == batch["y"]}

  train_step = dp.make_train_step(loss_fn, tx, mesh)
  steps_per_epoch = len(data.x_train) // config.batch_size
  test_set = {"x": data.x_test, "y": data.y_test}

  def evaluate(state) -> dict[str, float]:
    out = dp.evaluate(metric_fn, state.params, test_set, mesh,
                      batch_size=n_dev * max(1, 4096 // n_dev))
    return {"test_accuracy": 100.0 * out["accuracy"],
            "epoch": int(state.step) // steps_per_epoch}

  # A seeded shuffle of the training set every epoch, read through grain.
  source = dp.ArraySource({"x": data.x_train, "y": data.y_train})
  batches = iter(dp.data_loader(source, config.batch_size, seed=config.seed))
  return _loop.train_loop(
      config, workdir, train_step, train_step.init(params), batches,
      total_steps=steps_per_epoch * config.num_epochs, eval_every=steps_per_epoch,
      evaluate=evaluate,
      summary=lambda state: dict(
          method=config.method, batch_size=config.batch_size, iterations=int(state.step),
          devices=n_dev, peak_learning_rate=recipe.peak_learning_rate,
          warmup_steps=recipe.warmup_steps, wall_time=time.perf_counter() - start))
