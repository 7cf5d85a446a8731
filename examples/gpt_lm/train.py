"""Causal language-model pretraining: AdamW at B0, LAMB, DATE and the growing batch.

The model (`models.CausalLM`) is a Llama-shaped decoder with its blocks
under `nn.scan`, so each block parameter is a stacked leaf with the layer
as its leading axis; `layer_axes` gives `date_optax.lamb` and
`date_optax.date` one trust ratio per layer of such a leaf. RMSNorm scales
take neither weight decay nor a trust ratio.

The baseline is AdamW tuned at `config.base_batch_size` (B0): a
`date_optax.Baseline` whose solver is Adam's direction plus decoupled weight
decay, with a warmup and a cosine decay over one pass of
`config.num_train_tokens`. `config.optimizer` picks what runs at
`config.batch_size`:

* ``"adamw"``: `optax.adamw` on the baseline's recipe scaled to the batch by
  `date_optax.scale_recipe` (`lr_scaling`, `warmup_scaling`; at B0 the
  baseline itself);
* ``"lamb"``: `date_optax.lamb` with per-layer ratios, the recipe of its own
  learning rate at B0 (`base_learning_rate` of `configs/lamb.py`) scaled the
  same way;
* ``"date"``: `date_optax.date` of the AdamW baseline (its cosine decay
  kept), the step at batch `config.batch_size`; with
  ``config.batch_schedule = "adaptive"`` the batch grows from B0 to
  `config.batch_size` (`date_optax.BatchSchedule.adaptive`, its defaults),
  the learning rate following the batch (`lr_scaling`, linear for Adam in
  `configs/adaptive.py`) on a clock of examples.

The step is `date_optax.parallel.make_train_step` with bf16 compute
(`compute_dtype`, float32 master weights and optimizer state), on a data
mesh, or with FSDP (`config.fsdp` > 1) on a ``("data", "fsdp")`` mesh whose
"fsdp" axis holds a shard of every large kernel (`config.param_sharding`
rules on the d_model axis). Evaluation is `date_optax.parallel.evaluate`,
exact over every held-out window: mean next-token cross-entropy
(`eval_loss`, nats per token), `eval_perplexity` = exp(eval_loss) and
top-1 accuracy. The examples' loop (`examples/_loop.py`) makes the run
resumable, the grain iterator's position in every checkpoint.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import PartitionSpec as P

import date_optax
import date_optax.parallel as dp
from examples import _loop, _text_corpus
from examples.gpt_lm import input_pipeline, models

#: Parameters without weight decay or trust ratio: the RMSNorm scales and
#: the output bias (one pattern: a config without the bias has nothing for
#: a second one to match, and `path_mask` would warn).
NO_DECAY = date_optax.path_mask(exclude=r"norm|head_bias$")
#: The values of `config.optimizer`.
OPTIMIZERS = ("adamw", "lamb", "date")
#: The values of `config.batch_schedule`: None (a fixed batch) or a growing one.
BATCH_SCHEDULES = (None, "adaptive")


def layer_axes(params: Any) -> Any:
  """Axis 0 for the leaves of the scanned blocks (one trust ratio per layer), else None.

  Args:
    params: the model's parameters (``{"layers": ..., ...}``).

  Returns:
    A pytree like `params` with ``0`` on every leaf under ``layers`` and
    ``None`` elsewhere, for the `layer_axes` of `date_optax.lamb` and
    `date_optax.date`.
  """
  return {k: jax.tree.map(lambda _, axis=0 if k == "layers" else None: axis, v)
          for k, v in params.items()}


def num_sequences(config: ml_collections.ConfigDict) -> int:
  """Training sequences of the run: `num_train_tokens / seq_len`."""
  return int(config.num_train_tokens) // int(config.seq_len)


def make_baseline(config: ml_collections.ConfigDict) -> date_optax.Baseline:
  """The run tuned at `base_batch_size`: AdamW (Adam's direction plus
  decoupled weight decay), warmup ratio, cosine decay (`config.decay`), one
  pass over the run's sequences."""
  return date_optax.Baseline(
      batch_size=config.base_batch_size, learning_rate=config.base_learning_rate,
      warmup_ratio=config.warmup_ratio, epochs=1, num_examples=num_sequences(config),
      decay=config.decay,
      optimizer=optax.chain(
          optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps),
          optax.add_decayed_weights(config.weight_decay, NO_DECAY)))


def make_batch_schedule(config: ml_collections.ConfigDict) -> date_optax.BatchSchedule | None:
  """None (a fixed batch) or `BatchSchedule.adaptive` from `base_batch_size`
  to `batch_size` (B0 times a power of 2), with the trigger's settings of
  `config.growth` (unset ones: the library's defaults).

  Examples:
    >>> from examples.gpt_lm.configs import adaptive
    >>> make_batch_schedule(adaptive.get_config()).batch_sizes
    (8, 16, 32, 64, 128, 256, 512)
  """
  if _loop.batch_schedule_kind(config, BATCH_SCHEDULES) is None:
    return None
  growth = {k: v for k, v in config.get("growth", {}).items() if v is not None}
  return date_optax.BatchSchedule.adaptive(config.base_batch_size, max_batch=config.batch_size,
                                           **growth)


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.Recipe]:
  """The optimizer of `config.optimizer` at `config.batch_size`, and its recipe.

  "adamw" and "lamb" run the baseline's recipe scaled to the batch
  (`date_optax.scale_recipe` with `config.lr_scaling` and
  `config.warmup_scaling`); "date" is `date_optax.date` of the baseline
  with its own decay kept (``decay="baseline"``), and the one optimizer a
  growing batch takes. AdamW records its learning rate
  (`optax.inject_hyperparams`) for the step's metrics.

  Raises:
    ValueError: an unknown `config.optimizer`, or a growing batch with
      another optimizer than "date".
  """
  if config.optimizer not in OPTIMIZERS:
    raise ValueError(f"config.optimizer must be one of {OPTIMIZERS}, got {config.optimizer!r}.")
  baseline, batch = make_baseline(config), config.batch_size
  schedule = make_batch_schedule(config)
  rules = dict(lr_scaling=config.lr_scaling, warmup_scaling=config.warmup_scaling)
  if schedule is not None and config.optimizer != "date":
    raise ValueError(
        f"config.batch_schedule={config.batch_schedule!r} needs config.optimizer='date' "
        f"(the learning rate follows the batch), got {config.optimizer!r}.")
  if config.optimizer == "date":
    tx = date_optax.date(baseline, batch, batch_schedule=schedule, decay="baseline",
                         layer_axes=layer_axes, **rules)
    return tx, date_optax.date_recipe(baseline, batch, decay="baseline", **rules)
  recipe = date_optax.scale_recipe(baseline, batch, **rules)
  if config.optimizer == "lamb":
    tx = date_optax.lamb(recipe.schedule, b1=config.b1, b2=config.b2, eps=config.eps,
                         weight_decay=config.weight_decay, weight_decay_mask=NO_DECAY,
                         layer_axes=layer_axes)
    return tx, recipe
  tx = optax.inject_hyperparams(lambda learning_rate: optax.adamw(
      learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
      weight_decay=config.weight_decay, mask=NO_DECAY))(learning_rate=recipe.schedule)
  return tx, recipe


def vocab_size(config: ml_collections.ConfigDict) -> int:
  """The embedding rows of `config.tokenizer`, without building the vocabulary:
  `config.vocab_size` padded to a multiple of 8 ("bpe"), or the bytes'."""
  if config.tokenizer == "bytes":
    return _text_corpus.BYTES.size
  return -(-int(config.vocab_size) // 8) * 8


def create_model(config: ml_collections.ConfigDict, vocab_rows: int | None = None
                 ) -> models.CausalLM:
  """The decoder of `config.model` with `vocab_rows` (default `vocab_size(config)`)."""
  rows = vocab_size(config) if vocab_rows is None else vocab_rows
  return models.CausalLM(vocab_size=rows, **config.model)


def init_output_bias(config: ml_collections.ConfigDict, params: Any,
                     vocab: _text_corpus.Vocab) -> Any:
  """The output bias's start (`config.output_bias_init`): "zeros" or "unigram".

  "unigram" starts `head_bias` at the log-frequencies of the training
  tokens (`_text_corpus.log_unigram_prior`), so the model predicts the
  unigram distribution from its first step. Without it (no bias, or zeros)
  a small model spends its first steps learning that prior through the
  embeddings and the output kernel, all of which must share one direction:
  measured on the smoke config (60 steps of 512 tokens), the eval loss
  stayed at the unigram level.
  """
  if not config.model.get("output_bias"):
    return params
  return _text_corpus.init_output_bias(config.output_bias_init, params, vocab)


def make_mesh(config: ml_collections.ConfigDict, tpu: dp.TpuSlice | None = None
              ) -> jax.sharding.Mesh:
  """A data mesh, or with `config.param_sharding` a ("data", "fsdp") mesh.

  The "fsdp" axis has `config.fsdp` devices: the parameters and their
  optimizer state are split over it by the rules, and the batch over both
  axes (FSDP: every device is a data replica that holds a shard of each
  kernel). With `tpu` the mesh is over that
  slice's devices (a compile target; a Multislice target's mesh has a
  "slice" axis outermost).
  """
  n = jax.device_count() if tpu is None else tpu.num_devices // tpu.num_slices
  fsdp = int(config.fsdp)
  if fsdp < 1 or n % fsdp:
    raise ValueError(f"config.fsdp={fsdp} must divide the {n} devices"
                     f"{' of one slice' if tpu is not None and tpu.num_slices > 1 else ''}.")
  if not config.param_sharding:
    if fsdp != 1:
      raise ValueError(f"config.fsdp={fsdp} needs config.param_sharding rules naming 'fsdp'.")
    return dp.data_mesh() if tpu is None else tpu.data_mesh()
  if tpu is not None:
    return tpu.mesh(model=fsdp, axis_names=("data", "fsdp"))
  return jax.make_mesh((n // fsdp, fsdp), ("data", "fsdp"))


def lm_sums(logits: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Per-sequence means over the positions: next-token loss and top-1 hits.

  Args:
    logits: float32 ``[batch, length, vocab]``.
    batch: ``{"targets"}`` int ``[batch, length]``.

  Returns:
    ``{"nll", "correct"}``, each ``[batch]`` float32.
  """
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
  return {"nll": nll.mean(-1), "correct": correct.mean(-1)}


def lm_loss_fn(model: models.CausalLM):
  """The step's loss: mean next-token cross-entropy, with top-1 accuracy as aux.

  Returns:
    ``loss_fn(params, batch) -> (loss, {"accuracy": ...})`` for
    `date_optax.parallel.make_train_step(..., has_aux=True)`.
  """

  def loss_fn(params, batch):
    sums = lm_sums(model.apply({"params": params}, batch["inputs"]), batch)
    return sums["nll"].mean(), {"accuracy": sums["correct"].mean()}

  return loss_fn


def make_train_step(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                    model: models.CausalLM, tx: optax.GradientTransformation,
                    schedule: date_optax.BatchSchedule | None = None) -> dp.TrainStep:
  """The example's step: FSDP rules, update sharding, microbatches, bf16
  compute, and the noise statistics a growing batch decides from.

  With FSDP rules the batch is split over both mesh axes and the model's
  residual stream is kept whole along d_model on each device
  (`models.CausalLM.activation_sharding`), so the compiler gathers each
  block's kernels where the block runs instead of reducing its
  activations over "fsdp" (without it the 1 B program reduced
  activations 1,263 times a step and did twice the flops).
  """
  rules = [(regex, P(*spec)) for regex, spec in config.param_sharding]
  if rules:
    model = model.clone(activation_sharding=jax.sharding.NamedSharding(mesh, P()))
  return dp.make_train_step(
      lm_loss_fn(model), tx, mesh, has_aux=True,
      compute_dtype=jnp.bfloat16 if config.half_precision else None,
      shard_update=config.shard_update, microbatches=config.microbatches,
      param_sharding=rules or None, data_axes=tuple(mesh.axis_names) if rules else None,
      grad_stats=bool(config.grad_stats) or schedule is not None, batch_schedule=schedule)


def train_steps(config: ml_collections.ConfigDict) -> list[int | None]:
  """Steps each `compile_target` program trains for (``date-optax plan``): the
  recipe's at a fixed batch; None for each size of a growing batch, whose
  steps depend on the noise the run measures."""
  schedule = make_batch_schedule(config)
  if schedule is not None:
    return [None] * len(schedule.batch_sizes)
  return [make_optimizer(config)[1].total_steps]


def compile_target(config: ml_collections.ConfigDict, tpu: dp.TpuSlice) -> list:
  """The example's train step on `tpu`'s devices, abstract (``date-optax compile``).

  The vocabulary is not built (`vocab_size`).

  Returns:
    ``[(name, step, state, batch)]``: one program per batch size of the
    batch schedule (one for a fixed batch).
  """
  model = create_model(config)
  schedule = make_batch_schedule(config)
  tx, _ = make_optimizer(config)
  step = make_train_step(config, make_mesh(config, tpu), model, tx, schedule)
  length = int(config.seq_len)
  params = jax.eval_shape(lambda key: model.init(key, jnp.zeros((1, length), jnp.int32))["params"],
                          jax.random.key(0))
  state = step.abstract_state(params)
  sizes = schedule.batch_sizes if schedule is not None else (config.batch_size,)
  return [(f"batch {b} (length {length})", step, state, step.abstract_batch(
      {k: jax.ShapeDtypeStruct((b, length), jnp.int32) for k in ("inputs", "targets")}))
      for b in sizes]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains on `config.num_train_tokens` and evaluates; resumes from `workdir`.

  Args:
    config: the hyperparameters (configs/*.py).
    workdir: checkpoints (`workdir/checkpoints`), `metrics.csv` (and
      TensorBoard files), the tokenizer's cache and `results.json`.

  Returns:
    The final `eval_loss` (nats per token), `eval_perplexity`,
    `eval_accuracy`, the held-out text's `eval_unigram_entropy`, the last
    train metrics, the steps and tokens, the corpus and tokenizer hashes and
    the checksum of the final parameters (also in `results.json`); or
    `{"preempted_at_step": s}` after a signal (rerun the same call to
    resume).
  """
  start = time.perf_counter()
  data = _text_corpus.corpus()
  cache = workdir if "://" not in str(workdir) else None
  vocab = _text_corpus.get_vocab(config.tokenizer, vocab_size=config.vocab_size,
                                 cache_dir=cache)
  mesh = make_mesh(config)
  model = create_model(config, vocab.size)
  schedule = make_batch_schedule(config)
  tx, recipe = make_optimizer(config)
  step_fn = make_train_step(config, mesh, model, tx, schedule)
  length = int(config.seq_len)
  params = jax.jit(lambda key: model.init(key, jnp.zeros((1, length), jnp.int32))["params"])(
      jax.random.key(config.seed))
  state = step_fn.init(init_output_bias(config, params, vocab))

  eval_data = input_pipeline.eval_set(
      vocab, length,
      max_sequences=None if config.eval_max_sequences <= 0 else config.eval_max_sequences)
  # The loss of the best context-free predictor of the held-out targets.
  eval_entropy = _text_corpus.unigram_entropy(eval_data["targets"], vocab.pad_id)

  def metric_fn(params, batch):
    return lm_sums(model.apply({"params": params}, batch["inputs"]), batch)

  def evaluate(state) -> dict[str, float]:
    # Every window has `length` targets: the mean of the per-window means
    # over the whole set is the mean per token.
    out = dp.evaluate(metric_fn, state.params, eval_data, mesh,
                      batch_size=config.eval_batch_size, data_axes=tuple(mesh.axis_names))
    return {"eval_loss": out["nll"], "eval_perplexity": math.exp(out["nll"]),
            "eval_accuracy": out["correct"]}

  total = num_sequences(config)
  if schedule is None:
    batches = iter(input_pipeline.train_loader(vocab, config.batch_size, length,
                                               seed=config.seed))
    steps = recipe.total_steps if config.num_train_steps <= 0 else min(
        config.num_train_steps, recipe.total_steps)
    budget = dict(total_steps=steps, eval_every=config.eval_every_steps)
  else:
    # The data comes in chunks of the gcd of the schedule's batches; a step
    # takes as many as it needs. Evaluated every `eval_every_steps` steps'
    # worth of B0 sequences.
    batches = dp.GrowingBatches(
        iter(input_pipeline.train_loader(vocab, schedule.chunk_size, length, seed=config.seed)),
        schedule.chunk_size)
    budget = dict(total_examples=total,
                  eval_every_examples=config.eval_every_steps * config.base_batch_size)

  def summary(state) -> dict[str, Any]:
    sequences = (state.batch_schedule.num_examples() if schedule is not None
                 else int(state.step) * config.batch_size)
    grown = {} if schedule is None else {
        "batch_schedule": schedule.kind, "batch_sizes": list(schedule.batch_sizes)}
    return {"optimizer": config.optimizer, "batch_size": config.batch_size,
            "base_batch_size": config.base_batch_size, **grown,
            "tokens": sequences * length, "peak_learning_rate": recipe.peak_learning_rate,
            "eval_sequences": len(eval_data["inputs"]), "seq_len": length,
            "corpus_sha256": data["sha256"], "python": data["python"],
            "tokenizer": vocab.kind, "vocab_size": vocab.size,
            "tokenizer_sha256": vocab.sha256, "eval_unigram_entropy": eval_entropy,
            "wall_time": time.perf_counter() - start}

  if jax.process_index() == 0:
    n_params = sum(x.size for x in jax.tree.leaves(params))
    batch = (f"batch {config.batch_size}" if schedule is None else
             f"batch {schedule.start} growing to {schedule.max_batch}")
    print(f"{config.optimizer}, {batch} x {length} tokens, {n_params:,} parameters, on "
          f"{jax.device_count()} devices, mesh {dict(mesh.shape)}; peak lr "
          f"{recipe.peak_learning_rate:.4g}, warmup {recipe.warmup_steps} of "
          f"{recipe.total_steps} steps", flush=True)
  scalars = (lambda step: {}) if schedule is not None else (
      lambda step: {"tokens": float(step * config.batch_size * length)})
  return _loop.train_loop(config, workdir, step_fn, state, batches, evaluate=evaluate,
                          scalars=scalars, summary=summary, **budget)
