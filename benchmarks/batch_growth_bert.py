"""The BERT-style MLM task of the batch-growth study: LAMB with a growing batch.

The model, data, held-out set and settings are the batch-scaling study's
(`examples/bert_lamb/configs/scaling.py`: a 2-layer, 64-wide encoder on
bytes, 32-byte sequences, 64,000 training sequences, B0 = 2 on 2 devices,
LAMB at 2.5e-3). The growing run is
``date(baseline, 64·B0, batch_schedule=..., lr_scaling="sqrt",
ratio_source="update")`` over the baseline's LAMB (Adam's direction plus
the decay, the trust ratio measured on that update, unbounded: LAMB's own
ratio), trained through the growing step on the same 2 devices. Its B0 and
fixed 64·B0 rows are the batch-scaling study's runs
(`docs/studies/bert_scaling/bert_scaling.jsonl`), read by
`benchmarks/batch_growth.py`.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import date_optax
import date_optax.parallel as dp
from examples.bert_lamb import input_pipeline, train
from examples.bert_lamb.configs import scaling

NAME = "bert_mlm_lamb"
LABEL = "BERT-style MLM (bytes), LAMB"
#: The batch-scaling study's rows (method, batch) for the B0, fixed and gain rows.
READ_ROWS = {"baseline": ("lamb", 1), "date": ("lamb", 64), "date_gain": ("date_gain", 64)}


def config():
  """The batch-scaling study's run configuration (LAMB at B0 = 2)."""
  return scaling.get_config()


def baseline_of(cfg) -> date_optax.Baseline:
  """The LAMB baseline at B0 as DATE's solver (as the example's gain variant)."""
  return date_optax.Baseline(
      batch_size=cfg.base_batch_size, learning_rate=cfg.base_learning_rate,
      warmup_ratio=cfg.base_warmup_ratio, epochs=1,
      num_examples=cfg.num_train_tokens // cfg.seq_len,
      decay=date_optax.schedules.Poly(power=cfg.decay_power),
      optimizer=optax.chain(
          optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
          optax.add_decayed_weights(cfg.weight_decay, train.NO_DECAY)),
      optimizer_options=dict(trust_ratio_mask=train.NO_DECAY, layer_axes=train.layer_axes),
      ratio_bounds=(0.0, 1e30))


def run_growing(step, state, batches, total: int):
  """Steps until the next batch would pass `total` examples.

  Returns the state, every step's batch, learning rate, loss and noise
  scale (read once, at the end: no host read per step), and the examples.
  """
  examples, metrics = 0, []
  while True:
    b = step.next_batch_size(state)
    if examples + b > total:
      break
    state, m = step(state, batches.take(b))
    examples += b
    metrics.append({k: m[k] for k in ("batch_size", "learning_rate", "loss",
                                      "grad_noise_scale")})
  curve = [dict(batch=int(c["batch_size"]), lr=float(c["learning_rate"]),
                loss=float(c["loss"]), noise_scale=float(c["grad_noise_scale"]))
           for c in jax.device_get(metrics)]
  return state, curve, examples


def thin(curve: list[dict], points: int = 100) -> list[dict]:
  """About `points` of the curve, with every step where the batch changes
  and the one before it (so the examples between kept points are exact),
  floats to 5 significant digits (the log stays small)."""
  stride = max(1, len(curve) // points)
  changes = [i for i in range(1, len(curve)) if curve[i]["batch"] != curve[i - 1]["batch"]]
  keep = sorted({*range(0, len(curve), stride), *changes, *(i - 1 for i in changes),
                 len(curve) - 1})
  return [dict(step=i, **{k: float(f"{v:.5g}") if isinstance(v, float) else v
                          for k, v in curve[i].items()}) for i in keep]


def read_rows(path: str, scale: int) -> list[dict]:
  """The B0 / fixed / gain runs of the batch-scaling study, as batch-growth rows."""
  import json  # noqa: PLC0415

  cfg = config()
  out = []
  with open(path) as f:
    for line in f:
      rec = json.loads(line)
      key = rec["key"]
      if (key["base_batch"] != cfg.base_batch_size or key["seq_len"] != cfg.seq_len
          or key["lr"] != cfg.base_learning_rate):
        continue
      for row, (method, k) in READ_ROWS.items():
        if key["method"] == method and key["batch"] == k * cfg.base_batch_size and (
            k == 1 or k == scale):
          out.append(dict(key=dict(task=NAME, method=row, k=k, seed=key["seed"]),
                          loss=rec["eval_loss"], accuracy=rec["eval_accuracy"],
                          steps=rec["steps"], wall=rec["wall"]))
  return out


def train_growing(sched: date_optax.BatchSchedule, seed: int, rule: str = "sqrt",
                  num_train_tokens: int | None = None, eval_sequences: int | None = None,
                  grad_stats_decay: float | None = None,
                  max_rows_per_device: int | None = None) -> dict:
  """Trains the study's 64,000 sequences (or `num_train_tokens / 32`) with a
  growing batch; the eval MLM loss on the held-out windows (or the first
  `eval_sequences`)."""
  cfg = config()
  cfg.seed = seed
  if num_train_tokens is not None:
    cfg.num_train_tokens = num_train_tokens
  if eval_sequences is not None:
    cfg.eval_max_sequences = eval_sequences
  start = time.perf_counter()
  vocab = train.get_vocab(cfg)
  mesh = train.make_mesh(cfg)
  model = train.create_model(cfg, vocab)
  tx = date_optax.date(baseline_of(cfg), sched.max_batch, batch_schedule=sched,
                       lr_scaling=rule, ratio_source="update")

  loss_fn = train.mlm_loss_fn(model)

  def metric_fn(params, batch):
    return train.mlm_sums(model.apply({"params": params}, batch["inputs"], train=False),
                          batch)

  step = dp.make_train_step(loss_fn, tx, mesh, has_aux=True, grad_stats=True,
                            batch_schedule=sched, grad_stats_decay=grad_stats_decay,
                            max_rows_per_device=max_rows_per_device)
  tokens = jnp.zeros((1, cfg.seq_len), jnp.int32)
  params = model.init(jax.random.key(seed), tokens, train=False)["params"]
  params = train.init_output_bias(cfg, params, vocab)
  state = step.init(params, rng=jax.random.key(seed + 1))
  loader = input_pipeline.train_loader(vocab, sched.chunk_size, cfg.seq_len, seed=seed + 1000,
                                       mask_rate=cfg.mask_rate)
  batches = dp.GrowingBatches(iter(loader), sched.chunk_size)
  state, curve, examples = run_growing(step, state, batches,
                                       cfg.num_train_tokens // cfg.seq_len)
  wall = time.perf_counter() - start
  eval_data = input_pipeline.eval_set(
      cfg.seq_len, seed=cfg.eval_seed, mask_rate=cfg.mask_rate,
      max_sequences=None if cfg.eval_max_sequences <= 0 else cfg.eval_max_sequences,
      vocab=vocab)
  n = len(eval_data["inputs"])
  out = dp.evaluate(metric_fn, state.params, eval_data, mesh,
                    batch_size=cfg.eval_batch_size, data_axes=("data",))
  loss = float(out["nll"] / out["count"])
  acc = float(out["correct"] / out["count"])
  diverged = not np.isfinite(loss) or int(state.total_skips) > 0
  return dict(loss=loss, accuracy=acc, steps=len(curve), examples=examples, wall=wall,
              diverged=bool(diverged), programs=step.traces, devices=int(mesh.devices.size),
              eval_sequences=n, curve=thin(curve))
