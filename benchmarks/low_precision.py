"""Accuracy of low-precision gradient all-reduces, with and without APS.

Every run trains through `date_optax.parallel.make_train_step` over 8
emulated CPU devices with an explicit all-reduce whose gradient payload is
rounded to `comm_dtype` at every hop (`docs/algorithms.md`, "Low-precision
all-reduce and APS"), at 64·B0 = 1024 with no retuning:

  lstm_date   MNIST-1D LSTM (examples/mnist1d_lstm), `date_optax.date` of the
              momentum baseline (B0 = 16, lr 0.05), ring all-reduce
  lstm_lamb   the same LSTM with `date_optax.lamb`, peak lr 0.03 (the best
              LAMB learning rate at batch 1024 in docs/studies/solver_ladder/solver_ladder.md), 10%
              linear warmup then linear decay, ring all-reduce
  cnn_gbn     the 1-D CNN with ghost batch norm of benchmarks/oracle.py
              (ghost 16) under `date_optax.date` of its momentum baseline
              (lr 0.05), 2x4 torus all-reduce
  bert_lamb   BERT-style masked-language modelling with LAMB, the case 1-bit
              LAMB was built for: examples/bert_lamb run through its command
              line (`configs/scaling.py`: 2 layers, width 64, UTF-8 bytes,
              length 32) at batch 128 = 64·B0 with LAMB's own rule (base lr
              2.5e-3 at B0 = 2, LR x sqrt(k), warmup ratio x k), ring
              all-reduce over 8 replicas; "accuracy" is the masked-byte
              accuracy over the held-out set (`--long` only by default)
  bert_sharded the same BERT run on the sharded builder: 8 devices as a
              ("data", "model") = (4, 2) mesh, the attention and MLP kernels
              split over "model" (the example's `PARAM_SHARDING`), the
              low-bit reduce-scatter over the 4 data replicas in the
              `shard_map` island of `make_sharded_train_step`, ring

For each: float32 (exact), bfloat16, float8_e4m3fn, int8 and the 4-bit
float4_e2m1fn (`--formats` adds int4, float8_e5m2), each with APS (Han, Demmel and You 2020,
https://arxiv.org/abs/2003.00119) and without, over 2 seeds; with
`--rounding nearest,stochastic` the formats of at most 8 bits also run with
APS and stochastic rounding (Gupta et al. 2015,
https://arxiv.org/abs/1502.02551). Reported: final
test accuracy, the gap to float32, the number of skipped (non-finite) steps.
`--extras block,block_ef,aps_ef` adds, for the formats of at most 8 bits,
per-block scaling (`block_size=32`, no APS), the same with error feedback,
and APS with error feedback (`docs/guide/low_precision_communication.md`).
`--long` trains 64 epochs (512 steps) toward float32's plateau on a chosen
set of rows and writes `low_precision_long.{jsonl,md,png}`. Error feedback
is the complete two-stage rule (every replica's own residual and every
rounded hop's, `dp.ErrorFeedbackState`); the long log also keeps the rows
measured with the earlier rule that fed back only each replica's own
residual, shown as "worker (earlier)" and no longer run.
`--step-time` measures, for each task and payload, the step's time
(alternating payloads, median of rounds) and the bytes the busiest link
carries per step (`date_optax.parallel.allreduce_cost` on the step's
per-device gradient bytes), and writes `low_precision_step_time.md`.
`--algorithm two_shot` runs the low-bit rows with another reduction
(`ring`, `torus` or `two_shot`, 1-bit Adam's compressed reduce-scatter, or
`hierarchical`, Multislice's sync over two emulated slices of 4 devices:
float32 inside each slice, the payload across them) in
place of the task's own (ring, or the 2x4 torus for cnn_gbn);
`--algorithm own,two_shot` runs both. With `--long`, `--feedback-only` keeps
float32 and the rows with error feedback at every hop. float32, the exact reference, always
runs the task's own. `--extras-only` runs float32 and the `--extras` rows
alone (no APS on/off rows). The tables show each overriding row (all-reduce
column) next to the task's own row of the same payload, where logged.
Finished runs go to a JSON-lines log and are reused when the script is run
again with the same log (a run's key names its rounding only when it is
stochastic, and its algorithm only when it overrides the task's own, so
the runs logged before stay valid).

Usage:
  python benchmarks/low_precision.py                   # full study (~30 min)
  python benchmarks/low_precision.py --quick --out /tmp/lp   # a smoke run
  python benchmarks/low_precision.py --long --tasks lstm_date --seeds 0
  python benchmarks/low_precision.py --long --no-train   # table + plot from the log
  python benchmarks/low_precision.py --step-time --tasks lstm_lamb,bert_sharded
  python benchmarks/low_precision.py --formats float32,int4,float4_e2m1fn \
      --extras block_ef --algorithm own,two_shot --tasks lstm_date,cnn_gbn
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
  sys.path.insert(0, HERE)
import _paths  # noqa: E402

FORMATS = ("float32", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8", "int4",
           "float4_e2m1fn")
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float8_e4m3fn": "fp8 e4m3",
         "float8_e5m2": "fp8 e5m2",
         "int8": "int8", "int4": "int4", "float4_e2m1fn": "fp4 e2m1"}
TASKS = ("lstm_date", "lstm_lamb", "cnn_gbn", "bert_lamb", "bert_sharded")
BERT_TASKS = ("bert_lamb", "bert_sharded")
MNIST_TASKS = TASKS[:3]
TASK_LABELS = {
    "lstm_date": "MNIST-1D LSTM, date() of momentum B0=16 lr 0.05, ring",
    "lstm_lamb": "MNIST-1D LSTM, LAMB peak 0.03, ring",
    "cnn_gbn": "MNIST-1D CNN + GhostBatchNorm (ghost 16), date() of momentum, 2x4 torus",
    "bert_lamb": "BERT-style MLM (bytes), LAMB sqrt rule, batch 128, ring",
    "bert_sharded": "BERT-style MLM (bytes), LAMB sqrt rule, batch 128, sharded builder "
                    "(4 data x 2 model), ring over the data axis",
}
#: Error feedback: off, the earlier rule (each replica's own residual only;
#: logged, no longer run) or the complete rule (also every rounded hop's).
EF_LABELS = {False: "off", "worker": "worker (earlier)", True: "worker + hop"}
# The BERT task: B0 = 2 sequences of 32 bytes, LAMB's base learning rate
# there (the best of docs/studies/bert_scaling/bert_scaling.md's B0 grid), batch 128 = 64·B0.
BERT = dict(base_batch_size=2, base_learning_rate=2.5e-3, batch_size=128, seq_len=32)
B0, SCALE = 16, 64
FULL = dict(num_train=8192, num_test=4096, epochs=16, seeds=(0, 1),
            formats=("float32", "bfloat16", "float8_e4m3fn", "int8", "float4_e2m1fn"),
            roundings=("nearest",), extras=())
QUICK = dict(num_train=1024, num_test=512, epochs=8, seeds=(0,),
             formats=("float32", "int8"), roundings=("nearest",), extras=("block_ef",))
# Long runs toward float32's plateau: 64 epochs of 8 steps = 512 steps, on the
# rows of the error-feedback study (float32; int8 APS, APS + EF, block 32,
# block 32 + EF; int4 and fp4 e2m1 block 32, block 32 + EF). Variants are
# (format, APS, rounding, block size, EF); EF "worker" rows are the earlier
# rule's, read from the log.
LONG = dict(num_train=8192, num_test=4096, epochs=64, seeds=(0, 1),
            formats=("float32", "int8", "int4", "float4_e2m1fn"), roundings=("nearest",),
            extras=(),
            variants=(("float32", False, "nearest", None, False),
                      ("int8", True, "nearest", None, False),
                      ("int8", True, "nearest", None, "worker"),
                      ("int8", False, "nearest", 32, False),
                      ("int8", False, "nearest", 32, "worker"),
                      ("int8", False, "nearest", 32, True),
                      ("int4", False, "nearest", 32, False),
                      ("int4", False, "nearest", 32, "worker"),
                      ("int4", False, "nearest", 32, True),
                      ("float4_e2m1fn", False, "nearest", 32, False),
                      ("float4_e2m1fn", False, "nearest", 32, "worker"),
                      ("float4_e2m1fn", False, "nearest", 32, True)))
EXTRAS = {"block": (False, 32, False), "block_ef": (False, 32, True),
          "aps_ef": (True, None, True)}  # name -> (APS, block size, EF)
BLOCK = 32
ROUNDINGS = ("nearest", "stochastic")
#: Reductions `--algorithm` may put in place of a task's own ("own").
ALGORITHMS = ("ring", "torus", "two_shot", "hierarchical")
_BITS = {"float32": 32, "bfloat16": 16}  # the others have at most 8


def _setup_devices() -> None:
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  flag = "--xla_force_host_platform_device_count=8"
  if flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


def _own(task: str) -> str:
  """The reduction a task runs unless `--algorithm` overrides it."""
  return "torus" if task == "cnn_gbn" else "ring"


def _variants(formats, roundings=("nearest",), extras=(), variants=None,
              algorithms=(None,)) -> list[tuple[str, bool, str, int | None, bool, str | None]]:
  """(format, APS, rounding, block size, error feedback, algorithm) of each row.

  Stochastic rounding runs with APS; it and the `extras` (block scaling,
  error feedback) apply to the formats of at most 8 bits. `variants` given
  explicitly replaces the product. `algorithms`: None is the task's own
  reduction, a name overrides it for the low-bit rows (float32 runs once,
  with the task's own); each row is followed by its overrides.
  """
  rows = _payloads(formats, roundings, extras, variants)
  return [(*v, a) for v in rows
          for a in ((None,) if v[0] == "float32" else algorithms)]


def _payloads(formats, roundings, extras, variants):
  if variants is not None:
    return [tuple(v) for v in variants if v[0] in formats]
  out = []
  for f in formats:
    if f == "float32":
      out.append((f, False, "nearest", None, False))
      continue
    if "nearest" in roundings:  # `--extras-only`: no roundings, no APS on/off rows
      out += [(f, True, "nearest", None, False), (f, False, "nearest", None, False)]
    if "stochastic" in roundings and _BITS.get(f, 8) <= 8:
      out.append((f, True, "stochastic", None, False))
    if _BITS.get(f, 8) <= 8:
      out += [(f, EXTRAS[e][0], "nearest", EXTRAS[e][1], EXTRAS[e][2]) for e in extras]
  return out


def _ident(task, fmt, aps, rounding, block, ef, seed, cfg, alg=None) -> str:
  # The key names rounding, block size, error feedback and the algorithm only
  # when they are not the defaults, so the runs logged before these options
  # stay valid; "ef=1" is the earlier one-stage rule, "ef=2" the complete one;
  # `alg` None is the task's own reduction.
  sr = "|rounding=stochastic" if rounding == "stochastic" else ""
  sr += f"|block={block}" if block else ""
  sr += "|ef=1" if ef == "worker" else "|ef=2" if ef else ""
  sr += f"|alg={alg}" if alg else ""
  return (f"{task}|{fmt}|aps={int(aps)}{sr}|seed={seed}|n={cfg['num_train']}"
          f"|E={cfg['epochs']}")


def _rounding(rec: dict) -> str:
  return rec.get("rounding", "nearest")


def _ef(rec: dict):
  """A record's error feedback: False, "worker" (logged before `ef_stages`) or True."""
  if not rec.get("error_feedback", False):
    return False
  return True if rec.get("ef_stages", 1) == 2 else "worker"


def _match(rec: dict, task, fmt, aps, rounding, block, ef, alg=None) -> bool:
  return (rec["task"] == task and rec["fmt"] == fmt and rec["aps"] == aps
          and _rounding(rec) == rounding and rec.get("block_size") == block
          and _ef(rec) == ef and rec.get("algorithm") == alg)


def _optimizer(task: str, cfg: dict, batch: int):
  import optax

  import date_optax
  from benchmarks.tasks import methods

  if task == "lstm_lamb":
    steps = cfg["epochs"] * (cfg["num_train"] // batch)
    warm = max(1, round(0.1 * steps))
    sched = optax.join_schedules(
        [optax.linear_schedule(0.03 / warm, 0.03, warm - 1),
         optax.linear_schedule(0.03, 0.0, steps - warm)], [warm - 1])
    return date_optax.lamb(sched, weight_decay=0.0)
  base = methods.make_baseline("momentum", batch_size=B0, learning_rate=0.05,
                               warmup_epochs=0.1, epochs=cfg["epochs"],
                               num_examples=cfg["num_train"])
  return methods.scaled_run("date", base, batch)[0]


def _model(task: str):
  if task == "cnn_gbn":
    sys.path.insert(0, HERE)
    from oracle import GhostBNCNN

    return GhostBNCNN(B0)
  from benchmarks.tasks import models

  return models.LSTMClassifier()


def _sharded_flags() -> list[str]:
  """Command-line flags that put the BERT run on the sharded builder."""
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  from examples.bert_lamb.configs import default

  rules = tuple((regex, tuple(spec)) for regex, spec in default.PARAM_SHARDING)
  return ["--config.model_parallel=2", f"--config.param_sharding={rules!r}"]


def _bert_fields(fmt: str, aps: bool, rounding: str, block: int | None, ef,
                 steps: int, alg: str | None = None) -> dict:
  """The BERT run's config overrides (dotted names) for one payload and `steps`."""
  low = fmt != "float32"
  return dict(
      **BERT, num_train_tokens=steps * BERT["batch_size"] * BERT["seq_len"],
      optimizer="lamb", lr_scaling="sqrt", warmup_scaling="linear", grad_stats=False,
      **{"grad_sync.algorithm": alg or "ring", "grad_sync.comm_dtype": fmt,
         "grad_sync.aps": ("on" if aps else "off") if low else "auto",
         "grad_sync.rounding": rounding,
         "grad_sync.block_size": block or 0, "grad_sync.error_feedback": bool(ef)},
      **({"num_slices": 2} if alg == "hierarchical" else {}))


def train_bert(fmt: str, aps: bool, rounding: str, block: int | None, ef: bool,
               seed: int, cfg: dict, sharded: bool = False, alg: str | None = None) -> dict:
  """One run of examples/bert_lamb's command line, as many steps as the MNIST tasks.

  `sharded`: on the (4, 2) ("data", "model") mesh with the kernels split
  over "model" (the sharded builder).
  """
  if HERE not in sys.path:
    sys.path.insert(0, HERE)
  import bert_scaling

  steps = cfg["epochs"] * (cfg["num_train"] // (B0 * SCALE))
  fields = dict(_bert_fields(fmt, aps, rounding, block, ef, steps, alg), seed=seed,
                log_every_steps=max(1, steps // 64))
  start = time.perf_counter()
  flags = [f"--config.{k}={v}" for k, v in fields.items()]
  r = bert_scaling.run_example(flags + (_sharded_flags() if sharded else []), 8)
  return dict(accuracy=100.0 * r["eval_accuracy"], eval_loss=r["eval_loss"],
              final_loss=r["loss"], skipped=int(r["total_skips"]), steps=r["steps"],
              wall=time.perf_counter() - start, finite=math.isfinite(r["loss"]))


def _mnist_step(task: str, fmt: str, aps: bool, rounding: str, block: int | None, ef,
                seed: int, data, cfg: dict, alg: str | None = None):
  """(model, step, initial state) of an MNIST-1D task through make_train_step."""
  import jax
  import jax.numpy as jnp
  import optax

  import date_optax.parallel as dp

  model = _model(task)
  cnn = task == "cnn_gbn"
  x0 = jnp.asarray(data.x_train[:2])
  variables = model.init(jax.random.key(seed), x0, train=True) if cnn else model.init(
      jax.random.key(seed), x0)

  def loss_fn(p, b, model_state=None):
    if cnn:
      logits, upd = model.apply({"params": p, "batch_stats": model_state}, b["x"],
                                train=True, mutable=["batch_stats"])
    else:
      logits, upd = model.apply({"params": p}, b["x"]), None
    loss = optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), b["y"]).mean()
    return (loss, upd["batch_stats"]) if cnn else loss

  if alg == "hierarchical":  # two emulated slices of 4 devices
    mesh = dp.multislice_mesh((4,), ("data",), num_slices=2)
  else:
    mesh = dp.torus_mesh(2, 4) if cnn else dp.data_mesh()
  step = dp.make_train_step(
      loss_fn, _optimizer(task, cfg, B0 * SCALE), mesh,
      grad_reduce=alg or _own(task),
      comm_dtype=None if fmt == "float32" else fmt,
      aps=None if fmt == "float32" else aps, rounding=rounding,
      block_size=None if fmt == "float32" else block,
      error_feedback=fmt != "float32" and bool(ef))
  return model, step, step.init(variables["params"], model_state=variables.get("batch_stats"))


def train_one(task: str, fmt: str, aps: bool, rounding: str, block: int | None, ef: bool,
              seed: int, data, cfg: dict, alg: str | None = None) -> dict:
  """One training run through make_train_step; final test accuracy etc.

  `alg`: the reduction in place of the task's own (None: its own).
  """
  if task in BERT_TASKS:
    return train_bert(fmt, aps, rounding, block, ef, seed, cfg, task == "bert_sharded", alg)
  import jax
  import jax.numpy as jnp
  import numpy as np

  batch = B0 * SCALE
  cnn = task == "cnn_gbn"
  model, step, state = _mnist_step(task, fmt, aps, rounding, block, ef, seed, data, cfg, alg)

  @jax.jit
  def predict(p, st, x):
    v = {"params": p} if st is None else {"params": p, "batch_stats": st}
    out = model.apply(v, x, train=False) if cnn else model.apply(v, x)
    return jnp.argmax(out, -1)

  start = time.perf_counter()
  n = data.x_train.shape[0]
  spe = n // batch
  rng = np.random.default_rng(seed)
  losses = []
  metrics = None
  for _ in range(cfg["epochs"]):
    order = rng.permutation(n)[: spe * batch]
    epoch_losses = []
    for j in range(spe):
      rows = order[j * batch : (j + 1) * batch]
      state, metrics = step(state, {"x": data.x_train[rows], "y": data.y_train[rows]})
      epoch_losses.append(metrics["loss"])
    losses.append(float(np.mean(jax.device_get(epoch_losses))))
  p, st = jax.device_get((state.params, state.model_state))
  correct = sum(
      int(np.sum(np.asarray(predict(p, st, data.x_test[i : i + 2048]))
                 == data.y_test[i : i + 2048]))
      for i in range(0, len(data.x_test), 2048))
  return dict(accuracy=100.0 * correct / len(data.x_test), final_loss=losses[-1],
              skipped=int(metrics["total_skips"]), steps=spe * cfg["epochs"],
              wall=time.perf_counter() - start,
              finite=all(math.isfinite(v) for v in losses))


def _bert_step(sharded: bool, fmt: str, aps: bool, rounding: str, block: int | None, ef,
               alg: str | None = None):
  """(step, initial state, one batch) of the BERT task, built as the example builds it."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import PartitionSpec as P

  import date_optax.parallel as dp
  from examples.bert_lamb import train
  from examples.bert_lamb.configs import default, scaling

  config = scaling.get_config()
  for key, value in _bert_fields(fmt, aps, rounding, block, ef, 512, alg).items():
    *path, name = key.split(".")
    node = config
    for part in path:
      node = node[part]
    node[name] = value
  if sharded:
    config.model_parallel = 2
    config.param_sharding = default.PARAM_SHARDING
  vocab = train.get_vocab(config)
  mesh = train.make_mesh(config)
  model = train.create_model(config, vocab)
  tx, _ = train.make_optimizer(config)

  loss_fn = train.mlm_loss_fn(model)

  rules = [(regex, P(*spec)) for regex, spec in config.param_sharding]
  step = dp.make_train_step(loss_fn, tx, mesh, has_aux=True, param_sharding=rules or None,
                            grad_sync=train.make_grad_sync(config))
  tokens = jnp.zeros((1, config.seq_len), jnp.int32)
  params = model.init(jax.random.key(0), tokens, train=False)["params"]
  rng = np.random.default_rng(0)
  shape = (config.batch_size, config.seq_len)
  batch = {"inputs": rng.integers(4, vocab.size, shape).astype(np.int32),
           "targets": rng.integers(4, vocab.size, shape).astype(np.int32),
           "weights": (rng.random(shape) < 0.15).astype(np.int32)}
  return step, step.init(params, rng=jax.random.key(1)), batch


def step_times(tasks, rows, data, cfg, rounds: int = 5, steps: int = 8) -> list[dict]:
  """Median step time and the busiest link's bytes per step of every payload.

  Every payload's step of a task is compiled and warmed first; then `rounds`
  rounds each time `steps` steps of every payload in turn, so a slower
  moment of a shared machine falls on all of them.
  """
  import jax
  import numpy as np

  import date_optax.parallel as dp

  out = []
  for task in tasks:
    builds = {}
    for fmt, aps, rounding, block, ef, alg in rows:
      if ef == "worker":
        continue
      if task in BERT_TASKS:
        step, state, batch = _bert_step(task == "bert_sharded", fmt, aps, rounding, block, ef,
                                        alg)
      else:
        _, step, state = _mnist_step(task, fmt, aps, rounding, block, ef, 0, data, cfg, alg)
        batch = {"x": data.x_train[: B0 * SCALE], "y": data.y_train[: B0 * SCALE]}
      for _ in range(2):
        state, m = step(state, batch)
      jax.block_until_ready(m)
      # Temporary memory of the compiled step (per device): what the payload's
      # rounding, scales and residual updates add to the float32 step.
      mem = step.lower(state, batch).compile().memory_analysis()
      temp = getattr(mem, "temp_size_in_bytes", float("nan"))
      builds[(fmt, aps, rounding, block, ef, alg)] = [step, state, batch, [], temp]
    for _ in range(rounds):
      for entry in builds.values():
        step, state, batch, times, _ = entry
        start = time.perf_counter()
        for _ in range(steps):
          state, m = step(state, batch)
        jax.block_until_ready(m)
        times.append(1e3 * (time.perf_counter() - start) / steps)
        entry[1] = state
    for (fmt, aps, rounding, block, ef, over), (step, state, _, times, temp) in builds.items():
      leaves = jax.tree.leaves(state.params)
      # Gradient bytes per device: float32, one model shard of every leaf.
      nbytes = 4 * sum(x.addressable_shards[0].data.size for x in leaves)
      replicas = math.prod(step.mesh.shape[a] for a in step.data_axes)
      alg = over or _own(task)
      low = fmt != "float32"
      cost = dp.allreduce_cost(
          alg, (2, 4) if alg == "torus" else replicas, nbytes, alpha=0.0, beta=0.0,
          comm_dtype=fmt if low else None, block_size=block if low else None,
          aps=low and aps, layers=len(leaves))
      out.append(dict(task=task, fmt=fmt, aps=aps, rounding=rounding, block_size=block,
                      error_feedback=bool(ef), **({"algorithm": over} if over else {}),
                      replicas=replicas, grad_bytes=nbytes,
                      link_bytes=cost.bytes_per_link, temp_bytes=temp,
                      residual_bytes=sum(x.addressable_shards[0].data.nbytes for x in
                                         jax.tree.leaves(state.grad_residual)),
                      step_ms=float(np.median(times)),
                      step_ms_range=[min(times), max(times)]))
  return out


def step_time_markdown(recs: list[dict], argv) -> str:
  import jax

  lines = [
      "`python benchmarks/low_precision.py " + " ".join(argv) + "` on "
      f"{platform.machine()} ({os.cpu_count()} CPU cores, shared, no GPU), jax "
      f"{jax.__version__}, 8 emulated CPU devices. Link bytes: the bytes the busiest "
      "link carries per step (`date_optax.parallel.allreduce_cost`, payload plus block "
      "scales, the APS `pmax` included) for the step's float32 gradient bytes per "
      "device. Residual: the error-feedback state a device holds (worker + hop). "
      "Step temp: the compiled step's temporary buffers per device "
      "(`memory_analysis`). Step time: median over rounds of alternating payloads (range in "
      "brackets). On emulated CPU devices the collectives are memory copies: the "
      "time measures the rounding and error-feedback arithmetic, not the wire.", "",
      "| task | payload | APS | block | EF | gradient KiB / device | link KiB / step "
      "| vs fp32 | residual KiB / device | step temp MiB / device | step ms | vs fp32 |",
      "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
  for task in dict.fromkeys(r["task"] for r in recs):
    sel = [r for r in recs if r["task"] == task]
    ref = next(r for r in sel if r["fmt"] == "float32")
    for r in sel:
      low = r["fmt"] != "float32"
      lines.append(
          f"| {task} ({r['replicas']} replicas) | {SHORT[r['fmt']]}"
          f"{' (' + r['algorithm'] + ')' if r.get('algorithm') else ''} "
          f"| {('on' if r['aps'] else 'off') if low else '—'} "
          f"| {(r['block_size'] or 'off') if low else '—'} "
          f"| {EF_LABELS[r['error_feedback']] if low else '—'} "
          f"| {r['grad_bytes'] / 1024:.0f} | {r['link_bytes'] / 1024:.1f} "
          f"| {r['link_bytes'] / ref['link_bytes']:.3f} "
          f"| {r['residual_bytes'] / 1024:.0f} | {r['temp_bytes'] / 2**20:.2f} "
          f"| {r['step_ms']:.1f} ({r['step_ms_range'][0]:.1f}–{r['step_ms_range'][1]:.1f}) "
          f"| {r['step_ms'] / ref['step_ms']:.2f} |")
  return "\n".join(lines)


def _rows(cfg, report: bool = False):
  """The rows `cfg` runs; `report`: also the task's own beside each override."""
  algs = cfg.get("algorithms", (None,))
  if report:
    algs = tuple(dict.fromkeys((None, *algs)))
  return _variants(cfg["formats"], cfg["roundings"], cfg.get("extras", ()),
                   cfg.get("variants"), algs)


def run(cfg: dict, out: str, tasks, name: str = "low_precision",
        train: bool = True) -> dict[str, dict]:
  sys.path.insert(0, ROOT)
  sys.path.insert(0, HERE)
  import _runlog

  from benchmarks.tasks import data as input_pipeline

  os.makedirs(out, exist_ok=True)
  log = os.path.join(out, name + ".jsonl")
  done = _runlog.load_runs(log)
  data = input_pipeline.load_mnist1d(
      cfg["num_train"], cfg["num_test"], seed=0,
      cache_dir=_paths.MNIST1D_CACHE)
  todo = [(t, f, a, r, b, e, g, s) for s in cfg["seeds"] for t in tasks
          for f, a, r, b, e, g in _rows(cfg)]
  from tqdm import tqdm

  for task, fmt, aps, rounding, block, ef, alg, seed in tqdm(todo, desc="runs"):
    ident = _ident(task, fmt, aps, rounding, block, ef, seed, cfg, alg)
    if ident in done or not train or ef == "worker":  # the earlier rule: logged only
      continue
    rec = dict(task=task, fmt=fmt, aps=aps, seed=seed,
               **({"rounding": rounding} if rounding != "nearest" else {}),
               **({"block_size": block} if block else {}),
               **({"error_feedback": True, "ef_stages": 2} if ef else {}),
               **({"algorithm": alg} if alg else {}),
               **train_one(task, fmt, aps, rounding, block, ef, seed, data, cfg, alg))
    _runlog.log_run(log, done, ident, rec)
    tqdm.write(f"{task:10s} {fmt:14s} aps={int(aps)} {rounding} block={block} "
               f"ef={int(ef)} {alg or _own(task)} seed={seed}: "
               f"{rec['accuracy']:.2f}% skipped {rec['skipped']} ({rec['wall']:.0f} s)")
  shown = [(t, *row, s) for s in cfg["seeds"] for t in tasks for row in _rows(cfg, True)]
  return {k: v for k, v in done.items()
          if k in {_ident(*c[:6], c[7], cfg, c[6]) for c in shown}}


def _cell(recs) -> tuple[float, list[float]]:
  accs = [r["accuracy"] for r in recs]
  return sum(accs) / len(accs), accs


def markdown(done: dict, cfg: dict, tasks, elapsed: float, argv) -> str:
  import jax

  recs = list(done.values())
  seeds = cfg["seeds"]
  lines = [
      "`python benchmarks/low_precision.py " + " ".join(argv) + "` on "
      f"{platform.machine()} ({os.cpu_count()} CPU cores, shared, no GPU), "
      f"jax {jax.__version__}, 8 emulated CPU devices; {len(recs)} runs, "
      f"{elapsed / 60:.1f} min of training (compilation included).",
      "",
      f"MNIST-1D, {cfg['num_train']} train / {cfg['num_test']} test, batch "
      f"{B0 * SCALE} = 64·B0, {cfg['epochs']} epochs "
      f"({cfg['epochs'] * (cfg['num_train'] // (B0 * SCALE))} steps), seeds "
      f"{', '.join(map(str, seeds))}. Final test accuracy (%), mean over seeds "
      "(per seed in brackets); Δ = the mean over seeds of the difference to "
      "float32 on the same seed, ± its standard error; `skip` = steps skipped "
      "for non-finite gradients, summed over seeds.",
      "",
  ]
  if any(t in BERT_TASKS for t in tasks):
    lines += [
        f"BERT-style MLM: the same {cfg['epochs'] * (cfg['num_train'] // (B0 * SCALE))} "
        f"steps at batch {BERT['batch_size']} sequences of {BERT['seq_len']} bytes; "
        "accuracy is the masked-byte accuracy (%) over every held-out window, eval loss "
        "the mean cross-entropy per masked byte (lower is better; in brackets its "
        "change against float32 on the same seeds).", ""]
  # An all-reduce column where `--algorithm` adds rows beside the tasks' own.
  algs = any(a is not None for a in cfg.get("algorithms", (None,)))
  if algs:
    lines += [
        "all-reduce: the task's own reduction (ring; 2x4 torus for cnn_gbn) or the one "
        "`--algorithm` put in its place for the low-bit payload (two_shot: 1-bit Adam's "
        "compressed reduce-scatter, one all-to-all, a float32 sum at the owner and one "
        "all-gather, two roundings per element; hierarchical: Multislice's sync over two "
        "emulated slices of 4 devices (2 x 2 x 2 with the model axis), float32 "
        "reduce-scatter and all-gather inside each slice, the payload only across the "
        "slices, by two_shot); float32 always runs the task's own.", ""]
  for task in tasks:
    # The BERT task also reports its held-out MLM loss (lower is better).
    has_loss = any("eval_loss" in r for r in recs if r["task"] == task)
    lines += [f"**{TASK_LABELS[task]}**", "",
              "| payload |" + (" all-reduce |" if algs else "")
              + " APS | block | EF | rounding | accuracy | Δ vs fp32 |"
              + (" eval loss |" if has_loss else "") + " skip |",
              "|---|" + ("---|" if algs else "") + "---|---|---|---|---:|---:|"
              + ("---:|" if has_loss else "") + "---:|"]
    base = {r["seed"]: r for r in recs if r["task"] == task and r["fmt"] == "float32"
            and r.get("algorithm") is None}
    for fmt, aps, rounding, block, ef, alg in _rows(cfg, True):
      sel = [r for r in recs if _match(r, task, fmt, aps, rounding, block, ef, alg)]
      if not sel:
        continue
      mean, accs = _cell(sel)
      label = "—" if fmt == "float32" else ("on" if aps else "off")
      rlabel = "—" if fmt == "float32" else rounding
      blabel = "—" if fmt == "float32" else (str(block) if block else "off")
      elabel = "—" if fmt == "float32" else EF_LABELS[ef]
      # Δ against float32 on the same seeds, ± the standard error of the
      # per-seed differences (paired by seed).
      pairs = [(r, base[r["seed"]]) for r in sel if r["seed"] in base]
      diffs = [r["accuracy"] - b["accuracy"] for r, b in pairs]
      delta = f"{sum(diffs) / len(diffs):+.2f}" if diffs else "—"
      if len(diffs) > 1 and fmt != "float32":
        m = sum(diffs) / len(diffs)
        sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1))
        delta += f" ± {sd / math.sqrt(len(diffs)):.2f}"
      loss = ""
      if has_loss:
        loss = f" {sum(r['eval_loss'] for r in sel) / len(sel):.4f}"
        if fmt != "float32" and pairs:
          rel = [r["eval_loss"] / b["eval_loss"] - 1.0 for r, b in pairs]
          loss += f" ({100 * sum(rel) / len(rel):+.2f} %)"
        loss += " |"
      glabel = f" {alg or _own(task)} |" if algs else ""
      lines.append(
          f"| {SHORT[fmt]} |{glabel} {label} | {blabel} | {elabel} | {rlabel} | {mean:.2f} "
          f"({', '.join(f'{a:.2f}' for a in accs)}) | {delta} |{loss}"
          f" {sum(r['skipped'] for r in sel)} |")
    lines.append("")
  return "\n".join(lines)


def plot(done: dict, cfg: dict, tasks, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  recs = list(done.values())
  fmts = list(cfg["formats"])
  fig, axes = plt.subplots(1, len(tasks), figsize=(max(6.0, 4.2 * len(tasks)), 3.6), squeeze=False)
  for ax, task in zip(axes[0], tasks, strict=True):
    shown = []
    payloads = (
        (True, "nearest", None, False, "tab:blue", "APS on"),
        (True, "stochastic", None, False, "tab:green", "APS on, stochastic rounding"),
        (False, "nearest", None, False, "tab:red", "APS off"),
        (False, "nearest", BLOCK, False, "tab:orange", f"block {BLOCK}"),
        (False, "nearest", BLOCK, "worker", "tab:brown", f"block {BLOCK} + EF, earlier rule"),
        (False, "nearest", BLOCK, True, "tab:purple", f"block {BLOCK} + EF"),
        (True, "nearest", None, "worker", "tab:olive", "APS + EF, earlier rule"),
        (True, "nearest", None, True, "tab:cyan", "APS + EF"))
    # An `--algorithm` override's rows: the payload's colour, a marker of its own.
    rows = set(_rows(cfg, True))
    markers = dict(zip(sorted({r[5] for r in rows}, key=lambda a: (a is not None, str(a))),
                       "o^sD", strict=False))  # the task's own: circles
    series = [(*v[:4], alg, v[4], markers[alg],
               v[5] + (f", {alg}" if alg else "")) for alg in markers for v in payloads]
    # The series with a row to run and a run logged (on any task: one legend).
    series = [v for v in series if any(r[1:] == v[:5] for r in rows if r[0] != "float32")
              and any(_match(r, r["task"], r["fmt"], *v[:5]) for r in recs
                      if r["task"] in tasks and r["fmt"] != "float32")]
    for k, (aps, rounding, block, ef, alg, color, marker, label) in enumerate(series):
      off = 0.6 * (k - (len(series) - 1) / 2) / max(1, len(series))
      xs, ys = [], []
      for i, fmt in enumerate(fmts):
        if fmt == "float32":
          continue
        for r in recs:
          if _match(r, task, fmt, aps, rounding, block, ef, alg):
            xs.append(i + off)
            ys.append(r["accuracy"])
      ax.scatter(xs, ys, color=color, marker=marker, s=18, label=label)
      shown += ys
    fp32 = [r["accuracy"] for r in recs if r["task"] == task and r["fmt"] == "float32"
            and r.get("algorithm") is None]
    ax.scatter([fmts.index("float32")] * len(fp32), fp32, color="black", s=18,
               label="float32 (exact)")
    base = fp32
    if base:
      ax.axhline(sum(base) / len(base), color="gray", lw=0.8, ls="--")
    ax.set_xticks(range(len(fmts)), [SHORT[f] for f in fmts], rotation=30, fontsize=8)
    ax.set_title(textwrap.fill(TASK_LABELS[task], 48), fontsize=8)
    ax.set_ylabel("final test accuracy (%)")
    # Zoom in where no payload collapsed (every run within 20 % of float32).
    if base and shown and min(shown) > 0.8 * sum(base) / len(base):
      lo, hi = min(shown + base), max(shown + base)
      ax.set_ylim(lo - 0.15 * (hi - lo + 0.1), hi + 0.15 * (hi - lo + 0.1))
    else:
      ax.set_ylim(0, 100)
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=len(labels))
  fig.suptitle("Gradient all-reduce payload at 64·B0 (8 devices, rounded per hop)",
               fontsize=10)
  fig.tight_layout(rect=(0, 0.07, 1, 1))
  fig.savefig(path, dpi=120)


def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="a smoke run of seconds")
  parser.add_argument("--long", action="store_true",
                      help="512-step runs toward the float32 plateau, low_precision_long.*")
  parser.add_argument("--extras", default=None,
                      help=f"comma-separated rows for the <=8-bit formats, from {tuple(EXTRAS)}")
  parser.add_argument("--seeds", default=None, help="comma-separated seeds")
  parser.add_argument("--no-train", action="store_true",
                      help="write the table and plot from the runs already logged")
  parser.add_argument("--out", default=os.path.join(_paths.STUDIES, "low_precision"),
                      help="directory for the .jsonl log, .md table and .png plot")
  parser.add_argument("--tasks", default=None,
                      help=f"comma-separated, from {TASKS} (default: all with --long, "
                           "else the MNIST-1D ones)")
  parser.add_argument("--epochs", type=int, default=None)
  parser.add_argument("--formats", default=None,
                      help=f"comma-separated, from {FORMATS} (float32 first)")
  parser.add_argument("--step-time", action="store_true",
                      help="time each payload's step and price its bytes per link; "
                           "low_precision_step_time.md")
  parser.add_argument("--rounding", default=None,
                      help=f"comma-separated, from {ROUNDINGS} (default nearest)")
  parser.add_argument("--extras-only", action="store_true",
                      help="run only float32 and the --extras rows (no APS on/off rows)")
  parser.add_argument("--feedback-only", action="store_true",
                      help="with --long: float32 and the rows with error feedback at "
                           "every hop only")
  parser.add_argument("--algorithm", default=None,
                      help="comma-separated reductions for the low-bit rows: 'own' (the "
                           f"task's own, the default) and/or some of {ALGORITHMS}, which "
                           "override it (float32 always runs the task's own)")
  args = parser.parse_args(argv)
  _setup_devices()
  if args.quick and args.long:
    parser.error("--quick and --long exclude each other")
  cfg = dict(QUICK if args.quick else LONG if args.long else FULL)
  if args.extras is not None:
    cfg["extras"] = tuple(e for e in args.extras.split(",") if e)
    if any(e not in EXTRAS for e in cfg["extras"]):
      parser.error(f"--extras must name some of {tuple(EXTRAS)}, got {args.extras}")
  if args.seeds is not None:
    cfg["seeds"] = tuple(int(v) for v in args.seeds.split(","))
  if args.epochs is not None:
    cfg["epochs"] = args.epochs
  if args.formats is not None:
    cfg["formats"] = tuple(args.formats.split(","))
    if any(f not in FORMATS for f in cfg["formats"]):
      parser.error(f"--formats must name some of {FORMATS}, got {args.formats}")
  if args.rounding is not None:
    cfg["roundings"] = tuple(args.rounding.split(","))
    if any(r not in ROUNDINGS for r in cfg["roundings"]):
      parser.error(f"--rounding must name some of {ROUNDINGS}, got {args.rounding}")
  if args.extras_only:
    cfg["roundings"] = ()
  if args.feedback_only:
    if not args.long:
      parser.error("--feedback-only needs --long")
    cfg["variants"] = tuple(v for v in cfg["variants"] if v[0] == "float32" or v[4] is True)
  if args.algorithm is not None:
    names = [a for a in args.algorithm.split(",") if a]
    if not names or any(a != "own" and a not in ALGORITHMS for a in names):
      parser.error(f"--algorithm must name 'own' and/or some of {ALGORITHMS}, "
                   f"got {args.algorithm}")
    cfg["algorithms"] = tuple(dict.fromkeys(None if a == "own" else a for a in names))
  tasks = tuple(args.tasks.split(",")) if args.tasks else (
      TASKS if args.long else MNIST_TASKS)
  unknown = [t for t in tasks if t not in TASKS]
  if unknown:
    parser.error(f"--tasks must name some of {TASKS}, got {unknown}")
  if args.step_time:
    sys.path.insert(0, ROOT)
    from benchmarks.tasks import data as input_pipeline

    data = input_pipeline.load_mnist1d(cfg["num_train"], cfg["num_test"], seed=0,
                                       cache_dir=_paths.MNIST1D_CACHE)
    recs = step_times(tasks, _rows(cfg), data, cfg,
                      **({"rounds": 2, "steps": 2} if args.quick else {}))
    md = step_time_markdown(recs, argv)
    os.makedirs(args.out, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    with open(os.path.join(args.out, f"low_precision_step_time{suffix}.md"), "w") as f:
      f.write(md + "\n")
    with open(os.path.join(args.out, f"low_precision_step_time{suffix}.json"), "w") as f:
      json.dump(recs, f, indent=1)
    print(md)
    return 0
  name = "low_precision_quick" if args.quick else (
      "low_precision_long" if args.long else "low_precision")
  done = run(cfg, args.out, tasks, "low_precision_long" if args.long else "low_precision",
             train=not args.no_train)
  md = markdown(done, cfg, tasks, sum(r["wall"] for r in done.values()), argv)
  with open(os.path.join(args.out, name + ".md"), "w") as f:
    f.write(md + "\n")
  plot(done, cfg, tasks, os.path.join(args.out, name + ".png"))
  print(md)
  return 0


if __name__ == "__main__":
  sys.exit(main())
