"""An LSTM on MNIST-1D: the training behind ``date-optax demo`` and benchmarks/.

Private. MNIST-1D (Greydanus 2020) is generated locally by the ``mnist1d``
package (no download): 40-sample 1-D signals of the ten digits. The model
reads each signal as a sequence of ``40 / chunk`` steps of ``chunk`` samples
(the papers' MNIST-LSTM reads 28 rows of 28 pixels the same way), so a run of
tens of epochs fits a 2-core CPU.

Training runs one jitted ``lax.scan`` per epoch over a batch array sharded
along a ``"data"`` mesh axis when a mesh is given: the gradient of the global
batch is then computed data-parallel across the (emulated) devices, and the
compiler inserts the all-reduce.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

SEQ_LEN = 40
NUM_CLASSES = 10


class Dataset(NamedTuple):
  """MNIST-1D arrays: signals float32 ``(N, 40)``, labels int32 ``(N,)``."""

  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray

  @property
  def num_train(self) -> int:
    return int(self.x_train.shape[0])


def load_mnist1d(
    num_train: int, num_test: int, *, seed: int = 0, cache_dir: str | None = None
) -> Dataset:
  """Generates MNIST-1D locally with the ``mnist1d`` package (no download).

  The package draws from NumPy's global generator (``np.random.seed``); its
  state is saved and restored around the call so callers' streams are
  untouched. With `cache_dir`, the arrays are kept in an ``.npz`` there and
  re-read on the next call with the same sizes and seed (generation runs a
  Python loop per example: about 2 s per 10k examples).

  Args:
    num_train: training examples (a multiple of 10 keeps classes balanced).
    num_test: test examples.
    seed: the generator's seed.
    cache_dir: optional directory for the ``.npz`` cache.

  Returns:
    A :class:`Dataset`.
  """
  import os  # noqa: PLC0415

  total = num_train + num_test
  path = None
  if cache_dir is not None:
    path = os.path.join(cache_dir, f"mnist1d_{num_train}_{num_test}_seed{seed}.npz")
    if os.path.exists(path):
      with np.load(path) as f:
        return Dataset(f["x_train"], f["y_train"], f["x_test"], f["y_test"])
  import random  # noqa: PLC0415

  from mnist1d.data import get_dataset_args, make_dataset  # noqa: PLC0415

  args = get_dataset_args()
  # make_dataset makes num_samples // 10 examples per class.
  args.num_samples = int(math.ceil(total / NUM_CLASSES) * NUM_CLASSES)
  args.train_split = 1.0
  args.seed = seed
  np_state, py_state = np.random.get_state(), random.getstate()
  try:
    raw = make_dataset(args)
  finally:
    np.random.set_state(np_state)
    random.setstate(py_state)
  x = np.asarray(raw["x"], np.float32)
  y = np.asarray(raw["y"], np.int32)
  data = Dataset(x[:num_train], y[:num_train], x[num_train:total], y[num_train:total])
  if path is not None:
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **data._asdict())
    os.replace(tmp, path)
  return data


class LSTMClassifier(nn.Module):
  """One LSTM layer over the chunked signal, then a linear classifier.

  Attributes:
    hidden_size: LSTM units.
    chunk: signal samples per time step (must divide the signal length).
    num_classes: output classes.
  """

  hidden_size: int = 64
  chunk: int = 4
  num_classes: int = NUM_CLASSES

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1, self.chunk)
    h = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size), name="lstm")(x)
    return nn.Dense(self.num_classes, name="head")(h[:, -1])


@dataclasses.dataclass
class RunResult:
  """What one training run measured.

  Attributes:
    name: the method's label.
    batch_size: the global batch size.
    steps: optimizer steps taken.
    wall_time: seconds spent training and evaluating (compilation included).
    epochs: epoch numbers ``1..E`` at which the curves were sampled.
    test_accuracy: test accuracy (percent) after each epoch.
    train_loss: mean training loss of each epoch.
    learning_rate: the schedule's value at the last step of each epoch.
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


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  # Loss in float32 whatever the compute dtype.
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels
  ).mean()


def train(
    data: Dataset,
    *,
    optimizer: optax.GradientTransformation,
    batch_size: int,
    epochs: int,
    learning_rate: Callable[[Any], Any] | float | None = None,
    model: nn.Module | None = None,
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    name: str = "",
    progress: Callable[[int, float], None] | None = None,
    eval_batch_size: int = 4096,
) -> RunResult:
  """Trains `model` on `data` with `optimizer` for `epochs` epochs.

  Each epoch visits ``floor(n / batch_size)`` batches of a fresh permutation
  (the remainder is dropped, so pick ``n`` divisible by the batch sizes).

  Args:
    data: the :class:`Dataset`.
    optimizer: the optax transformation (its schedule counts steps from 0).
    batch_size: global batch size.
    epochs: number of passes over the training set.
    learning_rate: the schedule inside `optimizer`, only read for the
      learning-rate curve (a float for a constant).
    model: default :class:`LSTMClassifier`.
    seed: seeds the initialisation and the data order.
    mesh: optional mesh with a ``"data"`` axis; batches are split along it.
    name: label stored in the result.
    progress: called as ``progress(epoch, test_accuracy)`` after each epoch.
    eval_batch_size: batch size of the test-set evaluation.

  Returns:
    A :class:`RunResult`.
  """
  model = LSTMClassifier() if model is None else model
  n = data.num_train
  steps_per_epoch = n // batch_size
  if steps_per_epoch < 1:
    raise ValueError(f"batch_size={batch_size} exceeds the {n} training examples.")
  start = time.perf_counter()
  key = jax.random.key(seed)
  params = model.init(key, jnp.zeros((1, SEQ_LEN), jnp.float32))
  opt_state = optimizer.init(params)

  def loss_fn(p, x, y):
    return _cross_entropy(model.apply(p, x), y)

  def train_epoch(params, opt_state, xs, ys):
    def body(carry, batch):
      p, s = carry
      loss, grads = jax.value_and_grad(loss_fn)(p, *batch)
      updates, s = optimizer.update(grads, s, p)
      return (optax.apply_updates(p, updates), s), loss

    (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (xs, ys))
    return params, opt_state, jnp.mean(losses)

  def predict(params, x):
    return jnp.argmax(model.apply(params, x), axis=-1)

  train_epoch = jax.jit(train_epoch, donate_argnums=(0, 1))
  predict = jax.jit(predict)
  batch_sharding = None
  if mesh is not None:
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(None, "data")
    )
    params, opt_state = jax.device_put((params, opt_state), replicated)

  rng = np.random.default_rng(seed)
  used = steps_per_epoch * batch_size
  accs, losses, lrs = [], [], []
  for epoch in range(1, epochs + 1):
    order = rng.permutation(n)[:used]
    xs = data.x_train[order].reshape(steps_per_epoch, batch_size, SEQ_LEN)
    ys = data.y_train[order].reshape(steps_per_epoch, batch_size)
    if batch_sharding is not None:
      xs, ys = jax.device_put((xs, ys), batch_sharding)
    params, opt_state, loss = train_epoch(params, opt_state, xs, ys)
    acc = _accuracy(predict, params, data.x_test, data.y_test, eval_batch_size)
    accs.append(acc)
    losses.append(float(loss))
    lrs.append(_lr_at(learning_rate, epoch * steps_per_epoch - 1))
    if progress is not None:
      progress(epoch, acc)
  wall = time.perf_counter() - start
  total = epochs * steps_per_epoch
  return RunResult(
      name=name,
      batch_size=batch_size,
      steps=total,
      wall_time=wall,
      epochs=list(range(1, epochs + 1)),
      test_accuracy=accs,
      train_loss=losses,
      learning_rate=lrs,
      step_learning_rate=_lr_curve(learning_rate, total),
  )


def _accuracy(predict, params, x, y, batch_size: int) -> float:
  correct = 0
  for i in range(0, x.shape[0], batch_size):
    pred = predict(params, x[i : i + batch_size])
    correct += int(np.sum(np.asarray(pred) == y[i : i + batch_size]))
  return 100.0 * correct / x.shape[0]


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


# ---------------------------------------------------------------------------
# Recipes: a baseline tuned at B0 and the ways of scaling it to B.


@dataclasses.dataclass(frozen=True)
class TunedBaseline:
  """What was tuned at the baseline batch size ``B0``.

  Attributes:
    solver: ``"momentum"`` (heavy ball, 0.9) or ``"adam"``.
    batch_size: ``B0``.
    learning_rate: ``η0``, the peak learning rate at ``B0``.
    warmup_epochs: ``w0``, gradual warmup length at ``B0`` in epochs.
    epochs: ``E``, the same for every batch size.
    num_examples: ``n``, training examples per epoch.
  """

  solver: str
  batch_size: int
  learning_rate: float
  warmup_epochs: float
  epochs: int
  num_examples: int


#: Methods of scaling a tuned baseline to a larger batch (benchmarks/, demo).
METHODS = ("baseline", "linear", "adam", "legw", "date")

METHOD_LABELS = {
    "baseline": "baseline solver, sqrt LR + LEGW warmup, no ratio",
    "linear": "linear LR scaling + 5-epoch warmup (Goyal)",
    "adam": "Adam, constant LR tuned at B0, sqrt-scaled",
    "legw": "LEGW (sqrt LR, warmup x k, poly-2 decay)",
    "date": "DATE (date_optax.date)",
}


def baseline_of(tuned: TunedBaseline, **changes: Any):
  """The :class:`date_optax.Baseline` of `tuned` (roller-coaster decay)."""
  import date_optax  # noqa: PLC0415

  fields = dict(
      batch_size=tuned.batch_size, learning_rate=tuned.learning_rate,
      warmup_epochs=tuned.warmup_epochs, epochs=tuned.epochs,
      num_examples=tuned.num_examples, optimizer=tuned.solver,
      optimizer_options={"momentum": 0.9} if tuned.solver == "momentum" else {},
  )
  fields.update(changes)
  return date_optax.Baseline(**fields)


def scaled_run(
    method: str, tuned: TunedBaseline, batch_size: int
) -> tuple[optax.GradientTransformation, Callable[[Any], Any]]:
  """The optimizer and its learning-rate schedule for `method` at `batch_size`.

  With ``k = B / B0`` (every duration from :func:`date_optax.scale_recipe`):

  - ``"baseline"``: the plain solver (``Baseline.solver``) on DATE's schedule
    (sqrt LR, LEGW warmup, roller-coaster decay); at ``k = 1`` this is the
    tuned baseline itself.
  - ``"linear"``: the plain solver, peak ``η0·k``, 5-epoch gradual warmup,
    roller-coaster decay (Goyal et al. 2017, with the baseline's decay so
    that only the scaling rule differs).
  - ``"adam"``: Adam at the constant learning rate ``η0·sqrt(k)``.
  - ``"legw"``: the plain solver, peak ``η0·sqrt(k)``, warmup ``w0·k``
    epochs, poly decay of power 2 (LEGW; docs/algorithms.md, "Learning-rate scaling and LEGW").
  - ``"date"``: :func:`date_optax.date` of the baseline.
  """
  import date_optax  # noqa: PLC0415

  k = batch_size / tuned.batch_size
  baseline = baseline_of(tuned)
  if method == "adam":
    sched = optax.constant_schedule(tuned.learning_rate * math.sqrt(k))
    return optax.adam(sched), sched
  if method == "date":
    recipe = date_optax.date_recipe(baseline, batch_size)
    return date_optax.date(baseline, batch_size), recipe.schedule
  if method == "baseline":
    recipe = date_optax.date_recipe(baseline, batch_size)
  elif method == "linear":
    recipe = date_optax.scale_recipe(
        baseline_of(tuned, warmup_epochs=5.0), batch_size,
        lr_scaling="linear", warmup_scaling="none",
    )
  elif method == "legw":
    recipe = date_optax.scale_recipe(
        baseline, batch_size, decay=date_optax.schedules.Poly(power=2)
    )
  else:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
  return baseline.solver(recipe.schedule), recipe.schedule
