"""A batch that grows: fixed, ramped and adaptive batches at equal examples (issue 35).

Every row sees the same training examples (the baseline's epochs). The
growing rows are trained through
`date_optax.parallel.make_train_step(..., batch_schedule=...)` on `--devices`
emulated devices (default 2, one per core here), their data through
`data_loader` + `GrowingBatches`:

  adaptive       ``BatchSchedule.adaptive(B0, max_batch=64·B0, threshold=2)``:
                 double when the smoothed B_simple holds at twice the batch,
                 at most every 10 steps (the first default; ``adaptive_t3``
                 is today's default, threshold 3)
  doubling_<f>   the hand-made batch-size warmup: B0 doubled 6 times at
                 equal shares of the first fraction f of the examples
  ramp_<f>       Megatron-LM/NeMo's linear ramp from B0 to 64·B0 (7
                 increments of 9·B0) over the first fraction f

with ``date(baseline, 64·B0, batch_schedule=...)``: the baseline's DATE
schedule counted in examples, times the batch scale: the measured gain r
for momentum, sqrt of the batch ratio for Adam and LAMB (`lr_rule`; the
``adaptive_*`` rows try the other rules). The rows ``baseline`` (B0) and
``date`` (fixed 64·B0, DATE's defaults) are read from the oracle study's
log (`--oracle-log`, default docs/studies/oracle/oracle.jsonl; trained
here when missing), and
``date_gain`` (fixed 64·B0, ``lr_scaling="gain"``) from the gain study's
(`--gain-log`). The GhostBatchNorm CNN starts at 2·B0 on 2 devices: a
device's microbatch must hold its ghost batch (B0), and the noise scale
needs two of them.

  python benchmarks/batch_growth.py            # the study (resumable)
  python benchmarks/batch_growth.py --extended # + ramps on every seed
  python benchmarks/batch_growth.py --quick    # tiny pipeline check
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

# Emulated CPU devices (set before jax is imported): `--devices=N`, default 2,
# one per core of the 2-core machine the study was run on; 8 emulated
# devices on 2 cores spend most of a small microbatch's step on threads.
_DEVICES = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--devices=")), "2")
if __name__ == "__main__":
  os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_DEVICES}")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import date_optax  # noqa: E402
import date_optax.parallel as dp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/
import _paths  # noqa: E402
import _runlog  # noqa: E402
import batch_growth_bert as bert  # noqa: E402
import oracle  # noqa: E402

#: The largest batch, in units of B0, and the linear ramp's number of increments.
SCALE = 64
RAMP_INCREMENTS = 7
RAMP_FRACTIONS = (0.1, 0.25, 0.5)
DOUBLING = tuple(f"doubling_{f}" for f in RAMP_FRACTIONS)
LINEAR = tuple(f"ramp_{f}" for f in RAMP_FRACTIONS)
#: Variants of the adaptive row (seed 0), other learning-rate rules than
#: the row's (`lr_rule`), and the tasks they run on.
VARIANTS = {
    "adaptive_linear": ("mnist1d_lstm_momentum", "mnist_lstm_momentum", "mnist1d_lstm_adam"),
    "adaptive_sqrt": ("mnist1d_lstm_momentum", "mnist_lstm_momentum"),
    "adaptive_gain": ("mnist1d_lstm_adam",),
    # Adam's learning rate linear in the batch, growing at threshold 3.
    "adaptive_linear_t3": ("mnist1d_lstm_adam",),
}
#: The trigger's calibration (issue 48, item 7): `adaptive_c<x>` is the
#: adaptive row with ``calibration=x`` (B_crit = x · B_simple), on every task.
CALIBRATIONS = (2, 4)
#: The smoothing and stretch grid (item 7): decay per start batch (d) and
#: stretch in start batches (h); ``adaptive_d0.95_h4`` is the first default.
SMOOTHING = ("adaptive_d0.95_h4", "adaptive_d0.99_h4", "adaptive_d0.95_h32",
             "adaptive_d0.99_h32", "adaptive_d0.99_h64", "adaptive_d0.99_h32_m8",
             "adaptive_d0.95_h4_m8")
#: The threshold (item 7, the conservative side): grow when B_simple >= t·B
#: (the default is 2, Merrill et al.'s).
THRESHOLDS = (3, 4)
CALIBRATED = (*(f"adaptive_c{c}" for c in CALIBRATIONS),
              *(f"adaptive_t{t}" for t in THRESHOLDS), *SMOOTHING)
ADAPTIVE_VARIANTS = (*VARIANTS, *CALIBRATED)
NEW_METHODS = ("adaptive", *DOUBLING, *LINEAR, *ADAPTIVE_VARIANTS)
OLD_METHODS = ("baseline", "date")
#: Rows read from the gain study's log (`--gain-log`), never trained here.
READ_METHODS = ("date_gain",)
ROWS = (*OLD_METHODS, *READ_METHODS, *NEW_METHODS)
LABELS = {
    "baseline": "B0 baseline",
    "date": "fixed k·B0, DATE defaults",
    "date_gain": "fixed k·B0, DATE with the gain",
    "adaptive": "adaptive, threshold 2 (the first default)",
    "adaptive_linear": "adaptive, learning rate linear in the batch",
    "adaptive_sqrt": "adaptive, learning rate sqrt in the batch",
    "adaptive_gain": "adaptive, learning rate by the measured gain",
    "adaptive_linear_t3": "adaptive, threshold 3, learning rate linear in the batch",
    **{f"adaptive_c{c}": f"adaptive, calibration {c} (B_crit = {c}·B_simple)"
       for c in CALIBRATIONS},
    **{f"adaptive_t{t}": f"adaptive, threshold {t} (grow when B_simple ≥ {t}·B)"
       + (" — BatchSchedule.adaptive's defaults" if t == 3 else "") for t in THRESHOLDS},
    **{m: "adaptive, decay {} per start batch, stretch {} start batches".format(
        *(t[1:] for t in m.split("_")[1:3])) + (", 8 rows per microbatch" if "_m8" in m
                                                 else "") for m in SMOOTHING},
    **{f"doubling_{f}": f"doubling ramp over {f:.0%} of the examples"
       for f in RAMP_FRACTIONS},
    **{f"ramp_{f}": f"linear (NeMo) ramp over {f:.0%} of the examples"
       for f in RAMP_FRACTIONS},
}
#: The B0 learning rate of the tasks the oracle study tuned at B0 (its grid's
#: winner on seed 0: docs/studies/oracle/oracle.md).
TUNED_LR = {"mnist1d_cnn_gbn_momentum": 0.1}
#: The BERT-style MLM task (B0 = 2, LAMB at 2.5e-3; `batch_growth_bert.py`).
BERT = oracle.Task(bert.NAME, bert.LABEL, "bert", None, "lamb", 2, 2.5e-3)
#: Its rows (the others are not run on it) and seeds (as the batch-scaling study).
BERT_METHODS = ("adaptive", "doubling_0.25", *CALIBRATED)
BERT_SEEDS = 3
GROWING_TASKS = ("mnist1d_lstm_momentum", "mnist1d_lstm_adam", "mnist_lstm_momentum",
                 "mnist1d_cnn_gbn_momentum", bert.NAME)
#: The order the study runs its cells in: the adaptive rows on every seed
#: first, then the ramps of seed 0; `--extended` adds the ramps of the other
#: seeds and the other linear ramps.
PHASES = (("baseline", "date", "adaptive"),
          ("doubling_0.25", "ramp_0.25", "doubling_0.1", "doubling_0.5", *ADAPTIVE_VARIANTS),
          ("ramp_0.1", "ramp_0.5"))
FULL = dict(oracle.FULL, scale=SCALE, increments=RAMP_INCREMENTS)
QUICK = dict(oracle.QUICK, seeds=1, tasks=("mnist1d_lstm_momentum",), scale=4,
             increments=3)


def start_of(task, b0: int, devices: int) -> tuple[int, int]:
  """(first batch, devices): B0 over `devices`, except ghost batch norm,
  whose ghost batch (B0) must fit one device's microbatch and whose noise
  scale needs two units: 2·B0 on 2 devices."""
  if "gbn" in task.name:
    return 2 * b0, 2
  return b0, min(devices, jax.device_count())


def schedule_for(method: str, b0: int, total_examples: int, cfg: dict,
                 start: int | None = None) -> date_optax.BatchSchedule:
  top = cfg["scale"] * b0
  start = b0 if start is None else start
  if method.startswith("adaptive"):
    options, _ = adaptive_options(method, start)
    # Every row without its own threshold grows at 2, the library's default
    # when the study ran them (the default is 3 since: the ``adaptive_t3`` row).
    options.setdefault("threshold", 2.0)
    return date_optax.BatchSchedule.adaptive(start, max_batch=top, **options)
  kind, frac = method.split("_", 1)
  examples = max(1, int(float(frac) * total_examples))
  if kind == "doubling":
    return date_optax.BatchSchedule.doubling(start, examples, max_batch=top)
  return date_optax.BatchSchedule.ramp(start, (top - b0) // cfg["increments"], examples,
                                       max_batch=top)


#: The settings an adaptive row's name may carry, ``adaptive_c2_h16``: the
#: schedule's calibration (c), threshold (t), guard margin (g) and stretch
#: in start batches (h), and the statistics' decay per start batch (d).
_OPTION_CODES = {"c": "calibration", "t": "threshold", "g": "guard_margin",
                 "h": "hold_examples", "d": "grad_stats_decay", "m": "max_rows_per_device"}


#: The learning-rate rules a row's name may carry (``adaptive_linear_t3``).
LR_RULES = ("linear", "sqrt", "gain")


def adaptive_options(method: str, start: int) -> tuple[dict, dict]:
  """(the schedule's keywords, the step's keywords) of an adaptive row: the
  step's are `grad_stats_decay` and `max_rows_per_device` (``m8``: 8 rows
  per device, so a step keeps ``B / 8`` partial gradients, as accumulation
  did before rows first)."""
  options, step = {}, {}
  for token in method.split("_")[1:]:
    if token in LR_RULES or token[0] not in _OPTION_CODES:
      continue
    name, value = _OPTION_CODES[token[0]], float(token[1:])
    if name in ("grad_stats_decay", "max_rows_per_device"):
      step[name] = int(value) if name == "max_rows_per_device" else value
    elif name == "hold_examples":
      options[name] = int(value * start)
    else:
      options[name] = value
  return options, step


def lr_rule(base: date_optax.Baseline) -> str:
  """The growing rows' learning-rate rule, chosen by measurement (seed 0,
  the adaptive row): the measured gain r for the SGD family (linear in the
  batch diverged on real-digit MNIST, sqrt lost 1.7 points on MNIST-1D),
  sqrt of the batch ratio for Adam. The rows named ``_linear`` later showed
  linear better for Adam (3 seeds at threshold 3: −0.24 points against
  sqrt's −1.33); the rows without a rule in their name keep sqrt, the rule
  their logged runs used."""
  return "gain" if base.optimizer in ("sgd", "momentum", "nesterov") else "sqrt"


def train_growing(task, data: dict, base: date_optax.Baseline, sched, seed: int,
                  devices: int | None = None, rule: str | None = None,
                  step_options: dict | None = None) -> dict:
  """Trains `epochs · n` examples through the growing step; the curve per step."""
  tx = date_optax.date(base, sched.max_batch, batch_schedule=sched,
                       lr_scaling=rule or lr_rule(base))
  x_train, y_train = data["x_train"], data["y_train"]
  start = time.perf_counter()
  model, params, bstats = oracle.init_classifier(task, x_train, seed)
  loss_fn = oracle.classifier_loss(model)
  mesh = dp.data_mesh(devices)
  step = dp.make_train_step(loss_fn, tx, mesh, grad_stats=True, batch_schedule=sched,
                            **(step_options or {}))
  state = step.init(params, model_state=bstats)
  src = dp.ArraySource({"x": x_train, "y": y_train.astype(np.int32)})
  batches = dp.GrowingBatches(iter(dp.data_loader(src, sched.chunk_size, seed=seed)),
                              sched.chunk_size)
  state, curve, examples = bert.run_growing(step, state, batches,
                                            data["epochs"] * len(x_train))
  wall = time.perf_counter() - start

  loss = curve[-1]["loss"]
  acc, diverged = oracle.step_accuracy(model, state, data, loss)
  return dict(accuracy=acc, loss=loss, steps=len(curve), examples=examples, wall=wall,
              diverged=bool(diverged), programs=step.traces,
              devices=int(mesh.devices.size),
              curve=bert.thin(curve))


def run_study(args) -> int:
  cfg = dict(QUICK if args.quick else FULL, devices=args.devices)
  # The page always shows every task and the study's seeds, whatever subset
  # this invocation runs (`--tasks`, `--seeds`).
  shown_cfg = dict(cfg, seeds=max(cfg["seeds"], args.seeds or 0))
  if args.seeds is not None:
    cfg["seeds"] = args.seeds

  def select(names):
    return [dataclasses.replace(t, learning_rate=t.learning_rate or TUNED_LR[t.name])
            for t in (*oracle.TASKS, BERT) if t.name in names]

  tasks = select(args.tasks.split(",") if args.tasks else cfg.get("tasks", GROWING_TASKS))
  shown = select(cfg.get("tasks", GROWING_TASKS))
  methods = args.methods.split(",") if args.methods else None
  log_path = args.out + ".jsonl"
  done = _runlog.load_runs(log_path)
  old = {}
  for path in (args.oracle_log, args.gain_log):
    old.update(_runlog.load_runs(path) if path else {})
  if args.bert_log and os.path.exists(args.bert_log):
    old.update({json.dumps(r["key"], sort_keys=True): r
                for r in bert.read_rows(args.bert_log, cfg["scale"])})
  datasets: dict[str, dict] = {}
  t0 = time.perf_counter()

  def data_of(task):
    if task.data not in datasets:
      datasets[task.data] = oracle.load_data(task.data, cfg)
    return datasets[task.data]

  def run_bert(method, seed):
    k = 1 if method == "baseline" else cfg["scale"]
    key = dict(task=bert.NAME, method=method, k=k, seed=seed)
    if method in NEW_METHODS:
      key["devices"] = 2
    ident = json.dumps(key, sort_keys=True)
    if ident in done or ident in old:
      return done.get(ident) or old[ident]
    if args.report_only or method not in NEW_METHODS:
      return None
    total = bert.config().num_train_tokens // bert.config().seq_len
    sched = schedule_for(method, BERT.batch_size, total, cfg)
    rec = _runlog.run_and_log(
        log_path, done, ident, key,
        lambda: bert.train_growing(
            sched, seed, "linear" if method == "adaptive_linear" else "sqrt",
            **adaptive_options(method, BERT.batch_size)[1]),
        f"{bert.NAME} seed={seed} {method}")
    if rec is None:
      return None
    print(f"[{(time.perf_counter() - t0) / 60:5.1f} min] {bert.NAME} seed={seed} "
          f"{method}: eval loss {rec['loss']:.4f} in {rec['steps']} steps "
          f"({rec['wall']:.0f} s)", flush=True)
    return rec

  def run(task, method, seed):
    if task.data == "bert":
      if method in BERT_METHODS and seed < BERT_SEEDS:
        run_bert(method, seed)
      return None
    data = data_of(task)
    k = 1 if method == "baseline" else cfg["scale"]
    key = dict(task=task.name, lr=task.learning_rate, method=method, k=k, seed=seed,
               epochs=data["epochs"], n=len(data["x_train"]))
    first, devices = start_of(task, task.batch_size, args.devices)
    if method in NEW_METHODS:
      key["devices"] = devices
    ident = json.dumps(key, sort_keys=True)
    if ident in done:
      return done[ident]
    if ident in old:
      return old[ident]
    if args.report_only or method in READ_METHODS:
      return None
    base = oracle.baseline_of(task, task.learning_rate, data)

    def train():
      if method in OLD_METHODS:
        tx = oracle.optimizer_for(method, base, task.batch_size * k)
        return oracle.train(task.model(task.batch_size), data, tx, task.batch_size * k,
                            seed, task.steps_per_call)
      sched = schedule_for(method, task.batch_size, data["epochs"] * len(data["x_train"]),
                           cfg, start=first)
      rule = next((r for r in method.split("_")[1:] if r in LR_RULES), None)
      options = adaptive_options(method, first)[1] if method.startswith("adaptive") else {}
      return train_growing(task, data, base, sched, seed, devices, rule, options)

    rec = _runlog.run_and_log(log_path, done, ident, key, train,
                              f"{task.name} seed={seed} {method}")
    if rec is None:
      return None
    print(f"[{(time.perf_counter() - t0) / 60:5.1f} min] {task.name} seed={seed} "
          f"{method}: {rec['accuracy']:.2f} in {rec['steps']} steps ({rec['wall']:.0f} s)",
          flush=True)
    return rec

  seeds = range(cfg["seeds"])
  if args.quick:
    blocks = [((seed,), (*OLD_METHODS, *NEW_METHODS)) for seed in seeds]
  else:  # the adaptive rows on every seed, then seed 0's ramps (and the rest)
    blocks = [((seed,), PHASES[0]) for seed in seeds] + [((0,), PHASES[1])]
    if args.extended:
      blocks += [((seed,), PHASES[1]) for seed in seeds[1:]] + [(seeds, PHASES[2])]
  bert_late = []  # BERT's runs after seed 0's adaptive: last (~15 min each)
  for block_seeds, phase in blocks:
    for seed in block_seeds:
      for m in phase:  # a row on every task before the next row
        for t in tasks:
          if t.data == "bert" and (seed > 0 or phase is not PHASES[0]):
            bert_late.append((t, m, seed))
            continue
          if m in VARIANTS and t.name not in VARIANTS[m]:
            continue
          if methods is None or m in methods:
            run(t, m, seed)
  for t, m, seed in bert_late:
    if methods is None or m in methods:
      run(t, m, seed)
  recs = {**old, **done}
  md = markdown(recs, shown, shown_cfg) + "\n" + tracking(recs, shown, shown_cfg)
  with open(args.out + ".md", "w") as f:
    f.write(md)
  plot(recs, shown, shown_cfg, args.out + ".png")
  print(md)
  print(f"wrote {args.out}.md, {args.out}.png, {log_path}")
  return 0


def _records(recs, task, method, cfg, seeds=None):
  k = 1 if method == "baseline" else cfg["scale"]
  seeds = cfg["seeds"] if seeds is None else seeds
  if task.data == "bert":
    return [r for r in recs.values() if r["key"]["task"] == task.name
            and r["key"]["method"] == method and r["key"]["k"] == k
            and r["key"]["seed"] < seeds]
  devices = start_of(task, task.batch_size, cfg["devices"])[1]
  return [r for r in recs.values() if r["key"]["task"] == task.name
          and (method not in NEW_METHODS or r["key"].get("devices") == devices)
          and r["key"]["method"] == method and r["key"]["k"] == k
          and r["key"]["seed"] < seeds and r["key"].get("lr") == task.learning_rate
          and r["key"].get("epochs") == (cfg["mnist_epochs"] if task.data == "mnist"
                                         else cfg["epochs"])]


def markdown(recs, tasks, cfg) -> str:
  lines = [
      "# A batch that grows: fixed, ramped and adaptive batches at equal examples",
      "",
      f"Written by `benchmarks/batch_growth.py`; up to {cfg['seeds']} seed(s) (n); every "
      f"row sees the baseline's epochs of examples; the largest batch is "
      f"{cfg['scale']}·B0. Quality is the mean test accuracy (%) over seeds (a "
      "diverged run counts as chance), for BERT the eval MLM loss (nats per masked "
      "byte), with the range over seeds; Δ is against the B0 baseline's mean (in "
      "points; for BERT in % of its loss, lower is better); steps are optimizer "
      "steps (mean); wall is the mean training time in seconds (the baseline and "
      "fixed DATE rows come from the oracle "
      "study's in-memory trainer, the gain row from the gain study's step, the "
      f"growing rows from the growing step on {cfg['devices']} emulated CPU devices "
      "(2 for the GhostBatchNorm CNN, which starts at 2·B0 so that one device "
      "holds a ghost batch); BERT's B0, fixed and gain rows are the batch-scaling "
      "study's runs (its step on 2 devices), its growing rows on the same 2.",
      "",
      "| task | row | n | steps | quality (range) | Δ vs B0 | wall (s) |",
      "|---|---|---:|---:|---:|---:|---:|",
  ]
  for t in tasks:
    metric = "loss" if t.data == "bert" else "accuracy"
    base = _records(recs, t, "baseline", cfg)
    b0 = float(np.mean([r[metric] for r in base])) if base else float("nan")
    for m in ROWS:
      rs = _records(recs, t, m, cfg)
      if not rs:
        continue
      vals = [r[metric] for r in rs]
      val = float(np.mean(vals))
      steps = int(np.mean([r["steps"] for r in rs]))
      wall = float(np.mean([r["wall"] for r in rs]))
      if metric == "loss":
        q, d = f"{val:.4f} ({min(vals):.4f}–{max(vals):.4f})", f"{100 * (val / b0 - 1):+.2f} %"
      else:
        q, d = f"{val:.2f} ({min(vals):.2f}–{max(vals):.2f})", f"{val - b0:+.2f}"
      lines.append(f"| {t.label} | {LABELS[m]} | {len(rs)} | {steps} | {q} | {d} | {wall:.0f} |")
  grid = [r for r in recs.values() if r["key"]["task"] in {t.name for t in tasks}
          and (r["key"]["method"].endswith("_v1") or r["key"]["method"] in CALIBRATED)]
  if grid:
    lines += [
        "",
        "The calibration grid (issue 48, item 7) and the rule before it (`_v1`: "
        "smoothing per step, fixed at build, no stretch or guard, microbatches of "
        "B0's rows), per seed:",
        "",
        "| task | row | seed | steps | quality | Δ vs B0 | final batch |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    labels = {t.name: t for t in tasks}
    for r in sorted(grid, key=lambda r: (r["key"]["task"], r["key"]["method"],
                                         r["key"]["seed"])):
      t = labels[r["key"]["task"]]
      metric = "loss" if t.data == "bert" else "accuracy"
      base = _records(recs, t, "baseline", cfg)
      b0 = float(np.mean([b[metric] for b in base])) if base else float("nan")
      m = r["key"]["method"]
      label = ("before the stretch, guard and smoothing per example" if m.endswith("_v1")
               else LABELS.get(m, m))
      d = (f"{100 * (r[metric] / b0 - 1):+.2f} %" if metric == "loss"
           else f"{r[metric] - b0:+.2f}")
      last = r["curve"][-1]["batch"] if r.get("curve") else ""
      lines.append(f"| {t.label} | {label} | {r['key']['seed']} | {r['steps']} | "
                   f"{r[metric]:.4f} | {d} | {last} |" if metric == "loss" else
                   f"| {t.label} | {label} | {r['key']['seed']} | {r['steps']} | "
                   f"{r[metric]:.2f} | {d} | {last} |")
  first = [r for r in recs.values() if r["key"]["method"].endswith("_v0")
           and r["key"]["task"] in {t.name for t in tasks}]
  if first:
    lines += [
        "",
        "Before an infinite B_simple stopped counting as a reason to grow "
        "(`_v0`: the same rows, run with the first rule):",
        "",
        "| task | row | seed | steps | quality | batch changes (step: batch) |",
        "|---|---|---:|---:|---:|---|",
    ]
    labels = {t.name: t.label for t in tasks}
    for r in sorted(first, key=lambda r: (r["key"]["task"], r["key"]["method"],
                                          r["key"]["seed"])):
      c = r.get("curve", [])
      changes = ", ".join(f"{p['step']}: {p['batch']}" for i, p in enumerate(c)
                          if i == 0 or p["batch"] != c[i - 1]["batch"])
      m = r["key"]["method"][:-3]
      q = f"{r['loss']:.4f}" if r["key"]["task"] == bert.NAME else f"{r['accuracy']:.2f}"
      lines.append(f"| {labels[r['key']['task']]} | {LABELS.get(m, m)} | {r['key']['seed']} "
                   f"| {r['steps']} | {q} | {changes} |")
  return "\n".join(lines) + "\n"


def _examples_at(curve: list[dict]) -> list[tuple[int, int, float]]:
  """(examples before the step, batch, B_simple) at each kept curve point.

  The curve keeps every step where the batch changes and the one before, so
  the batch is constant between kept points and the examples are exact.
  """
  out, examples, prev = [], 0, None
  for p in curve:
    if prev is not None:
      examples += prev["batch"] * (p["step"] - prev["step"])
    out.append((examples, p["batch"], p["noise_scale"]))
    prev = p
  return out


def tracking(recs, tasks, cfg) -> str:
  """How the measured B_simple tracks the batch the ramps show a task tolerates.

  For each task and a few points of training (a share of the examples):
  the smoothed B_simple the adaptive run measured there (seed 0), the batch
  it ran, and the batch of each doubling ramp there with the ramp's final
  quality; a ramp that ends within 0.5 points (1 % of the loss) of B0 ran
  batches the task tolerated, one that misses ran some it did not.
  """
  fracs = (0.01, 0.03, 0.1, 0.25, 0.5, 1.0)
  lines = [
      "## The measured noise scale against the batches the ramps show a task tolerates",
      "",
      "Per task, at a share of the training examples: B_simple (the step's smoothed "
      "simple noise scale, adaptive run, seed 0) and the batch the adaptive run "
      "used there; then the batch each doubling ramp used there, with the ramp's "
      "final quality (✓: within 0.5 points of B0, or 1 % of its loss for BERT).",
      "",
      "| task | share of examples | B_simple | adaptive batch | "
      + " | ".join(LABELS[m].replace(" of the examples", "") for m in DOUBLING) + " |",
      "|---|---:|---:|---:|" + "---:|" * len(DOUBLING),
  ]
  for t in tasks:
    ad = _records(recs, t, "adaptive", cfg, 1)
    if not ad or "curve" not in ad[0]:
      continue
    metric = "loss" if t.data == "bert" else "accuracy"
    base = _records(recs, t, "baseline", cfg)
    b0 = float(np.mean([r[metric] for r in base])) if base else float("nan")
    pts = _examples_at(ad[0]["curve"])
    total = ad[0]["examples"]
    ramps = []
    for m in DOUBLING:
      rs = _records(recs, t, m, cfg)
      if not rs:
        ramps.append(None)
        continue
      val = float(np.mean([r[metric] for r in rs]))
      ok = (val <= 1.01 * b0) if metric == "loss" else (val >= b0 - 0.5)
      first = start_of(t, t.batch_size, cfg["devices"])[0]
      sched = schedule_for(m, t.batch_size, total, cfg, start=first)
      ramps.append((sched, val, ok))
    for f in fracs:
      e = int(f * total) - 1
      _, batch, ns = max((p for p in pts if p[0] <= e), key=lambda p: p[0])
      cells = []
      for r in ramps:
        if r is None:
          cells.append("—")
        else:
          sched, val, ok = r
          q = f"{val:.3f}" if metric == "loss" else f"{val:.2f}"
          cells.append(f"{sched.batch_size_at(e)} ({q} {'✓' if ok else '✗'})")
      lines.append(f"| {t.label} | {f:.0%} | {ns:.0f} | {batch} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot(recs, tasks, cfg, path: str) -> None:
  """Per task: the batch and the learning rate of every step (seed 0's growing
  rows), and every row's final quality against its optimizer steps."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, axes = plt.subplots(3, len(tasks), figsize=(4.6 * len(tasks), 10), squeeze=False)
  for j, t in enumerate(tasks):
    metric = "loss" if t.data == "bert" else "accuracy"
    for i, m in enumerate(ROWS):
      color = f"C{i}"
      rs = _records(recs, t, m, cfg)
      if rs:
        axes[2, j].scatter([r["steps"] for r in rs], [r[metric] for r in rs], color=color,
                           s=14, label=LABELS[m])
      first = _records(recs, t, m, cfg, 1)
      if m not in NEW_METHODS or not first or "curve" not in first[0]:
        continue
      c = first[0]["curve"]
      steps = [p["step"] for p in c]
      axes[0, j].plot(steps, [p["batch"] for p in c], color=color, label=LABELS[m])
      axes[1, j].plot(steps, [p["lr"] for p in c], color=color)
    axes[0, j].set_yscale("log", base=2)
    axes[0, j].set_title(t.label, fontsize=9)
    axes[0, j].set_ylabel("global batch (seed 0)")
    axes[1, j].set_ylabel("learning rate (seed 0)")
    axes[1, j].set_xlabel("optimizer step")
    axes[2, j].set_xscale("log")
    axes[2, j].set_xlabel("optimizer steps of the run")
    axes[2, j].set_ylabel("eval MLM loss" if metric == "loss" else "test accuracy (%)")
    axes[0, j].legend(fontsize=6)
    axes[2, j].legend(fontsize=6)
  _paths.save_figure(fig, path, dpi=80)


def step_cost(steps: int = 10, rounds: int = 15, batch: int = 256) -> dict:
  """Seconds per step at `batch`: the growing step (adaptive, grown to
  `batch`) against the plain step with the same microbatches and statistics."""
  task = oracle.TASKS[0]
  model = task.model(task.batch_size)
  x = np.random.default_rng(0).normal(size=(batch, 40)).astype(np.float32)
  data = {"x": x, "y": (np.arange(batch) % 10).astype(np.int32)}
  params = model.init(jax.random.key(0), jnp.asarray(x[:2]), train=True)["params"]

  def loss_fn(p, b):
    logits = model.apply({"params": p}, b["x"], train=True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()

  base = date_optax.Baseline(batch_size=16, learning_rate=0.05, warmup_epochs=1,
                             epochs=100, num_examples=16384, optimizer="momentum",
                             optimizer_options={"momentum": 0.9})
  grow = date_optax.BatchSchedule.adaptive(16, max_batch=batch, threshold=1e-9,
                                           min_steps=3)
  mesh = dp.data_mesh()
  k = batch // 16
  plain = dp.make_train_step(loss_fn, date_optax.date(base, batch), mesh, grad_stats=True,
                             microbatches=k)
  growing = dp.make_train_step(loss_fn, date_optax.date(base, batch, batch_schedule=grow),
                               mesh, grad_stats=True, batch_schedule=grow)
  states = {}
  for name, step in (("plain", plain), ("growing", growing)):
    state = step.init(params)
    if name == "growing":
      while step.next_batch_size(state) < batch:  # grow to `batch` first
        b = step.next_batch_size(state)
        state, _ = step(state, {key: v[:b] for key, v in data.items()})
    for _ in range(3):
      state, m = step(state, data)
    jax.block_until_ready(m)
    states[name] = state
  # Interleaved rounds, the fastest round of each: the machine is shared.
  out = {"plain": float("inf"), "growing": float("inf")}
  for _ in range(rounds):
    for name, step in (("plain", plain), ("growing", growing)):
      state = states[name]
      t = time.perf_counter()
      for _ in range(steps):
        state, m = step(state, data)
      jax.block_until_ready(m)
      out[name] = min(out[name], (time.perf_counter() - t) / steps)
      states[name] = state
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  oracle.add_follow_up_flags(p)
  p.add_argument("--gain-log", default=None,
                 help="the gain study's log, for the fixed-batch gain row (default "
                 "docs/studies/gain_study/gain_study.jsonl; none in --quick)")
  p.add_argument("--devices", type=int, default=int(_DEVICES),
                 help="data-parallel devices of the growing rows (emulated on CPU "
                 "when run as a script; default 2)")
  p.add_argument("--bert-log", default=None,
                 help="the batch-scaling study's log, for BERT's B0, fixed and gain rows "
                 "(default docs/studies/bert_scaling/bert_scaling.jsonl; none in --quick)")
  p.add_argument("--methods", default=None,
                 help="comma-separated rows to run (default: all, in PHASES order)")
  p.add_argument("--extended", action="store_true",
                 help="also the ramps on seeds 1 and 2 and the 10 %% and 50 %% linear "
                 "ramps (the default full study: about 90 minutes here)")
  p.add_argument("--step-cost", action="store_true",
                 help="only time the growing step against the plain step")
  args = p.parse_args(argv)
  if args.step_cost:
    for i in range(2):
      cost = step_cost()
      print(f"try {i}: plain {cost['plain'] * 1e3:.2f} ms/step, growing "
            f"{cost['growing'] * 1e3:.2f} ms/step "
            f"({cost['growing'] / cost['plain'] - 1:+.1%})", flush=True)
    return 0
  if args.out is None:
    args.out = _paths.study("batch_growth",
                            "batch_growth_quick" if args.quick else "batch_growth")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  if args.oracle_log is None and not args.quick:
    args.oracle_log = _paths.study("oracle") + ".jsonl"
  if args.gain_log is None and not args.quick:
    args.gain_log = _paths.study("gain_study") + ".jsonl"
  if args.bert_log is None and not args.quick:
    args.bert_log = _paths.study("bert_scaling") + ".jsonl"
  return run_study(args)


if __name__ == "__main__":
  sys.exit(main())
