"""The in-memory trainer of the studies and of `make demo`: one jitted epoch.

Each epoch's permuted arrays go to the devices at once and one jitted
`lax.scan` runs the epoch (or jitted calls of a few unrolled steps), with no
checkpoints: that is what makes grids of hundreds of short runs fast. The
examples train through `date_optax.parallel.make_train_step` and grain
instead (`examples/_loop.py`), resumably.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks.tasks import data as data_lib
from benchmarks.tasks import models


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
    data: data_lib.Dataset,
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
