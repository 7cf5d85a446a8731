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

With `config.batch_schedule` ("adaptive" or "ramp") the global batch grows
from `base_batch_size` to `config.batch_size` during the run
(`date_optax.BatchSchedule`): the step (`grad_stats=True`) takes
`step.next_batch_size(state)` examples from a
`date_optax.parallel.GrowingBatches`, the learning rate is
`date_optax.date(baseline, config.batch_size, batch_schedule=...)` (the
baseline's schedule counted in examples, times the batch scale: linear for
the SGD family, square root for Adam), and the run trains on the same
`num_epochs · num_train` examples in however many steps the schedule takes.
Every run draws the global batch and the learning rate against the step
into `workdir/batch_and_lr.png`.
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
from examples import _loop, _plots
from examples.mnist1d_lstm import input_pipeline, models


def make_baseline(config: ml_collections.ConfigDict) -> date_optax.Baseline:
  """The run tuned at `config.base_batch_size`: `config.solver` ("adam", or heavy ball 0.9)."""
  return date_optax.Baseline(
      batch_size=config.base_batch_size, learning_rate=config.learning_rate,
      warmup_epochs=config.warmup_epochs, epochs=config.num_epochs,
      num_examples=config.num_train, optimizer=config.solver,
      optimizer_options={"momentum": 0.9} if config.solver == "momentum" else {},
  )


#: The values of `config.batch_schedule`: None (a fixed batch) or a growing one.
BATCH_SCHEDULES = (None, "adaptive", "ramp")
#: The most increments of a ramp whose `config.ramp_increment` is None.
RAMP_INCREMENTS = 7
#: The solvers whose learning rate grows linearly with the batch (else √).
LINEAR_SOLVERS = ("sgd", "momentum", "nesterov")


def make_batch_schedule(config: ml_collections.ConfigDict) -> date_optax.BatchSchedule | None:
  """The growing batch of `config.batch_schedule`, from `base_batch_size` to `batch_size`.

  None keeps the batch fixed at `config.batch_size`. "adaptive" is
  `BatchSchedule.adaptive` with its defaults (double the batch when the
  measured noise scale B_simple reaches twice the batch); `batch_size` must
  be `base_batch_size` times a power of 2. "ramp" is Megatron-LM's ramp over
  the first `config.ramp_examples` examples (None: the first quarter of the
  run's), in steps of `config.ramp_increment` (None: the fewest equal steps
  of a whole number of base batches, at most 7: 9·B0 for 64·B0).

  Args:
    config: reads `batch_schedule`, `base_batch_size`, `batch_size`,
      `num_train`, `num_epochs` and, for a ramp, `ramp_examples` and
      `ramp_increment` (all but the first three optional).

  Returns:
    A `date_optax.BatchSchedule`, or None for a fixed batch.

  Raises:
    ValueError: `config.batch_schedule` is not one of `BATCH_SCHEDULES`, or
      the schedule's own checks fail (the message names the setting).

  Examples:
    >>> from examples.mnist1d_lstm.configs import adaptive
    >>> make_batch_schedule(adaptive.get_config()).batch_sizes
    (16, 32, 64, 128, 256, 512, 1024)
  """
  kind = _loop.batch_schedule_kind(config, BATCH_SCHEDULES)
  start, top = config.base_batch_size, config.batch_size
  if kind is None:
    return None
  if kind == "adaptive":
    return date_optax.BatchSchedule.adaptive(start, max_batch=top)
  total = config.num_epochs * config.num_train
  ramp_examples = config.get("ramp_examples") or max(1, total // 4)
  increment = config.get("ramp_increment")
  if increment is None:
    bases = max(1, (top - start) // start)  # the ramp's length in base batches
    parts = max(d for d in range(1, RAMP_INCREMENTS + 1) if bases % d == 0)
    increment = max(1, (top - start) // parts)
  schedule = date_optax.BatchSchedule.ramp(start, increment, ramp_examples, max_batch=top)
  schedule.check_run(total)
  return schedule


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.Recipe]:
  """The optimizer for `config.method` at `config.batch_size`, and its recipe.

  "date" is `date_optax.date` (with `config.ratio_bounds`, a pair, or None
  for its default bounds rule); "baseline" the plain solver on DATE's
  schedule; "linear" the plain solver with the learning rate scaled by k and
  a 5-epoch warmup (Goyal et al. 2017). The plain solver records its
  learning rate (`optax.inject_hyperparams`) for the step's metrics.

  With a growing batch (`make_batch_schedule`), "date" is
  `date_optax.date(baseline, config.batch_size, batch_schedule=...)` with
  `lr_scaling` "linear" for the SGD family and "sqrt" otherwise (as
  benchmarks/batch_growth.py); the recipe is DATE's at the largest batch
  (its peak learning rate is the one the run reaches there).
  """
  if config.method not in ("date", "baseline", "linear"):
    raise ValueError(
        f"config.method must be 'date', 'baseline' or 'linear', got {config.method!r}."
    )
  baseline, batch = make_baseline(config), config.batch_size
  schedule = make_batch_schedule(config)
  if schedule is not None:
    if config.method != "date":
      raise ValueError(
          f"config.batch_schedule={config.batch_schedule!r} needs config.method='date' "
          f"(the learning rate follows the batch), got {config.method!r}.")
    rule = "linear" if config.solver in LINEAR_SOLVERS else "sqrt"
    bounds = config.get("ratio_bounds")
    options = {} if bounds is None else dict(zip(("lower", "upper"), bounds))
    tx = date_optax.date(baseline, batch, batch_schedule=schedule, lr_scaling=rule,
                         **options)
    return tx, date_optax.date_recipe(baseline, batch, lr_scaling=rule)
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


def make_train_step(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, model: Any,
                    tx: optax.GradientTransformation,
                    schedule: date_optax.BatchSchedule | None) -> dp.TrainStep:
  """The example's step: cross-entropy of `model`, fixed or growing batch.

  A growing batch measures the noise statistics, which compare two or more
  gradients per step: on one device, two microbatches.
  """

  def loss_fn(p, batch):
    logits = model.apply(p, batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

  if schedule is None:
    return dp.make_train_step(loss_fn, tx, mesh)
  return dp.make_train_step(loss_fn, tx, mesh, grad_stats=True,
                            microbatches=2 if mesh.devices.size == 1 else 1,
                            batch_schedule=schedule,
                            max_rows_per_device=config.get("max_rows_per_device"))


def train_steps(config: ml_collections.ConfigDict) -> list[int | None]:
  """Steps each `compile_target` program trains for (``date-optax plan``):
  ``num_epochs`` epochs at a fixed batch; None for each size of a growing
  batch, whose steps depend on the noise the run measures."""
  schedule = make_batch_schedule(config)
  if schedule is not None:
    return [None] * len(schedule.batch_sizes)
  return [config.num_train // config.batch_size * config.num_epochs]


def compile_target(config: ml_collections.ConfigDict, tpu: dp.TpuSlice, model: Any = None,
                   input_shape: tuple[int, ...] = (40,)) -> list:
  """The example's train step on `tpu`'s devices, abstract (``date-optax compile``).

  Args:
    config: the run's config.
    tpu: the `date_optax.parallel.TpuSlice`.
    model: the module (default: this example's LSTM).
    input_shape: one example's signal shape (MNIST-1D: 40 samples).

  Returns:
    ``[(name, step, state, batch)]``: one program per batch size of the
    batch schedule (one for a fixed batch).
  """
  mesh = tpu.data_mesh()
  model = model or models.LSTMClassifier(hidden_size=config.hidden_size, chunk=config.chunk)
  schedule = make_batch_schedule(config)
  tx, _ = make_optimizer(config)
  step = make_train_step(config, mesh, model, tx, schedule)
  params = jax.eval_shape(model.init, jax.random.key(config.seed),
                          jax.ShapeDtypeStruct((1, *input_shape), jnp.float32))
  state = step.abstract_state(params)
  sizes = schedule.batch_sizes if schedule is not None else (config.batch_size,)
  return [(f"batch {b}", step, state, step.abstract_batch(
      {"x": jax.ShapeDtypeStruct((b, *input_shape), jnp.float32),
       "y": jax.ShapeDtypeStruct((b,), jnp.int32)})) for b in sizes]


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
  schedule = make_batch_schedule(config)
  tx, recipe = make_optimizer(config)
  params = model.init(jax.random.key(config.seed),
                      jnp.zeros((1, *data.x_train.shape[1:]), jnp.float32))

  def metric_fn(params, batch):
    return {"accuracy": jnp.argmax(model.apply(params, batch["x"]), -1) == batch["y"]}

  num_train = len(data.x_train)
  steps_per_epoch = num_train // config.batch_size
  test_set = {"x": data.x_test, "y": data.y_test}

  def epoch_of(state) -> float:
    if schedule is None:
      return int(state.step) // steps_per_epoch
    # Epochs of examples, fractional: a growing batch's steps end mid-epoch.
    return round(state.batch_schedule.num_examples() / num_train, 3)

  def evaluate(state) -> dict[str, float]:
    out = dp.evaluate(metric_fn, state.params, test_set, mesh,
                      batch_size=n_dev * max(1, 4096 // n_dev))
    return {"test_accuracy": 100.0 * out["accuracy"], "epoch": epoch_of(state)}

  # A seeded shuffle of the training set every epoch, read through grain.
  source = dp.ArraySource({"x": data.x_train, "y": data.y_train})
  train_step = make_train_step(config, mesh, model, tx, schedule)
  if schedule is None:
    batches = iter(dp.data_loader(source, config.batch_size, seed=config.seed))
    budget = dict(total_steps=steps_per_epoch * config.num_epochs,
                  eval_every=steps_per_epoch)
  else:
    # The noise statistics compare two or more gradients per step: on one
    # device, two microbatches. The data comes in chunks of the gcd of the
    # schedule's batches; a step takes as many as it needs.
    batches = dp.GrowingBatches(
        iter(dp.data_loader(source, schedule.chunk_size, seed=config.seed)),
        schedule.chunk_size)
    budget = dict(total_examples=config.num_epochs * num_train,
                  eval_every_examples=num_train)

  def summary(state) -> dict[str, Any]:
    if schedule is None:
      return dict(
          method=config.method, batch_size=config.batch_size, iterations=int(state.step),
          devices=n_dev, peak_learning_rate=recipe.peak_learning_rate,
          warmup_steps=recipe.warmup_steps, wall_time=time.perf_counter() - start)
    # The batch of the last step and every batch the schedule allows.
    return dict(
        method=config.method, batch_schedule=schedule.kind,
        batch_size=_loop.host_int(state.batch_schedule.batch_size),
        max_batch_size=schedule.max_batch, batch_sizes=list(schedule.batch_sizes),
        iterations=int(state.step), devices=n_dev, wall_time=time.perf_counter() - start)

  result = _loop.train_loop(config, workdir, train_step, train_step.init(params), batches,
                            evaluate=evaluate, summary=summary, **budget)
  if "preempted_at_step" not in result:
    _plots.write_batch_and_lr(workdir, batch_size=config.batch_size,
                              title=_plot_title(config, schedule, result))
  return result


def _plot_title(config: ml_collections.ConfigDict, schedule: date_optax.BatchSchedule | None,
                result: dict[str, Any]) -> str:
  """The figure's title: the run's batch, solver and final accuracy."""
  batch = (f"batch {config.batch_size}" if schedule is None else
           f"{schedule.kind} batch {schedule.start}..{schedule.max_batch}")
  return (f"{config.solver}, {batch}: "
          f"{result['test_accuracy']:.2f} % in {result['steps']} steps")
