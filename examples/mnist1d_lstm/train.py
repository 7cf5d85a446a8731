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

`fit` (the examples' loop) reads its batches through grain
(`date_optax.parallel.data_loader`) and checkpoints the iterator state with
the train state. `train` is the in-memory loop of the demo (`demo.py`) and of
the studies in `benchmarks/`: each epoch's permuted arrays go to the devices
at once and one jitted `lax.scan` runs the epoch, no checkpoints; that is
what makes grids of hundreds of short runs fast, so it does not use grain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
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
from examples.mnist1d_lstm import input_pipeline, methods, models


def make_baseline(config: ml_collections.ConfigDict) -> date_optax.Baseline:
  """The run tuned at `config.base_batch_size`."""
  return methods.make_baseline(
      config.solver, batch_size=config.base_batch_size,
      learning_rate=config.learning_rate, warmup_epochs=config.warmup_epochs,
      epochs=config.num_epochs, num_examples=config.num_train,
  )


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.Recipe]:
  """The optimizer for `config.method` at `config.batch_size`, and its recipe.

  `config.method` is one of "date", "baseline" or "linear" of
  `methods.scaled_run`; `config.ratio_bounds` (a pair, or None for
  `date_optax.date`'s default bounds rule) goes to DATE.
  """
  if config.method not in ("date", "baseline", "linear"):
    raise ValueError(
        f"config.method must be 'date', 'baseline' or 'linear', got {config.method!r}."
    )
  baseline = make_baseline(config)
  batch = config.batch_size
  options = {}
  if config.method == "date" and config.get("ratio_bounds") is not None:
    options = dict(zip(("lower", "upper"), config.ratio_bounds))
  tx, _ = methods.scaled_run(config.method, baseline, batch, **options)
  return tx, methods.scaled_recipe(config.method, baseline, batch)


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
  """The training loop shared with the MNIST example.

  Args:
    config: as for `train_and_evaluate`.
    workdir: output directory.
    data: the train and test arrays (labels int32).
    model: a flax module mapping a batch of `x` to logits.
    start: `time.perf_counter()` at the start, to count data loading.

  Resumable: checkpoints (parameters, optimizer state, step and the grain
  iterator's state) go to `workdir/checkpoints` every `config.checkpoint_every_steps`
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
  example = jnp.zeros((1, *data.x_train.shape[1:]), jnp.float32)
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

  test_set = {"x": data.x_test, "y": data.y_test}
  eval_batch = n_dev * max(1, 4096 // n_dev)
  steps_per_epoch = len(data.x_train) // config.batch_size
  total_steps = steps_per_epoch * config.num_epochs
  ckpt_every = config.get("checkpoint_every_steps") or steps_per_epoch

  # The training batches come from grain: a seeded shuffle of the training
  # set every epoch (epoch e = steps [e·S, (e+1)·S)), whose iterator state
  # is saved in each checkpoint and restored with it.
  source = dp.ArraySource({"x": data.x_train, "y": data.y_train})
  train_iter = iter(dp.data_loader(source, config.batch_size, seed=config.seed))
  step, accuracy = 0, float("nan")
  with contextlib.ExitStack() as stack:
    ckpt = stack.enter_context(CheckpointManager(
        os.path.join(workdir, "checkpoints"), max_to_keep=2, async_save=False))
    guard = stack.enter_context(PreemptionGuard())
    if ckpt.latest_step() is not None:
      # Resume: parameters, optimizer state, step and input position.
      state, meta = ckpt.restore(state)
      step, accuracy = meta["step"], meta["test_accuracy"]
      dp.restore_iterator(train_iter, meta.get("data"))
    writer = stack.enter_context(
        diagnostics.MetricWriter(workdir, tensorboard=None, resume_step=step))
    while step < total_steps:
      state, metrics = train_step(state, next(train_iter))
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
            "step": step, "epoch": epoch, "index": index, "test_accuracy": accuracy,
            "data": dp.iterator_state(train_iter)})
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


# ---------------------------------------------------------------------------
# The in-memory loop of the demo and the benchmarks.


@dataclasses.dataclass
class RunResult:
  """What one `train` run measured.

  Attributes:
    name: the method's label.
    batch_size: the global batch size.
    steps: optimizer steps taken.
    wall_time: seconds spent training and evaluating (compilation included).
    epochs: epoch numbers at which the test set was evaluated.
    test_accuracy: test accuracy (percent) at those epochs.
    train_loss: mean training loss of every epoch.
    learning_rate: the schedule's value at the last step of every epoch.
    step_learning_rate: the schedule's value at every step (for plots).
  """

  name: str
  batch_size: int
  steps: int
  wall_time: float
  epochs: list[int]
  test_accuracy: list[float]
  train_loss: list[float]
  learning_rate: list[float]
  step_learning_rate: np.ndarray

  @property
  def final_accuracy(self) -> float:
    return self.test_accuracy[-1]

  @property
  def diverged(self) -> bool:
    return not all(math.isfinite(v) for v in self.train_loss)


def train(
    data: input_pipeline.Dataset,
    *,
    optimizer: optax.GradientTransformation,
    batch_size: int,
    epochs: int,
    learning_rate: Callable[[Any], Any] | float | None = None,
    model: Any = None,
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    name: str = "",
    progress: Callable[[int, float], None] | None = None,
    eval_every_epoch: bool = True,
    eval_batch_size: int = 4096,
    steps_per_call: int | None = None,
) -> RunResult:
  """Trains `model` on `data` with `optimizer` for `epochs` epochs, in memory.

  Each epoch visits ``floor(n / batch_size)`` batches of a fresh permutation
  (the remainder is dropped) in one jitted ``lax.scan``, or in jitted calls
  of `steps_per_call` steps written out one after the other. A model with a
  ``batch_stats`` collection (batch norm) is called with ``train=True``
  while training and ``train=False`` for the test set, its statistics
  threaded through the scan. With a `mesh`, each epoch's batches are split
  along its ``"data"`` axis and the compiler inserts the gradient all-reduce.

  Args:
    data: the train and test arrays.
    optimizer: the optax transformation (its schedule counts steps from 0).
    batch_size: global batch size.
    epochs: number of passes over the training set.
    learning_rate: the schedule inside `optimizer`, only read for the
      learning-rate curve (a float for a constant).
    model: a flax module taking ``(x, train=...)``; default
      `models.LSTMClassifier()`.
    seed: seeds the initialisation and the data order.
    mesh: optional mesh with a ``"data"`` axis.
    name: label stored in the result.
    progress: called as ``progress(epoch, test_accuracy)`` after each
      evaluation.
    eval_every_epoch: evaluate after every epoch (else after the last only).
    eval_batch_size: batch size of the test-set evaluation.
    steps_per_call: ``None`` (default) runs each epoch as one ``lax.scan``;
      an integer ``n >= 1`` runs it as jitted calls of ``n`` unrolled steps
      (the last call takes the remainder), with no loop inside the compiled
      program. Use it for convolutions: XLA's CPU backend runs a convolution
      inside a loop body about 20x slower than outside one (measured on the
      MNIST-1D CNN of ``benchmarks/oracle.py``: 0.9 s against 0.04 s per step
      at batch 1024). The arithmetic is the same either way.

  Returns:
    A `RunResult`.
  """
  model = models.LSTMClassifier() if model is None else model
  n = data.num_train
  steps_per_epoch = n // batch_size
  if steps_per_epoch < 1:
    raise ValueError(f"batch_size={batch_size} exceeds the {n} training examples.")
  if steps_per_call is not None and (
      isinstance(steps_per_call, bool) or not isinstance(steps_per_call, int)
      or steps_per_call < 1):
    raise ValueError(f"steps_per_call must be None or an integer >= 1, got "
                     f"{steps_per_call!r}.")
  start = time.perf_counter()
  variables = model.init(jax.random.key(seed), jnp.asarray(data.x_train[:2]), train=True)
  params, stats = variables["params"], variables.get("batch_stats")
  opt_state = optimizer.init(params)

  def loss_fn(p, st, x, y):
    if st is None:
      logits, new_st = model.apply({"params": p}, x, train=True), None
    else:
      logits, upd = model.apply({"params": p, "batch_stats": st}, x, train=True,
                                mutable=["batch_stats"])
      new_st = upd["batch_stats"]
    # The loss in float32 whatever the compute dtype.
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), y).mean()
    return loss, new_st

  def train_epoch(p, st, s, xs, ys):
    def body(carry, batch):
      p, st, s = carry
      (loss, st), g = jax.value_and_grad(loss_fn, has_aux=True)(p, st, *batch)
      u, s = optimizer.update(g, s, p)
      return (optax.apply_updates(p, u), st, s), loss

    # unroll=True writes the steps out: no while loop in the program.
    (p, st, s), losses = jax.lax.scan(body, (p, st, s), (xs, ys),
                                      unroll=steps_per_call is not None)
    return p, st, s, jnp.sum(losses)

  def predict(p, st, x):
    v = {"params": p} if st is None else {"params": p, "batch_stats": st}
    return jnp.argmax(model.apply(v, x, train=False), axis=-1)

  train_epoch = jax.jit(train_epoch, donate_argnums=(0, 1, 2))
  predict = jax.jit(predict)
  batch_sharding = None
  if mesh is not None:
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, "data"))
    params, stats, opt_state = jax.device_put((params, stats, opt_state), replicated)

  def accuracy() -> float:
    correct = 0
    for i in range(0, len(data.x_test), eval_batch_size):
      pred = predict(params, stats, data.x_test[i : i + eval_batch_size])
      correct += int(np.sum(np.asarray(pred) == data.y_test[i : i + eval_batch_size]))
    return 100.0 * correct / len(data.x_test)

  rng = np.random.default_rng(seed)
  used = steps_per_epoch * batch_size
  evaluated, accs, losses, lrs = [], [], [], []
  for epoch in range(1, epochs + 1):
    order = rng.permutation(n)[:used]
    xs = data.x_train[order].reshape(steps_per_epoch, batch_size, *data.x_train.shape[1:])
    ys = data.y_train[order].reshape(steps_per_epoch, batch_size)
    if batch_sharding is not None:
      xs, ys = jax.device_put((xs, ys), batch_sharding)
    chunk = steps_per_call or steps_per_epoch
    loss = 0.0
    for i in range(0, steps_per_epoch, chunk):
      params, stats, opt_state, part = train_epoch(
          params, stats, opt_state, xs[i : i + chunk], ys[i : i + chunk])
      loss += part
    losses.append(float(loss) / steps_per_epoch)
    lrs.append(_lr_at(learning_rate, epoch * steps_per_epoch - 1))
    if eval_every_epoch or epoch == epochs:
      evaluated.append(epoch)
      accs.append(accuracy())
      if progress is not None:
        progress(epoch, accs[-1])
  total = epochs * steps_per_epoch
  return RunResult(
      name=name, batch_size=batch_size, steps=total,
      wall_time=time.perf_counter() - start, epochs=evaluated,
      test_accuracy=accs, train_loss=losses, learning_rate=lrs,
      step_learning_rate=_lr_curve(learning_rate, total),
  )


def _lr_at(learning_rate, count: int) -> float:
  if learning_rate is None:
    return float("nan")
  if callable(learning_rate):
    return float(learning_rate(count))
  return float(learning_rate)


def _lr_curve(learning_rate, total: int) -> np.ndarray:
  if learning_rate is None:
    return np.full(total, np.nan, np.float32)
  if callable(learning_rate):
    return np.asarray(jax.jit(jax.vmap(learning_rate))(jnp.arange(total)), np.float32)
  return np.full(total, float(learning_rate), np.float32)
