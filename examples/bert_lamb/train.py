"""Masked-language-model pretraining of a small BERT with LAMB, in two stages.

The model (`models.BertMLM`) has its transformer blocks under `nn.scan`, so
each block parameter is a stacked leaf with the layer as its leading axis;
`date_optax.lamb(..., layer_axes=layer_axes)` takes one trust ratio per
layer of such a leaf, as unstacked layers would get. Biases and layer-norm
parameters take neither weight decay nor a trust ratio (the BERT/LAMB
reference's exclusions).

The schedule is `date_optax.multi_stage` of one recipe per stage
(`date_optax.scale_recipe` of the LAMB-table baseline to the stage's batch):
stage 2 runs 4x longer sequences at its own batch and its learning rate
re-warms from 0. The step is `date_optax.parallel.make_train_step` on a
("data", "model") mesh with `param_sharding`, `shard_update`,
`microbatches`, bf16 compute and dropout keys; evaluation is
`date_optax.parallel.evaluate` (exact over the held-out set). The
examples' loop (`examples/_loop.py`) makes it resumable; the stage boundary
is always checkpointed, and stage 2 starts from that checkpoint when run
separately.
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
from examples._loop import make_grad_sync  # noqa: F401 - the example's name for it
from examples.bert_lamb import input_pipeline, models

#: Parameters without weight decay or trust ratio: biases, layer norms and
#: the output bias (BERT's `exclude_from_weight_decay`).
NO_DECAY = date_optax.path_mask(exclude=(r"bias$", r"norm", r"head_bias$"))


def layer_axes(params: Any) -> Any:
  """Axis 0 for the leaves of the scanned blocks (one trust ratio per layer), else None.

  Args:
    params: the model's parameters (``{"layers": ..., ...}``).

  Returns:
    A pytree like `params` with ``0`` on every leaf under ``layers`` and
    ``None`` elsewhere, for `date_optax.lamb`'s `layer_axes`.
  """
  return {k: jax.tree.map(lambda _: 0, v) if k == "layers" else jax.tree.map(lambda _: None, v)
          for k, v in params.items()}


def stage_configs(config: ml_collections.ConfigDict) -> list[dict[str, int]]:
  """The stages to run: ``[{"seq_len", "batch_size", "num_train_tokens"}, ...]``."""
  stages = [dict(seq_len=config.seq_len, batch_size=config.batch_size,
                 num_train_tokens=config.num_train_tokens)]
  if config.two_stage:
    s2 = config.stage2
    stages.append(dict(seq_len=s2.seq_len, batch_size=s2.batch_size,
                       num_train_tokens=s2.num_train_tokens))
  return stages


def make_recipe(config: ml_collections.ConfigDict) -> date_optax.MultiStageRecipe:
  """One LAMB-table recipe per stage, joined by `date_optax.multi_stage`.

  Stage `s` is the baseline (`base_batch_size`, `base_learning_rate`,
  `base_warmup_ratio`, one pass over the stage's `num_train_tokens /
  seq_len` sequences, poly decay) scaled to the stage's batch with
  `date_optax.scale_recipe` (`lr_scaling`, `warmup_scaling`).
  """
  recipes = []
  for stage in stage_configs(config):
    baseline = date_optax.Baseline(
        batch_size=config.base_batch_size,
        learning_rate=config.base_learning_rate,
        warmup_ratio=config.base_warmup_ratio,
        epochs=1,
        num_examples=stage["num_train_tokens"] // stage["seq_len"],
        decay=date_optax.schedules.Poly(power=config.decay_power),
    )
    # With the measured gain the step multiplies the baseline's peak LR.
    lr_scaling = "none" if config.lr_scaling == "gain" else config.lr_scaling
    recipes.append(date_optax.scale_recipe(
        baseline, stage["batch_size"], lr_scaling=lr_scaling,
        warmup_scaling=config.warmup_scaling))
  return date_optax.multi_stage(recipes)


def make_optimizer(
    config: ml_collections.ConfigDict,
) -> tuple[optax.GradientTransformation, date_optax.MultiStageRecipe]:
  """LAMB (or AdamW, for comparison) on the multi-stage schedule.

  Two gain-aware variants of the LAMB baseline read the statistics of a step
  built with `config.grad_stats` (one stage only): `config.lr_scaling =
  "gain"` is `date_optax.date(..., lr_scaling="gain")` over the baseline (its
  LAMB as the solver, the recipe's schedule at the baseline's peak LR times
  the measured sqrt(gain)); `config.adascale` is `date_optax.adascale` over
  the baseline's LAMB and its schedule at `base_batch_size`, on AdaScale's
  scale-invariant clock.
  """
  recipe = make_recipe(config)
  gain = config.lr_scaling == "gain" or config.get("adascale", False)
  if gain and (config.two_stage or config.optimizer != "lamb"):
    raise ValueError(
        'config.lr_scaling="gain" and config.adascale need one stage '
        "(config.two_stage=False) and config.optimizer='lamb'.")
  if config.lr_scaling == "gain" and config.get("adascale", False):
    raise ValueError('config.adascale=True needs config.lr_scaling != "gain".')
  if config.get("adascale", False):
    base = config.copy_and_resolve_references()
    base.batch_size = config.base_batch_size
    base.lr_scaling = "none"
    tx = date_optax.adascale(
        date_optax.lamb(1.0, b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, weight_decay_mask=NO_DECAY,
                        layer_axes=layer_axes),
        config.batch_size / config.base_batch_size,
        learning_rate=make_recipe(base).schedule)
    return tx, recipe
  if config.lr_scaling == "gain":
    stage = stage_configs(config)[0]
    # LAMB as DATE's solver: Adam's direction plus the decay, the ratio
    # measured on that update and unbounded (the baseline's own ratios).
    baseline = date_optax.Baseline(
        batch_size=config.base_batch_size, learning_rate=config.base_learning_rate,
        warmup_ratio=config.base_warmup_ratio, epochs=1,
        num_examples=stage["num_train_tokens"] // stage["seq_len"],
        decay=date_optax.schedules.Poly(power=config.decay_power),
        optimizer=optax.chain(
            optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps),
            optax.add_decayed_weights(config.weight_decay, NO_DECAY)),
        optimizer_options=dict(trust_ratio_mask=NO_DECAY, layer_axes=layer_axes),
        ratio_bounds=(0.0, 1e30))
    tx = date_optax.date(baseline, stage["batch_size"], lr_scaling="gain",
                         ratio_source="update", learning_rate=recipe.schedule)
    return tx, recipe
  if config.optimizer == "lamb":
    tx = date_optax.lamb(
        recipe.schedule, b1=config.b1, b2=config.b2, eps=config.eps,
        weight_decay=config.weight_decay, weight_decay_mask=NO_DECAY, layer_axes=layer_axes)
  elif config.optimizer == "adamw":
    # inject_hyperparams records the learning rate for the step's metrics.
    tx = optax.inject_hyperparams(lambda learning_rate: optax.adamw(
        learning_rate, b1=config.b1, b2=config.b2, eps=config.eps,
        weight_decay=config.weight_decay, mask=NO_DECAY))(learning_rate=recipe.schedule)
  else:
    raise ValueError(f"config.optimizer must be 'lamb' or 'adamw', got {config.optimizer!r}.")
  return tx, recipe


def get_vocab(config: ml_collections.ConfigDict, workdir: str | None = None
              ) -> input_pipeline.Vocab:
  """The run's tokenizer (`config.tokenizer`), cached in a local `workdir`."""
  cache = workdir if workdir and "://" not in str(workdir) else None
  return input_pipeline.get_vocab(config.tokenizer, vocab_size=config.vocab_size,
                                  cache_dir=cache)


def create_model(config: ml_collections.ConfigDict,
                 vocab: input_pipeline.Vocab | None = None) -> models.BertMLM:
  """The encoder; its position table covers the longest stage.

  `vocab` (default: `get_vocab(config)`) sets the embedding rows and the
  padding id.
  """
  vocab = get_vocab(config) if vocab is None else vocab
  max_len = max(s["seq_len"] for s in stage_configs(config))
  return models.BertMLM(vocab_size=vocab.size, max_len=max_len,
                        pad_id=vocab.pad_id, **config.model)


def init_output_bias(config: ml_collections.ConfigDict, params: Any,
                     vocab: input_pipeline.Vocab) -> Any:
  """The output bias's start (`config.output_bias_init`): "zeros" or "unigram".

  "unigram" starts `head_bias` at the log-frequencies of the training tokens
  (`input_pipeline.log_unigram_prior`). From zeros, the unigram prior is
  learnt first, and mostly through the tied embedding: at the start the
  softmax gradient of every row is nearly the same vector (the hidden
  state, times the row's predicted probability), and Adam's per-coordinate
  normalization (LAMB's direction) moves even the rows of rare tokens a
  full step along it. With thousands of BPE tokens the input embeddings
  then share one direction and the encoder cannot tell the tokens apart
  (measured in docs/RESULTS.md); with the prior in the bias those
  gradients average to zero from the first step.
  """
  return _text_corpus.init_output_bias(config.output_bias_init, params, vocab)


def make_mesh(config: ml_collections.ConfigDict, tpu: dp.TpuSlice | None = None
              ) -> jax.sharding.Mesh:
  """A ("data", "model") mesh over all devices, `model_parallel` on "model".

  When the device count is not a multiple of `model_parallel` the "model"
  axis gets the largest common divisor (1 on a single device). With `tpu`
  the mesh is over that slice's devices (a compile target; a Multislice
  target's mesh has a "slice" axis outermost). `config.num_slices` > 1 puts
  the devices at hand on such a mesh (`dp.multislice_mesh`: by slice index
  on a Multislice job, consecutive blocks of emulated devices otherwise).
  """
  n = jax.device_count() if tpu is None else tpu.num_devices
  slices = int(config.get("num_slices", 1)) if tpu is None else tpu.num_slices
  mp = math.gcd(int(config.model_parallel), n // slices)
  if tpu is not None:
    return tpu.mesh(model=mp)
  if slices > 1:
    return dp.multislice_mesh((n // slices // mp, mp), ("data", "model"), num_slices=slices)
  return jax.make_mesh((n // mp, mp), ("data", "model"))


def make_train_step(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh,
                    model: models.BertMLM, tx: optax.GradientTransformation
                    ) -> dp.TrainStep:
  """The example's step: `make_train_step` with the config's sharding rules,
  update sharding, microbatches, precision, statistics and gradient sync."""
  rules = [(regex, P(*spec)) for regex, spec in config.param_sharding]
  return dp.make_train_step(
      mlm_loss_fn(model), tx, mesh, has_aux=True,
      compute_dtype=jnp.bfloat16 if config.half_precision else None,
      shard_update=config.shard_update, microbatches=config.microbatches,
      param_sharding=rules or None, grad_stats=config.get("grad_stats", False),
      grad_sync=make_grad_sync(config))


def train_steps(config: ml_collections.ConfigDict) -> list[int]:
  """Steps each `compile_target` program (one per stage) trains for: each
  stage's recipe at its batch (``date-optax plan`` prices them)."""
  return [stage.total_steps for stage in make_recipe(config).stages]


def compile_target(config: ml_collections.ConfigDict, tpu: dp.TpuSlice) -> list:
  """The example's train step on `tpu`'s devices, abstract (``date-optax compile``).

  The vocabulary is not built: a "bpe" tokenizer's embedding has
  `config.vocab_size` rows (padded to a multiple of 8), "bytes" the byte
  vocabulary's.

  Returns:
    ``[(name, step, state, batch)]``: one program per training stage (its
    sequence length and batch), the same step object.
  """
  if config.tokenizer == "bytes":
    vocab_size, pad_id = input_pipeline.BYTES.size, input_pipeline.BYTES.pad_id
  else:
    vocab_size, pad_id = -(-int(config.vocab_size) // 8) * 8, 0
  max_len = max(s["seq_len"] for s in stage_configs(config))
  model = models.BertMLM(vocab_size=vocab_size, max_len=max_len, pad_id=pad_id,
                         **config.model)
  tx, _ = make_optimizer(config)
  step = make_train_step(config, make_mesh(config, tpu), model, tx)
  tokens = jax.ShapeDtypeStruct((1, max_len), jnp.int32)
  params = jax.eval_shape(lambda key, t: model.init(key, t, train=False)["params"],
                          jax.random.key(0), tokens)
  state = step.abstract_state(params, rng=jax.random.key(0))
  out = []
  for i, stage in enumerate(stage_configs(config)):
    shape = (stage["batch_size"], stage["seq_len"])
    batch = {k: jax.ShapeDtypeStruct(shape, jnp.int32) for k in ("inputs", "targets", "weights")}
    out.append((f"stage {i + 1} (batch {shape[0]}, length {shape[1]})", step, state,
                step.abstract_batch(batch)))
  return out


def mlm_sums(logits: jax.Array, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Per-sequence sums over the chosen positions: loss, correct, count.

  Args:
    logits: float32 ``[batch, length, vocab]``.
    batch: ``{"targets", "weights"}`` int ``[batch, length]``.

  Returns:
    ``{"nll", "correct", "count"}``, each ``[batch]`` float32.
  """
  w = batch["weights"].astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
  correct = (jnp.argmax(logits, -1) == batch["targets"]).astype(jnp.float32)
  return {"nll": (nll * w).sum(-1), "correct": (correct * w).sum(-1), "count": w.sum(-1)}


def mlm_loss_fn(model: models.BertMLM):
  """The step's loss: mean cross-entropy over the masked positions.

  Args:
    model: the encoder.

  Returns:
    ``loss_fn(params, batch, rng) -> (loss, {"accuracy": ...})`` for
    `date_optax.parallel.make_train_step(..., has_aux=True)`; `rng` is the
    step's dropout key.
  """

  def loss_fn(params, batch, rng):
    logits = model.apply({"params": params}, batch["inputs"], train=True,
                         rngs={"dropout": rng})
    sums = mlm_sums(logits, batch)
    count = jnp.maximum(sums["count"].sum(), 1.0)
    return sums["nll"].sum() / count, {"accuracy": sums["correct"].sum() / count}

  return loss_fn


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains both stages and evaluates; checkpoints to and resumes from `workdir`.

  Args:
    config: the hyperparameters (configs/*.py).
    workdir: checkpoints (`workdir/checkpoints`), `metrics.csv` (and
      TensorBoard files) and `results.json`.

  Returns:
    The final eval MLM loss (`eval_loss`, mean cross-entropy per masked
    token) and masked-token accuracy (`eval_accuracy`), the last train
    metrics, the steps, the stage boundaries, the corpus hash and the
    checksum of the final parameters; or `{"preempted_at_step": s}` after a
    signal (rerun the same call to resume).
  """
  start = time.perf_counter()
  data = input_pipeline.corpus()
  vocab = get_vocab(config, workdir)
  mesh = make_mesh(config)
  model = create_model(config, vocab)
  tx, recipe = make_optimizer(config)
  stages = stage_configs(config)
  total_steps = recipe.total_steps if config.num_train_steps <= 0 else min(
      config.num_train_steps, recipe.total_steps)

  def metric_fn(params, batch):
    return mlm_sums(model.apply({"params": params}, batch["inputs"], train=False), batch)

  step_fn = make_train_step(config, mesh, model, tx)
  tokens = jnp.zeros((1, stages[0]["seq_len"]), jnp.int32)
  params = jax.jit(lambda key: model.init(key, tokens, train=False)["params"])(
      jax.random.key(config.seed))
  params = init_output_bias(config, params, vocab)
  state = step_fn.init(params, rng=jax.random.key(config.seed + 1))

  eval_len = stages[-1]["seq_len"]
  eval_data = input_pipeline.eval_set(
      eval_len, seed=config.eval_seed, mask_rate=config.mask_rate,
      max_sequences=None if config.eval_max_sequences <= 0 else config.eval_max_sequences,
      vocab=vocab)
  num_eval = len(eval_data["inputs"])
  # The loss of the best context-free predictor of the held-out set (nats
  # per masked token): the bar an eval loss that uses the context is below.
  eval_entropy = input_pipeline.unigram_entropy(eval_data["targets"], vocab.pad_id)

  def evaluate(state) -> dict[str, float]:
    # Exact: per-sequence sums averaged over every held-out window by
    # dp.evaluate, times the number of windows, give the corpus totals.
    out = dp.evaluate(metric_fn, state.params, eval_data, mesh,
                      batch_size=config.eval_batch_size, data_axes=("data",))
    count = out["count"] * num_eval
    return {"eval_loss": out["nll"] * num_eval / count,
            "eval_accuracy": out["correct"] * num_eval / count}

  # One grain loader per stage (its own length, batch and seed); the
  # checkpoint holds the stage and its loader's position.
  batches = input_pipeline.StagedBatches(
      lambda s: input_pipeline.train_loader(
          vocab, stages[s]["batch_size"], stages[s]["seq_len"], seed=config.seed + 1000 * s,
          mask_rate=config.mask_rate),
      recipe.stage_of)
  if jax.process_index() == 0:
    desc = "; ".join(
        f"stage {i + 1}: L={c['seq_len']} B={c['batch_size']} "
        f"{r.total_steps} steps, peak lr {r.peak_learning_rate:.4g}, warmup {r.warmup_steps}"
        for i, (c, r) in enumerate(zip(stages, recipe.stages)))
    print(f"{config.optimizer} on {jax.device_count()} devices, mesh "
          f"{dict(mesh.shape)}; {desc}", flush=True)
  # The stage boundary is always logged, evaluated and checkpointed: stage 2
  # starts from it when run separately.
  return _loop.train_loop(
      config, workdir, step_fn, state, batches, total_steps=total_steps,
      eval_every=config.eval_every_steps, evaluate=evaluate,
      boundaries=recipe.boundaries[1:],
      scalars=lambda step: {"stage": float(recipe.stage_of(step - 1) + 1),
                            "tokens": float(_tokens_seen(stages, recipe, step))},
      summary=lambda state: {
          "stage_boundaries": list(recipe.boundaries),
          "tokens": _tokens_seen(stages, recipe, int(state.step)),
          "eval_sequences": num_eval, "eval_seq_len": eval_len,
          "corpus_sha256": data["sha256"], "python": data["python"],
          "tokenizer": vocab.kind, "vocab_size": vocab.size,
          "tokenizer_sha256": vocab.sha256, "eval_unigram_entropy": eval_entropy,
          "wall_time": time.perf_counter() - start})


def _tokens_seen(stages, recipe, step: int) -> int:
  """Training tokens consumed by the first `step` steps."""
  total = 0
  for cfg, begin, r in zip(stages, recipe.boundaries, recipe.stages):
    n = min(max(step - begin, 0), r.total_steps)
    total += n * cfg["batch_size"] * cfg["seq_len"]
  return total
