"""ResNet-50 on ImageNet, data-parallel over every device of a TPU slice.

One `("data",)` mesh over all devices of all hosts
(`date_optax.parallel.data_mesh`); each host feeds its share of the global
batch, and the step is the library's
(`date_optax.parallel.make_train_step`): each device computes the gradient
of its slice, one all-reduce averages them, and steps with a NaN/Inf
gradient are skipped. Batch norm's `batch_stats` are the step's model state:
statistics are taken inside each device (ghost batches of
`ghost_batch_size`), and the running averages are averaged over the devices
after every step, so they stay replicated. Evaluation is
`date_optax.parallel.evaluate` (padded, masked, exact). The optimizer is
LARS on the LEGW recipe or `date_optax.date` (see configs/default.py), with
the usual skip list: no trust ratio and no weight decay on biases and BN
parameters.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

import date_optax
import date_optax.parallel as dp
from examples import _loop
from examples.resnet50_imagenet import input_pipeline, models


def make_baseline(config: ml_collections.ConfigDict) -> date_optax.Baseline:
  """The LEGW baseline at `base_batch_size` (LARS learning rates)."""
  return date_optax.Baseline(
      batch_size=config.base_batch_size,
      learning_rate=config.base_learning_rate,
      warmup_epochs=config.base_warmup_epochs,
      epochs=config.num_epochs,
      num_examples=config.num_train_examples,
      decay=date_optax.schedules.Poly(power=config.poly_power),
      optimizer="momentum",
      optimizer_options={"momentum": config.momentum},
  )


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.Recipe]:
  """The optimizer at `config.batch_size` and the recipe it follows.

  "lars": LARS on the LEGW recipe of the baseline; "date": `date_optax.date`
  of the momentum baseline in `config.date_baseline`, on its DATE recipe.
  """
  if config.optimizer not in ("lars", "date"):
    raise ValueError(f"config.optimizer must be 'lars' or 'date', got {config.optimizer!r}.")
  baseline = make_baseline(config)
  skip = date_optax.exclude_bias_and_norm
  if config.optimizer == "lars":
    recipe = date_optax.scale_recipe(baseline, config.batch_size)
    return date_optax.lars(
        recipe.schedule, weight_decay=config.weight_decay, momentum=config.momentum,
        trust_coefficient=config.trust_coefficient, trust_ratio_mask=skip,
    ), recipe
  d = config.date_baseline
  baseline = dataclasses.replace(
      baseline, learning_rate=d.learning_rate, warmup_epochs=d.warmup_epochs,
      decay="roller_coaster",
  )
  recipe = date_optax.date_recipe(baseline, config.batch_size)
  return date_optax.date(
      baseline, config.batch_size, learning_rate=recipe.schedule,
      weight_decay=d.weight_decay, weight_decay_mask=skip, trust_ratio_mask=skip,
  ), recipe


def create_model(config: ml_collections.ConfigDict, num_replicas: int) -> models.ResNet:
  """The model one replica runs on its `batch_size / num_replicas` examples."""
  per_device = config.batch_size // num_replicas
  if config.batch_size % num_replicas or per_device % config.ghost_batch_size:
    raise ValueError(
        f"config.batch_size={config.batch_size} must split into {num_replicas} "
        f"device shares that are multiples of config.ghost_batch_size="
        f"{config.ghost_batch_size}."
    )
  return models.MODELS[config.model](
      num_classes=config.num_classes,
      dtype=jnp.bfloat16 if config.half_precision else jnp.float32,
      ghost_batch_size=config.ghost_batch_size,
      bn_momentum=config.bn_momentum,
  )


def make_train_step(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
  """The example's model, train step and recipe on `mesh` (every axis data).

  Returns:
    ``(model, step, recipe)``: the ResNet one replica runs, the
    `date_optax.parallel.make_train_step` step (LARS or DATE, ghost BN
    statistics as the model state) and the learning-rate recipe.
  """
  model = create_model(config, mesh.devices.size)
  tx, recipe = make_optimizer(config)

  def loss_fn(params, batch, model_state):
    logits, new_vars = model.apply(
        {"params": params, "batch_stats": model_state}, batch["image"],
        train=True, mutable=["batch_stats"],
    )
    labels = optax.smooth_labels(
        jax.nn.one_hot(batch["label"], config.num_classes), config.label_smoothing)
    loss = optax.softmax_cross_entropy(logits, labels).mean()  # float32 logits
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return loss, (new_vars["batch_stats"], {"accuracy": accuracy})

  step = dp.make_train_step(loss_fn, tx, mesh, has_aux=True,
                            shard_update=config.get("shard_update", False),
                            grad_sync=_loop.make_grad_sync(config))
  return model, step, recipe


def make_mesh(config: ml_collections.ConfigDict, tpu: dp.TpuSlice | None = None
              ) -> jax.sharding.Mesh:
  """Every device on one "data" axis; for the "torus" all-reduce an X x Y mesh;
  over `config.num_slices` > 1 slices a ("slice", "data") mesh.

  X is the slice's first torus axis (`tpu`), or on the devices at hand the
  largest divisor of their number up to its square root.
  """
  torus = config.grad_sync.algorithm == "torus"
  if tpu is not None:
    return tpu.torus_mesh() if torus else tpu.data_mesh()
  slices = int(config.get("num_slices", 1))
  if slices > 1:  # a Multislice job (or emulated slices): a "slice" axis outermost
    return dp.multislice_mesh((jax.device_count() // slices,), ("data",), num_slices=slices)
  if not torus:
    return dp.data_mesh()
  n = jax.device_count()
  x = max(d for d in range(1, int(n**0.5) + 1) if n % d == 0)
  return dp.torus_mesh(x, n // x)


def init_variables(config: ml_collections.ConfigDict, model: models.ResNet,
                   num_replicas: int, abstract: bool = False) -> Any:
  """The model's ``{"params", "batch_stats"}`` (shapes only with `abstract`)."""
  shape = (config.batch_size // num_replicas, config.image_size, config.image_size, 3)
  init = lambda key: model.init(key, jnp.zeros(shape, jnp.float32), train=False)  # noqa: E731
  key = jax.random.key(config.seed)
  return jax.eval_shape(init, key) if abstract else jax.jit(init)(key)


def train_steps(config: ml_collections.ConfigDict) -> list[int]:
  """Steps each `compile_target` program trains for: the recipe's whole run
  at `config.batch_size` (``date-optax plan`` prices them)."""
  return [make_optimizer(config)[1].total_steps]


def compile_target(config: ml_collections.ConfigDict, tpu: dp.TpuSlice) -> list:
  """The example's train step on `tpu`'s devices, abstract (``date-optax compile``).

  Returns:
    ``[(name, step, state, batch)]``: one program, the step at
    `config.batch_size` over a data mesh of every device of the slice.
  """
  mesh = make_mesh(config, tpu)
  model, step, _ = make_train_step(config, mesh)
  variables = init_variables(config, model, mesh.devices.size, abstract=True)
  state = step.abstract_state(variables["params"], model_state=variables["batch_stats"])
  size = config.image_size
  image_dtype = jnp.bfloat16 if config.half_precision else jnp.float32
  batch = {"image": jax.ShapeDtypeStruct((config.batch_size, size, size, 3), image_dtype),
           "label": jax.ShapeDtypeStruct((config.batch_size,), jnp.int32)}
  return [(f"train (batch {config.batch_size})", step, state, step.abstract_batch(batch))]


def _eval_chunks(config):
  """The evaluation set in chunks of `eval_batch_size`, the same on every host."""
  chunks = input_pipeline.eval_chunks(config)
  return chunks if config.steps_per_eval <= 0 else itertools.islice(
      chunks, config.steps_per_eval)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains and evaluates; checkpoints to and resumes from `workdir`.

  Args:
    config: the hyperparameters (configs/*.py).
    workdir: checkpoints (`workdir/checkpoints`), `metrics.csv` and
      `results.json` (written by host 0); a local path or gs://.

  Resumable: a run restarts from the newest complete checkpoint in
  `workdir/checkpoints` (parameters, BN statistics, optimizer state, step,
  and every host's grain iterator state in its metadata). On SIGTERM or
  SIGINT every host finishes its step, they save the same step, and the
  function returns; rerunning the same command resumes. The resumed run
  reads exactly the batches (random crops and flips included) of an
  uninterrupted one and ends bit-identical to it on the same device count
  (`params_checksum` in `results.json`). A checkpoint whose iterator state
  belongs to another pipeline (seed, process count, dataset) is refused.

  Returns:
    The last train and eval metrics, the number of steps and the checksum of
    the final parameters and BN statistics, or `{"preempted_at_step": s}`
    after a signal.
  """
  start = time.perf_counter()
  mesh = make_mesh(config)
  num_replicas = jax.device_count()
  model, step_fn, recipe = make_train_step(config, mesh)
  total_steps = recipe.total_steps if config.num_train_steps <= 0 else config.num_train_steps
  # Checked first: a batch that does not divide over the hosts, or a data
  # directory in the wrong layout, fails before anything compiles.
  loader = input_pipeline.train_loader(config)

  def metric_fn(variables, batch):
    logits = model.apply(variables, batch["image"], train=False)
    return {"accuracy": jnp.argmax(logits, -1) == batch["label"]}

  variables = init_variables(config, model, num_replicas)
  state = step_fn.init(variables["params"], model_state=variables["batch_stats"])

  def evaluate(state) -> dict[str, float]:
    variables = {"params": state.params, "batch_stats": state.model_state}
    correct = count = 0.0
    for chunk in _eval_chunks(config):
      n = len(chunk["label"])
      out = dp.evaluate(metric_fn, variables, chunk, mesh, batch_size=config.eval_batch_size)
      correct += out["accuracy"] * n
      count += n
    return {"eval_accuracy": correct / max(count, 1.0)}

  if jax.process_index() == 0:
    print(f"{config.model}: batch {config.batch_size} on {num_replicas} devices "
          f"({jax.process_count()} hosts), peak lr {recipe.peak_learning_rate:.4g}, "
          f"warmup {recipe.warmup_steps} of {recipe.total_steps} steps", flush=True)
  # Every host's grain iterator position is saved with the state.
  batches = dp.prefetch_to_device(iter(loader), step_fn.batch_sharding)
  return _loop.train_loop(
      config, workdir, step_fn, state, batches, total_steps=total_steps,
      eval_every=max(1, round(config.eval_every_epochs * recipe.steps_per_epoch)),
      evaluate=evaluate, summary=lambda state: {"wall_time": time.perf_counter() - start})
