"""ResNet-50 on ImageNet, data-parallel over every device of a TPU slice.

One `("data",)` mesh over all devices of all hosts
(`date_optax.parallel.data_mesh`); each host feeds its share of the global
batch (`date_optax.parallel.host_local_to_global`), and the step runs under
`jax.jit` with the batch sharded and the state replicated, so the compiler
inserts one gradient all-reduce per step. (The step is written here rather
than taken from `date_optax.parallel.make_train_step` because batch norm
carries mutable `batch_stats` next to the parameters.) Batch norm statistics
stay inside each device (ghost batches of `ghost_batch_size`). The optimizer
is LARS on the LEGW recipe or `date_optax.date` (see configs/default.py),
with the usual skip list: no trust ratio and no weight decay on biases and
BN parameters.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import date_optax
import date_optax.parallel as dp
from date_optax import diagnostics
from examples.resnet50_imagenet import input_pipeline, models


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  batch_stats: Any
  opt_state: Any


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
  """The optimizer at `config.batch_size` and the recipe it follows."""
  baseline = make_baseline(config)
  skip = date_optax.exclude_bias_and_norm
  if config.optimizer == "lars":
    recipe = date_optax.scale_recipe(baseline, config.batch_size)
    tx = date_optax.lars(
        recipe.schedule, weight_decay=config.weight_decay, momentum=config.momentum,
        trust_coefficient=config.trust_coefficient, trust_ratio_mask=skip,
    )
    return tx, recipe
  if config.optimizer == "date":
    d = config.date_baseline
    baseline = dataclasses.replace(
        baseline, learning_rate=d.learning_rate, warmup_epochs=d.warmup_epochs,
        decay="roller_coaster",
    )
    recipe = date_optax.date_recipe(baseline, config.batch_size)
    tx = date_optax.date(
        baseline, config.batch_size, weight_decay=d.weight_decay,
        weight_decay_mask=skip, trust_ratio_mask=skip,
    )
    return tx, recipe
  raise ValueError(f"config.optimizer must be 'lars' or 'date', got {config.optimizer!r}.")


def create_model(config: ml_collections.ConfigDict, num_replicas: int) -> models.ResNet:
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
      num_replicas=num_replicas,
      bn_momentum=config.bn_momentum,
  )


def _global_batch(batch: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  # Each host passes its rows; the global array spans all hosts' devices.
  return dp.host_local_to_global(batch, sharding)


def _batches(config, local_batch: int, train: bool):
  if config.dataset == "fake":
    it = input_pipeline.fake_batches(
        local_batch, config.image_size, config.num_classes,
        seed=config.seed + (0 if train else 1) + 7 * jax.process_index(),
    )
    if train:
      return it
    return ({**b, "mask": np.ones(local_batch, np.float32)} for b in it)
  return input_pipeline.imagenet_batches(
      split="train" if train else "validation", batch_size=local_batch,
      image_size=config.image_size, data_dir=config.data_dir, train=train,
      dtype="bfloat16" if config.half_precision else "float32", seed=config.seed,
  )


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains and evaluates; checkpoints to and resumes from `workdir`.

  Args:
    config: the hyperparameters (configs/*.py).
    workdir: checkpoints (`workdir/checkpoints`, any orbax path incl. gs://)
      and, for a local path, `metrics.csv` written by host 0.

  Returns:
    The last train and eval metrics, and the number of steps.
  """
  start = time.perf_counter()
  mesh = dp.data_mesh()
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  batch_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  num_replicas = jax.device_count()
  model = create_model(config, num_replicas)
  tx, recipe = make_optimizer(config)
  total_steps = recipe.total_steps if config.num_train_steps <= 0 else config.num_train_steps
  local_batch = config.batch_size // jax.process_count()

  def init(key):
    shape = (config.batch_size // num_replicas, config.image_size, config.image_size, 3)
    variables = model.init(key, jnp.zeros(shape, jnp.float32), train=False)
    params = variables["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      batch_stats=variables["batch_stats"], opt_state=tx.init(params))

  state = jax.jit(init, out_shardings=replicated)(jax.random.key(config.seed))

  def train_step(state: TrainState, batch):
    def loss_fn(params):
      logits, new_vars = model.apply(
          {"params": params, "batch_stats": state.batch_stats}, batch["image"],
          train=True, mutable=["batch_stats"],
      )
      labels = optax.smooth_labels(
          jax.nn.one_hot(batch["label"], config.num_classes), config.label_smoothing)
      loss = optax.softmax_cross_entropy(logits, labels).mean()  # float32 logits
      return loss, (new_vars["batch_stats"], logits)

    (loss, (batch_stats, logits)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "loss": loss,
        "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"]),
        "learning_rate": recipe.schedule(state.step),
        "grad_norm": optax.tree.norm(grads),
    }
    ratios = date_optax.trust_ratios(opt_state)
    if ratios is not None:
      metrics.update(diagnostics.trust_ratio_summary(ratios, prefix="trust_ratio/"))
    new_state = TrainState(step=state.step + 1, params=params,
                           batch_stats=batch_stats, opt_state=opt_state)
    return new_state, metrics

  def eval_step(state: TrainState, batch):
    logits = model.apply({"params": state.params, "batch_stats": state.batch_stats},
                         batch["image"], train=False)
    correct = (jnp.argmax(logits, -1) == batch["label"]) * batch["mask"]
    return {"correct": jnp.sum(correct), "count": jnp.sum(batch["mask"])}

  train_step = jax.jit(train_step, donate_argnums=0, out_shardings=(replicated, replicated))
  eval_step = jax.jit(eval_step, out_shardings=replicated)

  local = "://" not in workdir
  ckpt = date_optax.checkpoint.CheckpointManager(
      os.path.join(workdir, "checkpoints"), max_to_keep=2,
      save_interval_steps=config.checkpoint_every_steps,
  )
  if ckpt.latest_step() is not None:
    state, _ = ckpt.restore(state)
  writer = (diagnostics.MetricWriter(workdir, tensorboard=None)
            if local and jax.process_index() == 0 else None)
  # Hosts may hold a few more examples than the average: one extra (mostly
  # empty, masked) step on multi-host runs makes sure every example is seen.
  steps_per_eval = (config.steps_per_eval if config.steps_per_eval > 0 else
                    math.ceil(config.num_eval_examples / config.eval_batch_size)
                    + (jax.process_count() > 1))
  eval_every = max(1, round(config.eval_every_epochs * recipe.steps_per_epoch))

  def evaluate() -> dict[str, float]:
    it = _batches(config, config.eval_batch_size // jax.process_count(), train=False)
    correct = count = 0.0
    for _ in range(steps_per_eval):
      # Hosts with fewer examples keep stepping on empty batches, so every
      # host runs the same number of collective steps.
      batch = next(it, None)
      if batch is None:
        b = config.eval_batch_size // jax.process_count()
        batch = {"image": np.zeros((b, config.image_size, config.image_size, 3),
                                   np.float32),
                 "label": np.zeros(b, np.int32), "mask": np.zeros(b, np.float32)}
      out = eval_step(state, _global_batch(batch, batch_sharding))
      correct += float(out["correct"])
      count += float(out["count"])
    return {"eval_accuracy": correct / max(count, 1.0)}

  train_iter = _batches(config, local_batch, train=True)
  step = int(state.step)
  metrics: dict[str, float] = {}
  eval_metrics: dict[str, float] = {}
  if jax.process_index() == 0:
    print(f"{config.model}: batch {config.batch_size} on {num_replicas} devices "
          f"({jax.process_count()} hosts), peak lr {recipe.peak_learning_rate:.4g}, "
          f"warmup {recipe.warmup_steps} of {recipe.total_steps} steps; "
          f"running steps {step + 1}..{total_steps}", flush=True)
  while step < total_steps:
    state, m = train_step(state, _global_batch(next(train_iter), batch_sharding))
    step += 1
    if step % config.log_every_steps == 0 or step == total_steps:
      metrics = {k: float(v) for k, v in m.items()}
      if writer is not None:
        writer.write_scalars(step, metrics)
      if jax.process_index() == 0:
        print(f"step {step}: loss {metrics['loss']:.4f} lr "
              f"{metrics['learning_rate']:.4g} ({time.perf_counter() - start:.0f} s)",
              flush=True)
    ckpt.save(step, state)
    if step % eval_every == 0 or step == total_steps:
      eval_metrics = evaluate()
      if writer is not None:
        writer.write_scalars(step, eval_metrics)
      if jax.process_index() == 0:
        print(f"step {step}: eval accuracy {eval_metrics['eval_accuracy']:.4f}", flush=True)
  if ckpt.latest_step() != step:
    ckpt.save(step, state, force=True)
  ckpt.close()
  if writer is not None:
    writer.close()
  return {**metrics, **eval_metrics, "steps": step}
